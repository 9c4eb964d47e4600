// Llama 4 <-> Hugging Face conversion (see hf_adapter.h).
#include "titan/models/llama4/hf_adapter.h"

#include "titan/common/check.h"
#include "titan/common/logging.h"
#include "titan/models/common/hf_config_checks.h"
#include "titan/models/llama3/hf_adapter.h"
#include "titan/models/llama4/spec.h"

#include <array>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace titan::llama4 {
namespace {

using hf::bool_or;
using hf::int_or;
using hf::number_or;
using llama3::Llama3Args;

// Per-layer names that only change their name: (ours after "layers.N.", HF after
// "model.layers.N.").
constexpr std::array<std::pair<const char*, const char*>, 13> kLayerNames = {{
    {"attention.wq.weight", "self_attn.q_proj.weight"},
    {"attention.wk.weight", "self_attn.k_proj.weight"},
    {"attention.wv.weight", "self_attn.v_proj.weight"},
    {"attention.wo.weight", "self_attn.o_proj.weight"},
    {"attention_norm.weight", "input_layernorm.weight"},
    {"ffn_norm.weight", "post_attention_layernorm.weight"},
    {"feed_forward.w1.weight", "feed_forward.gate_proj.weight"},
    {"feed_forward.w3.weight", "feed_forward.up_proj.weight"},
    {"feed_forward.w2.weight", "feed_forward.down_proj.weight"},
    {"moe.gate.weight", "feed_forward.router.weight"},
    {"moe.shared_experts.w1.weight", "feed_forward.shared_expert.gate_proj.weight"},
    {"moe.shared_experts.w3.weight", "feed_forward.shared_expert.up_proj.weight"},
    {"moe.shared_experts.w2.weight", "feed_forward.shared_expert.down_proj.weight"},
}};

std::string rename(const std::string& name, bool from_ours) {
  for (const auto& [ours, theirs] : kLayerNames) {
    if (name == (from_ours ? ours : theirs)) return from_ours ? theirs : ours;
  }
  return "";
}

// What Llama4TextConfig can express; ConfigError naming the model's difference otherwise.
void check_exportable(const Llama3Args& a) {
  const MoEArgs& m = a.moe;
  const bool ok =
      a.has_moe() && a.n_dense_layers == 0 && !a.mla.enabled() && !a.qk_norm && !a.attention_bias &&
      !a.attention_sinks && a.sliding_window == 0 && !a.yarn.enabled() && !a.tie_embeddings &&
      m.score_func == MoEArgs::Score::kSigmoid && !m.route_norm && m.route_scale == 1.0 &&
      m.score_before_experts && m.num_shared_experts == 1 && m.num_expert_groups == 0 &&
      !m.router_bias && !m.expert_biases && m.swiglu_limit == 0;
  if (!ok) {
    throw ConfigError(
        "llama4 -> Hugging Face: Llama4ForCausalLM has MoE layers of one shared expert and a "
        "sigmoid router applied before the experts (no route norm, scale, groups or biases), "
        "dense layers between them, no attention biases, sinks, windows, YaRN or weighted qk "
        "norm, and untied embeddings; this model differs");
  }
}

// The HF layer_types: chunked in the RoPE layers where the model chunks.
nlohmann::json layer_types(const Llama3Args& a) {
  nlohmann::json types = nlohmann::json::array();
  for (int64_t i = 0; i < a.n_layers; ++i) {
    types.push_back(a.layer_attention_chunk(i) > 0 ? "chunked_attention" : "full_attention");
  }
  return types;
}

// A list of config.json's `key` with an entry per layer (or the layer indices when `indices`).
std::vector<int64_t> int_list(const nlohmann::json& config, const std::string& key) {
  const nlohmann::json& list = config[key];
  if (!list.is_array()) {
    throw ConfigError(message("config.json \"", key, "\" must be a list, got ", list.dump()));
  }
  std::vector<int64_t> out;
  for (const nlohmann::json& v : list) {
    if (!v.is_number_integer()) {
      throw ConfigError(message("config.json \"", key, "\" must hold integers, got ", list.dump()));
    }
    out.push_back(v.get<int64_t>());
  }
  return out;
}

// interleave_moe_layer_step from "moe_layers" (else "interleave_moe_layer_step"), refusing a
// placement other than every step-th layer (layers step - 1, 2 step - 1, ...).
void set_moe_layers(const nlohmann::json& c, Llama3Args& a) {
  int64_t step = int_or(c, "interleave_moe_layer_step", 1);
  if (hf::find_key(c, "moe_layers") != nullptr) {
    const std::vector<int64_t> layers = int_list(c, "moe_layers");
    if (layers.empty()) {
      throw ConfigError(
          "config.json \"moe_layers\" is empty: a Llama 4 without MoE layers is not supported");
    }
    hf::check_int("moe_layers[0]", layers[0], 0, a.n_layers - 1);
    step = layers[0] + 1;
  }
  hf::check_int("interleave_moe_layer_step", step, 1, a.n_layers);
  a.interleave_moe_layer_step = step;
  if (hf::find_key(c, "moe_layers") == nullptr) return;
  std::vector<int64_t> expected;
  for (int64_t i = step - 1; i < a.n_layers; i += step) expected.push_back(i);
  if (int_list(c, "moe_layers") != expected) {
    throw ConfigError(message("config.json \"moe_layers\" ", c["moe_layers"].dump(),
                              " is not supported: only every N-th layer (layers N - 1, 2N - 1, "
                              "...) as Llama 4's interleave_moe_layer_step places them"));
  }
}

// nope_every from "no_rope_layers" (1: RoPE, 0: NoPE; else "no_rope_layer_interval"), then the
// chunk size from "layer_types" and "attention_chunk_size".
void set_attention_layers(const nlohmann::json& c, Llama3Args& a) {
  std::vector<int64_t> rope;  // 1 per RoPE layer
  if (hf::find_key(c, "no_rope_layers") != nullptr && !c["no_rope_layers"].empty()) {
    rope = int_list(c, "no_rope_layers");
    if (static_cast<int64_t>(rope.size()) < a.n_layers) {
      throw ConfigError(message("config.json \"no_rope_layers\" lists ", rope.size(),
                                " layers for num_hidden_layers ", a.n_layers));
    }
    rope.resize(a.n_layers);
  } else {
    const int64_t interval = int_or(c, "no_rope_layer_interval", 4);
    hf::check_int("no_rope_layer_interval", interval, 1, int64_t{1} << 16);
    for (int64_t i = 0; i < a.n_layers; ++i) rope.push_back((i + 1) % interval != 0 ? 1 : 0);
  }
  a.nope_every = 0;
  for (int64_t i = 0; i < a.n_layers; ++i) {
    if (rope[i] == 0) {
      a.nope_every = i + 1;
      break;
    }
  }
  for (int64_t i = 0; i < a.n_layers; ++i) {
    if (rope[i] != (a.is_nope_layer(i) ? 0 : 1)) {
      throw ConfigError(message("config.json \"no_rope_layers\" ", nlohmann::json(rope).dump(),
                                " is not supported: only every N-th layer without RoPE (layers "
                                "N - 1, 2N - 1, ...), as Llama 4 places them"));
    }
  }
  // layer_types: Llama4TextConfig's default chunks every RoPE layer.
  nlohmann::json types = nlohmann::json::array();
  for (int64_t i = 0; i < a.n_layers; ++i) {
    types.push_back(a.is_nope_layer(i) ? "full_attention" : "chunked_attention");
  }
  if (const nlohmann::json* given = hf::find_key(c, "layer_types")) types = *given;
  if (!types.is_array() || static_cast<int64_t>(types.size()) != a.n_layers) {
    throw ConfigError(message("config.json \"layer_types\" must list the ", a.n_layers,
                              " layers' attention types, got ", types.dump()));
  }
  bool chunked = false;
  for (int64_t i = 0; i < a.n_layers; ++i) {
    if (types[i] != "chunked_attention" && types[i] != "full_attention") {
      throw ConfigError(message("config.json \"layer_types\"[", i, "] ", types[i].dump(),
                                " is not \"chunked_attention\" or \"full_attention\""));
    }
    chunked = chunked || types[i] == "chunked_attention";
  }
  a.attention_chunk_size = 0;
  if (chunked) {
    a.attention_chunk_size = int_or(c, "attention_chunk_size", 8192);
    hf::check_int("attention_chunk_size", a.attention_chunk_size, 1, int64_t{1} << 31);
  }
  if (layer_types(a) != types) {
    throw ConfigError(message("config.json \"layer_types\" ", types.dump(),
                              " is not supported: chunked attention in every RoPE layer (or in "
                              "none) and full attention in the NoPE layers"));
  }
}

// The Llama 4 text config of a config.json: itself, or a Llama4ForConditionalGeneration's
// text_config.
const nlohmann::json& text_config(const nlohmann::json& config) {
  if (!config.is_object()) throw ConfigError("config.json must hold a JSON object");
  const std::string type = hf::string_or(config, "model_type", "llama4_text");
  if (type == "llama4") {
    const nlohmann::json* text = hf::find_key(config, "text_config");
    if (text == nullptr || !text->is_object()) {
      throw ConfigError("config.json of model_type \"llama4\" has no \"text_config\" object");
    }
    return *text;
  }
  if (type != "llama4_text") {
    throw ConfigError(
        message("config.json model_type '", type, "' is not \"llama4_text\" or \"llama4\""));
  }
  return config;
}

const std::string kLanguageModel = "language_model.";

}  // namespace

nlohmann::json hf_config(const Llama3Args& a) {
  check_exportable(a);
  nlohmann::json rope = {{"rope_type", "default"}, {"rope_theta", a.rope_theta}};
  if (a.use_rope_scaling) {
    const RopeScaling& rs = a.rope_scaling;
    rope = {{"rope_type", "llama3"},
            {"rope_theta", a.rope_theta},
            {"factor", rs.scaling_factor},
            {"low_freq_factor", rs.low_freq_factor},
            {"high_freq_factor", rs.high_freq_factor},
            {"original_max_position_embeddings", rs.original_max_position_embeddings}};
  }
  nlohmann::json moe_layers = nlohmann::json::array(), no_rope = nlohmann::json::array();
  for (int64_t i = 0; i < a.n_layers; ++i) {
    if (a.is_moe_layer(i)) moe_layers.push_back(i);
    no_rope.push_back(a.is_nope_layer(i) ? 0 : 1);
  }
  return {
      {"architectures", {"Llama4ForCausalLM"}},
      {"model_type", "llama4_text"},
      {"hidden_size", a.dim},
      {"intermediate_size", a.moe.hidden_dim},
      {"intermediate_size_mlp", a.ffn_hidden_dim()},
      {"num_hidden_layers", a.n_layers},
      {"num_attention_heads", a.n_heads},
      {"num_key_value_heads", a.kv_heads()},
      {"head_dim", a.head_dim()},
      {"vocab_size", a.vocab_size},
      {"num_local_experts", a.moe.num_experts},
      {"num_experts_per_tok", a.moe.top_k},
      {"interleave_moe_layer_step", a.interleave_moe_layer_step},
      {"moe_layers", moe_layers},
      {"no_rope_layers", no_rope},
      {"no_rope_layer_interval", a.nope_every > 0 ? a.nope_every : 4},
      {"layer_types", layer_types(a)},
      // Hugging Face builds the chunked mask whether a layer uses it or not, and refuses no size:
      // without chunks, one chunk spans every position.
      {"attention_chunk_size", a.attention_chunk_size > 0 ? a.attention_chunk_size : a.max_seq_len},
      {"use_qk_norm", a.qk_l2_norm},
      {"attn_temperature_tuning", a.attn_temperature_floor > 0},
      {"floor_scale", a.attn_temperature_floor > 0 ? a.attn_temperature_floor : 8192},
      {"attn_scale", a.attn_temperature_scale},
      {"rms_norm_eps", a.norm_eps},
      {"rope_parameters", rope},
      {"max_position_embeddings", a.max_seq_len},
      {"attention_bias", false},
      {"attention_dropout", 0.0},
      {"hidden_act", "silu"},
      {"tie_word_embeddings", false},
      {"initializer_range", 0.02},
      {"router_aux_loss_coef", 0.001},
      {"router_jitter_noise", 0.0},
      {"output_router_logits", false},
      {"use_cache", true},
  };
}

Llama3Args args_from_hf_config(const nlohmann::json& config) {
  const nlohmann::json& c = text_config(config);
  if (hf::string_or(c, "hidden_act", "silu") != "silu") {
    throw ConfigError(message("config.json \"hidden_act\" ", c["hidden_act"].dump(),
                              " is not supported for llama4 (only \"silu\")"));
  }
  if (bool_or(c, "attention_bias", false)) {
    throw ConfigError("config.json \"attention_bias\": true is not supported for llama4");
  }
  if (bool_or(c, "tie_word_embeddings", false) || bool_or(config, "tie_word_embeddings", false)) {
    throw ConfigError("config.json \"tie_word_embeddings\": true is not supported for llama4");
  }
  Llama3Args a = llama4::flavors().back().second;  // the architecture's fixed choices
  a.ffn_dim_multiplier = 0.0;
  a.dim = int_or(c, "hidden_size", 5120);
  a.n_layers = int_or(c, "num_hidden_layers", 48);
  a.n_heads = int_or(c, "num_attention_heads", 40);
  a.n_kv_heads = int_or(c, "num_key_value_heads", a.n_heads);
  a.head_dim_override = int_or(c, "head_dim", 128);
  a.vocab_size = int_or(c, "vocab_size", 202048);
  a.max_seq_len = int_or(c, "max_position_embeddings", 131072);
  a.norm_eps = number_or(c, "rms_norm_eps", 1e-5);
  a.ffn_dim = int_or(c, "intermediate_size_mlp", 16384);
  hf::check_int("hidden_size", a.dim, 1, int64_t{1} << 24);
  hf::check_int("num_hidden_layers", a.n_layers, 1, int64_t{1} << 16);
  hf::check_int("num_attention_heads", a.n_heads, 1, int64_t{1} << 24);
  hf::check_int("num_key_value_heads", a.n_kv_heads, 1, a.n_heads, "dividing the heads");
  hf::check_int("head_dim", a.head_dim_override, 2, int64_t{1} << 24, "even: RoPE rotates pairs");
  hf::check_int("vocab_size", a.vocab_size, 1, int64_t{1} << 31);
  hf::check_int("intermediate_size_mlp", a.ffn_dim, 1, int64_t{1} << 24);
  a.moe.num_experts = int_or(c, "num_local_experts", 16);
  a.moe.top_k = int_or(c, "num_experts_per_tok", 1);
  a.moe.hidden_dim = int_or(c, "intermediate_size", 8192);
  hf::check_int("num_local_experts", a.moe.num_experts, 1, int64_t{1} << 16);
  hf::check_int("num_experts_per_tok", a.moe.top_k, 1, a.moe.num_experts, "at most the experts");
  hf::check_int("intermediate_size", a.moe.hidden_dim, 1, int64_t{1} << 24);
  set_moe_layers(c, a);
  set_attention_layers(c, a);
  a.qk_l2_norm = bool_or(c, "use_qk_norm", true);
  a.attn_temperature_floor = 0;
  a.attn_temperature_scale = number_or(c, "attn_scale", 0.1);
  hf::check_number("attn_scale", a.attn_temperature_scale, -1e6, 1e6);
  if (bool_or(c, "attn_temperature_tuning", true)) {
    a.attn_temperature_floor = int_or(c, "floor_scale", 8192);
    hf::check_int("floor_scale", a.attn_temperature_floor, 1, int64_t{1} << 40);
  }
  llama3::set_rope_from_hf(c, a);
  if (!c.contains("rope_parameters") && !c.contains("rope_scaling") && !c.contains("rope_theta")) {
    a.rope_theta = 500000.0;  // Llama4TextConfig's default_theta
  }
  llama3::check_hf_ranges(a);
  a.validate();
  return a;
}

TensorMap to_hf_tensors(const TensorMap& ours, const Llama3Args& a) {
  TensorMap hf;
  TensorMap shared;  // the top-level names, through the llama3 adapter
  std::map<int64_t, std::map<std::string, at::Tensor>> gate_up;  // per layer: w1 and w3
  for (const auto& [name, tensor] : ours) {
    int64_t layer = 0;
    std::string rest;
    if (!llama3::parse_layer_name(name, "layers.", layer, rest)) {
      shared.emplace(name, tensor);
      continue;
    }
    const std::string prefix = "model.layers." + std::to_string(layer) + ".";
    if (const std::string mapped = rename(rest, /*from_ours=*/true); !mapped.empty()) {
      llama3::put_tensor(hf, prefix + mapped, tensor, name);
    } else if (rest == "moe.expert_bias") {
      llama3::warn_dropped_expert_bias(name, tensor, "Llama 4");
    } else if (rest == "moe.experts.w1.weight" || rest == "moe.experts.w3.weight") {
      gate_up[layer][rest.substr(12, 2)] = tensor;
    } else if (rest == "moe.experts.w2.weight") {
      llama3::put_tensor(hf, prefix + "feed_forward.experts.down_proj",
                         tensor.transpose(1, 2).contiguous(), name);
    } else {
      throw DataError("llama4 -> Hugging Face: no Hugging Face name for tensor '" + name + "'");
    }
  }
  for (const auto& [layer, parts] : gate_up) {
    if (parts.size() != 2) {
      throw DataError(message("llama4 -> Hugging Face: layer ", layer,
                              " has one of experts.w1 and experts.w3 without the other (both "
                              "form gate_up_proj)"));
    }
    // (E, h, d) each -> (E, d, 2h): gate columns, then up columns.
    llama3::put_tensor(
        hf, "model.layers." + std::to_string(layer) + ".feed_forward.experts.gate_up_proj",
        at::cat({parts.at("w1").transpose(1, 2), parts.at("w3").transpose(1, 2)}, 2).contiguous(),
        "layers." + std::to_string(layer) + ".moe.experts.w1.weight");
  }
  for (const auto& [name, tensor] : llama3::to_hf_tensors(shared, a)) {
    llama3::put_tensor(hf, name, tensor, name);
  }
  return hf;
}

TensorMap from_hf_tensors(const TensorMap& hf, const Llama3Args& a) {
  TensorMap ours;
  TensorMap shared;
  int64_t vision = 0;
  for (const auto& item : hf) {
    const std::string& full_name = item.first;  // (a structured binding: clang's lambdas
    const at::Tensor& tensor = item.second;     // below could not capture it)
    // Llama4ForConditionalGeneration: the text model under language_model., the vision tower
    // and its projector beside it.
    std::string name = full_name;
    if (name.rfind(kLanguageModel, 0) == 0) {
      name = name.substr(kLanguageModel.size());
    } else if (name.rfind("vision_model.", 0) == 0 ||
               name.rfind("multi_modal_projector.", 0) == 0) {
      ++vision;
      continue;
    }
    int64_t layer = 0;
    std::string rest;
    if (!llama3::parse_layer_name(name, "model.layers.", layer, rest)) {
      shared.emplace(name, tensor);
      continue;
    }
    const std::string prefix = "layers." + std::to_string(layer) + ".";
    const auto expect3 = [&] {
      if (tensor.dim() != 3) {
        throw DataError(message("Hugging Face -> llama4: tensor '", full_name, "' has shape ",
                                tensor.sizes(), ", expected (experts, in, out)"));
      }
    };
    if (const std::string mapped = rename(rest, /*from_ours=*/false); !mapped.empty()) {
      llama3::put_tensor(ours, prefix + mapped, tensor, full_name);
    } else if (rest == "feed_forward.experts.gate_up_proj") {
      expect3();  // (E, d, 2h): gate columns, then up columns
      if (tensor.size(2) % 2 != 0) {
        throw DataError(message("Hugging Face -> llama4: tensor '", full_name, "' has shape ",
                                tensor.sizes(), ": an odd gate_up width"));
      }
      const int64_t h = tensor.size(2) / 2;
      llama3::put_tensor(ours, prefix + "moe.experts.w1.weight",
                         tensor.narrow(2, 0, h).transpose(1, 2).contiguous(), full_name);
      llama3::put_tensor(ours, prefix + "moe.experts.w3.weight",
                         tensor.narrow(2, h, h).transpose(1, 2).contiguous(), full_name);
    } else if (rest == "feed_forward.experts.down_proj") {
      expect3();  // (E, h, d)
      llama3::put_tensor(ours, prefix + "moe.experts.w2.weight",
                         tensor.transpose(1, 2).contiguous(), full_name);
    } else {
      throw DataError("Hugging Face -> llama4: unexpected tensor '" + full_name +
                      "' (not a Llama4ForCausalLM weight)");
    }
  }
  if (vision > 0) {
    log_info("Hugging Face -> llama4: imported the text model; the ", vision,
             " tensors of the vision tower and its projector are not read (model \"llama4\" is "
             "the text model)");
  }
  for (const auto& [name, tensor] : llama3::from_hf_tensors(shared, a)) {
    llama3::put_tensor(ours, name, tensor, name);
  }
  return ours;
}

HfAdapter make_hf_adapter() {
  HfAdapter adapter = llama3::family_hf_adapter(family(), "llama4_text",
                                                {&llama4::hf_config, &llama4::args_from_hf_config,
                                                 &llama4::to_hf_tensors, &llama4::from_hf_tensors});
  adapter.other_model_types = {"llama4"};
  return adapter;
}

}  // namespace titan::llama4
