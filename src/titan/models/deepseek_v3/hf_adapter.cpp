// DeepSeek-V3 <-> Hugging Face conversion (see hf_adapter.h).
#include "titan/models/deepseek_v3/hf_adapter.h"

#include "titan/common/check.h"
#include "titan/common/logging.h"
#include "titan/models/common/hf_config_checks.h"
#include "titan/models/deepseek_v3/spec.h"
#include "titan/models/llama3/hf_adapter.h"
#include "titan/models/qwen3/hf_adapter.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <set>
#include <string>
#include <utility>

namespace titan::deepseek_v3 {
namespace {

using llama3::Llama3Args;

// Names of ours (after "layers.N.") and Hugging Face's (after "model.layers.N.") that only
// DeepSeek-V3 has; the rest goes through the Qwen3 adapter (router, experts) and the Llama 3 one.
constexpr std::array<std::pair<const char*, const char*>, 12> kLayerNames = {{
    {"attention.wq.weight", "self_attn.q_proj.weight"},
    {"attention.wq_a.weight", "self_attn.q_a_proj.weight"},
    {"attention.q_norm.weight", "self_attn.q_a_layernorm.weight"},
    {"attention.wq_b.weight", "self_attn.q_b_proj.weight"},
    {"attention.wkv_a.weight", "self_attn.kv_a_proj_with_mqa.weight"},
    {"attention.kv_norm.weight", "self_attn.kv_a_layernorm.weight"},
    {"attention.wkv_b.weight", "self_attn.kv_b_proj.weight"},
    {"attention.wo.weight", "self_attn.o_proj.weight"},
    {"moe.expert_bias", "mlp.gate.e_score_correction_bias"},
    {"moe.shared_experts.w1.weight", "mlp.shared_experts.gate_proj.weight"},
    {"moe.shared_experts.w2.weight", "mlp.shared_experts.down_proj.weight"},
    {"moe.shared_experts.w3.weight", "mlp.shared_experts.up_proj.weight"},
}};

// The latent norms of Hugging Face's DeepseekV3Attention (a fixed eps, not rms_norm_eps).
constexpr double kHfLatentNormEps = 1e-6;

// "<prefix><N>.<rest>" -> (N, rest); false for any other form.
bool split_layer(const std::string& name, const std::string& prefix, int64_t& layer,
                 std::string& rest) {
  if (name.rfind(prefix, 0) != 0) return false;
  const size_t dot = name.find('.', prefix.size());
  if (dot == std::string::npos || dot == prefix.size() || dot - prefix.size() > 9) return false;
  const std::string digits = name.substr(prefix.size(), dot - prefix.size());
  if (digits.find_first_not_of("0123456789") != std::string::npos) return false;
  layer = std::stoll(digits);
  rest = name.substr(dot + 1);
  return true;
}

std::string translate(const std::string& rest, bool from_ours) {
  for (const auto& [ours, hf] : kLayerNames) {
    if (rest == (from_ours ? ours : hf)) return from_ours ? hf : ours;
  }
  return "";
}

bool has(const nlohmann::json& c, const std::string& key) {
  return c.contains(key) && !c[key].is_null();
}

int64_t int_or(const nlohmann::json& c, const std::string& key, int64_t fallback) {
  if (!has(c, key)) return fallback;
  if (!c[key].is_number_integer()) {
    throw ConfigError(message("config.json \"", key, "\" must be an integer, got ", c[key].dump()));
  }
  return c[key].get<int64_t>();
}

double double_or(const nlohmann::json& c, const std::string& key, double fallback) {
  if (!has(c, key)) return fallback;
  if (!c[key].is_number()) {
    throw ConfigError(message("config.json \"", key, "\" must be a number, got ", c[key].dump()));
  }
  return c[key].get<double>();
}

bool bool_or(const nlohmann::json& c, const std::string& key, bool fallback) {
  if (!has(c, key)) return fallback;
  if (!c[key].is_boolean()) {
    throw ConfigError(
        message("config.json \"", key, "\" must be true or false, got ", c[key].dump()));
  }
  return c[key].get<bool>();
}

// RoPE: "rope_parameters" (transformers >= 5) or "rope_theta" + "rope_scaling"; a non-empty
// rope_scaling wins, as in transformers. Only YaRN whose rotation is not rescaled (attention
// factor 1, as DeepSeek's mscale == mscale_all_dim gives) or no scaling.
void set_rope(const nlohmann::json& c, Llama3Args& args) {
  nlohmann::json rope = has(c, "rope_parameters") ? c["rope_parameters"] : nlohmann::json::object();
  if (has(c, "rope_scaling") && c["rope_scaling"].is_object() && !c["rope_scaling"].empty()) {
    rope = c["rope_scaling"];
  }
  if (!rope.is_object()) {
    throw ConfigError(
        message("config.json \"rope_parameters\" must be an object, got ", rope.dump()));
  }
  args.rope_theta = double_or(rope, "rope_theta", double_or(c, "rope_theta", 10000.0));
  const std::string type = hf::string_or(rope, "rope_type", hf::string_or(rope, "type", "default"));
  args.mla.yarn = YarnScaling{};
  args.mla.mscale = 1.0;
  if (double_or(rope, "partial_rotary_factor", 1.0) != 1.0) {
    throw ConfigError("config.json rope \"partial_rotary_factor\" other than 1 is not supported");
  }
  if (type == "default") return;
  if (type != "yarn") {
    throw ConfigError(message("config.json rope type \"", type,
                              "\" is not supported (DeepSeek-V3: \"yarn\" or \"default\")"));
  }
  YarnScaling& y = args.mla.yarn;
  y.original_seq_len = int_or(rope, "original_max_position_embeddings", 4096);
  y.factor = double_or(rope, "factor",
                       static_cast<double>(args.max_seq_len) /
                           static_cast<double>(std::max<int64_t>(1, y.original_seq_len)));
  const double fast = double_or(rope, "beta_fast", 0.0), slow = double_or(rope, "beta_slow", 0.0);
  y.beta_fast = fast != 0.0 ? fast : 32.0;  // transformers: `or 32`, `or 1`
  y.beta_slow = slow != 0.0 ? slow : 1.0;
  if (!bool_or(rope, "truncate", true)) {
    throw ConfigError("config.json rope \"truncate\": false is not supported (DeepSeek truncates)");
  }
  const double mscale = double_or(rope, "mscale", 0.0);
  const double mscale_all_dim = double_or(rope, "mscale_all_dim", 0.0);
  hf::check_int("rope_scaling.original_max_position_embeddings", y.original_seq_len, 1,
                int64_t{1} << 31);
  hf::check_number("rope_scaling.factor", y.factor, 0, 1e6, /*lo_open=*/true);
  hf::check_number("rope_scaling.beta_fast", y.beta_fast, 0, 1e6, /*lo_open=*/true);
  hf::check_number("rope_scaling.beta_slow", y.beta_slow, 0, 1e6, /*lo_open=*/true);
  hf::check_number("rope_scaling.mscale", mscale, 0, 1e3);
  hf::check_number("rope_scaling.mscale_all_dim", mscale_all_dim, 0, 1e3);
  // transformers scales cos/sin by the attention factor; our rotation is unscaled.
  const double factor =
      has(rope, "attention_factor")
          ? double_or(rope, "attention_factor", 1.0)
          : (mscale != 0.0 && mscale_all_dim != 0.0
                 ? yarn_mscale(y.factor, mscale) / yarn_mscale(y.factor, mscale_all_dim)
                 : yarn_mscale(y.factor, 1.0));
  if (std::abs(factor - 1.0) > 1e-12) {
    throw ConfigError(
        message("config.json YaRN scales the rotation by an attention factor ", factor,
                " (from attention_factor, or mscale / mscale_all_dim), which this model "
                "cannot express (DeepSeek-V3's configs give mscale == mscale_all_dim)"));
  }
  // The softmax correction: transformers applies mscale_all_dim (none when 0 or absent).
  args.mla.mscale = mscale_all_dim;
}

void check_false(const nlohmann::json& c, const std::string& key) {
  if (bool_or(c, key, false)) {
    throw ConfigError(message("config.json \"", key, "\": true is not supported (only false)"));
  }
}

}  // namespace

nlohmann::json hf_config(const Llama3Args& args) {
  const MoEArgs& m = args.moe;
  if (!args.mla.enabled() || !args.has_moe() || m.score_func != MoEArgs::Score::kSigmoid ||
      m.score_before_experts) {
    throw ConfigError(
        "deepseek_v3 -> Hugging Face: DeepseekV3ForCausalLM has latent attention and MoE layers "
        "routed by sigmoid scores applied after the experts; this model differs (e.g. the "
        "softmax-routed 16B / 236B flavors are DeepSeek-V2 models)");
  }
  if (args.mla.norm_eps != kHfLatentNormEps) {
    log_warning("deepseek_v3 -> Hugging Face: the latent norms (q_a_layernorm, kv_a_layernorm) ",
                "use eps ", args.mla.norm_eps, " here but ", kHfLatentNormEps,
                " in transformers; outputs will differ slightly");
  }
  const MlaArgs& a = args.mla;
  nlohmann::json config = {
      {"architectures", {"DeepseekV3ForCausalLM"}},
      {"model_type", "deepseek_v3"},
      {"vocab_size", args.vocab_size},
      {"hidden_size", args.dim},
      {"intermediate_size", args.ffn_hidden_dim()},
      {"moe_intermediate_size", m.hidden_dim},
      {"num_hidden_layers", args.n_layers},
      {"num_attention_heads", args.n_heads},
      {"num_key_value_heads", args.n_heads},
      {"n_shared_experts", m.num_shared_experts},
      {"n_routed_experts", m.num_experts},
      {"routed_scaling_factor", m.route_scale},
      {"kv_lora_rank", a.kv_lora_rank},
      {"q_lora_rank", a.q_lora_rank > 0 ? nlohmann::json(a.q_lora_rank) : nlohmann::json()},
      {"qk_rope_head_dim", a.qk_rope_head_dim},
      {"v_head_dim", a.v_head_dim},
      {"qk_nope_head_dim", a.qk_nope_head_dim},
      {"n_group", m.num_expert_groups > 0 ? m.num_expert_groups : 1},
      {"topk_group", m.num_expert_groups > 0 ? m.num_limited_groups : 1},
      {"num_experts_per_tok", m.top_k},
      {"first_k_dense_replace", args.n_dense_layers},
      {"norm_topk_prob", m.route_norm},
      {"hidden_act", "silu"},
      {"max_position_embeddings", args.max_seq_len},
      {"rms_norm_eps", args.norm_eps},
      {"tie_word_embeddings", false},
      {"rope_theta", args.rope_theta},
      {"rope_scaling", nullptr},
      {"rope_interleave", true},
      {"attention_bias", false},
      {"attention_dropout", 0.0},
      {"initializer_range", 0.02},
      {"use_cache", true},
      {"num_nextn_predict_layers", args.num_mtp_layers},
  };
  if (a.yarn.enabled()) {
    config["rope_scaling"] = {{"rope_type", "yarn"},
                              {"factor", a.yarn.factor},
                              {"beta_fast", a.yarn.beta_fast},
                              {"beta_slow", a.yarn.beta_slow},
                              {"mscale", a.mscale},
                              {"mscale_all_dim", a.mscale},
                              {"original_max_position_embeddings", a.yarn.original_seq_len}};
    // mscale 0 reads as "absent" in transformers, which would then scale the rotation.
    if (a.mscale == 0.0) config["rope_scaling"]["attention_factor"] = 1.0;
  }
  return config;
}

Llama3Args args_from_hf_config(const nlohmann::json& c) {
  if (!c.is_object()) throw ConfigError("config.json must hold a JSON object");
  const std::string type = hf::string_or(c, "model_type", "deepseek_v3");
  if (type != "deepseek_v3") {
    throw ConfigError(message("config.json model_type '", type, "' is not \"deepseek_v3\""));
  }
  // Absent keys take DeepseekV3Config's defaults, as transformers would.
  Llama3Args args;
  args.dim = int_or(c, "hidden_size", 7168);
  args.n_layers = int_or(c, "num_hidden_layers", 61);
  args.n_heads = int_or(c, "num_attention_heads", 128);
  args.vocab_size = int_or(c, "vocab_size", 129280);
  args.ffn_dim = int_or(c, "intermediate_size", 18432);
  args.n_dense_layers = int_or(c, "first_k_dense_replace", 3);
  args.norm_eps = double_or(c, "rms_norm_eps", 1e-6);
  args.max_seq_len = int_or(c, "max_position_embeddings", 4096);
  args.use_rope_scaling = false;
  if (int_or(c, "num_key_value_heads", args.n_heads) != args.n_heads) {
    throw ConfigError(message("config.json \"num_key_value_heads\" ",
                              c["num_key_value_heads"].dump(), " != num_attention_heads ",
                              args.n_heads,
                              " (latent attention expands keys and values for every head)"));
  }
  if (hf::string_or(c, "hidden_act", "silu") != "silu") {
    throw ConfigError(message("config.json \"hidden_act\" ", c["hidden_act"].dump(),
                              " is not supported (only \"silu\")"));
  }
  check_false(c, "attention_bias");
  check_false(c, "tie_word_embeddings");
  if (has(c, "quantization_config")) {
    throw ConfigError(
        "config.json has a \"quantization_config\" (DeepSeek-V3's released weights are fp8 "
        "blocks with scales): quantized folders are not supported. HINT: dequantize to bf16 or "
        "fp32 first (e.g. DeepSeek's fp8_cast_bf16.py) and drop quantization_config");
  }
  // DeepSeek's own config.json (remote code) names the router; transformers' is always sigmoid.
  if (hf::string_or(c, "scoring_func", "sigmoid") != "sigmoid") {
    throw ConfigError(message("config.json \"scoring_func\" ", c["scoring_func"].dump(),
                              " is not supported by DeepseekV3 (only \"sigmoid\")"));
  }
  if (!bool_or(c, "rope_interleave", true)) {
    throw ConfigError(
        "config.json \"rope_interleave\": false is not supported (rotary dimensions in "
        "interleaved pairs only, DeepSeek's layout)");
  }
  MlaArgs& a = args.mla;
  a.q_lora_rank = int_or(c, "q_lora_rank", 0);  // null: no q latent
  a.kv_lora_rank = int_or(c, "kv_lora_rank", 512);
  a.qk_nope_head_dim = int_or(c, "qk_nope_head_dim", 128);
  a.qk_rope_head_dim = int_or(c, "qk_rope_head_dim", 64);
  a.v_head_dim = int_or(c, "v_head_dim", 128);
  a.norm_eps = kHfLatentNormEps;
  set_rope(c, args);
  MoEArgs& m = args.moe;
  m = MoEArgs{};
  m.num_experts = int_or(c, "n_routed_experts", int_or(c, "num_local_experts", 256));
  m.top_k = int_or(c, "num_experts_per_tok", 8);
  m.hidden_dim = int_or(c, "moe_intermediate_size", 2048);
  m.num_shared_experts = int_or(c, "n_shared_experts", 1);
  m.score_func = MoEArgs::Score::kSigmoid;
  m.route_norm = bool_or(c, "norm_topk_prob", true);
  m.route_scale = double_or(c, "routed_scaling_factor", 2.5);
  m.score_before_experts = false;
  const int64_t groups = int_or(c, "n_group", 8), limited = int_or(c, "topk_group", 4);
  // One group is no limit (every expert in the chosen group).
  m.num_expert_groups = groups == 1 ? 0 : groups;
  m.num_limited_groups = groups == 1 ? 0 : limited;
  // transformers' default is 1, and it writes the key also where it saved no multi-token
  // prediction layer: fit_to_tensors then lowers the count to the layers the folder holds.
  args.num_mtp_layers = int_or(c, "num_nextn_predict_layers", 1);
  hf::check_int("num_nextn_predict_layers", args.num_mtp_layers, 0, 16);
  // Each value named by its key before the model's own checks, which know only our names (and a
  // zero kv_lora_rank would otherwise build attention without the latent and miss its tensors).
  llama3::check_hf_ranges(args);
  constexpr int64_t kWidth = int64_t{1} << 20;
  hf::check_int("q_lora_rank", a.q_lora_rank, 0, kWidth, "0 or null: queries without a latent");
  hf::check_int("kv_lora_rank", a.kv_lora_rank, 1, kWidth,
                "latent attention compresses keys and values into it");
  hf::check_int("qk_nope_head_dim", a.qk_nope_head_dim, 0, kWidth);
  hf::check_int("qk_rope_head_dim", a.qk_rope_head_dim, 2, kWidth, "RoPE rotates pairs");
  hf::check_int("v_head_dim", a.v_head_dim, 1, kWidth);
  hf::check_int("first_k_dense_replace", args.n_dense_layers, 0,
                std::max<int64_t>(0, args.n_layers), "at most num_hidden_layers");
  hf::check_int("n_routed_experts", m.num_experts, 1, int64_t{1} << 16);
  hf::check_int("num_experts_per_tok", m.top_k, 1, m.num_experts, "at most n_routed_experts");
  hf::check_int("moe_intermediate_size", m.hidden_dim, 1, int64_t{1} << 24);
  hf::check_int("n_shared_experts", m.num_shared_experts, 0, 1024);
  hf::check_int("n_group", groups, 1, m.num_experts, "at most n_routed_experts");
  hf::check_int("topk_group", limited, 1, groups, "at most n_group");
  hf::check_number("routed_scaling_factor", m.route_scale, 0, 1e4, /*lo_open=*/true);
  args.validate();
  return args;
}

namespace {

// Multi-token prediction depth j's own tensors (ours after "mtp.<j>.", Hugging Face's after
// "model.layers.<n_layers + j>."); its block's are a layer's, and the folder repeats the
// embedding and the head in each MTP layer (embed_tokens, shared_head.head).
constexpr std::array<std::pair<const char*, const char*>, 4> kMtpNames = {{
    {"enorm.weight", "enorm.weight"},
    {"hnorm.weight", "hnorm.weight"},
    {"eh_proj.weight", "eh_proj.weight"},
    {"norm.weight", "shared_head.norm.weight"},
}};

std::string translate_mtp(const std::string& rest, bool from_ours) {
  for (const auto& [ours, hf] : kMtpNames) {
    if (rest == (from_ours ? ours : hf)) return from_ours ? hf : ours;
  }
  return "";
}

}  // namespace

nlohmann::json fit_to_tensors(const nlohmann::json& model, const std::vector<std::string>& names) {
  Llama3Args args = llama3::args_from_description(model, family());
  const std::set<std::string> present(names.begin(), names.end());
  int64_t held = 0;
  while (held < args.num_mtp_layers &&
         present.count("model.layers." + std::to_string(args.mtp_layer_id(held + 1)) +
                       ".eh_proj.weight") != 0) {
    ++held;
  }
  if (held == args.num_mtp_layers) return model;
  // Quietly: every folder transformers saves says 1 and holds none.
  args.num_mtp_layers = held;
  return llama3::describe_args(args, family());
}

namespace {

// Our name of a multi-token prediction tensor as a main layer's ("mtp.<j>.block.<rest>" ->
// "layers.<n_layers + j>.<rest>") or its own HF name; false for other names.
bool mtp_to_hf_name(const std::string& name, const Llama3Args& args, std::string& as_layer,
                    std::string& hf) {
  int64_t j = 0;
  std::string rest;
  if (!split_layer(name, "mtp.", j, rest)) return false;
  const std::string layer = std::to_string(args.mtp_layer_id(j + 1));
  const std::string block = "block.";
  if (rest.rfind(block, 0) == 0) {
    as_layer = "layers." + layer + "." + rest.substr(block.size());
  } else {
    const std::string mapped = translate_mtp(rest, true);
    if (mapped.empty())
      throw DataError("deepseek_v3 -> Hugging Face: unknown tensor '" + name + "'");
    hf = "model.layers." + layer + "." + mapped;
  }
  return true;
}

}  // namespace

TensorMap to_hf_tensors(const TensorMap& ours_in, const Llama3Args& args) {
  // Multi-token prediction: the blocks as the layers after the main ones, the rest by name, and
  // DeepSeek's copies of the embedding and the head in every MTP layer.
  TensorMap ours, hf, rest;
  for (const auto& [name, tensor] : ours_in) {
    std::string as_layer, own;
    if (!mtp_to_hf_name(name, args, as_layer, own)) {
      ours.emplace(name, tensor);
    } else if (!as_layer.empty()) {
      llama3::put_tensor(ours, as_layer, tensor, name);
    } else {
      llama3::put_tensor(hf, own, tensor, name);
    }
  }
  for (int64_t depth = 1; depth <= args.num_mtp_layers; ++depth) {
    const std::string prefix = "model.layers." + std::to_string(args.mtp_layer_id(depth)) + ".";
    if (const auto e = ours_in.find("tok_embeddings.weight"); e != ours_in.end()) {
      llama3::put_tensor(hf, prefix + "embed_tokens.weight", e->second, e->first);
    }
    if (const auto o = ours_in.find("output.weight"); o != ours_in.end()) {
      llama3::put_tensor(hf, prefix + "shared_head.head.weight", o->second, o->first);
    }
  }
  for (const auto& [name, tensor] : ours) {
    int64_t layer = 0;
    std::string tail;
    const std::string mapped =
        split_layer(name, "layers.", layer, tail) ? translate(tail, true) : "";
    if (mapped.empty()) {
      rest.emplace(name, tensor);  // embeddings, norms, dense SwiGLU, router and experts
    } else {
      llama3::put_tensor(hf, "model.layers." + std::to_string(layer) + "." + mapped, tensor, name);
    }
  }
  // Every MoE layer has an e_score_correction_bias; zero where ours gave none (parameters only).
  const int64_t layers = args.n_layers + args.num_mtp_layers;
  for (int64_t layer = args.n_dense_layers; args.has_moe() && layer < layers; ++layer) {
    if (!args.is_moe_layer(layer)) continue;
    hf.emplace("model.layers." + std::to_string(layer) + ".mlp.gate.e_score_correction_bias",
               at::zeros({args.moe.num_experts}, at::kFloat));
  }
  for (const auto& [name, tensor] : qwen3::to_hf_tensors(rest, args))
    llama3::put_tensor(hf, name, tensor, name);
  return hf;
}

TensorMap from_hf_tensors(const TensorMap& hf, const Llama3Args& args) {
  TensorMap ours, rest;
  int64_t mtp_tensors = 0;
  const int64_t layers = args.n_layers + args.num_mtp_layers;
  for (const auto& [name, tensor] : hf) {
    int64_t layer = 0;
    std::string tail;
    if (!split_layer(name, "model.layers.", layer, tail)) {
      rest.emplace(name, tensor);
      continue;
    }
    if (layer >= layers) {  // multi-token prediction layers this model does not have
      ++mtp_tensors;
      continue;
    }
    if (layer >= args.n_layers) {  // multi-token prediction (layer 61 of the released folders)
      const std::string own = translate_mtp(tail, false);
      if (!own.empty()) {
        llama3::put_tensor(ours, "mtp." + std::to_string(layer - args.n_layers) + "." + own, tensor,
                           name);
        continue;
      }
      // DeepSeek's copies of the embedding and the head: the model's own are read.
      if (tail == "embed_tokens.weight" || tail == "shared_head.head.weight") continue;
    }
    const std::string mapped = translate(tail, false);
    if (mapped.empty()) {
      rest.emplace(name, tensor);
    } else {
      llama3::put_tensor(ours, "layers." + std::to_string(layer) + "." + mapped, tensor, name);
    }
  }
  for (const auto& [name, tensor] : qwen3::from_hf_tensors(rest, args)) {
    llama3::put_tensor(ours, name, tensor, name);
  }
  // The multi-token prediction blocks read as main layers: their names as ours.
  TensorMap out;
  for (auto& [name, tensor] : ours) {
    int64_t layer = 0;
    std::string tail;
    if (split_layer(name, "layers.", layer, tail) && layer >= args.n_layers) {
      llama3::put_tensor(out, "mtp." + std::to_string(layer - args.n_layers) + ".block." + tail,
                         tensor, name);
    } else {
      out.emplace(name, tensor);
    }
  }
  if (mtp_tensors > 0) {
    log_warning("Hugging Face -> deepseek_v3: the ", mtp_tensors,
                " tensors of the multi-token prediction layers from model.layers.", layers,
                " on are not read: this model has num_mtp_layers = ", args.num_mtp_layers,
                " (generation and the main model do not use them). HINT: to train them, use a "
                "flavor or description with num_mtp_layers (e.g. convert the folder itself)");
  }
  return out;
}

HfAdapter make_hf_adapter() {
  HfAdapter adapter =
      llama3::family_hf_adapter(family(), "deepseek_v3",
                                {&deepseek_v3::hf_config, &deepseek_v3::args_from_hf_config,
                                 &deepseek_v3::to_hf_tensors, &deepseek_v3::from_hf_tensors});
  adapter.fit_to_tensors = &deepseek_v3::fit_to_tensors;
  return adapter;
}

}  // namespace titan::deepseek_v3
