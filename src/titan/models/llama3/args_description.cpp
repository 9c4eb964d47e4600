// Llama 3 model descriptions: the JSON form of Llama3Args (see args.h), read, written, resolved
// and shortened to a flavor.
#include "titan/models/llama3/args.h"

#include "titan/common/check.h"
#include "titan/models/registry.h"

#include <algorithm>
#include <string>
#include <type_traits>
#include <vector>

namespace titan::llama3 {

namespace {

// Every field of a description, named as its JSON key, through one function per object: the key
// lists, reading and writing all come from these (as JobConfig's visit() does for the TOML).
// A and M may be const (writing) or not (reading).
template <typename A, typename V>
void visit_scalars(A& a, V&& v) {
  v("dim", a.dim);
  v("n_layers", a.n_layers);
  v("n_heads", a.n_heads);
  v("n_kv_heads", a.n_kv_heads);
  v("vocab_size", a.vocab_size);
  v("multiple_of", a.multiple_of);
  v("ffn_dim_multiplier", a.ffn_dim_multiplier);
  v("ffn_dim", a.ffn_dim);
  v("norm_eps", a.norm_eps);
  v("rope_theta", a.rope_theta);
  v("use_rope_scaling", a.use_rope_scaling);
  v("depth_init", a.depth_init);
  v("tie_embeddings", a.tie_embeddings);
  v("max_seq_len", a.max_seq_len);
  v("head_dim", a.head_dim_override);
  v("qk_norm", a.qk_norm);
  v("n_dense_layers", a.n_dense_layers);
  v("attention_bias", a.attention_bias);
  v("attention_sinks", a.attention_sinks);
  v("sliding_window", a.sliding_window);
  v("global_attention_every", a.global_attention_every);
  v("interleave_moe_layer_step", a.interleave_moe_layer_step);
  v("nope_every", a.nope_every);
  v("attention_chunk_size", a.attention_chunk_size);
  v("qk_l2_norm", a.qk_l2_norm);
  v("attn_temperature_floor", a.attn_temperature_floor);
  v("attn_temperature_scale", a.attn_temperature_scale);
  v("num_mtp_layers", a.num_mtp_layers);
  v("full_attention_interval", a.full_attention_interval);
  v("linear_num_k_heads", a.linear.num_k_heads);
  v("linear_num_v_heads", a.linear.num_v_heads);
  v("linear_head_k_dim", a.linear.head_k_dim);
  v("linear_head_v_dim", a.linear.head_v_dim);
  v("linear_conv_kernel", a.linear.conv_kernel);
  v("linear_chunk", a.linear.chunk);
  v("attention_output_gate", a.attention_output_gate);
  v("partial_rotary_factor", a.partial_rotary_factor);
  v("zero_centered_norms", a.zero_centered_norms);
}
// The objects within: "rope_scaling", "moe", "mla", "yarn" (null: none).
const char* const kObjectKeys[] = {"rope_scaling", "moe", "mla", "yarn"};

template <typename Y, typename V>
void visit_yarn(Y& y, V&& v) {
  v("factor", y.factor);
  v("beta_fast", y.beta_fast);
  v("beta_slow", y.beta_slow);
  v("original_seq_len", y.original_seq_len);
  v("truncate", y.truncate);
}

template <typename M, typename V>
void visit_moe(M& m, V&& v) {
  v("num_experts", m.num_experts);
  v("top_k", m.top_k);
  v("hidden_dim", m.hidden_dim);
  v("num_shared_experts", m.num_shared_experts);
  v("shared_expert_gate", m.shared_expert_gate);
  v("score_func", m.score_func);
  v("route_norm", m.route_norm);
  v("route_scale", m.route_scale);
  v("score_before_experts", m.score_before_experts);
  v("num_expert_groups", m.num_expert_groups);
  v("num_limited_groups", m.num_limited_groups);
  v("load_balance_coeff", m.load_balance_coeff);
  v("router_bias", m.router_bias);
  v("expert_biases", m.expert_biases);
  v("swiglu_limit", m.swiglu_limit);
  v("swiglu_alpha", m.swiglu_alpha);
}

template <typename M, typename V>
void visit_mla(M& m, V&& v) {
  v("q_lora_rank", m.q_lora_rank);
  v("kv_lora_rank", m.kv_lora_rank);
  v("qk_nope_head_dim", m.qk_nope_head_dim);
  v("qk_rope_head_dim", m.qk_rope_head_dim);
  v("v_head_dim", m.v_head_dim);
  v("latent_norm_eps", m.norm_eps);
  v("mscale", m.mscale);
  v("rope_factor", m.yarn.factor);
  v("beta_fast", m.yarn.beta_fast);
  v("beta_slow", m.yarn.beta_slow);
  v("original_seq_len", m.yarn.original_seq_len);
}

template <typename R, typename V>
void visit_rope_scaling(R& rs, V&& v) {
  v("scaling_factor", rs.scaling_factor);
  v("low_freq_factor", rs.low_freq_factor);
  v("high_freq_factor", rs.high_freq_factor);
  v("original_max_position_embeddings", rs.original_max_position_embeddings);
}

// The keys a visit names.
struct KeyList {
  std::vector<std::string> keys;
  template <typename T>
  void operator()(const char* key, const T&) {
    keys.emplace_back(key);
  }
};

// Writes each field as its JSON value.
struct JsonWriter {
  nlohmann::json& out;
  template <typename T>
  void operator()(const char* key, const T& value) {
    out[key] = value;
  }
  void operator()(const char* key, const MoEArgs::Score& score) {
    out[key] = score == MoEArgs::Score::kSigmoid ? "sigmoid" : "softmax";
  }
};

// Sets each field present in `in` (a JSON object at `where`), refusing values of another type.
struct JsonReader {
  const nlohmann::json& in;
  const std::string& where;
  template <typename T>
  void operator()(const char* key, T& field) {
    if (!in.contains(key)) return;
    const nlohmann::json& value = in.at(key);
    const std::string name = where + "." + key;
    if constexpr (std::is_same_v<T, bool>) {
      TITAN_CONFIG_CHECK(value.is_boolean(), name, " must be true or false, got ", value.dump());
      field = value.get<bool>();
    } else if constexpr (std::is_integral_v<T>) {
      TITAN_CONFIG_CHECK(value.is_number_integer(), name, " must be an integer, got ",
                         value.dump());
      field = value.get<T>();
    } else if constexpr (std::is_floating_point_v<T>) {
      TITAN_CONFIG_CHECK(value.is_number(), name, " must be a number, got ", value.dump());
      field = value.get<T>();
    } else {
      static_assert(std::is_same_v<T, MoEArgs::Score>);
      TITAN_CONFIG_CHECK(value.is_string(), name, " must be a string, got ", value.dump());
      field = parse_moe_score(value.get<std::string>());
    }
  }
};

// Refuses a key of `object` that `keys` does not hold, naming the nearest.
void check_keys(const nlohmann::json& object, const std::vector<std::string>& keys,
                const std::string& where) {
  for (const auto& item : object.items()) {
    TITAN_CONFIG_CHECK(std::find(keys.begin(), keys.end(), item.key()) != keys.end(),
                       "unknown key '", item.key(), "' in ", where,
                       suggestion(item.key(), keys, "keys"));
  }
}

// Reads the object `key` of `json` (at `where`) into `fields` through `visit`: null sets
// `none`, an object starts from `start` and applies its keys; absent, nothing changes.
template <typename T, typename Visit>
void read_object(const nlohmann::json& json, const char* key, const std::string& where, T& fields,
                 const Visit& visit, const std::function<void()>& none,
                 const std::function<void()>& start) {
  if (!json.contains(key)) return;
  const nlohmann::json& object = json[key];
  if (object.is_null()) {
    none();
    return;
  }
  const std::string sub = where + "." + key;
  TITAN_CONFIG_CHECK(object.is_object(), sub, " must be an object or null, got ", object.dump());
  KeyList keys;
  visit(fields, keys);
  check_keys(object, keys.keys, sub);
  start();
  visit(fields, JsonReader{object, sub});
}

// Applies the keys present in `json` to `args`.
void apply_args_json(const nlohmann::json& json, Llama3Args& args) {
  const std::string where = "llama3 args";
  TITAN_CONFIG_CHECK(json.is_object(), where, " must be a JSON object, got ", json.dump());
  KeyList keys;
  visit_scalars(args, keys);
  keys.keys.insert(keys.keys.end(), std::begin(kObjectKeys), std::end(kObjectKeys));
  check_keys(json, keys.keys, where);
  visit_scalars(args, JsonReader{json, where});
  const auto moe = [](auto& m, auto&& v) { visit_moe(m, v); };
  read_object(
      json, "moe", where, args.moe, moe, [&] { args.moe = Llama3Args::dense_moe(); },
      [&] {
        if (args.moe.num_experts == 0) args.moe = MoEArgs{};  // a dense flavor made MoE
      });
  TITAN_CONFIG_CHECK(!json.contains("moe") || json["moe"].is_null() || args.moe.num_experts >= 1,
                     where, ".moe.num_experts must be >= 1 (null \"moe\": a dense model)");
  const auto mla = [](auto& m, auto&& v) { visit_mla(m, v); };
  read_object(
      json, "mla", where, args.mla, mla, [&] { args.mla = MlaArgs{}; },
      [&] {
        if (!args.mla.enabled()) args.mla.kv_lora_rank = 512;  // GQA made MLA: DeepSeek's size
      });
  TITAN_CONFIG_CHECK(!json.contains("mla") || json["mla"].is_null() || args.mla.kv_lora_rank >= 1,
                     where, ".mla.kv_lora_rank must be >= 1 (null \"mla\": no latent attention)");
  const auto yarn = [](auto& y, auto&& v) { visit_yarn(y, v); };
  read_object(
      json, "yarn", where, args.yarn, yarn, [&] { args.yarn = YarnScaling{}; }, [] {});
  const auto scaling = [](auto& r, auto&& v) { visit_rope_scaling(r, v); };
  read_object(
      json, "rope_scaling", where, args.rope_scaling, scaling,
      [&] { args.use_rope_scaling = false; }, [] {});
  TITAN_CONFIG_CHECK(args.n_kv_heads >= 0 && args.ffn_dim >= 0 && args.max_seq_len > 0 &&
                         args.norm_eps > 0 && args.rope_theta > 0,
                     where,
                     ": n_kv_heads and ffn_dim must be >= 0; max_seq_len, norm_eps and "
                     "rope_theta > 0 (got ",
                     args_to_json(args).dump(), ")");
}

nlohmann::json moe_json(const Llama3Args& args) {
  if (!args.has_moe()) return nullptr;
  nlohmann::json out = nlohmann::json::object();
  visit_moe(args.moe, JsonWriter{out});
  return out;
}

nlohmann::json mla_json(const Llama3Args& args) {
  if (!args.mla.enabled()) return nullptr;
  nlohmann::json out = nlohmann::json::object();
  visit_mla(args.mla, JsonWriter{out});
  return out;
}

nlohmann::json yarn_json(const Llama3Args& args) {
  if (!args.yarn.enabled()) return nullptr;
  nlohmann::json out = nlohmann::json::object();
  visit_yarn(args.yarn, JsonWriter{out});
  return out;
}

nlohmann::json rope_scaling_json(const RopeScaling& rs) {
  nlohmann::json out = nlohmann::json::object();
  visit_rope_scaling(rs, JsonWriter{out});
  return out;
}

}  // namespace

Llama3Args args_from_description(const nlohmann::json& model, const Family& family) {
  if (!model.is_object() || !model.contains("flavor") || !model["flavor"].is_string()) {
    throw ConfigError(
        message(family.name, " model description ", model.dump(), " has no \"flavor\""));
  }
  const std::string flavor = model["flavor"].get<std::string>();
  const auto names = family.flavor_names();
  const bool registered = std::find(names.begin(), names.end(), flavor) != names.end();
  const bool has_args = model.contains("args");
  if (!registered && !has_args) {
    check_flavor(family.name, names, flavor);  // throws, naming the nearest flavor
  }
  Llama3Args args = registered ? args_for_flavor(flavor, family) : Llama3Args{};
  if (has_args) {
    apply_args_json(model["args"], args);
  }
  args.validate();
  return args;
}

nlohmann::json args_to_json(const Llama3Args& args) {
  nlohmann::json out = nlohmann::json::object();
  visit_scalars(args, JsonWriter{out});
  out["rope_scaling"] = rope_scaling_json(args.rope_scaling);
  out["moe"] = moe_json(args);
  out["mla"] = mla_json(args);
  out["yarn"] = yarn_json(args);
  return out;
}

nlohmann::json resolved_args(const Llama3Args& args) {
  nlohmann::json resolved = {
      {"dim", args.dim},
      {"n_layers", args.n_layers},
      {"n_heads", args.n_heads},
      {"n_kv_heads", args.kv_heads()},
      {"vocab_size", args.vocab_size},
      {"ffn_dim", args.ffn_hidden_dim()},
      {"norm_eps", args.norm_eps},
      {"rope_theta", args.rope_theta},
      {"rope_scaling",
       args.use_rope_scaling ? rope_scaling_json(args.rope_scaling) : nlohmann::json(nullptr)},
      {"tie_embeddings", args.tie_embeddings},
      {"head_dim", args.head_dim()},
      {"qk_norm", args.qk_norm}};
  // Dense models: no MoE keys (they would only say "none").
  if (args.has_moe()) {
    resolved["moe"] = moe_json(args);
    resolved["n_dense_layers"] = args.n_dense_layers;
  }
  // gpt-oss's attention: only when used (the other models' resolved arguments stay as they were).
  if (args.attention_bias) resolved["attention_bias"] = true;
  if (args.attention_sinks) resolved["attention_sinks"] = true;
  if (args.sliding_window > 0) {
    resolved["sliding_window"] = args.sliding_window;
    resolved["global_attention_every"] = args.global_attention_every;
  }
  // Llama 4's: only when used.
  if (args.has_moe() && args.interleave_moe_layer_step > 1) {
    resolved["interleave_moe_layer_step"] = args.interleave_moe_layer_step;
  }
  if (args.nope_every > 0) {
    resolved["nope_every"] = args.nope_every;
    if (args.attn_temperature_floor > 0) {
      resolved["attn_temperature_floor"] = args.attn_temperature_floor;
      resolved["attn_temperature_scale"] = args.attn_temperature_scale;
    }
  }
  if (args.attention_chunk_size > 0) resolved["attention_chunk_size"] = args.attention_chunk_size;
  if (args.qk_l2_norm) resolved["qk_l2_norm"] = true;
  if (args.num_mtp_layers > 0) resolved["num_mtp_layers"] = args.num_mtp_layers;
  // Qwen3-Next's: only when used.
  if (args.full_attention_interval > 0) {
    resolved["full_attention_interval"] = args.full_attention_interval;
    resolved["linear"] = {{"num_k_heads", args.linear.num_k_heads},
                          {"num_v_heads", args.linear.num_v_heads},
                          {"head_k_dim", args.linear.head_k_dim},
                          {"head_v_dim", args.linear.head_v_dim},
                          {"conv_kernel", args.linear.conv_kernel}};
  }
  if (args.attention_output_gate) resolved["attention_output_gate"] = true;
  if (args.partial_rotary_factor != 1.0) resolved["rope_dim"] = args.rope_dim();
  if (args.zero_centered_norms) resolved["zero_centered_norms"] = true;
  if (args.yarn.enabled()) {
    resolved["yarn"] = yarn_json(args);
    resolved["rope_scaling"] = nullptr;  // YaRN replaces the Llama 3.1 scaling
  }
  // MLA: its own head sizes and RoPE (GQA's keys would only describe unused fields).
  if (args.mla.enabled()) {
    resolved["mla"] = mla_json(args);
    for (const char* unused : {"n_kv_heads", "head_dim", "qk_norm", "rope_scaling"}) {
      resolved.erase(unused);
    }
  }
  return resolved;
}

nlohmann::json describe_args(const Llama3Args& args, const Family& family) {
  const nlohmann::json resolved = resolved_args(args);
  for (const auto& [name, flavor_args] : *family.flavors) {
    if (resolved_args(flavor_args) == resolved) {
      nlohmann::json model = {{"name", family.name}, {"flavor", name}};
      if (flavor_args.max_seq_len != args.max_seq_len) {
        model["args"] = {{"max_seq_len", args.max_seq_len}};
      }
      return model;
    }
  }
  return {{"name", family.name}, {"flavor", "custom"}, {"args", args_to_json(args)}};
}

}  // namespace titan::llama3
