// AdamW / Adam with the update of torch.optim.AdamW / torch.optim.Adam: bias-corrected moments,
// eps added after the bias-corrected square root, decoupled decay p *= 1 - lr * wd (AdamW) or L2
// decay g += wd * p (Adam). optimizer.implementation chooses the kernel as in PyTorch:
//   fused     one pass over each parameter's p, g, m, v (titan::kernels::adam_step, float math,
//             one bf16 rounding per stored value); CUDA tensors and dtypes or layouts it does not
//             take fall back to the for-loop, per parameter.
//   foreach   the same ATen ops as the for-loop, each issued once over all parameters
//             (at::_foreach_*): fewer dispatches, still one pass over memory per op.
//   for-loop  ATen ops per parameter: the reference the other two are tested against.
// The state layout (exp_avg, exp_avg_sq per parameter, one step count) is the same for all
// three, so a checkpoint written under one loads under another.
#include "titan/components/optimizer.h"

#include "titan/common/check.h"
#include "titan/kernels/adamw.h"

#include <ATen/core/grad_mode.h>

#include <cmath>

namespace titan {

namespace {

// Bias corrections of step `step` (1-based).
struct BiasCorrection {
  double step_size;   // lr / (1 - beta1^step)
  double bias2_sqrt;  // sqrt(1 - beta2^step)
};

BiasCorrection bias_correction(const OptimizerSection& c, double lr, int64_t step) {
  const double t = static_cast<double>(step);
  return {lr / (1.0 - std::pow(c.beta1, t)), std::sqrt(1.0 - std::pow(c.beta2, t))};
}

}  // namespace

Optimizer::Optimizer(std::vector<NamedParam> params, const OptimizerSection& config)
    : params_(std::move(params)), config_(config), decoupled_(config.name == "AdamW") {
  TITAN_CHECK(config.name == "AdamW" || config.name == "Adam", "unknown optimizer.name '",
              config.name, "' (AdamW, Adam)");
  if (config.implementation == "fused") {
    implementation_ = Implementation::kFused;
  } else if (config.implementation == "foreach") {
    implementation_ = Implementation::kForeach;
  } else if (config.implementation == "for-loop") {
    implementation_ = Implementation::kForLoop;
  } else {
    TITAN_CHECK(false, "unknown optimizer.implementation '", config.implementation,
                "' (fused, foreach, for-loop)");
  }
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
  if (implementation_ == Implementation::kForeach) {
    step_foreach(lr);
    return;
  }
  kernels::AdamStepOptions options;
  options.lr = lr;
  options.beta1 = config_.beta1;
  options.beta2 = config_.beta2;
  options.eps = config_.eps;
  options.weight_decay = config_.weight_decay;
  options.decoupled = decoupled_;
  options.step = step_count_;
  for (size_t i = 0; i < params_.size(); ++i) {
    const at::Tensor& p = params_[i].param;
    const at::Tensor& g = p.grad();
    if (!g.defined()) continue;
    if (implementation_ == Implementation::kFused &&
        kernels::adam_step_supported(p, g, exp_avg_[i], exp_avg_sq_[i])) {
      kernels::adam_step(p, g, exp_avg_[i], exp_avg_sq_[i], options);
    } else {
      step_param_aten(i, lr);
    }
  }
}

void Optimizer::step_param_aten(size_t i, double lr) {
  at::Tensor p = params_[i].param;
  at::Tensor g = p.grad();
  const BiasCorrection bc = bias_correction(config_, lr, step_count_);
  if (config_.weight_decay != 0) {
    if (decoupled_) {
      p.mul_(1.0 - lr * config_.weight_decay);
    } else {
      g = g.add(p, config_.weight_decay);
    }
  }
  exp_avg_[i].lerp_(g, 1.0 - config_.beta1);
  exp_avg_sq_[i].mul_(config_.beta2).addcmul_(g, g, 1.0 - config_.beta2);
  at::Tensor denom = (exp_avg_sq_[i].sqrt() / bc.bias2_sqrt).add_(config_.eps);
  p.addcdiv_(exp_avg_[i], denom, -bc.step_size);
}

// torch.optim's _multi_tensor_adam. It first groups tensors by device and dtype, which ATen's CUDA
// fast path needs; here all parameters share one (and a mixed list still runs, per tensor).
void Optimizer::step_foreach(double lr) {
  std::vector<at::Tensor> params, grads, exp_avgs, exp_avg_sqs;
  for (size_t i = 0; i < params_.size(); ++i) {
    const at::Tensor& p = params_[i].param;
    if (!p.grad().defined()) continue;
    params.push_back(p);
    grads.push_back(p.grad());
    exp_avgs.push_back(exp_avg_[i]);
    exp_avg_sqs.push_back(exp_avg_sq_[i]);
  }
  if (params.empty()) return;
  const BiasCorrection bc = bias_correction(config_, lr, step_count_);
  if (config_.weight_decay != 0) {
    if (decoupled_) {
      at::_foreach_mul_(params, 1.0 - lr * config_.weight_decay);
    } else {
      grads = at::_foreach_add(grads, params, config_.weight_decay);
    }
  }
  at::_foreach_lerp_(exp_avgs, grads, 1.0 - config_.beta1);
  at::_foreach_mul_(exp_avg_sqs, config_.beta2);
  at::_foreach_addcmul_(exp_avg_sqs, grads, grads, 1.0 - config_.beta2);
  std::vector<at::Tensor> denoms = at::_foreach_sqrt(exp_avg_sqs);
  at::_foreach_div_(denoms, bc.bias2_sqrt);
  at::_foreach_add_(denoms, config_.eps);
  at::_foreach_addcdiv_(params, exp_avgs, denoms, -bc.step_size);
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
