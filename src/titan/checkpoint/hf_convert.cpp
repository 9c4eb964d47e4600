// Checkpoint / model <-> Hugging Face folder conversions (see hf_convert.h).
#include "titan/checkpoint/hf_convert.h"

#include "titan/checkpoint/peft_folder.h"
#include "titan/common/check.h"
#include "titan/common/format.h"
#include "titan/common/logging.h"
#include "titan/models/common/moe.h"
#include "titan/models/lora.h"

#include <ATen/core/grad_mode.h>

#include <filesystem>
#include <optional>
#include <sstream>

namespace titan::ckpt {
namespace {

std::string shape_str(at::IntArrayRef shape) {
  std::ostringstream os;
  os << shape;
  return os.str();
}

const HfAdapter& adapter_of(const ModelSpec& spec) {
  if (!spec.hf.to_hf || !spec.hf.from_hf) {
    throw ConfigError(message("model '", spec.name, "' has no Hugging Face adapter"));
  }
  return spec.hf;
}

// How a folder for `adapter`'s library is written: its weight file name, and a diffusers model
// folder (not "model") holds neither the tokenizer nor transformers' token ids.
HfWriteOptions options_for(const HfAdapter& adapter, HfWriteOptions options) {
  options.weights_name = adapter.weights_name;
  if (options.weights_name != "model") options.tokenizer_path.clear();
  return options;
}

// The buffers of `model` that are state (MoE expert biases, auxiliary-loss-free balancing),
// carried with the parameters; DeepSeek-V3's Hugging Face models hold them too
// (e_score_correction_bias).
TensorMap expert_biases(const Model& model) {
  TensorMap out;
  for (auto& [name, buffer] : state_buffers(model)) out.emplace(name, std::move(buffer));
  return out;
}

// An empty model of `description` whose parameter names and shapes say what to load.
std::shared_ptr<Model> empty_model(const nlohmann::json& description) {
  ModelBuildOptions options;
  options.max_seq_len = 2;                             // RoPE tables are derived, not loaded
  return build_described_model(description, options);  // with the LoRA adapters it describes
}

const nlohmann::json& checkpoint_model(const CheckpointReader& reader) {
  const nlohmann::json& state = reader.state();
  if (!state.is_object() || !state.contains("model") || !state["model"].is_object()) {
    throw DataError(reader.dir() + "/index.json: state has no \"model\" description");
  }
  return state["model"];
}

// "key: model A, config.json B" for each argument that differs, joined by "; ".
std::string args_difference(const nlohmann::json& model, const nlohmann::json& config) {
  std::vector<std::string> out;
  const auto add = [&](const std::string& key) {
    const nlohmann::json a = model.contains(key) ? model[key] : nlohmann::json();
    const nlohmann::json b = config.contains(key) ? config[key] : nlohmann::json();
    if (a != b) out.push_back(key + ": model " + a.dump() + ", config.json " + b.dump());
  };
  for (const auto& item : model.items()) add(item.key());
  for (const auto& item : config.items()) {
    if (!model.contains(item.key())) add(item.key());
  }
  return join(out, "; ");
}

// The tensors of a checkpoint, and for a QLoRA run's (state "qlora_base") the frozen base weights
// it does not hold: the Hugging Face folder the run quantized, read whole in float the first time
// a name is missing (the adapters were trained over its NF4 copy; PEFT applies them to it too).
class CheckpointTensors {
 public:
  explicit CheckpointTensors(const CheckpointReader& reader) : reader_(reader) {}

  bool has(const std::string& name) { return reader_.has(name) || base().count(name) != 0; }
  std::vector<int64_t> shape(const std::string& name) {
    if (reader_.has(name)) return reader_.meta(name).shape;
    return base().at(name).sizes().vec();
  }
  at::Tensor read(const std::string& name) {
    return reader_.has(name) ? reader_.read(name) : base().at(name);
  }

 private:
  const TensorMap& base() {
    if (base_) return *base_;
    base_.emplace();
    const nlohmann::json& state = reader_.state();
    if (!state.is_object() || !state.contains("qlora_base")) return *base_;
    const std::string folder = state["qlora_base"].value("hf_folder", "");
    if (!std::filesystem::is_directory(folder)) {
      throw DataError(reader_.dir() +
                      ": a QLoRA checkpoint (qlora_base in its index.json): its "
                      "frozen base weights are the Hugging Face folder '" +
                      folder +
                      "', which is not there. HINT: put the base folder back at that path");
    }
    log_info(reader_.dir(), ": a QLoRA checkpoint; its frozen base weights from ", folder,
             " (in float, not NF4)");
    *base_ = read_hf_parameters(folder, base_description(checkpoint_model(reader_)));
    return *base_;
  }

  const CheckpointReader& reader_;
  std::optional<TensorMap> base_;
};

}  // namespace

TensorMap model_tensors(const Model& model) {
  TensorMap out;
  for (const auto& item : model.named_parameters()) {
    out.emplace(item.key(), item.value());
  }
  return out;
}

void copy_into_model(Model& model, const TensorMap& tensors, const std::string& source) {
  const auto params = model.named_parameters();
  for (const auto& item : params) {
    const auto it = tensors.find(item.key());
    if (it == tensors.end()) {
      throw DataError(source + ": no tensor for parameter '" + item.key() + "'");
    }
    if (it->second.sizes() != item.value().sizes()) {
      throw DataError(source + ": tensor '" + item.key() + "' has shape " +
                      shape_str(it->second.sizes()) + ", the model expects " +
                      shape_str(item.value().sizes()));
    }
  }
  const TensorMap biases = expert_biases(model);
  for (const auto& [name, tensor] : tensors) {
    if (params.find(name) == nullptr && biases.count(name) == 0) {
      throw DataError(source + ": tensor '" + name + "' is not a parameter of the model");
    }
  }
  at::NoGradGuard no_grad;
  for (const auto& item : params) {
    item.value().copy_(tensors.at(item.key()));
  }
  // Expert biases where the source has them (a Hugging Face DeepSeek-V3); else kept as they are.
  for (const auto& [name, buffer] : biases) {
    const auto it = tensors.find(name);
    if (it == tensors.end()) continue;
    if (it->second.sizes() != buffer.sizes()) {
      throw DataError(source + ": tensor '" + name + "' has shape " +
                      shape_str(it->second.sizes()) + ", the model expects " +
                      shape_str(buffer.sizes()));
    }
    at::Tensor target = buffer;
    target.copy_(it->second);
  }
}

void load_checkpoint_parameters(Model& model, const CheckpointReader& reader) {
  at::NoGradGuard no_grad;
  CheckpointTensors tensors(reader);
  for (const auto& item : model.named_parameters()) {
    if (!tensors.has(item.key())) {
      throw DataError(reader.dir() + ": checkpoint has no tensor for parameter '" + item.key() +
                      "'");
    }
    const std::vector<int64_t> shape = tensors.shape(item.key());
    if (at::IntArrayRef(shape) != item.value().sizes()) {
      throw DataError(reader.dir() + ": tensor '" + item.key() + "' has shape " + shape_str(shape) +
                      ", the model expects " + shape_str(item.value().sizes()));
    }
    item.value().copy_(tensors.read(item.key()));
  }
  // Buffers that are state: MoE expert biases steer routing at inference too.
  for (const auto& [name, buffer] : expert_biases(model)) {
    if (!reader.has(name)) {
      throw DataError(reader.dir() + ": checkpoint has no tensor for the MoE state '" + name + "'");
    }
    at::Tensor target = buffer;
    target.copy_(reader.read(name).to(buffer.scalar_type()));
  }
}

TensorMap read_model_tensors(const CheckpointReader& reader) {
  const auto model = empty_model(checkpoint_model(reader));
  CheckpointTensors tensors(reader);
  TensorMap out;
  for (const auto& item : model->named_parameters()) {
    if (!tensors.has(item.key())) {
      throw DataError(reader.dir() + ": checkpoint has no tensor for parameter '" + item.key() +
                      "'");
    }
    at::Tensor t = tensors.read(item.key());
    if (t.sizes() != item.value().sizes()) {
      throw DataError(reader.dir() + ": tensor '" + item.key() + "' has shape " +
                      shape_str(t.sizes()) + ", the model expects " +
                      shape_str(item.value().sizes()));
    }
    out.emplace(item.key(), t);
  }
  return out;
}

nlohmann::json hf_model_description(const nlohmann::json& config, const std::string& config_path,
                                    const std::vector<std::string>& tensor_names) {
  // transformers' configs name the architecture in "model_type", diffusers' in "_class_name".
  const char* key = config.contains("model_type") ? "model_type" : "_class_name";
  if (!config.contains(key) || !config[key].is_string()) {
    throw DataError(config_path + ": no \"model_type\" string (nor a diffusers \"_class_name\")");
  }
  try {
    const ModelSpec& spec = spec_for_hf_model_type(config[key].get<std::string>());
    const HfAdapter& adapter = adapter_of(spec);
    const nlohmann::json description = adapter.from_hf_config(config);
    return adapter.fit_to_tensors ? adapter.fit_to_tensors(description, tensor_names) : description;
  } catch (const ConfigError& e) {
    throw DataError(config_path + ": " + e.what());
  }
}

void checkpoint_to_hf(const std::string& checkpoint_dir, const std::string& out_dir,
                      const HfWriteOptions& options, bool merge_adapters) {
  const CheckpointReader reader(checkpoint_dir);
  const nlohmann::json& description = checkpoint_model(reader);
  const HfAdapter& adapter = adapter_of(spec_for_description(description));
  TensorMap ours = read_model_tensors(reader);
  if (description.contains("lora")) {
    if (!merge_adapters) {
      throw ConfigError(
          message(checkpoint_dir,
                  " holds LoRA adapters, which a Hugging Face model folder cannot. HINT: "
                  "add --merge-lora to write the merged weights, or run `titan convert to-peft ",
                  checkpoint_dir, " OUT` for the adapters alone (a PEFT folder)"));
    }
    ours = merge_lora(ours, LoraSpec::from_json(description["lora"]));
  } else if (merge_adapters) {
    throw ConfigError(message("--merge-lora: ", checkpoint_dir,
                              " holds no LoRA adapters (it was not trained with model.converters "
                              "= [\"lora\"]). HINT: drop --merge-lora"));
  }
  const nlohmann::json base = base_description(description);
  // Expert biases go along: an adapter maps them (DeepSeek-V3) or drops them (Qwen3).
  for (const auto& [name, buffer] : expert_biases(*empty_model(base))) {
    if (reader.has(name)) ours.emplace(name, reader.read(name));
  }
  write_hf_folder(out_dir, adapter.to_hf_config(base), adapter.to_hf(ours, base),
                  options_for(adapter, options));
}

void checkpoint_to_peft(const std::string& checkpoint_dir, const std::string& out_dir) {
  std::error_code ec;
  if (std::filesystem::exists(out_dir, ec)) {
    throw ConfigError(
        message("output folder ", out_dir, " already exists; remove it or pick another"));
  }
  const CheckpointReader reader(checkpoint_dir);
  const nlohmann::json& description = checkpoint_model(reader);
  if (!description.contains("lora")) {
    throw ConfigError(message(checkpoint_dir,
                              " holds no LoRA adapters (it was not trained with model.converters "
                              "= [\"lora\"]). HINT: `titan convert to-hf` writes the whole model"));
  }
  write_peft_adapter(out_dir, read_model_tensors(reader), base_description(description),
                     LoraSpec::from_json(description["lora"]));
}

void hf_to_checkpoint(const std::string& hf_dir, const std::string& out_dir,
                      const std::string& adapter_dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::exists(out_dir, ec)) {
    throw ConfigError(message("output ", out_dir, " already exists; remove it or pick another"));
  }
  const HfFolderReader reader(hf_dir);
  const nlohmann::json base = hf_model_description(
      reader.config(), (fs::path(hf_dir) / "config.json").string(), reader.names());
  nlohmann::json description = base;
  const ModelSpec& spec = spec_for_description(description);
  TensorMap ours = adapter_of(spec).from_hf(reader.read_all(at::kFloat), description);
  if (!adapter_dir.empty()) {
    PeftAdapter adapter = read_peft_adapter(adapter_dir, base);
    ours.insert(adapter.params.begin(), adapter.params.end());
    description = with_lora(base, adapter.spec);
  }
  // Check against the model the description builds, and save in its parameter order.
  const auto model = empty_model(description);
  std::vector<SavedTensor> saved;
  for (const auto& item : model->named_parameters()) {
    const auto it = ours.find(item.key());
    if (it == ours.end()) {
      throw DataError(hf_dir + ": no Hugging Face tensor for parameter '" + item.key() + "'");
    }
    if (it->second.sizes() != item.value().sizes()) {
      throw DataError(hf_dir + ": tensor for '" + item.key() + "' has shape " +
                      shape_str(it->second.sizes()) + ", config.json implies " +
                      shape_str(item.value().sizes()));
    }
    saved.push_back(SavedTensor{item.key(), it->second, {}});
  }
  const TensorMap biases = expert_biases(*model);
  for (const auto& [name, tensor] : ours) {
    if (model->named_parameters().find(name) == nullptr && biases.count(name) == 0) {
      throw DataError(hf_dir + ": tensor '" + name + "' is not a parameter of the model");
    }
  }
  // MoE expert biases: from the folder where its model has them (DeepSeek-V3), else zero
  // (Qwen3-MoE has none).
  for (const auto& [name, buffer] : biases) {
    const auto it = ours.find(name);
    if (it != ours.end() && it->second.sizes() != buffer.sizes()) {
      throw DataError(hf_dir + ": tensor for '" + name + "' has shape " +
                      shape_str(it->second.sizes()) + ", config.json implies " +
                      shape_str(buffer.sizes()));
    }
    saved.push_back(SavedTensor{
        name,
        it != ours.end() ? it->second.to(at::kFloat) : at::zeros(buffer.sizes(), at::kFloat),
        {}});
  }
  const std::string tokenizer = hf_tokenizer_path(hf_dir);
  // "model_only" and "entries" as the checkpoint manager writes a model-only save, so that
  // checkpoint.initial_load_path restores it like one.
  const nlohmann::json state = {
      {"model", description},
      {"tokenizer_path",
       tokenizer.empty() ? "" : fs::absolute(tokenizer).lexically_normal().string()},
      {"model_only", true},
      {"entries", {{"model", nlohmann::json::object()}}},
  };
  write_checkpoint(out_dir, saved, state);
}

void load_hf_weights(Model& model, const nlohmann::json& model_description,
                     const std::string& hf_dir) {
  const HfFolderReader reader(hf_dir);
  const std::string config_path = (std::filesystem::path(hf_dir) / "config.json").string();
  const ModelSpec& spec = spec_for_description(model_description);
  const HfAdapter& adapter = adapter_of(spec);
  const nlohmann::json hf_description =
      hf_model_description(reader.config(), config_path, reader.names());
  if (spec_for_description(hf_description).name != spec.name) {
    throw ConfigError(message(config_path, " describes model '",
                              hf_description["name"].get<std::string>(), "', not '", spec.name,
                              "'"));
  }
  const nlohmann::json ours = spec.resolve_args(model_description);
  nlohmann::json theirs = spec.resolve_args(hf_description);
  // Multi-token prediction layers the model lacks are left unread (the adapter says so): a model
  // without them trains or generates from the folder's main model.
  const auto mtp_layers = [](const nlohmann::json& args) {
    return args.value("num_mtp_layers", int64_t{0});
  };
  if (mtp_layers(theirs) > mtp_layers(ours)) {
    if (mtp_layers(ours) > 0) {
      theirs["num_mtp_layers"] = mtp_layers(ours);
    } else {
      theirs.erase("num_mtp_layers");
    }
  }
  if (ours != theirs) {
    throw ConfigError(
        message(config_path, " describes another architecture than the model ",
                model_description.dump(), " (", args_difference(ours, theirs),
                "). HINT: pick the model.flavor that matches the Hugging Face config"));
  }
  copy_into_model(model, adapter.from_hf(reader.read_all(at::kFloat), model_description), hf_dir);
}

void save_hf_weights(const Model& model, const nlohmann::json& model_description,
                     const std::string& out_dir, const HfWriteOptions& options) {
  const HfAdapter& adapter = adapter_of(spec_for_description(model_description));
  // The adapter's permutes and concatenations run on the host, not in device memory.
  TensorMap on_host;
  for (const auto& [name, t] : model_tensors(model)) on_host.emplace(name, t.detach().cpu());
  for (const auto& [name, t] : expert_biases(model)) on_host.emplace(name, t.detach().cpu());
  write_hf_folder(out_dir, adapter.to_hf_config(model_description),
                  adapter.to_hf(on_host, model_description), options_for(adapter, options));
}

TensorMap read_hf_parameters(const std::string& hf_dir, const nlohmann::json& model_description) {
  const auto model = empty_model(model_description);
  load_hf_weights(*model, model_description, hf_dir);
  TensorMap out = model_tensors(*model);
  for (auto& [name, buffer] : state_buffers(*model)) out.emplace(name, buffer);
  return out;
}

std::string hf_export_dir(const std::string& folder, int64_t step) {
  return (std::filesystem::path(folder) / ("step-" + std::to_string(step) + "-hf")).string();
}

void export_hf(const std::string& dir, const std::vector<std::pair<std::string, at::Tensor>>& full,
               const nlohmann::json& model_description, int64_t rank,
               const HfWriteOptions& options) {
  if (rank != 0) return;
  const auto model = empty_model(model_description);
  copy_into_model(*model, TensorMap(full.begin(), full.end()), "the gathered parameters");
  std::error_code ec;
  if (std::filesystem::exists(dir, ec)) {
    log_warning("replacing the Hugging Face export ", dir);
    std::filesystem::remove_all(dir, ec);
  }
  save_hf_weights(*model, model_description, dir, options);
  log_info("final model written as a Hugging Face folder: ", dir);
}

}  // namespace titan::ckpt
