// Llama 3 flavors and analytic sizes (see args.h).
#include "titan/models/llama3/args.h"

#include "titan/common/check.h"
#include "titan/models/common/attention.h"
#include "titan/models/common/linear.h"
#include "titan/models/registry.h"

#include <algorithm>
#include <cmath>
#include <sstream>

namespace titan::llama3 {
namespace {

Llama3Args make_args(int64_t dim, int64_t n_layers, int64_t n_heads, int64_t n_kv_heads,
                     int64_t vocab_size, int64_t multiple_of, double ffn_dim_multiplier,
                     bool tie_embeddings) {
  Llama3Args args;
  args.dim = dim;
  args.n_layers = n_layers;
  args.n_heads = n_heads;
  args.n_kv_heads = n_kv_heads;
  args.vocab_size = vocab_size;
  args.multiple_of = multiple_of;
  args.ffn_dim_multiplier = ffn_dim_multiplier;
  args.rope_theta = 500000.0;
  args.tie_embeddings = tie_embeddings;
  return args;
}

int64_t dtype_bytes(at::ScalarType dtype) { return static_cast<int64_t>(c10::elementSize(dtype)); }

std::vector<std::string> flavor_names(const Family& family) {
  std::vector<std::string> names;
  for (const auto& [name, args] : *family.flavors) {
    names.push_back(name);
  }
  return names;
}

}  // namespace

int64_t Llama3Args::ffn_hidden_dim() const {
  if (ffn_dim > 0) {
    return ffn_dim;
  }
  int64_t hidden = 2 * (4 * dim) / 3;  // int(2 * hidden_dim / 3) with hidden_dim = 4 * dim
  if (ffn_dim_multiplier > 0) {
    hidden = static_cast<int64_t>(ffn_dim_multiplier * static_cast<double>(hidden));
  }
  return multiple_of * ((hidden + multiple_of - 1) / multiple_of);
}

void Llama3Args::validate() const {
  if (dim <= 0 || n_layers <= 0 || n_heads <= 0 || vocab_size <= 0 || multiple_of <= 0) {
    throw ConfigError("llama3: dim, n_layers, n_heads, vocab_size and multiple_of must be > 0");
  }
  // Far above any real model (Llama 3 405B: dim 16384, ffn 53248, 126 layers, vocab 128256), and
  // low enough that the size arithmetic (ffn_hidden_dim, parameter counts) cannot overflow int64:
  // a config.json with hidden_size 2^62 used to overflow 4 * dim (found by tests/fuzz).
  constexpr int64_t kMaxWidth = int64_t{1} << 24;
  struct Bound {
    const char* name;
    int64_t value;
    int64_t limit;
  };
  const Bound bounds[] = {{"dim", dim, kMaxWidth},
                          {"n_heads", n_heads, kMaxWidth},
                          {"n_kv_heads", n_kv_heads, kMaxWidth},
                          {"ffn_dim", ffn_dim, kMaxWidth},
                          {"multiple_of", multiple_of, kMaxWidth},
                          {"n_layers", n_layers, int64_t{1} << 16},
                          {"vocab_size", vocab_size, int64_t{1} << 31},
                          {"max_seq_len", max_seq_len, int64_t{1} << 31}};
  for (const Bound& b : bounds) {
    if (b.value < 0 || b.value > b.limit) {
      throw ConfigError("llama3: " + std::string(b.name) + " = " + std::to_string(b.value) +
                        " is out of range (want at most " + std::to_string(b.limit) +
                        ", and > 0; n_kv_heads and ffn_dim may be 0: derived)");
    }
  }
  if (!std::isfinite(ffn_dim_multiplier) || ffn_dim_multiplier > 1000.0) {
    throw ConfigError("llama3: ffn_dim_multiplier = " + std::to_string(ffn_dim_multiplier) +
                      " is out of range (want <= 1000; <= 0 means none)");
  }
  if (head_dim_override < 0 || head_dim_override > kMaxWidth || n_dense_layers < 0 ||
      n_dense_layers > n_layers) {
    throw ConfigError(
        "llama3: head_dim = " + std::to_string(head_dim_override) +
        " (0: dim / n_heads) and n_dense_layers = " + std::to_string(n_dense_layers) +
        " must be in range (n_dense_layers at most n_layers = " + std::to_string(n_layers) + ")");
  }
  if (mla.enabled()) {
    mla.validate();  // heads of their own sizes: dim / n_heads and head_dim do not apply
  } else if (head_dim_override > 0) {
    if (head_dim_override % 2 != 0) {
      throw ConfigError("llama3: head_dim " + std::to_string(head_dim_override) +
                        " must be even (RoPE rotates pairs)");
    }
  } else if (dim % n_heads != 0 || head_dim() % 2 != 0) {
    std::ostringstream os;
    os << "llama3: dim (" << dim << ") must be divisible by n_heads (" << n_heads
       << ") into an even head_dim (RoPE rotates pairs)";
    throw ConfigError(os.str());
  }
  if (has_moe()) moe.validate();
  if (n_heads % kv_heads() != 0) {
    std::ostringstream os;
    os << "llama3: n_kv_heads (" << kv_heads() << ") must divide n_heads (" << n_heads << ")";
    throw ConfigError(os.str());
  }
}

const std::vector<std::pair<std::string, Llama3Args>>& flavors() {
  // (dim, n_layers, n_heads, n_kv_heads, vocab_size, multiple_of, ffn_dim_multiplier, tied)
  static const std::vector<std::pair<std::string, Llama3Args>> kFlavors = {
      // For unit tests: a few milliseconds per step.
      {"tiny", make_args(64, 2, 4, 2, 300, 32, 0.0, false)},
      {"debugmodel", make_args(256, 6, 16, 0, 2048, 256, 0.0, false)},
      // CPU benchmark sizes.
      {"bench_small", make_args(256, 6, 8, 4, 8192, 256, 0.0, false)},
      {"bench_medium", make_args(512, 8, 8, 8, 32000, 256, 0.0, false)},
      {"1B", make_args(2048, 16, 32, 8, 128256, 256, 1.5, true)},
      {"3B", make_args(3072, 28, 24, 8, 128256, 256, 1.0, true)},
      // 8B's widths (dim, heads, ffn 14336, vocab) with 8 of its 32 layers: bf16 training with
      // AdamW at seq_len 8192 fits one GPU (69 GiB by `titan inspect`), so gpu_check.sh can time
      // 8B-shaped matmuls and attention on one device.
      {"8B_cut", make_args(4096, 8, 32, 8, 128256, 1024, 1.3, false)},
      {"8B", make_args(4096, 32, 32, 8, 128256, 1024, 1.3, false)},
      {"70B", make_args(8192, 80, 64, 8, 128256, 4096, 1.3, false)},
      {"405B", make_args(16384, 126, 128, 8, 128256, 4096, 1.2, false)},
  };
  return kFlavors;
}

const Family& llama3_family() {
  static const Family kFamily{"llama3", &flavors()};
  return kFamily;
}

Llama3Args args_for_flavor(const std::string& flavor, const Family& family) {
  for (const auto& [name, args] : *family.flavors) {
    if (name == flavor) {
      return args;
    }
  }
  check_flavor(family.name, flavor_names(family), flavor);  // throws, naming the nearest flavor
  throw ConfigError("unknown " + family.name + " flavor '" + flavor + "'");
}

at::ScalarType residual_dtype(at::ScalarType compute_dtype) {
  // Under bf16 compute the residual stream is bf16 too, as in TorchTitan's FSDP mixed precision.
  // Measured on the 2-core CPU (bench_small and bench_medium, alternating steps in one process):
  // a float32 residual stream was no faster (within 1-2%), gave the same loss to 4 digits, and
  // keeps twice the bytes per residual activation.
  return is_reduced_float(compute_dtype) ? compute_dtype : at::kFloat;
}

// Activation memory: the tensors autograd keeps for backward, for T = batch * seq_len tokens,
// with c = bytes of the compute dtype, r = bytes of the residual stream (c under bf16, else 4),
// and the fused attention kernel's float32 log-sum-exp per (sequence, head, position):
//   per layer:
//     2 RMSNorms            2 * (r * T * dim + 4 * T)                 input and 1/rms
//     norm outputs          2 * c * T * dim                           inputs of wq/wk/wv, w1/w3
//     q, k, v               c * T * (n_heads + 2 * n_kv_heads) * head_dim
//     attention statistics  4 * batch * n_heads * seq_len             log-sum-exp, float32
//     attention output      c * T * dim                               input of wo
//     SwiGLU                4 * c * T * ffn_hidden                    w1 out, silu, w3 out, product
//     weight copies         c * params_per_layer when c < 4           cast weights kept for grads
//   final norm + head:      r * T * dim + 4 * T + c * T * dim (+ c * vocab * dim when c < 4)
//   logits + log-softmax    2 * 4 * T * vocab                         float32 for the loss
//   token ids               8 * T
ModelStats compute_stats(const Llama3Args& args, int64_t batch, int64_t seq_len,
                         at::ScalarType compute_dtype) {
  const int64_t dim = args.dim;
  const bool mla = args.mla.enabled();
  // MLA: q, k and v of every head are padded to one size (mla.h), which the terms below count.
  const int64_t head_dim =
      mla ? std::max(args.mla.qk_head_dim(), args.mla.v_head_dim) : args.head_dim();
  const int64_t n_kv = mla ? args.n_heads : args.kv_heads();
  const int64_t ffn = args.ffn_hidden_dim();
  const int64_t vocab = args.vocab_size;

  const int64_t attention_params = mla ? args.mla.params(dim, args.n_heads)
                                       : dim * args.n_heads * head_dim * 2 +
                                             dim * n_kv * head_dim * 2 +
                                             (args.qk_norm ? 2 * head_dim : 0);
  const int64_t ffn_params = 3 * dim * ffn;
  const int64_t layer_params = attention_params + ffn_params + 2 * dim;
  // An MoE block: the router, every expert, the shared experts; a token uses top_k experts.
  const MoEArgs& moe = args.moe;
  const int64_t expert_params = 3 * dim * moe.hidden_dim;
  const int64_t moe_common =
      attention_params + 2 * dim + moe.num_experts * dim + moe.num_shared_experts * expert_params;
  const int64_t moe_layer_params = moe_common + moe.num_experts * expert_params;
  const int64_t moe_layer_active = moe_common + moe.top_k * expert_params;
  const int64_t n_moe = args.has_moe() ? args.n_layers - args.n_dense_layers : 0;
  const int64_t n_dense = args.n_layers - n_moe;

  ModelStats stats;
  stats.n_embedding_params = vocab * dim;
  const int64_t outside = stats.n_embedding_params + dim + (args.tie_embeddings ? 0 : vocab * dim);
  stats.n_params = outside + n_dense * layer_params + n_moe * moe_layer_params;
  stats.n_active_params = outside + n_dense * layer_params + n_moe * moe_layer_active;
  stats.n_layers = args.n_layers;
  stats.n_heads = args.n_heads;
  // flops_per_token counts 12 * head_dim FLOPs per head and key position: scores and weighted
  // sum. MLA's are (nope + rope) and v_head_dim wide (TorchTitan: 6 * (qk + v)), their mean here.
  stats.head_dim = mla ? (args.mla.qk_head_dim() + args.mla.v_head_dim) / 2 : head_dim;
  stats.dim = dim;
  stats.vocab_size = vocab;

  const bool reduced = is_reduced_float(compute_dtype);
  const int64_t c = reduced ? dtype_bytes(compute_dtype) : 4;
  const int64_t r = dtype_bytes(residual_dtype(reduced ? compute_dtype : at::kFloat));
  const int64_t tokens = batch * seq_len;
  const int64_t attention_stats = 4 * batch * args.n_heads * seq_len;
  // MLA also keeps its latents: the q latent and its norm, the kv latent and its norm, wkv_b's
  // output, and the attention output before the padding is cut off.
  const int64_t mla_latents =
      mla ? c * tokens *
                (2 * args.mla.q_lora_rank + 2 * args.mla.kv_lora_rank + args.mla.qk_rope_head_dim +
                 args.n_heads * (args.mla.qk_nope_head_dim + args.mla.v_head_dim + head_dim))
          : 0;
  const int64_t attention_part = 2 * (r * tokens * dim + 4 * tokens) + 2 * c * tokens * dim +
                                 c * tokens * (args.n_heads + 2 * n_kv) * head_dim +
                                 attention_stats + c * tokens * dim + mla_latents;
  int64_t per_layer = attention_part + 4 * c * tokens * ffn;
  if (reduced) {
    per_layer += c * layer_params;
  }
  // An MoE block keeps, per (token, choice): the routed input, the SwiGLU's four hidden tensors
  // and the expert output; per token the float32 router scores; and the shared experts' SwiGLU.
  const int64_t routed = tokens * moe.top_k;
  int64_t moe_per_layer = attention_part + 2 * c * routed * dim + 4 * c * routed * moe.hidden_dim +
                          4 * tokens * moe.num_experts +
                          4 * c * tokens * moe.hidden_dim * moe.num_shared_experts;
  if (reduced) moe_per_layer += c * moe_layer_params;
  stats.activation_bytes = n_dense * per_layer + n_moe * moe_per_layer + r * tokens * dim +
                           4 * tokens + c * tokens * dim + (reduced ? c * vocab * dim : 0) +
                           2 * 4 * tokens * vocab + 8 * tokens;
  stats.block_activation_bytes = n_moe > 0 ? moe_per_layer : per_layer;
  stats.block_input_bytes = r * tokens * dim;
  // Selective "op" keeps the outputs of wq, wv, w1 and w2 (every second matmul) and of the
  // attention kernel (output and log-sum-exp), besides the block's input.
  stats.block_op_kept_bytes = stats.block_input_bytes + c * tokens * args.n_heads * head_dim +
                              c * tokens * n_kv * head_dim + c * tokens * ffn + c * tokens * dim +
                              c * tokens * args.n_heads * head_dim + attention_stats;
  return stats;
}

std::string describe(const Llama3Args& args) {
  std::ostringstream os;
  os << "dim " << args.dim << ", " << args.n_layers << " layers, " << args.n_heads << " heads, ";
  if (args.mla.enabled()) {
    const MlaArgs& m = args.mla;
    os << "MLA (";
    if (m.q_lora_rank > 0) os << "q rank " << m.q_lora_rank << ", ";
    os << "kv rank " << m.kv_lora_rank << ", qk " << m.qk_nope_head_dim << " + rope "
       << m.qk_rope_head_dim << ", v " << m.v_head_dim << ")";
    if (m.yarn.enabled()) os << ", YaRN x" << m.yarn.factor;
  } else {
    os << args.kv_heads() << " kv heads";
  }
  if (args.head_dim_override > 0 && !args.mla.enabled()) os << " of " << args.head_dim();
  if (args.qk_norm) os << ", qk norm";
  if (!args.has_moe() || args.n_dense_layers > 0) {
    os << ", ffn " << args.ffn_hidden_dim();
  }
  if (args.has_moe()) {
    os << ", MoE " << args.moe.num_experts << " experts top-" << args.moe.top_k << " of ffn "
       << args.moe.hidden_dim;
    if (args.moe.num_shared_experts > 0) os << " + " << args.moe.num_shared_experts << " shared";
    if (args.n_dense_layers > 0) os << " after " << args.n_dense_layers << " dense layers";
  }
  os << ", vocab " << args.vocab_size;
  if (args.tie_embeddings) {
    os << ", tied embeddings";
  }
  return os.str();
}

// ---- Model descriptions ---------------------------------------------------------------------

namespace {

const std::vector<std::string>& arg_keys() {
  static const std::vector<std::string> kKeys = {"dim",
                                                 "n_layers",
                                                 "n_heads",
                                                 "n_kv_heads",
                                                 "vocab_size",
                                                 "multiple_of",
                                                 "ffn_dim_multiplier",
                                                 "ffn_dim",
                                                 "norm_eps",
                                                 "rope_theta",
                                                 "use_rope_scaling",
                                                 "rope_scaling",
                                                 "depth_init",
                                                 "tie_embeddings",
                                                 "max_seq_len",
                                                 "head_dim",
                                                 "qk_norm",
                                                 "moe",
                                                 "n_dense_layers",
                                                 "mla"};
  return kKeys;
}

const std::vector<std::string>& moe_keys() {
  static const std::vector<std::string> kKeys = {"num_experts",       "top_k",
                                                 "hidden_dim",        "num_shared_experts",
                                                 "score_func",        "route_norm",
                                                 "route_scale",       "score_before_experts",
                                                 "num_expert_groups", "num_limited_groups",
                                                 "load_balance_coeff"};
  return kKeys;
}

const std::vector<std::string>& mla_keys() {
  static const std::vector<std::string> kKeys = {
      "q_lora_rank", "kv_lora_rank",    "qk_nope_head_dim", "qk_rope_head_dim",
      "v_head_dim",  "latent_norm_eps", "mscale",           "rope_factor",
      "beta_fast",   "beta_slow",       "original_seq_len"};
  return kKeys;
}

const std::vector<std::string>& rope_scaling_keys() {
  static const std::vector<std::string> kKeys = {
      "scaling_factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"};
  return kKeys;
}

void check_keys(const nlohmann::json& object, const std::vector<std::string>& keys,
                const std::string& where) {
  for (const auto& item : object.items()) {
    if (std::find(keys.begin(), keys.end(), item.key()) == keys.end()) {
      throw ConfigError("unknown key '" + item.key() + "' in " + where +
                        suggestion(item.key(), keys, "keys"));
    }
  }
}

int64_t get_int(const nlohmann::json& object, const std::string& key, const std::string& where) {
  const nlohmann::json& value = object.at(key);
  if (!value.is_number_integer()) {
    throw ConfigError(where + "." + key + " must be an integer, got " + value.dump());
  }
  return value.get<int64_t>();
}

double get_double(const nlohmann::json& object, const std::string& key, const std::string& where) {
  const nlohmann::json& value = object.at(key);
  if (!value.is_number()) {
    throw ConfigError(where + "." + key + " must be a number, got " + value.dump());
  }
  return value.get<double>();
}

bool get_bool(const nlohmann::json& object, const std::string& key, const std::string& where) {
  const nlohmann::json& value = object.at(key);
  if (!value.is_boolean()) {
    throw ConfigError(where + "." + key + " must be true or false, got " + value.dump());
  }
  return value.get<bool>();
}

// Applies the keys present in `json` to `args`.
void apply_args_json(const nlohmann::json& json, Llama3Args& args) {
  const std::string where = "llama3 args";
  if (!json.is_object()) {
    throw ConfigError(where + " must be a JSON object, got " + json.dump());
  }
  check_keys(json, arg_keys(), where);
  const auto set_int = [&](const char* key, int64_t& field) {
    if (json.contains(key)) field = get_int(json, key, where);
  };
  const auto set_double = [&](const char* key, double& field) {
    if (json.contains(key)) field = get_double(json, key, where);
  };
  const auto set_bool = [&](const char* key, bool& field) {
    if (json.contains(key)) field = get_bool(json, key, where);
  };
  set_int("dim", args.dim);
  set_int("n_layers", args.n_layers);
  set_int("n_heads", args.n_heads);
  set_int("n_kv_heads", args.n_kv_heads);
  set_int("vocab_size", args.vocab_size);
  set_int("multiple_of", args.multiple_of);
  set_double("ffn_dim_multiplier", args.ffn_dim_multiplier);
  set_int("ffn_dim", args.ffn_dim);
  set_double("norm_eps", args.norm_eps);
  set_double("rope_theta", args.rope_theta);
  set_bool("use_rope_scaling", args.use_rope_scaling);
  set_bool("depth_init", args.depth_init);
  set_bool("tie_embeddings", args.tie_embeddings);
  set_int("max_seq_len", args.max_seq_len);
  set_int("head_dim", args.head_dim_override);
  set_bool("qk_norm", args.qk_norm);
  set_int("n_dense_layers", args.n_dense_layers);
  if (json.contains("moe")) {
    const nlohmann::json& moe = json["moe"];
    if (moe.is_null()) {
      args.moe = Llama3Args::dense_moe();
    } else {
      const std::string sub = where + ".moe";
      if (!moe.is_object())
        throw ConfigError(sub + " must be an object or null, got " + moe.dump());
      check_keys(moe, moe_keys(), sub);
      MoEArgs& m = args.moe;
      if (m.num_experts == 0) m = MoEArgs{};  // a dense flavor made MoE: the defaults
      const auto moe_int = [&](const char* key, int64_t& field) {
        if (moe.contains(key)) field = get_int(moe, key, sub);
      };
      const auto moe_double = [&](const char* key, double& field) {
        if (moe.contains(key)) field = get_double(moe, key, sub);
      };
      const auto moe_bool = [&](const char* key, bool& field) {
        if (moe.contains(key)) field = get_bool(moe, key, sub);
      };
      moe_int("num_experts", m.num_experts);
      moe_int("top_k", m.top_k);
      moe_int("hidden_dim", m.hidden_dim);
      moe_int("num_shared_experts", m.num_shared_experts);
      moe_bool("route_norm", m.route_norm);
      moe_double("route_scale", m.route_scale);
      moe_bool("score_before_experts", m.score_before_experts);
      moe_int("num_expert_groups", m.num_expert_groups);
      moe_int("num_limited_groups", m.num_limited_groups);
      moe_double("load_balance_coeff", m.load_balance_coeff);
      if (moe.contains("score_func")) {
        if (!moe["score_func"].is_string()) {
          throw ConfigError(sub + ".score_func must be a string, got " + moe["score_func"].dump());
        }
        m.score_func = parse_moe_score(moe["score_func"].get<std::string>());
      }
      if (m.num_experts < 1) {
        throw ConfigError(sub + ".num_experts must be >= 1 (null \"moe\": a dense model)");
      }
    }
  }
  if (json.contains("mla")) {
    const nlohmann::json& mla = json["mla"];
    if (mla.is_null()) {
      args.mla = MlaArgs{};
    } else {
      const std::string sub = where + ".mla";
      if (!mla.is_object()) {
        throw ConfigError(sub + " must be an object or null, got " + mla.dump());
      }
      check_keys(mla, mla_keys(), sub);
      MlaArgs& m = args.mla;
      if (!m.enabled()) m.kv_lora_rank = 512;  // a GQA flavor made MLA: DeepSeek's latent size
      const auto mla_int = [&](const char* key, int64_t& field) {
        if (mla.contains(key)) field = get_int(mla, key, sub);
      };
      const auto mla_double = [&](const char* key, double& field) {
        if (mla.contains(key)) field = get_double(mla, key, sub);
      };
      mla_int("q_lora_rank", m.q_lora_rank);
      mla_int("kv_lora_rank", m.kv_lora_rank);
      mla_int("qk_nope_head_dim", m.qk_nope_head_dim);
      mla_int("qk_rope_head_dim", m.qk_rope_head_dim);
      mla_int("v_head_dim", m.v_head_dim);
      mla_double("latent_norm_eps", m.norm_eps);
      mla_double("mscale", m.mscale);
      mla_double("rope_factor", m.yarn.factor);
      mla_double("beta_fast", m.yarn.beta_fast);
      mla_double("beta_slow", m.yarn.beta_slow);
      mla_int("original_seq_len", m.yarn.original_seq_len);
      if (m.kv_lora_rank < 1) {
        throw ConfigError(sub + ".kv_lora_rank must be >= 1 (null \"mla\": no latent attention)");
      }
    }
  }
  if (json.contains("rope_scaling")) {
    const nlohmann::json& scaling = json["rope_scaling"];
    if (scaling.is_null()) {
      args.use_rope_scaling = false;
    } else {
      const std::string sub = where + ".rope_scaling";
      if (!scaling.is_object()) {
        throw ConfigError(sub + " must be an object or null, got " + scaling.dump());
      }
      check_keys(scaling, rope_scaling_keys(), sub);
      RopeScaling& rs = args.rope_scaling;
      if (scaling.contains("scaling_factor")) {
        rs.scaling_factor = get_double(scaling, "scaling_factor", sub);
      }
      if (scaling.contains("low_freq_factor")) {
        rs.low_freq_factor = get_double(scaling, "low_freq_factor", sub);
      }
      if (scaling.contains("high_freq_factor")) {
        rs.high_freq_factor = get_double(scaling, "high_freq_factor", sub);
      }
      if (scaling.contains("original_max_position_embeddings")) {
        rs.original_max_position_embeddings =
            get_int(scaling, "original_max_position_embeddings", sub);
      }
    }
  }
  if (args.n_kv_heads < 0 || args.ffn_dim < 0 || args.max_seq_len <= 0 || !(args.norm_eps > 0) ||
      !(args.rope_theta > 0)) {
    throw ConfigError(where + ": n_kv_heads and ffn_dim must be >= 0; max_seq_len, norm_eps and " +
                      "rope_theta > 0 (got " + args_to_json(args).dump() + ")");
  }
}

nlohmann::json moe_json(const Llama3Args& args) {
  if (!args.has_moe()) return nullptr;
  const MoEArgs& m = args.moe;
  return {{"num_experts", m.num_experts},
          {"top_k", m.top_k},
          {"hidden_dim", m.hidden_dim},
          {"num_shared_experts", m.num_shared_experts},
          {"score_func", m.score_func == MoEArgs::Score::kSigmoid ? "sigmoid" : "softmax"},
          {"route_norm", m.route_norm},
          {"route_scale", m.route_scale},
          {"score_before_experts", m.score_before_experts},
          {"num_expert_groups", m.num_expert_groups},
          {"num_limited_groups", m.num_limited_groups},
          {"load_balance_coeff", m.load_balance_coeff}};
}

nlohmann::json mla_json(const Llama3Args& args) {
  if (!args.mla.enabled()) return nullptr;
  const MlaArgs& m = args.mla;
  return {{"q_lora_rank", m.q_lora_rank},
          {"kv_lora_rank", m.kv_lora_rank},
          {"qk_nope_head_dim", m.qk_nope_head_dim},
          {"qk_rope_head_dim", m.qk_rope_head_dim},
          {"v_head_dim", m.v_head_dim},
          {"latent_norm_eps", m.norm_eps},
          {"mscale", m.mscale},
          {"rope_factor", m.yarn.factor},
          {"beta_fast", m.yarn.beta_fast},
          {"beta_slow", m.yarn.beta_slow},
          {"original_seq_len", m.yarn.original_seq_len}};
}

nlohmann::json rope_scaling_json(const RopeScaling& rs) {
  return {{"scaling_factor", rs.scaling_factor},
          {"low_freq_factor", rs.low_freq_factor},
          {"high_freq_factor", rs.high_freq_factor},
          {"original_max_position_embeddings", rs.original_max_position_embeddings}};
}

}  // namespace

Llama3Args args_from_description(const nlohmann::json& model, const Family& family) {
  if (!model.is_object() || !model.contains("flavor") || !model["flavor"].is_string()) {
    throw ConfigError(family.name + " model description " + model.dump() + " has no \"flavor\"");
  }
  const std::string flavor = model["flavor"].get<std::string>();
  const auto names = flavor_names(family);
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
  return {{"dim", args.dim},
          {"n_layers", args.n_layers},
          {"n_heads", args.n_heads},
          {"n_kv_heads", args.n_kv_heads},
          {"vocab_size", args.vocab_size},
          {"multiple_of", args.multiple_of},
          {"ffn_dim_multiplier", args.ffn_dim_multiplier},
          {"ffn_dim", args.ffn_dim},
          {"norm_eps", args.norm_eps},
          {"rope_theta", args.rope_theta},
          {"use_rope_scaling", args.use_rope_scaling},
          {"rope_scaling", rope_scaling_json(args.rope_scaling)},
          {"depth_init", args.depth_init},
          {"tie_embeddings", args.tie_embeddings},
          {"max_seq_len", args.max_seq_len},
          {"head_dim", args.head_dim_override},
          {"qk_norm", args.qk_norm},
          {"moe", moe_json(args)},
          {"n_dense_layers", args.n_dense_layers},
          {"mla", mla_json(args)}};
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
