// Causal self-attention with grouped-query attention (GQA): n_kv_heads key/value heads, each
// shared by n_heads / n_kv_heads consecutive query heads. Head counts are read from tensor
// shapes, so a tensor-parallel plan can shard heads (wq/wk/wv by rows, wo by columns) without
// this code knowing.
#pragma once

#include "titan/models/common/kv_cache.h"
#include "titan/models/common/linear.h"
#include "titan/models/common/rope.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <memory>

namespace titan {

// softmax(q k^T / sqrt(head_dim) + causal mask) v, with the softmax in float32 (or wider), by
// libtorch's fused kernel. For backward it keeps q, k, v, the output and float32 log-sum-exp
// statistics (bs, n_heads, seqlen): no probability matrix.
// q (bs, seqlen, n_heads, head_dim), k and v (bs, seqlen, n_kv_heads, head_dim), n_kv_heads
// dividing n_heads; query head h reads kv head h / (n_heads / n_kv_heads).
// Returns (bs, seqlen, n_heads, head_dim), contiguous, in v's dtype.
at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v);

// Inference attention of n new queries at positions [start_pos, start_pos + n) over the keys and
// values of positions [0, start_pos + n), causal within the new block. q (bs, n, n_heads,
// head_dim); k and v in the cache layout (bs, n_kv_heads, >= start_pos + n, head_dim), of which
// only the first start_pos + n positions are read. Returns (bs, n, n_heads, head_dim),
// contiguous, in v's dtype. Not differentiable (no autograd bookkeeping for inference).
at::Tensor cached_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            int64_t start_pos);

// The kernel between the projections: q (bs, seqlen, n_heads, head_dim), k and v
// (bs, seqlen, n_kv_heads, head_dim) -> (bs, seqlen, n_heads, head_dim), contiguous. The default
// is causal_attention over the local sequence; context parallelism swaps in a kernel that also
// attends to the other ranks' keys and values.
class InnerAttention {
 public:
  virtual ~InnerAttention() = default;
  virtual at::Tensor forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) = 0;
};

class CausalAttention final : public InnerAttention {
 public:
  at::Tensor forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) override {
    return causal_attention(q, k, v);
  }
};

// Incremental inference: the layer's cache, the position of the first new token, and the cache's
// capacity in positions.
struct KVCacheStep {
  LayerKVCache* cache = nullptr;
  int64_t start_pos = 0;
  int64_t max_len = 0;
};

// Multi-head causal self-attention with RoPE on q and k. Parameters: wq (n_heads * head_dim, dim),
// wk and wv (n_kv_heads * head_dim, dim), wo (dim, n_heads * head_dim).
class Attention : public HookedModule {
 public:
  Attention(int64_t dim, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
            at::ScalarType compute_dtype = at::kFloat);

  // x (bs, seqlen, dim) -> (bs, seqlen, dim) in the compute dtype. `positions` (seqlen) int64
  // are the tokens' absolute positions for RoPE (undefined: [0, seqlen)). Training runs
  // inner_attention over the sequence; with `cache` (incremental inference, no autograd) x holds
  // positions [start_pos, start_pos + n), their keys and values are written into the cache
  // (allocated on first use, or when bs / heads / dtype change at start_pos 0) and the queries
  // attend over positions [0, start_pos + n) of it (cached_attention).
  at::Tensor forward(const at::Tensor& x, const RotaryEmbedding& rope,
                     const at::Tensor& positions = {}, const KVCacheStep* cache = nullptr);

  std::shared_ptr<Linear> wq, wk, wv, wo;
  std::shared_ptr<InnerAttention> inner_attention = std::make_shared<CausalAttention>();
  int64_t head_dim;
  at::ScalarType compute_dtype;

 private:
  // Writes k and v into the cache at step.start_pos and attends over the cached prefix.
  at::Tensor attend_cached(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const KVCacheStep& step);
};

}  // namespace titan
