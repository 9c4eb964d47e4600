// Qwen3 / Qwen3-MoE <-> Hugging Face conversion (see hf_adapter.h). Everything Llama 3 also has
// goes through the llama3 adapter; this file adds q/k norms, experts and the Qwen3 config keys.
#include "titan/models/qwen3/hf_adapter.h"

#include "titan/common/check.h"
#include "titan/common/logging.h"
#include "titan/models/common/hf_config_checks.h"
#include "titan/models/llama3/hf_adapter.h"
#include "titan/models/qwen3/spec.h"

#include <array>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace titan::qwen3 {
namespace {

using llama3::Llama3Args;

// Expert weights: (ours after "moe.experts.", HF projection after "mlp.experts.<e>.").
constexpr std::array<std::pair<const char*, const char*>, 3> kExpertNames = {{
    {"w1", "gate_proj"},
    {"w2", "down_proj"},
    {"w3", "up_proj"},
}};

// A q/k norm weight (head_dim) in HF's half layout and back: one head of the wq row permutation.
at::Tensor norm_to_hf(const at::Tensor& w) {
  return llama3::permute_to_hf(w.reshape({w.numel(), 1}), /*n_heads=*/1).view(w.sizes());
}

at::Tensor norm_from_hf(const at::Tensor& w) {
  return llama3::permute_from_hf(w.reshape({w.numel(), 1}), /*n_heads=*/1).view(w.sizes());
}

int64_t int_or(const nlohmann::json& config, const std::string& key, int64_t fallback) {
  if (!config.contains(key) || config[key].is_null()) return fallback;
  if (!config[key].is_number_integer()) {
    throw ConfigError(
        message("config.json \"", key, "\" must be an integer, got ", config[key].dump()));
  }
  return config[key].get<int64_t>();
}

// What Qwen3-MoE's router and experts can express; ConfigError naming the first other setting.
void check_exportable(const Llama3Args& args) {
  if (!args.qk_norm) {
    throw ConfigError(
        "qwen3 -> Hugging Face: qk_norm false has no Qwen3 config (Qwen3 always "
        "normalizes q and k)");
  }
  if (!args.has_moe()) return;
  const MoEArgs& m = args.moe;
  if (m.score_func != MoEArgs::Score::kSoftmax || m.num_shared_experts != 0 ||
      m.route_scale != 1.0 || m.score_before_experts || m.num_expert_groups != 0) {
    throw ConfigError(
        "qwen3 -> Hugging Face: Qwen3-MoE routes by softmax, without shared "
        "experts, route scale, groups or scores applied before the experts; this "
        "MoE differs");
  }
}

void set_moe(const nlohmann::json& config, Llama3Args& args) {
  if (int_or(config, "decoder_sparse_step", 1) != 1) {
    throw ConfigError(
        message("config.json \"decoder_sparse_step\" ", config["decoder_sparse_step"].dump(),
                " is not supported (only 1: every layer past mlp_only_layers has experts)"));
  }
  // mlp_only_layers: a first run 0, 1, ..., n - 1 of dense layers (our n_dense_layers).
  const nlohmann::json dense =
      config.contains("mlp_only_layers") && !config["mlp_only_layers"].is_null()
          ? config["mlp_only_layers"]
          : nlohmann::json::array();
  for (size_t i = 0; i < dense.size(); ++i) {
    if (!dense.is_array() || dense[i] != nlohmann::json(i)) {
      throw ConfigError(message("config.json \"mlp_only_layers\" ", dense.dump(),
                                " is not supported (only the first layers: [0, 1, ..., n - 1])"));
    }
  }
  args.n_dense_layers = static_cast<int64_t>(dense.size());
  args.moe = MoEArgs{};
  args.moe.num_experts = int_or(config, "num_experts", int_or(config, "num_local_experts", 0));
  args.moe.top_k = int_or(config, "num_experts_per_tok", 0);
  args.moe.hidden_dim = int_or(config, "moe_intermediate_size", 0);
  if (args.moe.num_experts <= 0 || args.moe.top_k <= 0 || args.moe.hidden_dim <= 0) {
    throw ConfigError(
        "config.json of a qwen3_moe model needs num_experts, num_experts_per_tok "
        "and moe_intermediate_size > 0");
  }
  hf::check_int("num_experts", args.moe.num_experts, 1, int64_t{1} << 16);
  hf::check_int("num_experts_per_tok", args.moe.top_k, 1, args.moe.num_experts,
                "at most num_experts");
  hf::check_int("moe_intermediate_size", args.moe.hidden_dim, 1, int64_t{1} << 24);
  args.moe.score_func = MoEArgs::Score::kSoftmax;
  const bool norm = config.contains("norm_topk_prob") && config["norm_topk_prob"].is_boolean() &&
                    config["norm_topk_prob"].get<bool>();
  args.moe.route_norm = norm;
  args.moe.score_before_experts = false;
}

// One layer's per-expert HF tensors: our weight name (w1, w2, w3) -> expert -> 2-D tensor.
using LayerExperts = std::map<std::string, std::map<int64_t, at::Tensor>>;

}  // namespace

nlohmann::json hf_config(const Llama3Args& args) {
  check_exportable(args);
  nlohmann::json config = llama3::hf_config(args);
  config.erase("pretraining_tp");
  config.erase("mlp_bias");
  config["use_sliding_window"] = false;
  config["sliding_window"] = nullptr;
  config["max_window_layers"] = args.n_layers;
  if (!args.has_moe()) {
    config["architectures"] = {"Qwen3ForCausalLM"};
    config["model_type"] = "qwen3";
    return config;
  }
  config["architectures"] = {"Qwen3MoeForCausalLM"};
  config["model_type"] = "qwen3_moe";
  config["num_experts"] = args.moe.num_experts;
  config["num_experts_per_tok"] = args.moe.top_k;
  config["moe_intermediate_size"] = args.moe.hidden_dim;
  config["norm_topk_prob"] = args.moe.route_norm;
  config["decoder_sparse_step"] = 1;
  nlohmann::json dense = nlohmann::json::array();
  for (int64_t i = 0; i < args.n_dense_layers; ++i) dense.push_back(i);
  config["mlp_only_layers"] = dense;
  config["output_router_logits"] = false;
  config["router_aux_loss_coef"] = 0.001;
  return config;
}

Llama3Args args_from_hf_config(const nlohmann::json& config) {
  if (!config.is_object()) {
    throw ConfigError("config.json must hold a JSON object");
  }
  const std::string type = hf::string_or(config, "model_type", "qwen3");
  if (type != "qwen3" && type != "qwen3_moe") {
    throw ConfigError(
        message("config.json model_type '", type, "' is not \"qwen3\" or \"qwen3_moe\""));
  }
  if (config.contains("use_sliding_window") && config["use_sliding_window"] == true) {
    throw ConfigError("config.json \"use_sliding_window\": true is not supported (only false)");
  }
  // The llama3 reader checks and reads the shared keys; head_dim is free in Qwen3.
  nlohmann::json shared = config;
  shared.erase("head_dim");
  if (!shared.contains("max_position_embeddings")) {
    shared["max_position_embeddings"] = 32768;  // Qwen3Config's default
  }
  Llama3Args args = llama3::args_from_hf_config(shared);
  args.head_dim_override =
      int_or(config, "head_dim", args.n_heads > 0 ? args.dim / args.n_heads : 0);
  hf::check_int("head_dim", args.head_dim_override, 2, int64_t{1} << 24,
                "even: RoPE rotates pairs");
  args.qk_norm = true;
  if (type == "qwen3_moe") set_moe(config, args);
  args.validate();
  return args;
}

TensorMap to_hf_tensors(const TensorMap& ours, const Llama3Args& args) {
  TensorMap hf;
  TensorMap shared;  // the names the llama3 adapter knows
  for (const auto& [name, tensor] : ours) {
    int64_t layer = 0;
    std::string rest;
    if (!llama3::parse_layer_name(name, "layers.", layer, rest)) {
      shared.emplace(name, tensor);
      continue;
    }
    const std::string prefix = "model.layers." + std::to_string(layer) + ".";
    if (rest == "attention.q_norm.weight" || rest == "attention.k_norm.weight") {
      llama3::put_tensor(hf, prefix + "self_attn." + rest.substr(10), norm_to_hf(tensor), name);
    } else if (rest == "moe.gate.weight") {
      llama3::put_tensor(hf, prefix + "mlp.gate.weight", tensor, name);
    } else if (rest == "moe.expert_bias") {
      llama3::warn_dropped_expert_bias(name, tensor, "Qwen3-MoE");
    } else if (rest.rfind("moe.experts.", 0) == 0) {
      std::string proj;
      for (const auto& [w, hf_proj] : kExpertNames) {
        if (rest == "moe.experts." + std::string(w) + ".weight") proj = hf_proj;
      }
      if (proj.empty() || tensor.dim() != 3) {
        throw DataError("qwen3 -> Hugging Face: no Hugging Face name for tensor '" + name + "'");
      }
      for (int64_t e = 0; e < tensor.size(0); ++e) {
        llama3::put_tensor(hf, prefix + "mlp.experts." + std::to_string(e) + "." + proj + ".weight",
                           tensor.select(0, e), name);
      }
    } else {
      shared.emplace(name, tensor);
    }
  }
  for (const auto& [name, tensor] : llama3::to_hf_tensors(shared, args)) {
    llama3::put_tensor(hf, name, tensor, name);
  }
  return hf;
}

TensorMap from_hf_tensors(const TensorMap& hf, const Llama3Args& args) {
  TensorMap ours;
  TensorMap shared;
  std::map<int64_t, LayerExperts> experts;
  for (const auto& [name, tensor] : hf) {
    int64_t layer = 0;
    std::string rest;
    if (!llama3::parse_layer_name(name, "model.layers.", layer, rest)) {
      shared.emplace(name, tensor);
      continue;
    }
    const std::string prefix = "layers." + std::to_string(layer) + ".";
    int64_t expert = 0;
    std::string proj;
    if (rest == "self_attn.q_norm.weight" || rest == "self_attn.k_norm.weight") {
      llama3::put_tensor(ours, prefix + "attention." + rest.substr(10), norm_from_hf(tensor), name);
    } else if (rest == "mlp.gate.weight") {
      llama3::put_tensor(ours, prefix + "moe.gate.weight", tensor, name);
    } else if (rest == "mlp.experts.gate_up_proj" && tensor.dim() == 3) {
      // Fused (E, 2h, dim): gate rows then up rows.
      const auto halves = tensor.chunk(2, /*dim=*/1);
      llama3::put_tensor(ours, prefix + "moe.experts.w1.weight", halves[0].contiguous(), name);
      llama3::put_tensor(ours, prefix + "moe.experts.w3.weight", halves[1].contiguous(), name);
    } else if (rest == "mlp.experts.down_proj" && tensor.dim() == 3) {
      llama3::put_tensor(ours, prefix + "moe.experts.w2.weight", tensor, name);
    } else if (llama3::parse_layer_name(rest, "mlp.experts.", expert, proj)) {
      std::string w;
      for (const auto& [our_w, hf_proj] : kExpertNames) {
        if (proj == std::string(hf_proj) + ".weight") w = our_w;
      }
      if (w.empty() || tensor.dim() != 2 || !experts[layer][w].emplace(expert, tensor).second) {
        throw DataError("Hugging Face -> qwen3: unexpected tensor '" + name +
                        "' (not a Qwen3-MoE expert weight)");
      }
    } else {
      shared.emplace(name, tensor);
    }
  }
  for (const auto& [layer, layer_experts] : experts) {
    for (const auto& [w, by_expert] : layer_experts) {
      const std::string name = "layers." + std::to_string(layer) + ".moe.experts." + w + ".weight";
      std::vector<at::Tensor> stack;
      for (const auto& [e, t] : by_expert) {
        if (e != static_cast<int64_t>(stack.size())) break;
        stack.push_back(t);
      }
      if (static_cast<int64_t>(stack.size()) != args.moe.num_experts ||
          stack.size() != by_expert.size()) {
        throw DataError("Hugging Face -> qwen3: layer " + std::to_string(layer) + " has " +
                        std::to_string(by_expert.size()) + " " + w +
                        " expert tensors, not experts 0.." +
                        std::to_string(args.moe.num_experts - 1) + " (config num_experts " +
                        std::to_string(args.moe.num_experts) + ")");
      }
      llama3::put_tensor(ours, name, at::stack(stack), name);
    }
  }
  for (const auto& [name, tensor] : llama3::from_hf_tensors(shared, args)) {
    llama3::put_tensor(ours, name, tensor, name);
  }
  return ours;
}

HfAdapter make_hf_adapter() {
  HfAdapter adapter = llama3::family_hf_adapter(family(), "qwen3",
                                                {&qwen3::hf_config, &qwen3::args_from_hf_config,
                                                 &qwen3::to_hf_tensors, &qwen3::from_hf_tensors});
  adapter.other_model_types = {"qwen3_moe"};
  return adapter;
}

}  // namespace titan::qwen3
