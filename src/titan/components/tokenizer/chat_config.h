// The chat template of a Hugging Face tokenizer folder and the special-token strings transformers
// hands it: the template from chat_template.jinja (which wins, as transformers loads it), else
// tokenizer_config.json's "chat_template" (a string, or a list of {name, template} of which
// "default" is taken) or chat_template.json's; bos_token, eos_token, unk_token and pad_token from
// tokenizer_config.json (a string, or an AddedToken object's "content").
#pragma once

#include <nlohmann/json.hpp>

#include <string>

namespace titan {

struct ChatTemplateFiles {
  std::string source;  // the Jinja text
  std::string origin;  // the file it came from, for messages: "DIR/tokenizer_config.json"
  // The special tokens by name ("bos_token": "<|begin_of_text|>"), only those the config gives.
  nlohmann::ordered_json special_tokens = nlohmann::ordered_json::object();
};

// Reads `path` (a tokenizer folder, or a tokenizer_config.json / chat_template.jinja file).
// ConfigError when the folder has no chat template (naming the files looked for); DataError for
// an unreadable or malformed file, with the file and what is wrong.
ChatTemplateFiles read_chat_template_files(const std::string& path);

// Only the special tokens of `path`'s tokenizer_config.json (an empty object without one).
nlohmann::ordered_json read_special_tokens(const std::string& path);

}  // namespace titan
