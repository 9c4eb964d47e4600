// load_model: a model with weights from a titan checkpoint or a Hugging Face folder (see
// model_loader.h).
#include "titan/checkpoint/model_loader.h"

#include "titan/checkpoint/checkpoint_files.h"
#include "titan/checkpoint/hf_convert.h"
#include "titan/checkpoint/hf_folder.h"
#include "titan/common/check.h"
#include "titan/common/format.h"
#include "titan/common/logging.h"
#include "titan/models/lora.h"
#include "titan/models/registry.h"

#include <filesystem>

namespace titan::ckpt {
namespace {

// The flavor, or for dims of no flavor "custom (dim 96, n_layers 2, ...)" from the integer
// architecture arguments.
std::string flavor_label(const nlohmann::json& description) {
  const std::string flavor = description.value("flavor", std::string("custom"));
  if (!description.contains("args")) {
    return flavor;
  }
  const nlohmann::json args = spec_for_description(description).resolve_args(description);
  std::vector<std::string> dims;
  for (const auto& item : args.items()) {
    if (item.value().is_number_integer()) dims.push_back(item.key() + " " + item.value().dump());
  }
  return flavor + " (" + join(dims) + ")";
}

std::shared_ptr<Model> build(const nlohmann::json& description, at::ScalarType compute_dtype,
                             int64_t max_seq_len) {
  ModelBuildOptions options;
  options.max_seq_len = max_seq_len;
  options.compute_dtype = compute_dtype;
  return build_described_model(description, options);  // with LoRA adapters it describes
}

LoadedModel load_from_checkpoint(const CheckpointReader& reader, at::ScalarType compute_dtype,
                                 int64_t max_seq_len) {
  const nlohmann::json& state = reader.state();
  if (!state.is_object() || !state.contains("model") || !state["model"].is_object()) {
    throw DataError(reader.dir() + "/index.json: state has no \"model\" description");
  }
  LoadedModel loaded;
  loaded.model = build(state["model"], compute_dtype, max_seq_len);
  load_checkpoint_parameters(*loaded.model, reader);
  loaded.model_name = state["model"].value("name", std::string());
  loaded.flavor = flavor_label(state["model"]);
  const auto tokenizer = state.find("tokenizer_path");
  loaded.tokenizer_path =
      tokenizer != state.end() && tokenizer->is_string() ? tokenizer->get<std::string>() : "";
  loaded.source = reader.dir();
  const auto job_config = state.find("job_config");
  if (job_config != state.end() && job_config->is_string()) {
    loaded.job_config_toml = job_config->get<std::string>();
  }
  return loaded;
}

LoadedModel load_from_hf(const std::string& dir, at::ScalarType compute_dtype,
                         int64_t max_seq_len) {
  const HfFolderReader reader(dir);
  const nlohmann::json description = hf_model_description(
      reader.config(), (std::filesystem::path(dir) / "config.json").string(), reader.names());
  const ModelSpec& spec = spec_for_description(description);
  LoadedModel loaded;
  loaded.model = build(description, compute_dtype, max_seq_len);
  copy_into_model(*loaded.model, spec.hf.from_hf(reader.read_all(at::kFloat), description), dir);
  loaded.model_name = spec.name;
  loaded.flavor = flavor_label(description);
  loaded.tokenizer_path = hf_tokenizer_path(dir);
  loaded.source = dir;
  return loaded;
}

}  // namespace

LoadedModel load_model(const std::string& path, at::ScalarType compute_dtype, int64_t max_seq_len) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    throw ConfigError(message("model path '", path, "' does not exist"));
  }
  if (is_checkpoint_dir(path)) {
    return load_from_checkpoint(CheckpointReader(path), compute_dtype, max_seq_len);
  }
  if (is_hf_folder(path)) {
    return load_from_hf(path, compute_dtype, max_seq_len);
  }
  const auto steps = list_step_dirs(path);
  if (steps.empty()) {
    throw ConfigError(
        message("'", path,
                "' is neither a titan checkpoint (a step directory with "
                "index.json, or a folder of step-N directories) nor a Hugging Face model "
                "folder (config.json)"));
  }
  // The newest complete checkpoint; a corrupt one falls back to the one before, with a warning.
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    try {
      return load_from_checkpoint(CheckpointReader(it->second), compute_dtype, max_seq_len);
    } catch (const DataError& e) {
      if (std::next(it) == steps.rend()) {
        throw;
      }
      log_warning("skipping corrupt checkpoint ", it->second, ": ", e.what(), "; trying ",
                  std::next(it)->second);
    }
  }
  throw DataError("no loadable checkpoint in " + path);  // unreachable
}

}  // namespace titan::ckpt
