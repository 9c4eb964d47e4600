// gpt-oss <-> Hugging Face conversion (see hf_adapter.h).
#include "titan/models/gpt_oss/hf_adapter.h"

#include "titan/common/check.h"
#include "titan/common/logging.h"
#include "titan/models/common/hf_config_checks.h"
#include "titan/models/gpt_oss/spec.h"
#include "titan/models/llama3/hf_adapter.h"

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace titan::gpt_oss {
namespace {

using llama3::Llama3Args;

using hf::bool_or;
using hf::int_or;
using hf::number_or;

const nlohmann::json* find(const nlohmann::json& config, const std::string& key) {
  return hf::find_key(config, key);
}

// A (rows) bias of a RoPE-rotated projection: its rows permuted as the weight's rows.
at::Tensor bias_to_hf(const at::Tensor& b, int64_t heads) {
  return llama3::permute_to_hf(b.reshape({b.numel(), 1}), heads).view(b.sizes());
}
at::Tensor bias_from_hf(const at::Tensor& b, int64_t heads) {
  return llama3::permute_from_hf(b.reshape({b.numel(), 1}), heads).view(b.sizes());
}

// What GptOssConfig can express; ConfigError naming the first other setting.
void check_exportable(const Llama3Args& a) {
  const MoEArgs& m = a.moe;
  const bool ok = a.has_moe() && a.n_dense_layers == 0 && !a.mla.enabled() && !a.qk_norm &&
                  a.attention_bias && a.attention_sinks && !a.tie_embeddings &&
                  !a.use_rope_scaling && m.score_func == MoEArgs::Score::kSoftmax && m.route_norm &&
                  m.route_scale == 1.0 && !m.score_before_experts && m.num_shared_experts == 0 &&
                  m.num_expert_groups == 0 && m.router_bias && m.expert_biases &&
                  m.swiglu_limit > 0;
  if (!ok) {
    throw ConfigError(
        "gpt_oss -> Hugging Face: GptOssForCausalLM has attention biases and sinks, MoE in every "
        "layer with a biased softmax top-k router, biased experts and the clamped SwiGLU, no qk "
        "norm, untied embeddings and YaRN or plain RoPE; this model differs");
  }
}

// The Hugging Face layer_types of `a`.
nlohmann::json layer_types(const Llama3Args& a) {
  nlohmann::json types = nlohmann::json::array();
  for (int64_t i = 0; i < a.n_layers; ++i) {
    types.push_back(a.is_sliding_layer(i) ? "sliding_attention" : "full_attention");
  }
  return types;
}

// Sets sliding_window / global_attention_every from config.json's layer_types (GptOssConfig's
// default: sliding in the even layers), refusing a pattern other than "every N-th layer global".
void set_layer_types(const nlohmann::json& config, Llama3Args& a) {
  const int64_t window = int_or(config, "sliding_window", 0);
  hf::check_int("sliding_window", window, 0, int64_t{1} << 31);
  a.sliding_window = window;
  a.global_attention_every = 2;
  const nlohmann::json* types = find(config, "layer_types");
  if (types == nullptr) {
    if (window == 0) a.global_attention_every = 0;
    return;
  }
  if (!types->is_array() || static_cast<int64_t>(types->size()) != a.n_layers) {
    throw ConfigError(message("config.json \"layer_types\" must list the ", a.n_layers,
                              " layers' attention types, got ", types->dump()));
  }
  int64_t first_full = -1;
  bool any_sliding = false;
  for (int64_t i = 0; i < a.n_layers; ++i) {
    const nlohmann::json& t = (*types)[i];
    if (t != "sliding_attention" && t != "full_attention") {
      throw ConfigError(message("config.json \"layer_types\"[", i, "] ", t.dump(),
                                " is not \"sliding_attention\" or \"full_attention\""));
    }
    if (t == "full_attention" && first_full < 0) first_full = i;
    any_sliding = any_sliding || t == "sliding_attention";
  }
  if (!any_sliding) {
    a.sliding_window = 0;
    a.global_attention_every = 0;
    return;
  }
  if (window == 0) {
    throw ConfigError("config.json has sliding_attention layers and no \"sliding_window\"");
  }
  a.global_attention_every = first_full < 0 ? 0 : first_full + 1;
  if (layer_types(a) != *types) {
    throw ConfigError(message("config.json \"layer_types\" ", types->dump(),
                              " is not supported: only every N-th layer attending globally and "
                              "the others sliding (gpt-oss: N = 2)"));
  }
}

// RoPE from "rope_parameters" (transformers 5) or "rope_theta" + "rope_scaling".
void set_rope(const nlohmann::json& config, Llama3Args& a) {
  nlohmann::json rope;
  if (const nlohmann::json* p = find(config, "rope_parameters")) {
    rope = *p;
  } else if (const nlohmann::json* s = find(config, "rope_scaling")) {
    rope = *s;
  } else if (!config.contains("rope_parameters") && !config.contains("rope_scaling")) {
    // GptOssConfig's default.
    rope = {{"rope_type", "yarn"}, {"factor", 32.0},    {"beta_fast", 32.0},
            {"beta_slow", 1.0},    {"truncate", false}, {"original_max_position_embeddings", 4096}};
  }
  if (!rope.is_null() && !rope.is_object()) {
    throw ConfigError(message("config.json RoPE parameters must be an object, got ", rope.dump()));
  }
  a.rope_theta = number_or(rope.is_object() ? rope : nlohmann::json::object(), "rope_theta",
                           number_or(config, "rope_theta", 150000.0));
  hf::check_number("rope_theta", a.rope_theta, 0, 1e12, /*lo_open=*/true);
  a.use_rope_scaling = false;
  a.yarn = YarnScaling{};
  if (!rope.is_object()) return;
  const std::string type = hf::string_or(rope, "rope_type", hf::string_or(rope, "type", "default"));
  if (type == "default") return;
  if (type != "yarn") {
    throw ConfigError(message("config.json rope_type \"", type,
                              "\" is not supported for gpt_oss (only \"yarn\" or \"default\")"));
  }
  for (const char* key : {"attention_factor", "mscale", "mscale_all_dim"}) {
    if (find(rope, key) != nullptr) {
      throw ConfigError(message("config.json RoPE \"", key,
                                "\" is not supported for gpt_oss (the attention factor is "
                                "derived from \"factor\", as GptOssConfig does)"));
    }
  }
  a.yarn.factor = number_or(rope, "factor", 0.0);
  hf::check_number("factor", a.yarn.factor, 1.0, 1e6, /*lo_open=*/true);
  a.yarn.beta_fast = number_or(rope, "beta_fast", 32.0);
  a.yarn.beta_slow = number_or(rope, "beta_slow", 1.0);
  hf::check_number("beta_fast", a.yarn.beta_fast, 0, 1e6, /*lo_open=*/true);
  hf::check_number("beta_slow", a.yarn.beta_slow, 0, 1e6, /*lo_open=*/true);
  a.yarn.original_seq_len = int_or(rope, "original_max_position_embeddings", 0);
  hf::check_int("original_max_position_embeddings", a.yarn.original_seq_len, 1, int64_t{1} << 31);
  a.yarn.truncate = bool_or(rope, "truncate", true);
}

}  // namespace

nlohmann::json hf_config(const Llama3Args& a) {
  check_exportable(a);
  nlohmann::json rope = {{"rope_type", "default"}, {"rope_theta", a.rope_theta}};
  if (a.yarn.enabled()) {
    rope = {{"rope_type", "yarn"},
            {"rope_theta", a.rope_theta},
            {"factor", a.yarn.factor},
            {"beta_fast", a.yarn.beta_fast},
            {"beta_slow", a.yarn.beta_slow},
            {"truncate", a.yarn.truncate},
            {"original_max_position_embeddings", a.yarn.original_seq_len}};
  }
  return {
      {"architectures", {"GptOssForCausalLM"}},
      {"model_type", "gpt_oss"},
      {"hidden_size", a.dim},
      {"intermediate_size", a.moe.hidden_dim},
      {"num_hidden_layers", a.n_layers},
      {"num_attention_heads", a.n_heads},
      {"num_key_value_heads", a.kv_heads()},
      {"head_dim", a.head_dim()},
      {"vocab_size", a.vocab_size},
      {"num_local_experts", a.moe.num_experts},
      {"num_experts_per_tok", a.moe.top_k},
      {"sliding_window", a.sliding_window > 0 ? nlohmann::json(a.sliding_window) : nullptr},
      {"layer_types", layer_types(a)},
      {"rms_norm_eps", a.norm_eps},
      {"rope_parameters", rope},
      {"max_position_embeddings", a.max_seq_len},
      {"swiglu_limit", a.moe.swiglu_limit},
      {"swiglu_alpha", a.moe.swiglu_alpha},
      {"attention_bias", true},
      {"attention_dropout", 0.0},
      {"hidden_act", "silu"},
      {"tie_word_embeddings", false},
      {"initializer_range", 0.02},
      {"router_aux_loss_coef", 0.001},
      {"output_router_logits", false},
      {"use_cache", true},
  };
}

Llama3Args args_from_hf_config(const nlohmann::json& config) {
  if (!config.is_object()) throw ConfigError("config.json must hold a JSON object");
  const std::string type = hf::string_or(config, "model_type", "gpt_oss");
  if (type != "gpt_oss") {
    throw ConfigError(message("config.json model_type '", type, "' is not \"gpt_oss\""));
  }
  if (hf::string_or(config, "hidden_act", "silu") != "silu") {
    throw ConfigError(message("config.json \"hidden_act\" ", config["hidden_act"].dump(),
                              " is not supported for gpt_oss (only \"silu\")"));
  }
  if (!bool_or(config, "attention_bias", true)) {
    throw ConfigError("config.json \"attention_bias\": false is not supported for gpt_oss");
  }
  if (bool_or(config, "tie_word_embeddings", false)) {
    throw ConfigError("config.json \"tie_word_embeddings\": true is not supported for gpt_oss");
  }
  Llama3Args a = gpt_oss::flavors().back().second;  // the architecture's fixed choices
  a.dim = int_or(config, "hidden_size", 2880);
  a.n_layers = int_or(config, "num_hidden_layers", 36);
  a.n_heads = int_or(config, "num_attention_heads", 64);
  a.n_kv_heads = int_or(config, "num_key_value_heads", a.n_heads);
  a.head_dim_override = int_or(config, "head_dim", a.n_heads > 0 ? a.dim / a.n_heads : 0);
  a.vocab_size = int_or(config, "vocab_size", 201088);
  a.max_seq_len = int_or(config, "max_position_embeddings", 131072);
  a.norm_eps = number_or(config, "rms_norm_eps", 1e-5);
  hf::check_int("hidden_size", a.dim, 1, int64_t{1} << 24);
  hf::check_int("num_hidden_layers", a.n_layers, 1, int64_t{1} << 16);
  hf::check_int("num_attention_heads", a.n_heads, 1, int64_t{1} << 24);
  hf::check_int("num_key_value_heads", a.n_kv_heads, 1, a.n_heads, "dividing the heads");
  hf::check_int("head_dim", a.head_dim_override, 2, int64_t{1} << 24, "even: RoPE rotates pairs");
  hf::check_int("vocab_size", a.vocab_size, 1, int64_t{1} << 31);
  hf::check_int("max_position_embeddings", a.max_seq_len, 1, int64_t{1} << 31);
  hf::check_number("rms_norm_eps", a.norm_eps, 0, 1, /*lo_open=*/true);
  a.moe.num_experts = int_or(config, "num_local_experts", 128);
  a.moe.top_k = int_or(config, "num_experts_per_tok", 4);
  a.moe.hidden_dim = int_or(config, "intermediate_size", 2880);
  hf::check_int("num_local_experts", a.moe.num_experts, 1, int64_t{1} << 16);
  hf::check_int("num_experts_per_tok", a.moe.top_k, 1, a.moe.num_experts, "at most the experts");
  hf::check_int("intermediate_size", a.moe.hidden_dim, 1, int64_t{1} << 24);
  a.moe.swiglu_limit = number_or(config, "swiglu_limit", 7.0);
  a.moe.swiglu_alpha = number_or(config, "swiglu_alpha", 1.702);
  hf::check_number("swiglu_limit", a.moe.swiglu_limit, 0, 1e6, /*lo_open=*/true);
  hf::check_number("swiglu_alpha", a.moe.swiglu_alpha, 0, 1e6, /*lo_open=*/true);
  set_layer_types(config, a);
  set_rope(config, a);
  a.validate();
  return a;
}

TensorMap to_hf_tensors(const TensorMap& ours, const Llama3Args& a) {
  TensorMap hf;
  TensorMap shared;  // the names the llama3 adapter knows
  // Per layer: w1/w3 and b1/b3, interleaved into one HF tensor each once both are seen.
  std::map<int64_t, std::map<std::string, at::Tensor>> gate_up;
  for (const auto& [name, tensor] : ours) {
    int64_t layer = 0;
    std::string rest;
    if (!llama3::parse_layer_name(name, "layers.", layer, rest)) {
      shared.emplace(name, tensor);
      continue;
    }
    const std::string prefix = "model.layers." + std::to_string(layer) + ".";
    if (rest == "attention.bq.weight") {
      llama3::put_tensor(hf, prefix + "self_attn.q_proj.bias", bias_to_hf(tensor, a.n_heads), name);
    } else if (rest == "attention.bk.weight") {
      llama3::put_tensor(hf, prefix + "self_attn.k_proj.bias", bias_to_hf(tensor, a.kv_heads()),
                         name);
    } else if (rest == "attention.bv.weight") {
      llama3::put_tensor(hf, prefix + "self_attn.v_proj.bias", tensor, name);
    } else if (rest == "attention.bo.weight") {
      llama3::put_tensor(hf, prefix + "self_attn.o_proj.bias", tensor, name);
    } else if (rest == "attention.sinks.weight") {
      llama3::put_tensor(hf, prefix + "self_attn.sinks", tensor, name);
    } else if (rest == "moe.gate.weight") {
      llama3::put_tensor(hf, prefix + "mlp.router.weight", tensor, name);
    } else if (rest == "moe.gate_bias.weight") {
      llama3::put_tensor(hf, prefix + "mlp.router.bias", tensor, name);
    } else if (rest == "moe.expert_bias") {
      llama3::warn_dropped_expert_bias(name, tensor, "gpt-oss");
    } else if (rest == "moe.experts.w1.weight" || rest == "moe.experts.w3.weight" ||
               rest == "moe.experts.b1.weight" || rest == "moe.experts.b3.weight") {
      gate_up[layer][rest.substr(12, 2)] = tensor;
    } else if (rest == "moe.experts.w2.weight") {
      llama3::put_tensor(hf, prefix + "mlp.experts.down_proj", tensor.transpose(1, 2).contiguous(),
                         name);
    } else if (rest == "moe.experts.b2.weight") {
      llama3::put_tensor(hf, prefix + "mlp.experts.down_proj_bias", tensor, name);
    } else {
      shared.emplace(name, tensor);
    }
  }
  for (const auto& [layer, parts] : gate_up) {
    const std::string prefix = "model.layers." + std::to_string(layer) + ".mlp.experts.";
    const auto pair = [&](const char* gate, const char* up) {
      if (parts.count(gate) == 0 || parts.count(up) == 0) {
        throw DataError(message("gpt_oss -> Hugging Face: layer ", layer, " has experts.", gate,
                                " or experts.", up, " without the other (both form gate_up_proj)"));
      }
      return std::make_pair(parts.at(gate), parts.at(up));
    };
    if (parts.count("w1") || parts.count("w3")) {
      const auto [w1, w3] = pair("w1", "w3");  // (E, h, d) each
      // (E, d, h, 2): gate then up for every hidden index, flattened to (E, d, 2h).
      const at::Tensor both = at::stack({w1.transpose(1, 2), w3.transpose(1, 2)}, -1);
      llama3::put_tensor(hf, prefix + "gate_up_proj", both.reshape({w1.size(0), w1.size(2), -1}),
                         "layers." + std::to_string(layer) + ".moe.experts.w1.weight");
    }
    if (parts.count("b1") || parts.count("b3")) {
      const auto [b1, b3] = pair("b1", "b3");  // (E, h) each
      llama3::put_tensor(hf, prefix + "gate_up_proj_bias",
                         at::stack({b1, b3}, -1).reshape({b1.size(0), -1}),
                         "layers." + std::to_string(layer) + ".moe.experts.b1.weight");
    }
  }
  for (const auto& [name, tensor] : llama3::to_hf_tensors(shared, a))
    llama3::put_tensor(hf, name, tensor, name);
  return hf;
}

TensorMap from_hf_tensors(const TensorMap& hf, const Llama3Args& a) {
  TensorMap ours;
  TensorMap shared;
  for (const auto& [name, tensor] : hf) {
    int64_t layer = 0;
    std::string rest;
    if (!llama3::parse_layer_name(name, "model.layers.", layer, rest)) {
      shared.emplace(name, tensor);
      continue;
    }
    const std::string prefix = "layers." + std::to_string(layer) + ".";
    const auto expect = [&](int64_t dims) {
      if (tensor.dim() != dims) {
        throw DataError(message("Hugging Face -> gpt_oss: tensor '", name, "' has shape ",
                                tensor.sizes(), ", expected ", dims, " dimensions"));
      }
    };
    if (rest == "self_attn.q_proj.bias") {
      llama3::put_tensor(ours, prefix + "attention.bq.weight", bias_from_hf(tensor, a.n_heads),
                         name);
    } else if (rest == "self_attn.k_proj.bias") {
      llama3::put_tensor(ours, prefix + "attention.bk.weight", bias_from_hf(tensor, a.kv_heads()),
                         name);
    } else if (rest == "self_attn.v_proj.bias") {
      llama3::put_tensor(ours, prefix + "attention.bv.weight", tensor, name);
    } else if (rest == "self_attn.o_proj.bias") {
      llama3::put_tensor(ours, prefix + "attention.bo.weight", tensor, name);
    } else if (rest == "self_attn.sinks") {
      llama3::put_tensor(ours, prefix + "attention.sinks.weight", tensor, name);
    } else if (rest == "mlp.router.weight") {
      llama3::put_tensor(ours, prefix + "moe.gate.weight", tensor, name);
    } else if (rest == "mlp.router.bias") {
      llama3::put_tensor(ours, prefix + "moe.gate_bias.weight", tensor, name);
    } else if (rest == "mlp.experts.gate_up_proj") {
      expect(3);  // (E, d, 2h), gate in the even columns
      const at::Tensor split = tensor.view({tensor.size(0), tensor.size(1), -1, 2});
      llama3::put_tensor(ours, prefix + "moe.experts.w1.weight",
                         split.select(3, 0).transpose(1, 2).contiguous(), name);
      llama3::put_tensor(ours, prefix + "moe.experts.w3.weight",
                         split.select(3, 1).transpose(1, 2).contiguous(), name);
    } else if (rest == "mlp.experts.gate_up_proj_bias") {
      expect(2);  // (E, 2h)
      const at::Tensor split = tensor.view({tensor.size(0), -1, 2});
      llama3::put_tensor(ours, prefix + "moe.experts.b1.weight", split.select(2, 0).contiguous(),
                         name);
      llama3::put_tensor(ours, prefix + "moe.experts.b3.weight", split.select(2, 1).contiguous(),
                         name);
    } else if (rest == "mlp.experts.down_proj") {
      expect(3);  // (E, h, d)
      llama3::put_tensor(ours, prefix + "moe.experts.w2.weight",
                         tensor.transpose(1, 2).contiguous(), name);
    } else if (rest == "mlp.experts.down_proj_bias") {
      llama3::put_tensor(ours, prefix + "moe.experts.b2.weight", tensor, name);
    } else {
      shared.emplace(name, tensor);
    }
  }
  for (const auto& [name, tensor] : llama3::from_hf_tensors(shared, a)) {
    llama3::put_tensor(ours, name, tensor, name);
  }
  return ours;
}

HfAdapter make_hf_adapter() {
  HfAdapter adapter =
      llama3::family_hf_adapter(family(), "gpt_oss",
                                {&gpt_oss::hf_config, &gpt_oss::args_from_hf_config,
                                 &gpt_oss::to_hf_tensors, &gpt_oss::from_hf_tensors});
  return adapter;
}

}  // namespace titan::gpt_oss
