// Autograd wrappers of the fused CPU kernels (see fused_ops.h).
#include "titan/models/common/fused_ops.h"

#include "titan/kernels/fused_layers.h"

#include <ATen/record_function.h>
#include <torch/csrc/autograd/custom_function.h>

#include <vector>

namespace titan {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct FusedRMSNorm : public torch::autograd::Function<FusedRMSNorm> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            double eps) {
    auto [y, rstd] = kernels::rms_norm_forward(x, weight, eps);
    ctx->save_for_backward({x, weight, rstd});
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    auto [grad_x, grad_weight] = kernels::rms_norm_backward(grads[0].to(saved[0].scalar_type()),
                                                            saved[0], saved[1], saved[2]);
    return {grad_x, grad_weight, at::Tensor()};
  }
};

struct FusedAddRMSNorm : public torch::autograd::Function<FusedAddRMSNorm> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& delta,
                               const at::Tensor& weight, double eps) {
    auto [h, y, rstd] = kernels::add_rms_norm_forward(x, delta, weight, eps);
    ctx->save_for_backward({h, weight, rstd});
    return {h, y};
  }
  // grads: {d h, d y}, either undefined when its output was not used.
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& h = saved[0];
    const at::Tensor grad_h = grads[0].defined() ? grads[0].to(h.scalar_type()) : at::Tensor();
    at::Tensor grad, grad_weight;
    if (grads[1].defined()) {
      std::tie(grad, grad_weight) =
          kernels::rms_norm_backward(grads[1].to(h.scalar_type()), h, saved[1], saved[2], grad_h);
    } else {
      grad = grad_h.defined() ? grad_h : at::zeros_like(h);
    }
    return {grad, grad, grad_weight, at::Tensor()};
  }
};

struct FusedSwiGLU : public torch::autograd::Function<FusedSwiGLU> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gate, const at::Tensor& up) {
    ctx->save_for_backward({gate, up});
    return kernels::swiglu_forward(gate, up);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    auto [grad_gate, grad_up] =
        kernels::swiglu_backward(grads[0].to(saved[0].scalar_type()), saved[0], saved[1]);
    return {grad_gate, grad_up};
  }
};

struct WidenedSwiGLU : public torch::autograd::Function<WidenedSwiGLU> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gate, const at::Tensor& up) {
    RECORD_FUNCTION("titan::widened_swiglu", std::vector<c10::IValue>());
    auto [h, a, b] = kernels::widened_swiglu_forward(gate, up);
    ctx->save_for_backward({a, b});
    return h;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    auto [grad_gate, grad_up] =
        kernels::widened_swiglu_backward(grads[0].to(at::kFloat), saved[0], saved[1]);
    return {grad_gate, grad_up};
  }
};

struct FusedRope : public torch::autograd::Function<FusedRope> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& cos,
                            const at::Tensor& sin) {
    ctx->save_for_backward({cos, sin});
    ctx->saved_data["dtype"] = static_cast<int64_t>(x.scalar_type());
    return kernels::rope_rotate(x, cos, sin, /*inverse=*/false);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto dtype = static_cast<at::ScalarType>(ctx->saved_data["dtype"].toInt());
    return {kernels::rope_rotate(grads[0].to(dtype), saved[0], saved[1], /*inverse=*/true),
            at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor fused_rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  return FusedRMSNorm::apply(x, weight, eps);
}

std::pair<at::Tensor, at::Tensor> fused_add_rms_norm(const at::Tensor& x, const at::Tensor& delta,
                                                     const at::Tensor& weight, double eps) {
  const variable_list out = FusedAddRMSNorm::apply(x, delta, weight, eps);
  return {out[0], out[1]};
}

at::Tensor fused_swiglu(const at::Tensor& gate, const at::Tensor& up) {
  return FusedSwiGLU::apply(gate, up);
}

at::Tensor widened_swiglu(const at::Tensor& gate, const at::Tensor& up) {
  return WidenedSwiGLU::apply(gate, up);
}

at::Tensor fused_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  return FusedRope::apply(x, cos, sin);
}

}  // namespace titan
