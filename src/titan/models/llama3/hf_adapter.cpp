// Llama 3 <-> Hugging Face LlamaForCausalLM conversion (see hf_adapter.h).
#include "titan/models/llama3/hf_adapter.h"

#include "titan/common/check.h"
#include "titan/common/logging.h"
#include "titan/models/common/hf_config_checks.h"

#include <array>
#include <cmath>
#include <cstdlib>
#include <string>
#include <utility>

namespace titan::llama3 {
namespace {

// Per-layer names: (ours after "layers.N.", HF after "model.layers.N.").
constexpr std::array<std::pair<const char*, const char*>, 9> kLayerNames = {{
    {"attention.wq.weight", "self_attn.q_proj.weight"},
    {"attention.wk.weight", "self_attn.k_proj.weight"},
    {"attention.wv.weight", "self_attn.v_proj.weight"},
    {"attention.wo.weight", "self_attn.o_proj.weight"},
    {"feed_forward.w1.weight", "mlp.gate_proj.weight"},
    {"feed_forward.w2.weight", "mlp.down_proj.weight"},
    {"feed_forward.w3.weight", "mlp.up_proj.weight"},
    {"attention_norm.weight", "input_layernorm.weight"},
    {"ffn_norm.weight", "post_attention_layernorm.weight"},
}};

// Top-level names: (ours, HF).
constexpr std::array<std::pair<const char*, const char*>, 3> kTopNames = {{
    {"tok_embeddings.weight", "model.embed_tokens.weight"},
    {"norm.weight", "model.norm.weight"},
    {"output.weight", "lm_head.weight"},
}};

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Splits "<prefix><N>.<rest>" into (N, rest); false if `name` has another form.
bool split_layer_name(const std::string& name, const std::string& prefix, int64_t& layer,
                      std::string& rest) {
  if (!starts_with(name, prefix)) {
    return false;
  }
  const size_t dot = name.find('.', prefix.size());
  if (dot == std::string::npos || dot == prefix.size()) {
    return false;
  }
  const std::string number = name.substr(prefix.size(), dot - prefix.size());
  if (number.find_first_not_of("0123456789") != std::string::npos) {
    return false;
  }
  layer = std::strtoll(number.c_str(), nullptr, 10);
  rest = name.substr(dot + 1);
  return true;
}

// `name` translated by a (from, to) table where `from_first` picks the direction; "" if absent.
template <size_t N>
std::string lookup(const std::array<std::pair<const char*, const char*>, N>& table,
                   const std::string& name, bool from_ours) {
  for (const auto& [ours, hf] : table) {
    if (name == (from_ours ? ours : hf)) {
      return from_ours ? hf : ours;
    }
  }
  return "";
}

at::Tensor permute_rows(const at::Tensor& w, int64_t n_heads, bool to_hf) {
  TITAN_CHECK(w.dim() == 2 && n_heads > 0 && w.size(0) % (2 * n_heads) == 0, "q/k weight of shape ",
              w.sizes(), " cannot be split into ", n_heads, " heads of an even head_dim");
  const int64_t rows = w.size(0);
  const int64_t cols = w.size(1);
  const int64_t half = rows / n_heads / 2;
  // to HF: (heads, half, 2, cols) -> (heads, 2, half, cols); from HF: the reverse.
  const at::Tensor split =
      to_hf ? w.reshape({n_heads, half, 2, cols}) : w.reshape({n_heads, 2, half, cols});
  return split.transpose(1, 2).contiguous().view({rows, cols});
}

void check_unique(const TensorMap& map, const std::string& name, const std::string& original) {
  if (map.count(name) != 0) {
    throw DataError("tensor '" + original + "' maps to '" + name + "', which is already present");
  }
}

int64_t config_int(const nlohmann::json& config, const std::string& key) {
  if (!config.contains(key)) {
    throw ConfigError(message("config.json lacks \"", key, "\""));
  }
  const nlohmann::json& value = config[key];
  if (!value.is_number_integer()) {
    throw ConfigError(message("config.json \"", key, "\" must be an integer, got ", value.dump()));
  }
  return value.get<int64_t>();
}

double config_double(const nlohmann::json& config, const std::string& key, double fallback) {
  if (!config.contains(key) || config[key].is_null()) {
    return fallback;
  }
  const nlohmann::json& value = config[key];
  if (!value.is_number()) {
    throw ConfigError(message("config.json \"", key, "\" must be a number, got ", value.dump()));
  }
  return value.get<double>();
}

// Keys whose only supported value is `expected` (absent is fine).
void check_fixed(const nlohmann::json& config, const std::string& key,
                 const nlohmann::json& expected) {
  if (config.contains(key) && !config[key].is_null() && config[key] != expected) {
    throw ConfigError(message("config.json \"", key, "\": ", config[key].dump(),
                              " is not supported (only ", expected.dump(), ")"));
  }
}

}  // namespace

// RoPE from config.json (hf_adapter.h). transformers >= 5 writes one "rope_parameters" object
// (rope_type, rope_theta and the scaling keys); older versions write "rope_theta" plus
// "rope_scaling" (null without scaling). As in transformers, a non-empty "rope_scaling" wins over
// "rope_parameters", a rope_theta inside the object over the top-level one, and a llama3 scaling
// without original_max_position_embeddings uses max_position_embeddings (args.max_seq_len).
void set_rope_from_hf(const nlohmann::json& config, Llama3Args& args) {
  std::string key = "rope_parameters";
  if (config.contains("rope_scaling") && !config["rope_scaling"].is_null() &&
      !config["rope_scaling"].empty()) {
    key = "rope_scaling";
  }
  const nlohmann::json rope =
      config.contains(key) && !config[key].is_null() ? config[key] : nlohmann::json::object();
  if (!rope.is_object()) {
    throw ConfigError(
        message("config.json \"", key, "\" must be an object or null, got ", rope.dump()));
  }
  args.rope_theta = config_double(rope, "rope_theta", config_double(config, "rope_theta", 10000.0));
  const double partial = config_double(rope, "partial_rotary_factor",
                                       config_double(config, "partial_rotary_factor", 1.0));
  if (partial != 1.0) {
    throw ConfigError(message("config.json partial_rotary_factor ", partial,
                              " is not supported (RoPE rotates the whole head: only 1)"));
  }
  const auto type_of = [&](const char* name) {
    if (rope.contains(name) && !rope[name].is_string()) {
      throw ConfigError(message("config.json \"", key, "\".", name, " must be a string, got ",
                                rope[name].dump()));
    }
    return rope.value(name, std::string());
  };
  std::string type = type_of("rope_type");
  if (type.empty()) {
    type = type_of("type");
  }
  if (type.empty() || type == "default") {
    args.use_rope_scaling = false;
    return;
  }
  if (type != "llama3") {
    throw ConfigError(message("config.json ", key, " type '", type,
                              "' is not supported (only \"llama3\" and \"default\")"));
  }
  args.use_rope_scaling = true;
  args.rope_scaling.scaling_factor = config_double(rope, "factor", 8.0);
  args.rope_scaling.low_freq_factor = config_double(rope, "low_freq_factor", 1.0);
  args.rope_scaling.high_freq_factor = config_double(rope, "high_freq_factor", 4.0);
  args.rope_scaling.original_max_position_embeddings =
      rope.contains("original_max_position_embeddings")
          ? config_int(rope, "original_max_position_embeddings")
          : args.max_seq_len;
}

void check_hf_ranges(const Llama3Args& args) {
  // Named by their config.json keys here; later checks know only our argument names. Bounds far
  // outside every released model, inside what the arithmetic survives.
  hf::check_number("rms_norm_eps", args.norm_eps, 0, 1, /*lo_open=*/true);
  hf::check_number("rope_theta", args.rope_theta, 0, 1e12, /*lo_open=*/true);
  hf::check_int("max_position_embeddings", args.max_seq_len, 1, int64_t{1} << 31);
  if (args.use_rope_scaling) {
    const RopeScaling& rs = args.rope_scaling;
    hf::check_number("rope_scaling.factor", rs.scaling_factor, 0, 1e6, /*lo_open=*/true);
    hf::check_number("rope_scaling.low_freq_factor", rs.low_freq_factor, 0, 1e6, true);
    hf::check_number("rope_scaling.high_freq_factor", rs.high_freq_factor, 0, 1e6, true);
    if (rs.high_freq_factor < rs.low_freq_factor) {
      throw ConfigError(message("config.json rope_scaling \"high_freq_factor\" ",
                                rs.high_freq_factor, " must be at least \"low_freq_factor\" ",
                                rs.low_freq_factor,
                                " (Llama 3 scaling blends the band between them; Llama 4's "
                                "equal factors leave none)"));
    }
    hf::check_int("rope_scaling.original_max_position_embeddings",
                  rs.original_max_position_embeddings, 1, int64_t{1} << 31);
  }
}

at::Tensor permute_to_hf(const at::Tensor& w, int64_t n_heads) {
  return permute_rows(w, n_heads, /*to_hf=*/true);
}

at::Tensor permute_from_hf(const at::Tensor& w, int64_t n_heads) {
  return permute_rows(w, n_heads, /*to_hf=*/false);
}

namespace {

at::Tensor permute_rotary_rows(const at::Tensor& w, int64_t n_heads, int64_t head_rows,
                               int64_t rope_dim, bool to_hf) {
  if (w.dim() == 1) {  // a norm's weight: rows of one column
    return permute_rotary_rows(w.reshape({w.numel(), 1}), n_heads, head_rows, rope_dim, to_hf)
        .view(w.sizes());
  }
  TITAN_CHECK(w.size(0) == n_heads * head_rows && rope_dim > 0 && rope_dim <= head_rows &&
                  rope_dim % 2 == 0,
              "permute_rotary_rows: ", w.size(0), " rows for ", n_heads, " heads of ", head_rows,
              " rows, rope_dim ", rope_dim);
  std::vector<int64_t> sizes = w.sizes().vec();
  sizes[0] = n_heads;
  sizes.insert(sizes.begin() + 1, head_rows);
  const at::Tensor heads = w.reshape(sizes);  // (n_heads, head_rows, ...)
  const at::Tensor rotary = heads.narrow(1, 0, rope_dim).reshape([&] {
    std::vector<int64_t> s = w.sizes().vec();
    s[0] = n_heads * rope_dim;
    return s;
  }());
  const at::Tensor turned = permute_rows(rotary, n_heads, to_hf).reshape([&] {
    std::vector<int64_t> s = sizes;
    s[1] = rope_dim;
    return s;
  }());
  return at::cat({turned, heads.narrow(1, rope_dim, head_rows - rope_dim)}, 1).reshape(w.sizes());
}

}  // namespace

at::Tensor permute_rotary_to_hf(const at::Tensor& w, int64_t n_heads, int64_t head_rows,
                                int64_t rope_dim) {
  return permute_rotary_rows(w, n_heads, head_rows, rope_dim, /*to_hf=*/true);
}

at::Tensor permute_rotary_from_hf(const at::Tensor& w, int64_t n_heads, int64_t head_rows,
                                  int64_t rope_dim) {
  return permute_rotary_rows(w, n_heads, head_rows, rope_dim, /*to_hf=*/false);
}

nlohmann::json hf_config(const Llama3Args& args) {
  // RoPE as "rope_theta" + "rope_scaling", the keys every transformers version reads (5.x turns
  // them into its "rope_parameters" on loading).
  nlohmann::json config = {
      {"architectures", {"LlamaForCausalLM"}},
      {"model_type", "llama"},
      {"hidden_size", args.dim},
      {"intermediate_size", args.ffn_hidden_dim()},
      {"num_hidden_layers", args.n_layers},
      {"num_attention_heads", args.n_heads},
      {"num_key_value_heads", args.kv_heads()},
      {"head_dim", args.head_dim()},
      {"vocab_size", args.vocab_size},
      {"rms_norm_eps", args.norm_eps},
      {"rope_theta", args.rope_theta},
      {"rope_scaling", nullptr},
      {"max_position_embeddings", args.max_seq_len},
      {"tie_word_embeddings", args.tie_embeddings},
      {"hidden_act", "silu"},
      {"attention_bias", false},
      {"mlp_bias", false},
      {"attention_dropout", 0.0},
      {"initializer_range", 0.02},
      {"pretraining_tp", 1},
      {"use_cache", true},
  };
  if (args.use_rope_scaling) {
    const RopeScaling& rs = args.rope_scaling;
    config["rope_scaling"] = {
        {"rope_type", "llama3"},
        {"factor", rs.scaling_factor},
        {"low_freq_factor", rs.low_freq_factor},
        {"high_freq_factor", rs.high_freq_factor},
        {"original_max_position_embeddings", rs.original_max_position_embeddings}};
  }
  return config;
}

Llama3Args args_from_hf_config(const nlohmann::json& config) {
  if (!config.is_object()) {
    throw ConfigError("config.json must hold a JSON object");
  }
  Llama3Args args;
  args.dim = config_int(config, "hidden_size");
  args.n_layers = config_int(config, "num_hidden_layers");
  args.n_heads = config_int(config, "num_attention_heads");
  args.n_kv_heads =
      config.contains("num_key_value_heads") && !config["num_key_value_heads"].is_null()
          ? config_int(config, "num_key_value_heads")
          : args.n_heads;
  args.vocab_size = config_int(config, "vocab_size");
  args.ffn_dim = config_int(config, "intermediate_size");
  // transformers' LlamaConfig defaults for the optional keys.
  args.norm_eps = config_double(config, "rms_norm_eps", 1e-6);
  args.max_seq_len = config.contains("max_position_embeddings")
                         ? config_int(config, "max_position_embeddings")
                         : 2048;
  if (config.contains("tie_word_embeddings")) {
    if (!config["tie_word_embeddings"].is_boolean()) {
      throw ConfigError("config.json \"tie_word_embeddings\" must be true or false");
    }
    args.tie_embeddings = config["tie_word_embeddings"].get<bool>();
  } else {
    args.tie_embeddings = false;
  }
  set_rope_from_hf(config, args);
  check_fixed(config, "hidden_act", "silu");
  check_fixed(config, "attention_bias", false);
  check_fixed(config, "mlp_bias", false);
  check_fixed(config, "pretraining_tp", 1);
  if (config.contains("head_dim") && !config["head_dim"].is_null() && args.n_heads > 0 &&
      config_int(config, "head_dim") * args.n_heads != args.dim) {
    throw ConfigError(message("config.json head_dim ", config["head_dim"].dump(),
                              " != hidden_size / num_attention_heads (", args.dim, " / ",
                              args.n_heads, "), which this model requires"));
  }
  check_hf_ranges(args);
  args.validate();
  return args;
}

TensorMap to_hf_tensors(const TensorMap& ours, const Llama3Args& args) {
  TensorMap hf;
  for (const auto& [name, tensor] : ours) {
    std::string hf_name = lookup(kTopNames, name, /*from_ours=*/true);
    at::Tensor value = tensor;
    int64_t layer = 0;
    std::string rest;
    if (hf_name.empty() && split_layer_name(name, "layers.", layer, rest)) {
      const std::string mapped = lookup(kLayerNames, rest, /*from_ours=*/true);
      if (!mapped.empty()) {
        hf_name = "model.layers." + std::to_string(layer) + "." + mapped;
      }
      if (rest == "attention.wq.weight") {
        value = permute_to_hf(tensor, args.n_heads);
      } else if (rest == "attention.wk.weight") {
        value = permute_to_hf(tensor, args.kv_heads());
      }
    }
    if (hf_name.empty()) {
      throw DataError("llama3 -> Hugging Face: no Hugging Face name for tensor '" + name + "'");
    }
    check_unique(hf, hf_name, name);
    hf.emplace(hf_name, value);
  }
  return hf;
}

TensorMap from_hf_tensors(const TensorMap& hf, const Llama3Args& args) {
  TensorMap ours;
  for (const auto& [name, tensor] : hf) {
    // Buffers some exports include; they hold no parameters.
    if (ends_with(name, ".rotary_emb.inv_freq")) {
      continue;
    }
    // With tie_word_embeddings, lm_head.weight (if saved at all) is the embedding table.
    if (name == "lm_head.weight" && args.tie_embeddings) {
      continue;
    }
    std::string our_name = lookup(kTopNames, name, /*from_ours=*/false);
    at::Tensor value = tensor;
    int64_t layer = 0;
    std::string rest;
    if (our_name.empty() && split_layer_name(name, "model.layers.", layer, rest)) {
      const std::string mapped = lookup(kLayerNames, rest, /*from_ours=*/false);
      if (!mapped.empty()) {
        our_name = "layers." + std::to_string(layer) + "." + mapped;
      }
      if (rest == "self_attn.q_proj.weight") {
        value = permute_from_hf(tensor, args.n_heads);
      } else if (rest == "self_attn.k_proj.weight") {
        value = permute_from_hf(tensor, args.kv_heads());
      }
    }
    if (our_name.empty()) {
      throw DataError("Hugging Face -> llama3: unexpected tensor '" + name +
                      "' (not a LlamaForCausalLM weight)");
    }
    check_unique(ours, our_name, name);
    ours.emplace(our_name, value);
  }
  return ours;
}

HfAdapter make_hf_adapter() {
  return family_hf_adapter(llama3_family(), "llama",
                           {&hf_config, &args_from_hf_config, &to_hf_tensors, &from_hf_tensors});
}

HfAdapter family_hf_adapter(const Family& family, const std::string& model_type,
                            const FamilyHfFunctions& f) {
  const Family* fam = &family;
  HfAdapter adapter;
  adapter.model_type = model_type;
  adapter.to_hf_config = [fam, f](const nlohmann::json& model) {
    return f.to_config(args_from_description(model, *fam));
  };
  adapter.from_hf_config = [fam, f](const nlohmann::json& config) {
    return describe_args(f.from_config(config), *fam);
  };
  adapter.to_hf = [fam, f](const TensorMap& ours, const nlohmann::json& model) {
    return f.to_hf(ours, args_from_description(model, *fam));
  };
  adapter.from_hf = [fam, f](const TensorMap& hf, const nlohmann::json& model) {
    return f.from_hf(hf, args_from_description(model, *fam));
  };
  return adapter;
}

bool parse_layer_name(const std::string& name, const std::string& prefix, int64_t& layer,
                      std::string& rest) {
  if (name.rfind(prefix, 0) != 0) return false;
  const size_t dot = name.find('.', prefix.size());
  if (dot == std::string::npos) return false;
  const std::string digits = name.substr(prefix.size(), dot - prefix.size());
  if (digits.empty() || digits.size() > 9 ||
      digits.find_first_not_of("0123456789") != std::string::npos) {
    return false;
  }
  layer = std::stoll(digits);
  rest = name.substr(dot + 1);
  return true;
}

void put_tensor(TensorMap& map, const std::string& name, const at::Tensor& value,
                const std::string& original) {
  if (!map.emplace(name, value).second) {
    throw DataError("tensor '" + original + "' maps to '" + name + "', which is already present");
  }
}

void warn_dropped_expert_bias(const std::string& name, const at::Tensor& bias,
                              const std::string& model) {
  if (bias.is_meta() || bias.numel() == 0) return;
  const double most = bias.abs().max().item<double>();
  if (most == 0) return;
  log_warning(
      "Hugging Face export: ", name, " is not zero (max |bias| ", most, "); ", model,
      "'s Hugging Face model has no routing bias for load balancing, so the exported model "
      "routes without it (a model with load_balance_coeff 0, or a LoRA run, which keeps the "
      "bias as loaded, exports the routing as trained)");
}

}  // namespace titan::llama3
