// Layers with a learned bias (see affine.h).
#include "titan/models/common/affine.h"

#include "titan/models/common/init.h"

namespace titan {

BiasedLinear::BiasedLinear(int64_t in_features, int64_t out_features, at::ScalarType compute_dtype)
    : Linear(in_features, out_features, compute_dtype) {
  bias = register_module("bias", std::make_shared<Bias>(at::IntArrayRef{out_features}));
}

at::Tensor BiasedLinear::forward(const at::Tensor& x) {
  const at::Tensor y = Linear::forward(x);
  return y + to_compute(bias->weight, compute_dtype).to(y.scalar_type());
}

LayerNorm::LayerNorm(int64_t dim, double eps) : eps(eps) {
  weight = register_parameter("weight", new_parameter({dim}));
  bias = register_module("bias", std::make_shared<Bias>(at::IntArrayRef{dim}));
  if (!weight.is_meta()) {  // the identity, as models' inits set it
    at::NoGradGuard no_grad;
    weight.fill_(1.0);
    bias->weight.zero_();
  }
}

at::Tensor LayerNorm::forward(const at::Tensor& x) {
  const at::ScalarType wide = upcast_dtype(x.scalar_type());
  return at::layer_norm(x.to(wide), {x.size(-1)}, weight.to(wide), bias->weight.to(wide), eps)
      .to(x.scalar_type());
}

}  // namespace titan
