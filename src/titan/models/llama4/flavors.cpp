// Llama 4's flavors (see spec.h), apart from the registry entry (spec.cpp) so that the Hugging
// Face reader and its fuzzer link without the modules.
#include "titan/models/llama4/spec.h"

namespace titan::llama4 {
namespace {

using llama3::Llama3Args;

// A Llama 4 model as TorchTitan's llama4 flavors give it: `dim`, `n_layers` layers of `n_heads`
// query heads and `n_kv_heads` kv heads (0: as many), `experts` routed experts (top-1, sigmoid of
// the chosen logit applied before the experts, one shared expert of the same size) in every
// `moe_step`-th layer, the dense SwiGLU and the experts' hidden sizes from multiple_of and
// ffn_dim_multiplier (TorchTitan's auto_scale_hidden_dim: the experts get the dense size over
// top_k + shared experts, rounded up to multiple_of), rope_theta 500000, rms_norm_eps 1e-5,
// untied embeddings, TorchTitan's auxiliary-loss-free balancing (load_balance_coeff 1e-3).
Llama3Args make(int64_t dim, int64_t n_layers, int64_t n_heads, int64_t n_kv_heads, int64_t vocab,
                int64_t multiple_of, double ffn_dim_multiplier, int64_t experts, int64_t moe_step,
                bool rope_scaling, int64_t max_seq_len) {
  Llama3Args a;
  a.dim = dim;
  a.n_layers = n_layers;
  a.n_heads = n_heads;
  a.n_kv_heads = n_kv_heads;
  a.vocab_size = vocab;
  a.multiple_of = multiple_of;
  a.ffn_dim_multiplier = ffn_dim_multiplier;
  a.norm_eps = 1e-5;
  a.rope_theta = 500000.0;
  // Llama 4's RoPE scaling (Scout's rope_scaling, TorchTitan's RoPEScalingArgs): factor 16 over
  // 8192 positions with equal low and high frequency factors (no blended band).
  a.use_rope_scaling = rope_scaling;
  a.rope_scaling.scaling_factor = 16.0;
  a.rope_scaling.low_freq_factor = 1.0;
  a.rope_scaling.high_freq_factor = 1.0;
  a.rope_scaling.original_max_position_embeddings = 8192;
  a.max_seq_len = max_seq_len;
  a.moe = MoEArgs{};
  a.moe.num_experts = experts;
  a.moe.top_k = 1;
  a.moe.num_shared_experts = 1;
  a.moe.score_func = MoEArgs::Score::kSigmoid;
  a.moe.route_norm = false;
  a.moe.score_before_experts = true;
  a.moe.load_balance_coeff = 1e-3;
  int64_t hidden = 2 * (4 * dim) / 3;
  if (ffn_dim_multiplier > 0) {
    hidden = static_cast<int64_t>(ffn_dim_multiplier * static_cast<double>(hidden));
  }
  hidden /= a.moe.top_k + a.moe.num_shared_experts;
  a.moe.hidden_dim = multiple_of * ((hidden + multiple_of - 1) / multiple_of);
  a.interleave_moe_layer_step = moe_step;
  return a;
}

// iRoPE as Meta's released models have it: no RoPE in layers 3, 7, ... (global attention,
// queries temperature-tuned from position `floor` on), the other layers attending within chunks
// of `chunk` positions, with the L2 qk norm when `qk_norm` (Scout has it, Maverick not); no
// balancing bias (balanced()).
Llama3Args irope(Llama3Args a, int64_t chunk, int64_t floor, bool qk_norm) {
  a.nope_every = 4;
  a.moe.load_balance_coeff = 0.0;  // see released()
  a.attention_chunk_size = chunk;
  a.attn_temperature_floor = floor;
  a.attn_temperature_scale = 0.1;
  a.qk_l2_norm = qk_norm;
  return a;
}

// The released models route by their router alone: Hugging Face's Llama 4 has no place for a
// balancing bias, so fine-tuning them (and the Hugging Face tests' tiny flavor) keeps none.
// TorchTitan's flavors, trained from scratch, and debugmodel_irope balance as TorchTitan does.
Llama3Args balanced(Llama3Args a) {
  a.moe.load_balance_coeff = 1e-3;
  return a;
}

// Exact sizes for the unit and Hugging Face tests: head_dim 16, the MoE and dense SwiGLU sizes
// given (64 and 128), and everything iRoPE does within 8 positions.
Llama3Args tiny() {
  Llama3Args a = make(64, 4, 4, 2, 300, 32, 0.0, 4, 2, /*rope_scaling=*/true, 131072);
  a.ffn_dim = 128;
  a.moe.hidden_dim = 64;
  return irope(a, /*chunk=*/8, /*floor=*/4, /*qk_norm=*/true);
}

}  // namespace

const std::vector<std::pair<std::string, Llama3Args>>& flavors() {
  // (dim, n_layers, n_heads, n_kv_heads, vocab, multiple_of, ffn_dim_multiplier, experts,
  //  moe step, rope scaling, max_seq_len)
  static const Llama3Args kDebug = make(256, 6, 16, 0, 2048, 256, 0.0, 8, 2, true, 1048576);
  static const Llama3Args k16e = make(5120, 48, 40, 8, 202048, 2048, 1.2, 16, 1, true, 10485760);
  static const Llama3Args k128e = make(5120, 48, 40, 8, 202048, 2048, 1.2, 128, 2, false, 1048576);
  static const std::vector<std::pair<std::string, Llama3Args>> kFlavors = {
      {"tiny", tiny()},
      {"debugmodel", kDebug},
      // TorchTitan's debugmodel_irope (chunks of 256) with Scout's qk norm, and its temperature
      // tuning from the chunk size on, so that debug runs of 2048 positions exercise both.
      {"debugmodel_irope", balanced(irope(kDebug, 256, 256, true))},
      {"17bx16e", k16e},
      {"17bx128e", k128e},
      // Meta's Llama-4-Scout-17B-16E and Llama-4-Maverick-17B-128E as released.
      {"17bx16e_irope", irope(k16e, 8192, 8192, true)},
      {"17bx128e_irope", irope(k128e, 8192, 8192, false)},
  };
  return kFlavors;
}

const llama3::Family& family() {
  static const llama3::Family kFamily{"llama4", &flavors()};
  return kFamily;
}

}  // namespace titan::llama4
