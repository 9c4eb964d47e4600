// Where a Hugging Face tokenizer folder keeps its chat template (see chat_config.h).
#include "titan/components/tokenizer/chat_config.h"

#include "titan/common/check.h"
#include "titan/common/file_io.h"

#include <filesystem>

namespace titan {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

json chat_json_file(const fs::path& path) {
  try {
    return json::parse(read_regular_file(path.string(), "tokenizer file"));
  } catch (const json::exception& e) {
    throw DataError(message(path.string(), ": not valid JSON (", e.what(), ")"));
  }
}

// The template of a "chat_template" value: a string, or transformers' list of named templates.
std::string chat_template_of(const json& value, const std::string& origin) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_array()) {
    std::string names;
    for (const json& entry : value) {
      if (!entry.is_object() || !entry.contains("name") || !entry.contains("template") ||
          !entry["name"].is_string() || !entry["template"].is_string()) {
        throw DataError(message(origin, ": \"chat_template\" lists an entry that is not ",
                                "{\"name\": ..., \"template\": ...}"));
      }
      if (entry["name"] == "default") return entry["template"].get<std::string>();
      names += (names.empty() ? "" : ", ") + entry["name"].get<std::string>();
    }
    throw ConfigError(message(origin, ": \"chat_template\" names the templates ", names,
                              " but none \"default\""));
  }
  throw DataError(message(origin, ": \"chat_template\" is ", value.type_name(),
                          ", not a string or a list of named templates"));
}

}  // namespace

namespace {

// tokenizer_config.json of `dir` (an empty object when there is none) and its special tokens.
json read_tokenizer_config(const fs::path& dir, nlohmann::ordered_json* special_tokens) {
  const fs::path config_path = dir / "tokenizer_config.json";
  json config = json::object();
  if (!fs::exists(config_path)) return config;
  config = chat_json_file(config_path);
  if (!config.is_object()) {
    throw DataError(message(config_path.string(), ": not a JSON object"));
  }
  for (const char* name : {"bos_token", "eos_token", "unk_token", "pad_token"}) {
    if (!config.contains(name) || config[name].is_null()) continue;
    const json& token = config[name];
    if (token.is_string()) {
      (*special_tokens)[name] = token;
    } else if (token.is_object() && token.contains("content") && token["content"].is_string()) {
      (*special_tokens)[name] = token["content"];  // an AddedToken as older configs store it
    } else {
      throw DataError(message(config_path.string(), ": \"", name, "\" is ", token.type_name(),
                              ", not a string or an object with \"content\""));
    }
  }
  return config;
}

}  // namespace

nlohmann::ordered_json read_special_tokens(const std::string& path) {
  const fs::path given(path);
  TITAN_CONFIG_CHECK(fs::exists(given), "tokenizer path '", path, "' does not exist");
  nlohmann::ordered_json tokens = nlohmann::ordered_json::object();
  read_tokenizer_config(fs::is_directory(given) ? given : given.parent_path(), &tokens);
  return tokens;
}

ChatTemplateFiles read_chat_template_files(const std::string& path) {
  const fs::path given(path);
  TITAN_CONFIG_CHECK(fs::exists(given), "tokenizer path '", path, "' does not exist");
  const fs::path dir = fs::is_directory(given) ? given : given.parent_path();
  ChatTemplateFiles out;
  const fs::path config_path = dir / "tokenizer_config.json";
  const json config = read_tokenizer_config(dir, &out.special_tokens);

  // transformers reads chat_template.jinja over the config's template when both exist.
  const fs::path jinja_path = given.extension() == ".jinja" ? given : dir / "chat_template.jinja";
  const fs::path json_path = dir / "chat_template.json";
  if (fs::exists(jinja_path)) {
    out.source = read_regular_file(jinja_path.string(), "chat template");
    out.origin = jinja_path.string();
  } else if (config.contains("chat_template")) {
    out.source = chat_template_of(config["chat_template"], config_path.string());
    out.origin = config_path.string();
  } else if (fs::exists(json_path)) {
    const json j = chat_json_file(json_path);
    if (!j.is_object() || !j.contains("chat_template")) {
      throw DataError(message(json_path.string(), ": no \"chat_template\" key"));
    }
    out.source = chat_template_of(j["chat_template"], json_path.string());
    out.origin = json_path.string();
  } else {
    throw ConfigError(message(
        "no chat template in '", dir.string(),
        "': looked for chat_template.jinja, \"chat_template\" in tokenizer_config.json and "
        "chat_template.json. HINT: name the model's Hugging Face folder, whose tokenizer files "
        "carry its template"));
  }
  return out;
}

}  // namespace titan
