// LoRA (Hu et al., "LoRA: Low-Rank Adaptation of Large Language Models", 2021) as a model
// converter (model.converters = ["lora"], configured by [lora]): chosen Linear layers of the
// transformer blocks get two small trained matrices, and every other parameter is frozen.
//
//   y = W x + scaling * B (A dropout(x))      A = lora_a (r, in), B = lora_b (out, r)
//   scaling = alpha / r  (alpha / sqrt(r) with use_rslora)
//
// A starts as PEFT's kaiming_uniform(a = sqrt(5)), uniform on +-1/sqrt(in); B starts at zero, so
// the adapted model begins as the base model. The adapters are Linear children of the layer they
// adapt ("layers.0.attention.wq.lora_a.weight"), so FSDP shards them, tensor parallelism splits
// them with their layer (models/common/linear.h) and checkpoints hold them like any parameter.
// Frozen parameters keep requires_grad = false: no weight-gradient GEMM, no gradient reduction,
// no optimizer state.
//
// PEFT interop: the adapters under PEFT's names ("base_model.model.<HF module>.lora_A.weight"),
// through the model's Hugging Face adapter, so that row layouts (Llama's q/k permutation) follow
// the base weights; adapter_config.json as PEFT writes it.
#pragma once

#include "titan/config/job_config.h"
#include "titan/models/model.h"
#include "titan/models/registry.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace titan {

// Target name that adapts every Linear layer of the transformer blocks (PEFT's spelling).
inline constexpr const char* kAllLinear = "all-linear";

struct LoraSpec {
  int64_t rank = 8;
  double alpha = 16.0;
  double dropout = 0.0;
  std::vector<std::string> target_modules = {"wq", "wv"};
  bool use_rslora = false;

  double scaling() const;
  static LoraSpec from_section(const LoraSection& section);
  // A model description's "lora" entry, and back (from_json: DataError on a malformed entry).
  nlohmann::json to_json() const;
  static LoraSpec from_json(const nlohmann::json& entry);
};

// What apply_lora did.
struct LoraApplied {
  std::vector<std::string> adapted;  // module names, in model order
  // The GroupedExperts modules whose routed experts got adapters ("layers.1.moe.experts").
  std::vector<std::string> adapted_experts;
  int64_t adapter_params = 0;  // elements of the adapters (trained)
  int64_t frozen_params = 0;   // elements of every other parameter
};

// Adds adapters to the Linear layers of `model` inside its transformer blocks ("layers.N.")
// whose last name part is a target, ours or the Hugging Face name the model's adapter gives it
// (description: the model's description, for that mapping), and freezes every other parameter
// (and the MoE routers' load-balancing bias, MoE::expert_bias_frozen). The routed experts of MoE
// layers are adapted only when named: "experts" (all), PEFT's "experts.gate_up_proj" /
// "experts.down_proj", or ours "experts.w1" + "experts.w3" (together: they share one A) /
// "experts.w2"; each expert gets its own adapter (moe.h, ExpertWeight). ConfigError when a target
// matches no layer (naming the layer names there are), names only one of experts.w1 / w3, matches a
// layer that is not a Linear, or adapts experts with dropout. Applies to a model on the meta device
// too.
LoraApplied apply_lora(Model& model, const LoraSpec& spec, const nlohmann::json& description);

// Whether `name` is an adapter parameter ("<module>.lora_a.weight" or "<module>.lora_b.weight").
bool is_lora_param(const std::string& name);

// Whether model.converters lists "lora".
bool lora_enabled(const ModelSection& model);
// The description of the model a run trains: model_description(model), with a "lora" entry when
// lora_enabled (checkpoints record it, so loaders rebuild the adapters).
nlohmann::json trained_model_description(const ModelSection& model, const LoraSection& lora);

// The parameters a LoRA run of `model` trains (its adapters' elements), counted on a build on
// the meta device (nothing allocated); remembered per description. For memory estimates.
int64_t lora_trained_params(const ModelSection& model, const LoraSection& lora);
// The weights QLoRA (lora.quantize_base) holds in NF4: the frozen linear weights of the blocks
// (what quantize_frozen_nf4 takes), counted the same way; 0 without quantize_base.
int64_t qlora_base_params(const ModelSection& model, const LoraSection& lora);

// The description with the adapters (a "lora" entry), for checkpoints of a LoRA run.
nlohmann::json with_lora(nlohmann::json description, const LoraSpec& spec);
// The description without its "lora" entry (the base model).
nlohmann::json base_description(nlohmann::json description);

// The model of a description, parameters allocated and not initialized (build_uninitialized),
// with the adapters its "lora" entry describes (frozen base). Loaders use this.
std::shared_ptr<Model> build_described_model(const nlohmann::json& description,
                                             const ModelBuildOptions& options);

// `params` (FQN -> whole tensor; any mix of base and adapter parameters) with every adapter
// folded into its base weight, W + scaling * B A (in float32), and the adapters removed.
TensorMap merge_lora(const TensorMap& params, const LoraSpec& spec);

// The adapters of `params` under PEFT's names and layouts for the base model of `description`
// (Hugging Face names through its adapter). DataError when there are none.
TensorMap to_peft_tensors(const TensorMap& params, const nlohmann::json& description);
// The inverse: PEFT adapter tensors -> our adapter parameters; `lora` (from the adapter's config)
// gives the rank and which routed-expert parameters it targets (PEFT nests several on one
// module). DataError naming an entry that is no LoRA A/B matrix of a module of the model.
TensorMap from_peft_tensors(const TensorMap& peft, const nlohmann::json& description,
                            const LoraSpec& lora);

// adapter_config.json for the adapters of `params` (target modules by their Hugging Face names;
// the routed experts' as PEFT's target_parameters).
nlohmann::json peft_adapter_config(const TensorMap& params, const nlohmann::json& description,
                                   const LoraSpec& spec);
// The LoraSpec of a PEFT adapter_config.json (ConfigError for settings we do not train: biases,
// DoRA, per-module ranks, another task type); target modules as written, and the routed
// experts' target_parameters as "experts.gate_up_proj" / "experts.down_proj".
LoraSpec lora_spec_from_peft_config(const nlohmann::json& config, const std::string& path);

}  // namespace titan
