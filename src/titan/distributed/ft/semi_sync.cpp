// LocalSGD and DiLoCo's outer step (see semi_sync.h).
#include "titan/distributed/ft/semi_sync.h"

#include <ATen/ATen.h>

#include <stdexcept>

namespace titan::ft {

SemiSync semi_sync_from_name(const std::string& name) {
  if (name.empty()) return SemiSync::kNone;
  if (name == "local_sgd") return SemiSync::kLocalSgd;
  if (name == "diloco") return SemiSync::kDiLoCo;
  throw std::invalid_argument("unknown semi-synchronous method '" + name +
                              "' (want local_sgd or diloco)");
}

OuterStep::OuterStep(SemiSync method, std::vector<at::Tensor> params, double lr, double momentum)
    : method_(method), params_(std::move(params)), lr_(lr), momentum_coef_(momentum) {
  if (method_ == SemiSync::kNone) throw std::invalid_argument("OuterStep needs a method");
  if (method_ != SemiSync::kDiLoCo) return;
  for (const at::Tensor& p : params_) {
    snapshot_.push_back(p.detach().clone());
    momentum_.push_back(at::zeros_like(p));
  }
}

std::vector<at::Tensor> OuterStep::to_average() const {
  if (method_ == SemiSync::kLocalSgd) return params_;
  std::vector<at::Tensor> pseudo;
  for (size_t i = 0; i < params_.size(); ++i) pseudo.push_back(snapshot_[i] - params_[i].detach());
  return pseudo;
}

void OuterStep::apply(const std::vector<at::Tensor>& averaged) {
  if (method_ == SemiSync::kLocalSgd) return;
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    const at::Tensor& g = averaged[i];
    momentum_[i].mul_(momentum_coef_).add_(g);
    // p = p0 - lr * (g + momentum * buf)
    params_[i].copy_(snapshot_[i]).sub_(g, lr_).sub_(momentum_[i], lr_ * momentum_coef_);
    snapshot_[i].copy_(params_[i]);
  }
}

void OuterStep::reset_snapshot() {
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < snapshot_.size(); ++i) snapshot_[i].copy_(params_[i]);
}

}  // namespace titan::ft
