// Qwen3-Next <-> Hugging Face conversion (see hf_adapter.h).
#include "titan/models/qwen3_next/hf_adapter.h"

#include "titan/common/check.h"
#include "titan/models/common/hf_config_checks.h"
#include "titan/models/llama3/hf_adapter.h"
#include "titan/models/qwen3/hf_adapter.h"
#include "titan/models/qwen3_next/spec.h"

#include <array>
#include <string>
#include <utility>

namespace titan::qwen3_next {
namespace {

using llama3::Llama3Args;

// Names after "layers.N." (ours) and "model.layers.N." (Hugging Face) that move unchanged.
constexpr std::array<std::pair<const char*, const char*>, 12> kNames = {{
    {"attention.wv.weight", "self_attn.v_proj.weight"},
    {"attention.wo.weight", "self_attn.o_proj.weight"},
    {"linear_attention.in_proj_qkvz.weight", "linear_attn.in_proj_qkvz.weight"},
    {"linear_attention.in_proj_ba.weight", "linear_attn.in_proj_ba.weight"},
    {"linear_attention.conv1d.weight", "linear_attn.conv1d.weight"},
    {"linear_attention.norm.weight", "linear_attn.norm.weight"},
    {"linear_attention.out_proj.weight", "linear_attn.out_proj.weight"},
    {"linear_attention.dt_bias.weight", "linear_attn.dt_bias"},
    {"linear_attention.A_log.weight", "linear_attn.A_log"},
    {"moe.shared_experts.w1.weight", "mlp.shared_expert.gate_proj.weight"},
    {"moe.shared_experts.w3.weight", "mlp.shared_expert.up_proj.weight"},
    {"moe.shared_experts.w2.weight", "mlp.shared_expert.down_proj.weight"},
}};

// Rows per head, heads and rotated rows of the tensors whose rows RoPE permutes (empty heads: not
// one of them).
struct Rotated {
  int64_t heads = 0, head_rows = 0;
};
Rotated rotated(const std::string& ours, const Llama3Args& a) {
  if (ours == "attention.wq.weight") return {a.n_heads, 2 * a.head_dim()};
  if (ours == "attention.wk.weight") return {a.kv_heads(), a.head_dim()};
  if (ours == "attention.q_norm.weight" || ours == "attention.k_norm.weight") {
    return {1, a.head_dim()};
  }
  return {};
}

const char* const kRotatedHf[][2] = {{"attention.wq.weight", "self_attn.q_proj.weight"},
                                     {"attention.wk.weight", "self_attn.k_proj.weight"},
                                     {"attention.q_norm.weight", "self_attn.q_norm.weight"},
                                     {"attention.k_norm.weight", "self_attn.k_norm.weight"},
                                     {"moe.shared_gate.weight", "mlp.shared_expert_gate.weight"}};

// Ours <-> HF for a name after the layer prefix; "" when the Qwen3 adapter handles it.
std::string translate(const std::string& rest, bool from_ours) {
  for (const auto& [ours, hf] : kNames) {
    if (rest == (from_ours ? ours : hf)) return from_ours ? hf : ours;
  }
  for (const auto& pair : kRotatedHf) {
    if (rest == (from_ours ? pair[0] : pair[1])) return from_ours ? pair[1] : pair[0];
  }
  return "";
}

void check_exportable(const Llama3Args& a) {
  const MoEArgs& m = a.moe;
  if (a.full_attention_interval <= 0 || !a.attention_output_gate || !a.zero_centered_norms ||
      !a.qk_norm || !a.has_moe() || m.score_func != MoEArgs::Score::kSoftmax ||
      m.score_before_experts || m.num_expert_groups > 0 || m.num_shared_experts != 1 ||
      !m.shared_expert_gate || a.tie_embeddings != false || a.use_rope_scaling) {
    throw ConfigError(
        "qwen3_next -> Hugging Face: Qwen3NextForCausalLM has linear-attention layers, gated "
        "attention with q/k norms, zero-centred norms and softmax-routed MoE layers with one "
        "gated shared expert; this model differs");
  }
}

}  // namespace

nlohmann::json hf_config(const Llama3Args& a) {
  check_exportable(a);
  nlohmann::json types = nlohmann::json::array();
  for (int64_t i = 0; i < a.n_layers; ++i) {
    types.push_back(a.is_linear_attention_layer(i) ? "linear_attention" : "full_attention");
  }
  nlohmann::json dense = nlohmann::json::array();
  for (int64_t i = 0; i < a.n_dense_layers; ++i) dense.push_back(i);
  return {
      {"architectures", {"Qwen3NextForCausalLM"}},
      {"model_type", "qwen3_next"},
      {"vocab_size", a.vocab_size},
      {"hidden_size", a.dim},
      {"intermediate_size", a.ffn_hidden_dim()},
      {"num_hidden_layers", a.n_layers},
      {"num_attention_heads", a.n_heads},
      {"num_key_value_heads", a.kv_heads()},
      {"head_dim", a.head_dim()},
      {"hidden_act", "silu"},
      {"max_position_embeddings", a.max_seq_len},
      {"rms_norm_eps", a.norm_eps},
      {"tie_word_embeddings", false},
      {"rope_parameters",
       {{"rope_type", "default"},
        {"rope_theta", a.rope_theta},
        {"partial_rotary_factor", a.partial_rotary_factor}}},
      {"attention_bias", false},
      {"attention_dropout", 0.0},
      {"linear_conv_kernel_dim", a.linear.conv_kernel},
      {"linear_key_head_dim", a.linear.head_k_dim},
      {"linear_value_head_dim", a.linear.head_v_dim},
      {"linear_num_key_heads", a.linear.num_k_heads},
      {"linear_num_value_heads", a.linear.num_v_heads},
      {"decoder_sparse_step", 1},
      {"moe_intermediate_size", a.moe.hidden_dim},
      {"shared_expert_intermediate_size", a.moe.hidden_dim},
      {"num_experts_per_tok", a.moe.top_k},
      {"num_experts", a.moe.num_experts},
      {"norm_topk_prob", a.moe.route_norm},
      {"output_router_logits", false},
      {"router_aux_loss_coef", 0.001},
      {"mlp_only_layers", dense},
      {"layer_types", types},
      {"initializer_range", 0.02},
      {"use_cache", true},
  };
}

Llama3Args args_from_hf_config(const nlohmann::json& c) {
  if (!c.is_object()) throw ConfigError("config.json must hold a JSON object");
  const std::string type = hf::string_or(c, "model_type", "qwen3_next");
  if (type != "qwen3_next") {
    throw ConfigError(message("config.json model_type '", type, "' is not \"qwen3_next\""));
  }
  // Absent keys take Qwen3NextConfig's defaults, as transformers would.
  Llama3Args a = flavors().back().second;  // 80B-A3B: the config's defaults but for these
  a.dim = hf::int_or(c, "hidden_size", 2048);
  a.n_layers = hf::int_or(c, "num_hidden_layers", 48);
  a.n_heads = hf::int_or(c, "num_attention_heads", 16);
  a.n_kv_heads = hf::int_or(c, "num_key_value_heads", 2);
  a.head_dim_override = hf::int_or(c, "head_dim", 256);
  a.vocab_size = hf::int_or(c, "vocab_size", 151936);
  a.ffn_dim = hf::int_or(c, "intermediate_size", 5632);
  a.max_seq_len = hf::int_or(c, "max_position_embeddings", 32768);
  a.norm_eps = hf::number_or(c, "rms_norm_eps", 1e-6);
  a.linear.conv_kernel = hf::int_or(c, "linear_conv_kernel_dim", 4);
  a.linear.head_k_dim = hf::int_or(c, "linear_key_head_dim", 128);
  a.linear.head_v_dim = hf::int_or(c, "linear_value_head_dim", 128);
  a.linear.num_k_heads = hf::int_or(c, "linear_num_key_heads", 16);
  a.linear.num_v_heads = hf::int_or(c, "linear_num_value_heads", 32);
  a.moe.num_experts = hf::int_or(c, "num_experts", 512);
  a.moe.top_k = hf::int_or(c, "num_experts_per_tok", 10);
  a.moe.hidden_dim = hf::int_or(c, "moe_intermediate_size", 512);
  a.moe.route_norm = hf::bool_or(c, "norm_topk_prob", true);
  if (hf::int_or(c, "shared_expert_intermediate_size", a.moe.hidden_dim) != a.moe.hidden_dim) {
    throw ConfigError(message("config.json \"shared_expert_intermediate_size\" ",
                              c["shared_expert_intermediate_size"].dump(),
                              " differs from moe_intermediate_size ", a.moe.hidden_dim,
                              ", which titan's shared expert takes"));
  }
  if (hf::int_or(c, "decoder_sparse_step", 1) != 1) {
    throw ConfigError("config.json \"decoder_sparse_step\" other than 1 is not supported");
  }
  if (hf::bool_or(c, "attention_bias", false)) {
    throw ConfigError("config.json \"attention_bias\": true is not supported (only false)");
  }
  if (hf::bool_or(c, "tie_word_embeddings", false)) {
    throw ConfigError("config.json \"tie_word_embeddings\": true is not supported (only false)");
  }
  if (hf::string_or(c, "hidden_act", "silu") != "silu") {
    throw ConfigError(message("config.json \"hidden_act\" ", c["hidden_act"].dump(),
                              " is not supported (only \"silu\")"));
  }
  // mlp_only_layers: a first run of dense layers.
  a.n_dense_layers = 0;
  if (const nlohmann::json* dense = hf::find_key(c, "mlp_only_layers")) {
    if (!dense->is_array()) throw ConfigError("config.json \"mlp_only_layers\" must be a list");
    for (const auto& layer : *dense) {
      if (!layer.is_number_integer() || layer.get<int64_t>() != a.n_dense_layers) {
        throw ConfigError(message("config.json \"mlp_only_layers\" ", dense->dump(),
                                  " is not supported (only the first layers: [0, 1, ...])"));
      }
      ++a.n_dense_layers;
    }
  }
  // RoPE: "rope_parameters" (transformers >= 5) or "rope_theta" + "partial_rotary_factor".
  nlohmann::json rope = c.contains("rope_parameters") && c["rope_parameters"].is_object()
                            ? c["rope_parameters"]
                            : nlohmann::json::object();
  const std::string rope_type =
      hf::string_or(rope, "rope_type", hf::string_or(rope, "type", "default"));
  if (rope_type != "default") {
    throw ConfigError(message("config.json rope type \"", rope_type,
                              "\" is not supported (Qwen3-Next: \"default\")"));
  }
  a.rope_theta = hf::number_or(rope, "rope_theta", hf::number_or(c, "rope_theta", 10000.0));
  a.partial_rotary_factor =
      hf::number_or(rope, "partial_rotary_factor", hf::number_or(c, "partial_rotary_factor", 0.25));
  // layer_types: linear layers with a full one every full_attention_interval-th.
  a.full_attention_interval = hf::int_or(c, "full_attention_interval", 4);
  if (const nlohmann::json* types = hf::find_key(c, "layer_types")) {
    int64_t interval = 0;
    if (types->is_array() && !types->empty()) {
      for (size_t i = 0; i < types->size(); ++i) {
        if ((*types)[i] == "full_attention") {
          interval = static_cast<int64_t>(i) + 1;
          break;
        }
      }
    }
    bool fits = interval > 0 && types->size() == static_cast<size_t>(a.n_layers);
    for (size_t i = 0; fits && i < types->size(); ++i) {
      const bool full = (static_cast<int64_t>(i) + 1) % interval == 0;
      fits = (*types)[i] == (full ? "full_attention" : "linear_attention");
    }
    if (!fits) {
      throw ConfigError(
          message("config.json \"layer_types\" ", types->dump(),
                  " is not supported: one full_attention layer after every run of linear_attention "
                  "layers of one length, over num_hidden_layers = ",
                  a.n_layers, " layers"));
    }
    a.full_attention_interval = interval;
  }
  hf::check_int("full_attention_interval", a.full_attention_interval, 1,
                std::max<int64_t>(1, a.n_layers));
  hf::check_int("num_experts_per_tok", a.moe.top_k, 1, std::max<int64_t>(1, a.moe.num_experts),
                "at most num_experts");
  llama3::check_hf_ranges(a);
  a.validate();
  return a;
}

TensorMap to_hf_tensors(const TensorMap& ours, const Llama3Args& args) {
  TensorMap hf, rest;
  const int64_t rope_dim = args.rope_dim();
  for (const auto& [name, tensor] : ours) {
    int64_t layer = 0;
    std::string tail;
    const std::string mapped =
        llama3::parse_layer_name(name, "layers.", layer, tail) ? translate(tail, true) : "";
    if (!mapped.empty()) {
      const Rotated r = rotated(tail, args);
      llama3::put_tensor(hf, "model.layers." + std::to_string(layer) + "." + mapped,
                         r.heads > 0
                             ? llama3::permute_rotary_to_hf(tensor, r.heads, r.head_rows, rope_dim)
                             : tensor,
                         name);
    } else if (tail == "moe.expert_bias") {
      llama3::warn_dropped_expert_bias(name, tensor, "Qwen3-Next");
    } else {
      rest.emplace(name, tensor);  // embeddings, norms, the router and the routed experts
    }
  }
  for (const auto& [name, tensor] : qwen3::to_hf_tensors(rest, args)) {
    llama3::put_tensor(hf, name, tensor, name);
  }
  return hf;
}

TensorMap from_hf_tensors(const TensorMap& hf, const Llama3Args& args) {
  TensorMap ours, rest;
  const int64_t rope_dim = args.rope_dim();
  for (const auto& [name, tensor] : hf) {
    int64_t layer = 0;
    std::string tail;
    if (name.rfind("mtp.", 0) == 0) continue;  // the released folders' MTP module: not modelled
    const std::string mapped =
        llama3::parse_layer_name(name, "model.layers.", layer, tail) ? translate(tail, false) : "";
    if (mapped.empty()) {
      rest.emplace(name, tensor);
      continue;
    }
    const Rotated r = rotated(mapped, args);
    llama3::put_tensor(ours, "layers." + std::to_string(layer) + "." + mapped,
                       r.heads > 0
                           ? llama3::permute_rotary_from_hf(tensor, r.heads, r.head_rows, rope_dim)
                           : tensor,
                       name);
  }
  for (const auto& [name, tensor] : qwen3::from_hf_tensors(rest, args)) {
    llama3::put_tensor(ours, name, tensor, name);
  }
  return ours;
}

HfAdapter make_hf_adapter() {
  return llama3::family_hf_adapter(family(), "qwen3_next",
                                   {&qwen3_next::hf_config, &qwen3_next::args_from_hf_config,
                                    &qwen3_next::to_hf_tensors, &qwen3_next::from_hf_tensors});
}

}  // namespace titan::qwen3_next
