// Llama 3 flavors and analytic sizes (see args.h).
#include "titan/models/llama3/args.h"

#include "titan/common/check.h"
#include "titan/models/common/attention.h"
#include "titan/models/common/linear.h"
#include "titan/models/registry.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <iterator>
#include <sstream>
#include <type_traits>

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
      throw ConfigError(message("llama3: ", b.name, " = ", b.value,
                                " is out of range (want at most ", b.limit,
                                ", and > 0; n_kv_heads and ffn_dim may be 0: derived)"));
    }
  }
  if (!std::isfinite(ffn_dim_multiplier) || ffn_dim_multiplier > 1000.0) {
    throw ConfigError(message("llama3: ffn_dim_multiplier = ", ffn_dim_multiplier,
                              " is out of range (want <= 1000; <= 0 means none)"));
  }
  if (head_dim_override < 0 || head_dim_override > kMaxWidth || n_dense_layers < 0 ||
      n_dense_layers > n_layers) {
    throw ConfigError(message("llama3: head_dim = ", head_dim_override,
                              " (0: dim / n_heads) and n_dense_layers = ", n_dense_layers,
                              " must be in range (n_dense_layers at most n_layers = ", n_layers,
                              ")"));
  }
  if (mla.enabled()) {
    mla.validate();  // heads of their own sizes: dim / n_heads and head_dim do not apply
  } else if (head_dim_override > 0) {
    if (head_dim_override % 2 != 0) {
      throw ConfigError(
          message("llama3: head_dim ", head_dim_override, " must be even (RoPE rotates pairs)"));
    }
  } else if (dim % n_heads != 0 || head_dim() % 2 != 0) {
    std::ostringstream os;
    os << "llama3: dim (" << dim << ") must be divisible by n_heads (" << n_heads
       << ") into an even head_dim (RoPE rotates pairs)";
    throw ConfigError(os.str());
  }
  if (has_moe()) moe.validate();
  if (sliding_window < 0 || sliding_window > (int64_t{1} << 31) || global_attention_every < 0 ||
      global_attention_every > n_layers) {
    throw ConfigError(message("llama3: sliding_window = ", sliding_window,
                              " (0: none) and global_attention_every = ", global_attention_every,
                              " (0: no global layer) must be in range (global_attention_every at "
                              "most n_layers = ",
                              n_layers, ")"));
  }
  if (interleave_moe_layer_step < 1 || interleave_moe_layer_step > std::max<int64_t>(1, n_layers) ||
      nope_every < 0 || nope_every > n_layers || attention_chunk_size < 0 ||
      attention_chunk_size > (int64_t{1} << 31) || attn_temperature_floor < 0 ||
      !std::isfinite(attn_temperature_scale)) {
    throw ConfigError(message(
        "llama3: interleave_moe_layer_step = ", interleave_moe_layer_step,
        " (1: every layer), nope_every = ", nope_every, " (0: none), attention_chunk_size = ",
        attention_chunk_size, " (0: none) and attn_temperature_floor = ", attn_temperature_floor,
        " (0: none) must be in range (the steps at most n_layers = ", n_layers, ")"));
  }
  if (full_attention_interval < 0 || full_attention_interval > std::max<int64_t>(1, n_layers)) {
    throw ConfigError(message("llama3: full_attention_interval = ", full_attention_interval,
                              " (0: no linear attention) must be at most n_layers = ", n_layers));
  }
  if (full_attention_interval > 0) linear.validate();
  if (!(partial_rotary_factor > 0 && partial_rotary_factor <= 1) || rope_dim() % 2 != 0 ||
      rope_dim() < 2) {
    throw ConfigError(message("llama3: partial_rotary_factor = ", partial_rotary_factor,
                              " must be in (0, 1] and give an even number of rotated dimensions "
                              "(head_dim ",
                              head_dim(), " x ", partial_rotary_factor, " = ",
                              static_cast<double>(head_dim()) * partial_rotary_factor, ")"));
  }
  if ((attention_output_gate || partial_rotary_factor != 1.0) &&
      (mla.enabled() || attention_bias || attention_sinks)) {
    throw ConfigError(
        "llama3: Qwen3-Next's gated attention and partial RoPE do not combine with MLA, attention "
        "biases or sinks");
  }
  if (num_mtp_layers < 0 || num_mtp_layers > 16) {
    throw ConfigError(message("llama3: num_mtp_layers = ", num_mtp_layers,
                              " is out of range (0: none, at most 16 prediction depths)"));
  }
  if ((nope_every > 0 || attention_chunk_size > 0 || qk_l2_norm || attn_temperature_floor > 0) &&
      (mla.enabled() || sliding_window > 0 || attention_sinks || qk_norm)) {
    throw ConfigError(
        "llama3: Llama 4's attention (nope_every, attention_chunk_size, qk_l2_norm, "
        "attn_temperature_floor) does not combine with MLA, sliding windows, sinks or the "
        "weighted qk_norm. HINT: use one model's attention");
  }
  if (yarn.enabled()) {
    if (mla.enabled()) {
      throw ConfigError(
          "llama3: \"yarn\" scales grouped-query attention's RoPE; multi-head latent attention "
          "has its own (mla.rope_factor). HINT: set one of them");
    }
    if (!(yarn.beta_fast > 0) || !(yarn.beta_slow > 0) || yarn.original_seq_len <= 0 ||
        yarn.factor > 1e6) {
      throw ConfigError(message(
          "llama3: yarn needs beta_fast, beta_slow, original_seq_len > 0 "
          "and factor at most 1e6, got ",
          yarn.beta_fast, ", ", yarn.beta_slow, ", ", yarn.original_seq_len, ", ", yarn.factor));
    }
  }
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
      // debugmodel at half the width (1.8M parameters, a third of its FLOPs per token): the
      // multi-process tests' model, where every layout must reproduce one process's curve.
      {"debugmodel_narrow", make_args(128, 6, 16, 0, 2048, 128, 0.0, false)},
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

std::vector<std::string> Family::flavor_names() const {
  std::vector<std::string> names;
  for (const auto& [name, args] : *flavors) names.push_back(name);
  return names;
}

Llama3Args args_for_flavor(const std::string& flavor, const Family& family) {
  for (const auto& [name, args] : *family.flavors) {
    if (name == flavor) {
      return args;
    }
  }
  check_flavor(family.name, family.flavor_names(), flavor);  // throws, naming the nearest flavor
  throw ConfigError(message("unknown ", family.name, " flavor '", flavor, "'"));
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

  const int64_t attention_params =
      mla ? args.mla.params(dim, args.n_heads)
          : dim * args.n_heads * head_dim * 2 + dim * n_kv * head_dim * 2 +
                (args.qk_norm ? 2 * head_dim : 0) +
                (args.attention_bias ? (args.n_heads + 2 * n_kv) * head_dim + dim : 0) +
                (args.attention_sinks ? args.n_heads : 0) +
                (args.attention_output_gate ? dim * args.n_heads * head_dim : 0);
  const int64_t ffn_params = 3 * dim * ffn;
  const int64_t layer_params = attention_params + ffn_params + 2 * dim;
  // An MoE block: the router, every expert, the shared experts; a token uses top_k experts.
  const MoEArgs& moe = args.moe;
  const int64_t expert_params =
      3 * dim * moe.hidden_dim + (moe.expert_biases ? 2 * moe.hidden_dim + dim : 0);
  const int64_t moe_common =
      attention_params + 2 * dim + moe.num_experts * dim + (moe.router_bias ? moe.num_experts : 0) +
      moe.num_shared_experts * 3 * dim * moe.hidden_dim + (moe.shared_expert_gate ? dim : 0);
  const int64_t moe_layer_params = moe_common + moe.num_experts * expert_params;
  const int64_t moe_layer_active = moe_common + moe.top_k * expert_params;
  const int64_t n_moe = args.n_moe_layers();
  const int64_t n_dense = args.n_layers - n_moe;

  ModelStats stats;
  stats.n_embedding_params = vocab * dim;
  const int64_t outside = stats.n_embedding_params + dim + (args.tie_embeddings ? 0 : vocab * dim);
  stats.n_params = outside + n_dense * layer_params + n_moe * moe_layer_params;
  stats.n_active_params = outside + n_dense * layer_params + n_moe * moe_layer_active;
  // Multi-token prediction: per depth a block, eh_proj and three norms (the embedding and head
  // are the model's).
  int64_t n_mtp_moe = 0;
  for (int64_t depth = 1; depth <= args.num_mtp_layers; ++depth) {
    const bool moe_block = args.is_moe_layer(args.mtp_layer_id(depth));
    n_mtp_moe += moe_block;
    const int64_t own = 2 * dim * dim + 3 * dim;
    stats.n_params += own + (moe_block ? moe_layer_params : layer_params);
    stats.n_active_params += own + (moe_block ? moe_layer_active : layer_params);
  }
  stats.n_mtp_layers = args.num_mtp_layers;
  // Qwen3-Next: the linear-attention layers hold Gated DeltaNet in place of attention.
  if (args.full_attention_interval > 0) {
    const int64_t swap =
        args.n_linear_attention_layers() * (args.linear.params(dim) - attention_params);
    stats.n_params += swap;
    stats.n_active_params += swap;
  }
  stats.n_layers = args.n_layers;
  stats.n_heads = args.n_heads;
  // flops_per_token counts 12 * head_dim FLOPs per head and key position: scores and weighted
  // sum. MLA's are (nope + rope) and v_head_dim wide (TorchTitan: 6 * (qk + v)), their mean here.
  stats.head_dim = mla ? (args.mla.qk_head_dim() + args.mla.v_head_dim) / 2 : head_dim;
  stats.dim = dim;
  stats.vocab_size = vocab;
  // Sliding windows (gpt-oss) and chunks (Llama 4) bound the keys a query sees alike.
  for (int64_t i = 0; i < args.n_layers; ++i) {
    stats.n_window_layers += args.is_sliding_layer(i) || args.layer_attention_chunk(i) > 0;
  }
  stats.attention_window =
      args.sliding_window > 0 ? args.sliding_window : args.attention_chunk_size;
  // Linear attention (Qwen3-Next) costs per token about what attention over one chunk does.
  if (args.full_attention_interval > 0) {
    stats.n_window_layers += args.n_linear_attention_layers();
    stats.attention_window = args.linear.chunk;
  }

  const bool reduced = is_reduced_float(compute_dtype);
  const int64_t c = reduced ? dtype_bytes(compute_dtype) : 4;
  const int64_t r = dtype_bytes(residual_dtype(reduced ? compute_dtype : at::kFloat));
  const int64_t tokens = batch * seq_len;
  int64_t attention_stats = 4 * batch * args.n_heads * seq_len;
  if (!mla && (args.attention_sinks || args.sliding_window > 0 || args.yarn.enabled() ||
               args.attention_chunk_size > 0)) {
    // gpt-oss's and Llama 4's chunked attention keep their float32 probabilities (and their copy
    // in a 16-bit compute dtype) instead of log-sum-exp statistics: the layers' mean (a Llama 4
    // NoPE layer runs the plain kernel: its log-sum-exp).
    int64_t kept = 0;
    for (int64_t i = 0; i < args.n_layers; ++i) {
      const bool own = args.attention_sinks || args.is_sliding_layer(i) || args.yarn.enabled() ||
                       args.layer_attention_chunk(i) > 0;
      kept +=
          own ? sink_window_kept_scores(seq_len, args.is_sliding_layer(i) ? args.sliding_window : 0,
                                        args.attention_sinks, args.layer_attention_chunk(i)) *
                    (4 + (reduced ? c : 0))
              : 4 * seq_len;
    }
    attention_stats = batch * args.n_heads * (kept / args.n_layers);  // kept is in bytes
  }
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
  // Each multi-token prediction depth: its block, the [embedding, hidden state] input and its
  // projection, and the head's float32 logits and their gradient again.
  const int64_t n_mtp_dense = args.num_mtp_layers - n_mtp_moe;
  stats.activation_bytes += n_mtp_dense * per_layer + n_mtp_moe * moe_per_layer +
                            args.num_mtp_layers * (3 * r * tokens * dim + c * tokens * dim +
                                                   2 * 4 * tokens * vocab + 8 * tokens);
  // The mean block (dense and MoE blocks differ; Llama 4 interleaves them, DeepSeek-V3 starts
  // with dense ones).
  stats.block_activation_bytes = (n_dense * per_layer + n_moe * moe_per_layer) / args.n_layers;
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
  if (args.attention_output_gate) os << ", gated attention";
  if (args.partial_rotary_factor != 1.0) os << ", RoPE on " << args.rope_dim() << " dims";
  if (args.full_attention_interval > 0) {
    const GatedDeltaNetArgs& l = args.linear;
    os << ", linear attention (Gated DeltaNet " << l.num_k_heads << " key x " << l.head_k_dim
       << " / " << l.num_v_heads << " value x " << l.head_v_dim << " heads) but every "
       << args.full_attention_interval << "th layer";
  }
  if (args.zero_centered_norms) os << ", zero-centred norms";
  if (args.attention_bias) os << ", attention biases";
  if (args.attention_sinks) os << ", sinks";
  if (args.sliding_window > 0) {
    os << ", sliding window " << args.sliding_window;
    if (args.global_attention_every > 0)
      os << " (global every " << args.global_attention_every << ")";
  }
  if (args.yarn.enabled()) os << ", YaRN x" << args.yarn.factor;
  if (args.nope_every > 0) os << ", NoPE every " << args.nope_every;
  if (args.attention_chunk_size > 0) os << ", chunked attention " << args.attention_chunk_size;
  if (args.qk_l2_norm) os << ", qk L2 norm";
  if (!args.has_moe() || args.n_dense_layers > 0 || args.interleave_moe_layer_step > 1) {
    os << ", ffn " << args.ffn_hidden_dim();
  }
  if (args.has_moe()) {
    os << ", MoE " << args.moe.num_experts << " experts top-" << args.moe.top_k << " of ffn "
       << args.moe.hidden_dim;
    if (args.moe.num_shared_experts > 0) {
      os << " + " << args.moe.num_shared_experts << (args.moe.shared_expert_gate ? " gated" : "")
         << " shared";
    }
    if (args.n_dense_layers > 0) os << " after " << args.n_dense_layers << " dense layers";
    if (args.interleave_moe_layer_step > 1)
      os << " every " << args.interleave_moe_layer_step << " layers";
  }
  os << ", vocab " << args.vocab_size;
  if (args.tie_embeddings) {
    os << ", tied embeddings";
  }
  if (args.num_mtp_layers > 0) {
    os << ", " << args.num_mtp_layers << " multi-token prediction layer"
       << (args.num_mtp_layers > 1 ? "s" : "");
  }
  return os.str();
}

}  // namespace titan::llama3
