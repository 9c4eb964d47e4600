// SwiGLU feed-forward block: w2(silu(w1 x) * w3 x).
#pragma once

#include "titan/models/common/linear.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <memory>

namespace titan {

// Parameters: w1 and w3 (hidden_dim, dim), w2 (dim, hidden_dim). A tensor-parallel plan shards
// w1/w3 by rows and w2 by columns; nothing here depends on hidden_dim.
class FeedForward : public HookedModule {
 public:
  FeedForward(int64_t dim, int64_t hidden_dim, at::ScalarType compute_dtype = at::kFloat);

  // x (bs, seqlen, dim) -> (bs, seqlen, dim) in the compute dtype.
  at::Tensor forward(const at::Tensor& x);

  std::shared_ptr<Linear> w1, w2, w3;
  at::ScalarType compute_dtype;
  // silu(w1 x) * w3 x by the fused CPU kernel (titan/models/common/fused_ops.h) for CPU tensors
  // of the dtypes where it is faster (kernels::fused_is_faster; compile.enable); in bf16 on a CPU
  // whose bf16 GEMMs are slow, the three products kept in float32 around widened_swiglu (same
  // numbers as the casts around each op; Linear::widens_plainly).
  bool fused = false;
  // w1 and w3 packed into one matrix for inference (prepare_for_inference); used while intact.
  PackedLinear packed_w13;
};

}  // namespace titan
