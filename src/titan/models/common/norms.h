// Normalization layers.
#pragma once

#include "titan/models/common/linear.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <utility>

namespace titan {

// Root-mean-square norm: y = x * rsqrt(mean(x^2, -1) + eps) * weight, computed in float32 (or
// the input's dtype if wider) and returned in the input's dtype. Parameter: weight (dim).
// Zero-centred (Qwen3-Next, Gemma): the scale is 1 + weight, and the weight starts at zero, so
// that weight decay pulls the scale toward 1 rather than 0.
class RMSNorm : public WeightLayer {
 public:
  explicit RMSNorm(int64_t dim, double eps = 1e-5, bool zero_centered = false);

  // x (..., dim) -> (..., dim), same dtype as x.
  at::Tensor forward(const at::Tensor& x);
  // A residual add and this norm after it: {x + delta, forward(x + delta)}. One fused kernel
  // (fused_add_rms_norm) where forward would take the fused RMSNorm, x and delta match in shape
  // and dtype and no hook wraps the norm (a parallelism's layout change); else the add, then
  // forward.
  std::pair<at::Tensor, at::Tensor> forward_add(const at::Tensor& x, const at::Tensor& delta);
  // weight <- ones (zero-centred: zeros).
  void reset_parameters();
  // The scale forward multiplies by: weight, or 1 + weight.
  at::Tensor scale() const { return zero_centered ? weight + 1.0 : weight; }

  double eps;
  bool zero_centered = false;
  // The fused CPU kernel (titan/models/common/fused_ops.h) for CPU inputs of the dtypes where it
  // is faster (kernels::fused_is_faster; compile.enable); other inputs take the composition.
  bool fused = false;
};

}  // namespace titan
