// The model registry. Each model (e.g. models/llama3) provides a `make_<model>_spec()` that
// registry.cpp registers on first use (explicitly, since static-init registration is dropped by
// the linker from static libraries); the trainer and `inspect` look models up by name.
//
// A *model description* is the JSON a checkpoint stores under state["model"]:
//   {"name": "llama3", "flavor": "debugmodel"}                      a registered flavor, or
//   {"name": "llama3", "flavor": "custom", "args": {"dim": 512, ...}}  dims of no flavor (e.g.
//                                                                    from a Hugging Face config).
// "args" keys override the flavor's arguments (or the model's defaults when the flavor is not
// registered); each model documents its keys (llama3: args.h).
#pragma once

#include "titan/models/model.h"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace titan {

// Named tensors (parameter FQN or Hugging Face name -> tensor).
using TensorMap = std::map<std::string, at::Tensor>;

// Conversion between our parameters and a Hugging Face transformers model folder (what
// TorchTitan calls a state-dict adapter). Every function is pure: no files, no model instance.
struct HfAdapter {
  // config.json "model_type" this adapter reads, e.g. "llama" (a diffusers model folder:
  // "_class_name", e.g. "FluxTransformer2DModel").
  std::string model_type;
  // The stem of the folder's weight files: "model" (transformers), "diffusion_pytorch_model"
  // (diffusers).
  std::string weights_name = "model";
  // Further model_type values from_hf_config reads (Qwen3's MoE configs: "qwen3_moe").
  std::vector<std::string> other_model_types;
  // The config.json for a model description (architectures, model_type, dims; no dtype or
  // token ids, which the caller adds).
  std::function<nlohmann::json(const nlohmann::json& model)> to_hf_config;
  // The model description for a config.json; ConfigError naming the key it cannot represent.
  std::function<nlohmann::json(const nlohmann::json& hf_config)> from_hf_config;
  // Our parameters (FQN -> tensor) to HF names and layouts; DataError on a name it does not know.
  std::function<TensorMap(const TensorMap& ours, const nlohmann::json& model)> to_hf;
  // The inverse; HF tensors that hold no parameter (e.g. rotary inv_freq buffers) are dropped.
  std::function<TensorMap(const TensorMap& hf, const nlohmann::json& model)> from_hf;
  // Optional: from_hf_config's description fitted to the tensors a folder holds (their HF names),
  // for what a config.json states that its tensors may lack (DeepSeek-V3's
  // num_nextn_predict_layers, which transformers writes as 1 also where it saved no multi-token
  // prediction layer).
  std::function<nlohmann::json(const nlohmann::json& model,
                               const std::vector<std::string>& hf_names)>
      fit_to_tensors;
};

struct ModelSection;

// What a model learns, which decides its data and loss (the trainer asks, never the model's name).
enum class ModelObjective {
  kNextToken,       // a decoder: token sequences, cross-entropy of the next token
  kFlowMatching,    // a diffusion transformer (FLUX): image-caption data, rectified-flow velocity
  kVisionLanguage,  // a decoder reading images (the VLM): image-caption data as token sequences
                    // with image placeholders, cross-entropy of the next text token
};

struct ModelSpec {
  std::string name;
  ModelObjective objective = ModelObjective::kNextToken;
  std::vector<std::string> flavors;  // in registration order (small to large)
  // Analytic stats of `flavor` at (batch, seq_len); never allocates weights.
  std::function<ModelStats(const std::string& flavor, int64_t batch, int64_t seq_len,
                           at::ScalarType compute_dtype)>
      describe;
  // A freshly built model of `flavor`, initialized from options.seed (on the meta device and not
  // initialized with options.meta).
  std::function<std::shared_ptr<Model>(const std::string& flavor, const ModelBuildOptions&)> build;
  // One line per flavor (dims) for `--help`-style listings.
  std::function<std::string(const std::string& flavor)> describe_flavor;

  // Every architecture argument of a model description (see the top of this file), resolved:
  // two descriptions with equal resolve_args() build models with identical parameter layouts.
  // ConfigError for an unknown flavor without "args", an unknown or invalid args key.
  std::function<nlohmann::json(const nlohmann::json& model)> resolve_args;
  // The model of a description with parameters allocated but NOT initialized (for loading).
  std::function<std::shared_ptr<Model>(const nlohmann::json& model, const ModelBuildOptions&)>
      build_uninitialized;
  // Hugging Face conversion; functions are empty when the model has none.
  HfAdapter hf;
  // How the model is parallelized is not here: parallel/parallelize.h maps model names to
  // parallelize functions, which read the model's data (tensor_parallel_plan(), units()).
};

// Registers a spec; a duplicate name is a programming error.
void register_model(ModelSpec spec);

// The spec for `name`. Throws ConfigError naming the nearest registered model if unknown.
const ModelSpec& get_model_spec(const std::string& name);

// Throws ConfigError naming the nearest flavor of `spec` if `flavor` is unknown.
void check_flavor(const ModelSpec& spec, const std::string& flavor);
// The same check against a plain list, for code that has the flavors but not the spec.
void check_flavor(const std::string& model, const std::vector<std::string>& flavors,
                  const std::string& flavor);

std::vector<std::string> registered_models();

// "; did you mean 'x'? (<kind>: a, b, c)" with x the candidate nearest to `name` (edit distance).
std::string suggestion(const std::string& name, const std::vector<std::string>& candidates,
                       const std::string& kind);

// The model description of the [model] config section: {"name": name, "flavor": flavor}.
nlohmann::json model_description(const ModelSection& model);

// The spec for a model description's "name" (ConfigError if missing or unknown).
const ModelSpec& spec_for_description(const nlohmann::json& model);

// The spec whose HF adapter reads config.json's "model_type" `model_type`; ConfigError listing
// the supported types otherwise.
const ModelSpec& spec_for_hf_model_type(const std::string& model_type);

}  // namespace titan
