// AdamW with the update of torch.optim.AdamW (bias-corrected moments, eps added after the
// bias-corrected square root, decoupled decay p *= 1 - lr * wd). `implementation` selects a
// kernel in PyTorch; here all three share this loop, which is already one pass per tensor.
#include "titan/components/optimizer.h"

#include "titan/common/check.h"

#include <ATen/core/grad_mode.h>

#include <cmath>

namespace titan {

Optimizer::Optimizer(std::vector<NamedParam> params, const OptimizerSection& config)
    : params_(std::move(params)), config_(config), decoupled_(config.name == "AdamW") {
  TITAN_CHECK(config.name == "AdamW" || config.name == "Adam", "unknown optimizer.name '",
              config.name, "' (AdamW, Adam)");
  exp_avg_.reserve(params_.size());
  exp_avg_sq_.reserve(params_.size());
  for (const auto& p : params_) {
    // bfloat16: full bf16 training (training.dtype), whose states are bf16 as well.
    TITAN_CHECK(p.param.scalar_type() == at::kFloat || p.param.scalar_type() == at::kBFloat16,
                "optimizer expects float32 or bfloat16 parameters; ", p.name, " is ",
                p.param.scalar_type());
    exp_avg_.push_back(at::zeros_like(p.param, at::MemoryFormat::Preserve));
    exp_avg_sq_.push_back(at::zeros_like(p.param, at::MemoryFormat::Preserve));
  }
}

void Optimizer::step(double lr) {
  at::NoGradGuard no_grad;
  ++step_count_;
  const double beta1 = config_.beta1, beta2 = config_.beta2;
  const double bias1 = 1.0 - std::pow(beta1, static_cast<double>(step_count_));
  const double bias2 = 1.0 - std::pow(beta2, static_cast<double>(step_count_));
  const double step_size = lr / bias1;
  const double bias2_sqrt = std::sqrt(bias2);
  for (size_t i = 0; i < params_.size(); ++i) {
    at::Tensor p = params_[i].param;
    at::Tensor g = p.grad();
    if (!g.defined()) continue;
    if (config_.weight_decay != 0) {
      if (decoupled_) {
        p.mul_(1.0 - lr * config_.weight_decay);
      } else {
        g = g.add(p, config_.weight_decay);
      }
    }
    exp_avg_[i].lerp_(g, 1.0 - beta1);
    exp_avg_sq_[i].mul_(beta2).addcmul_(g, g, 1.0 - beta2);
    at::Tensor denom = (exp_avg_sq_[i].sqrt() / bias2_sqrt).add_(config_.eps);
    p.addcdiv_(exp_avg_[i], denom, -step_size);
  }
}

void Optimizer::zero_grad() {
  for (auto& p : params_) {
    if (p.param.grad().defined()) {
      p.param.mutable_grad() = at::Tensor();
    }
  }
}

std::vector<std::pair<std::string, at::Tensor>> Optimizer::state_tensors() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (size_t i = 0; i < params_.size(); ++i) {
    out.emplace_back(params_[i].name + ".exp_avg", exp_avg_[i]);
    out.emplace_back(params_[i].name + ".exp_avg_sq", exp_avg_sq_[i]);
  }
  return out;
}

double clip_grad_norm(const std::vector<at::Tensor>& params, double max_norm) {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> norms;
  for (const auto& p : params) {
    if (p.grad().defined()) norms.push_back(p.grad().norm(2).to(at::kDouble));
  }
  if (norms.empty()) return 0.0;
  const double total = at::stack(norms).norm(2).item<double>();
  if (max_norm > 0 && std::isfinite(total)) {
    const double coef = max_norm / (total + 1e-6);
    if (coef < 1.0) {
      for (const auto& p : params) {
        if (p.grad().defined()) p.grad().mul_(coef);
      }
    }
  }
  return total;
}

}  // namespace titan
