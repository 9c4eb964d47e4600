// Gated DeltaNet, Qwen3-Next's linear attention layer (toward model "qwen3_next"), with
// transformers' Qwen3NextGatedDeltaNet's parameters and layouts:
//
//   [q k v z] = in_proj_qkvz(x), [b a] = in_proj_ba(x)   grouped per key head: key head h holds
//       its q and k, then the v and z of its num_v_heads / num_k_heads value heads (b and a alike)
//   [q k v] = silu(causal depthwise conv over the last conv_kernel positions of [q k v])
//   beta = sigmoid(b), g = -exp(A_log) softplus(a + dt_bias)             per value head
//   o = gated delta rule (gated_delta.h) of L2-normalised q and k (each key head serving its value
//       heads), v, g, beta
//   out = out_proj(rmsnorm(o) * norm.weight * silu(z))                    per value head
//
// Packed documents (document_ids): the convolution reads no position of an earlier document and
// the recurrent state restarts at every document start. Generation carries the last
// conv_kernel - 1 convolution inputs and the recurrent state from call to call
// (LinearAttentionState), one position or many at a time.
#pragma once

#include "titan/models/common/kv_cache.h"
#include "titan/models/common/linear.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <memory>

namespace titan {

struct GatedDeltaNetArgs {
  int64_t num_k_heads = 16;
  int64_t num_v_heads = 32;  // a multiple of num_k_heads
  int64_t head_k_dim = 128;
  int64_t head_v_dim = 128;
  int64_t conv_kernel = 4;
  double norm_eps = 1e-6;  // the gated output norm's
  int64_t chunk = 64;      // the chunked delta rule's chunk (training)
  int64_t key_dim() const { return num_k_heads * head_k_dim; }
  int64_t value_dim() const { return num_v_heads * head_v_dim; }
  int64_t conv_dim() const { return 2 * key_dim() + value_dim(); }
  // Parameters of one layer for a model of width `dim`.
  int64_t params(int64_t dim) const;
  // ConfigError naming the first value out of range (heads that do not divide, sizes <= 0).
  void validate() const;
};

class GatedDeltaNet : public HookedModule {
 public:
  GatedDeltaNet(int64_t dim, const GatedDeltaNetArgs& args, at::ScalarType compute_dtype);

  // x (bs, L, dim) -> (bs, L, dim) in x's dtype. `document_ids` (bs, L) int64: packed documents
  // (training; undefined: one sequence). `state`: generation's, read and updated in place (the
  // whole of x continues it; no documents then).
  at::Tensor forward(const at::Tensor& x, const at::Tensor& document_ids = {},
                     LinearAttentionState* state = nullptr);

  const GatedDeltaNetArgs& args() const { return args_; }

  std::shared_ptr<Linear> in_proj_qkvz;  // dim -> 2 key_dim + 2 value_dim
  std::shared_ptr<Linear> in_proj_ba;    // dim -> 2 num_v_heads
  std::shared_ptr<Bias> conv1d;          // (conv_dim, 1, conv_kernel), no bias
  std::shared_ptr<Bias> dt_bias;         // (num_v_heads)
  std::shared_ptr<Bias> A_log;           // (num_v_heads)
  std::shared_ptr<Bias> norm;            // (head_v_dim): the gated RMSNorm's weight
  std::shared_ptr<Linear> out_proj;      // value_dim -> dim

 private:
  at::Tensor compute(const at::Tensor& x, const at::Tensor& document_ids,
                     LinearAttentionState* state);

  GatedDeltaNetArgs args_;
};

// The causal depthwise convolution of x (bs, L, C) with weight (C, 1, K): out[t] = sum_i
// weight[:, 0, i] x[t - K + 1 + i], positions before the start reading `history` (bs, C, K - 1)
// (undefined: zeros) and, with document_ids (bs, L), positions of another document reading zero.
at::Tensor causal_depthwise_conv(const at::Tensor& x, const at::Tensor& weight,
                                 const at::Tensor& history = {},
                                 const at::Tensor& document_ids = {});

}  // namespace titan
