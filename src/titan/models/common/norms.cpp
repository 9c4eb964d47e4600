// RMSNorm (see norms.h) as one autograd node: it keeps only its input and 1/rms for backward
// (instead of the several float32 intermediates a composition of ops would keep) and computes
// the gradient in closed form.
#include "titan/models/common/norms.h"

#include "titan/common/phase.h"
#include "titan/kernels/fused_layers.h"
#include "titan/models/common/fused_ops.h"
#include "titan/models/common/init.h"
#include "titan/models/common/linear.h"

#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/custom_function.h>

namespace titan {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct RMSNormFunction : public torch::autograd::Function<RMSNormFunction> {
  // x (..., dim), weight (dim) -> (..., dim) in x's dtype.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            double eps) {
    const at::Tensor xf = x.to(math_dtype(x, weight));
    const at::Tensor rstd =
        at::rsqrt(xf.square().mean(-1, /*keepdim=*/true).add_(eps));  // (..., 1)
    ctx->save_for_backward({x, weight, rstd});
    return (xf * rstd).mul_(weight).to(x.scalar_type());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor& weight = saved[1];
    const at::Tensor& rstd = saved[2];
    const at::ScalarType dtype = math_dtype(x, weight);
    const at::Tensor grad = grads[0].to(dtype);
    const at::Tensor x_hat = x.to(dtype) * rstd;  // x / rms
    // y = weight * x_hat:  dx = rstd * (g w - x_hat * mean(g w * x_hat)),  dw = sum(g * x_hat).
    const at::Tensor grad_w = grad * weight;
    const at::Tensor grad_x =
        (grad_w - x_hat * (grad_w * x_hat).mean(-1, /*keepdim=*/true)).mul_(rstd);
    const at::Tensor grad_weight = (grad * x_hat).reshape({-1, x.size(-1)}).sum(0);
    return {grad_x.to(x.scalar_type()), grad_weight.to(weight.scalar_type()), at::Tensor()};
  }

  // float32 for 16-bit inputs, else the wider of input and weight (float64 in tests).
  static at::ScalarType math_dtype(const at::Tensor& x, const at::Tensor& weight) {
    return at::promote_types(upcast_dtype(x.scalar_type()), weight.scalar_type());
  }
};

}  // namespace

RMSNorm::RMSNorm(int64_t dim, double eps, bool zero_centered)
    : eps(eps), zero_centered(zero_centered) {
  // Ones (zeros), as the model's init sets them (nothing to fill on the meta device).
  weight = register_parameter("weight", new_parameter({dim}));
  if (!weight.is_meta()) reset_parameters();
}

at::Tensor RMSNorm::forward(const at::Tensor& x) {
  return hooked(x, [this](const at::Tensor& in) {
    const TraceSpan span("rmsnorm");
    const at::Tensor w = scale();
    if (fused && kernels::cpu_fusable({in, w}) &&
        kernels::fused_is_faster(kernels::FusedOp::kRmsNorm, in.scalar_type())) {
      return fused_rms_norm(in, w, eps);
    }
    return RMSNormFunction::apply(in, w, eps);
  });
}

std::pair<at::Tensor, at::Tensor> RMSNorm::forward_add(const at::Tensor& x,
                                                       const at::Tensor& delta) {
  if (fused && !has_forward_hooks() && x.sizes() == delta.sizes() &&
      x.scalar_type() == delta.scalar_type() && kernels::cpu_fusable({x, delta, weight}) &&
      kernels::fused_is_faster(kernels::FusedOp::kRmsNorm, x.scalar_type())) {
    const TraceSpan span("rmsnorm");
    return fused_add_rms_norm(x, delta, scale(), eps);
  }
  const at::Tensor h = x + delta;
  return {h, forward(h)};
}

void RMSNorm::reset_parameters() {
  at::NoGradGuard no_grad;
  weight.fill_(zero_centered ? 0.0 : 1.0);
}

}  // namespace titan
