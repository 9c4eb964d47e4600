// Multi-head latent attention (MLA, DeepSeek-V2/V3): queries and keys/values pass through
// low-rank "latent" projections, and RoPE acts on a few extra dimensions per head only, with one
// rotary key shared by all heads:
//
//   q            = wq(x), or wq_b(q_norm(wq_a(x)))         (bs, n, heads, nope + rope)
//   latent, k_pe = split(wkv_a(x), [kv_lora_rank, rope])   k_pe: one rotary key for all heads
//   k_nope, v    = split(wkv_b(kv_norm(latent)), [nope, v_head_dim]) per head
//   q[.., nope:], k_pe rotated by RoPE (dimension qk_rope_head_dim, YaRN-scaled frequencies)
//   out          = wo(softmax(q k^T * scale + causal) v),  k = [k_nope, k_pe]
//
// scale = (nope + rope)^-0.5, times yarn_mscale(factor, mscale)^2 when YaRN is on. The heads are
// read from shapes (view(-1)), so a tensor-parallel plan may shard wq / wq_b and wkv_b by rows
// and wo by columns; the a-projections and norms are replicated. The kernel between the
// projections is an InnerAttention over q, k, v padded to one head size (its default scale is
// corrected by scaling q), so the training paths of the GQA attention (fused SDPA, selective
// AC, block-causal masks) serve it unchanged.
#pragma once

#include "titan/models/common/attention.h"
#include "titan/models/common/linear.h"
#include "titan/models/common/norms.h"
#include "titan/models/common/rope.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>

namespace titan {

struct MlaArgs {
  int64_t q_lora_rank = 0;   // 0: queries by one projection wq (no q latent)
  int64_t kv_lora_rank = 0;  // 0: no MLA (the decoder's grouped-query attention)
  int64_t qk_nope_head_dim = 128;
  int64_t qk_rope_head_dim = 64;
  int64_t v_head_dim = 128;
  double norm_eps = 1e-5;  // of q_norm and kv_norm (Hugging Face's DeepSeek-V3 uses 1e-6)
  double mscale = 1.0;     // YaRN softmax correction (see yarn_mscale)
  YarnScaling yarn;        // rope scaling of the rotary dimensions

  bool enabled() const { return kv_lora_rank > 0; }
  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  // Parameters of one attention layer for model width `dim` and `n_heads` heads.
  int64_t params(int64_t dim, int64_t n_heads) const;
  // ConfigError (with the values) for impossible sizes.
  void validate() const;
};

// The softmax scale of `args` (see the top of this file).
double mla_softmax_scale(const MlaArgs& args);

class MultiHeadLatentAttention : public HookedModule {
 public:
  MultiHeadLatentAttention(int64_t dim, int64_t n_heads, const MlaArgs& args,
                           at::ScalarType compute_dtype = at::kFloat);

  // As Attention::forward: x (bs, n, dim) -> (bs, n, dim) in the compute dtype; `rope` rotates
  // qk_rope_head_dim dimensions. With `cache` the expanded keys and values (padded to one head
  // size) of the new positions go into the cache and the queries attend over its prefix.
  at::Tensor forward(const at::Tensor& x, const RotaryEmbedding& rope,
                     const at::Tensor& positions = {}, const KVCacheStep* cache = nullptr,
                     const at::Tensor& document_ids = {});

  std::shared_ptr<Linear> wq;          // (heads * qk_head_dim, dim); null with q_lora
  std::shared_ptr<Linear> wq_a, wq_b;  // (q_lora, dim), (heads * qk_head_dim, q_lora)
  std::shared_ptr<RMSNorm> q_norm;     // (q_lora); null without q_lora
  std::shared_ptr<Linear> wkv_a;       // (kv_lora + rope, dim)
  std::shared_ptr<RMSNorm> kv_norm;    // (kv_lora)
  std::shared_ptr<Linear> wkv_b;       // (heads * (nope + v_head_dim), kv_lora)
  std::shared_ptr<Linear> wo;          // (dim, heads * v_head_dim)
  std::shared_ptr<InnerAttention> inner_attention = std::make_shared<CausalAttention>();
  MlaArgs args;
  at::ScalarType compute_dtype;
};

}  // namespace titan
