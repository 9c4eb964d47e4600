// Layers with a learned bias beside their weight: a biased linear layer and LayerNorm with a
// scale and a shift (FLUX's transformer, the SigLIP2 vision encoder). Our Linear holds no bias:
// the bias is the layer's child "bias" (parameter "<layer>.bias.weight", Hugging Face's
// "<layer>.bias"), added after the layer's hooks so that a row-wise split reduces before the
// bias is added once.
#pragma once

#include "titan/models/common/linear.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>

namespace titan {

// x @ weight^T + bias. Parameters: weight (out, in), bias.weight (out).
class BiasedLinear : public Linear {
 public:
  BiasedLinear(int64_t in_features, int64_t out_features, at::ScalarType compute_dtype);
  // x (..., in) -> (..., out) in the compute dtype.
  at::Tensor forward(const at::Tensor& x);
  std::shared_ptr<Bias> bias;
};

// (x - mean) / sqrt(var + eps) * weight + bias over the last dim, computed in float32 (or the
// input's dtype if wider) and returned in the input's dtype. Parameters: weight (dim) (ones),
// bias.weight (dim) (zeros).
class LayerNorm : public WeightLayer {
 public:
  LayerNorm(int64_t dim, double eps);
  at::Tensor forward(const at::Tensor& x);
  std::shared_ptr<Bias> bias;
  double eps;
};

}  // namespace titan
