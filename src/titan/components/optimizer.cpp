// AdamW / Adam with the update of torch.optim.AdamW / torch.optim.Adam: bias-corrected moments,
// eps added after the bias-corrected square root, decoupled decay p *= 1 - lr * wd (AdamW) or L2
// decay g += wd * p (Adam). optimizer.implementation chooses the kernel as in PyTorch:
//   fused     on the CPU one pass over each parameter's p, g, m, v (titan::kernels::adam_step,
//             float math, one bf16 rounding per stored value; dtypes or layouts it does not take
//             fall back to the for-loop, per parameter); elsewhere ATen's fused multi-tensor
//             kernel (at::_fused_adamw_ / _fused_adam_: one launch for all parameters).
//   foreach   the same ATen ops as the for-loop, each issued once over all parameters
//             (at::_foreach_*): fewer dispatches, still one pass over memory per op.
//   for-loop  ATen ops per parameter: the reference the other two are tested against.
// The state layout (exp_avg, exp_avg_sq per parameter, one step count) is the same for all
// three, so a checkpoint written under one loads under another.
#include "titan/components/optimizer.h"

#include "titan/common/check.h"
#include "titan/kernels/adamw.h"

#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <array>
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

std::optional<Optimizer::FusedKernel> fused_kernel_override;

// Every defined gradient times `scale` (a 0-d tensor), in place; nothing for an undefined scale.
void scale_in_place(const std::vector<at::Tensor>& grads, const at::Tensor& scale) {
  if (!scale.defined()) return;
  std::vector<at::Tensor> defined;
  for (const auto& g : grads) {
    if (g.defined() && g.numel() > 0) defined.push_back(g);
  }
  if (!defined.empty()) at::_foreach_mul_(defined, scale);
}

}  // namespace

void Optimizer::override_fused_kernel_for_testing(std::optional<FusedKernel> kernel) {
  fused_kernel_override = kernel;
}

Optimizer::Optimizer(std::vector<NamedParam> params, const OptimizerSection& config)
    : params_(std::move(params)),
      muon_config_(config),
      config_(config),
      decoupled_(config.name == "AdamW" || config.name == "Muon") {
  TITAN_CHECK(config.name == "AdamW" || config.name == "Adam" || config.name == "Muon",
              "unknown optimizer.name '", config.name, "' (AdamW, Adam, Muon)");
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
  const bool muon = config.name == "Muon";
  if (muon) {
    if (config.muon_adamw_lr >= 0) adamw_lr_ratio_ = config.muon_adamw_lr / config.lr;
    if (config.muon_adamw_weight_decay >= 0) {
      config_.weight_decay = config.muon_adamw_weight_decay;
    }
  }
  exp_avg_.resize(params_.size());
  exp_avg_sq_.resize(params_.size());
  momentum_.resize(params_.size());
  muon_.assign(params_.size(), false);
  for (size_t i = 0; i < params_.size(); ++i) {
    NamedParam& p = params_[i];
    // bfloat16: full bf16 training (training.dtype), whose states are bf16 as well.
    TITAN_CHECK(p.param.scalar_type() == at::kFloat || p.param.scalar_type() == at::kBFloat16,
                "optimizer expects float32 or bfloat16 parameters; ", p.name, " is ",
                p.param.scalar_type());
    if (p.box.global_shape.empty()) p.box = ShardBox::whole(p.param.sizes());
    const size_t dims = p.box.global_shape.size();
    muon_[i] = muon && p.matrix && (dims == 2 || dims == 3) &&
               !muon_excluded(p.name, config.muon_adamw_fqns);
    // optimizer.state_dtype bfloat16: bf16 states of float32 parameters (bf16 parameters, of
    // training.dtype, have bf16 states already).
    const at::TensorOptions state = p.param.options().dtype(
        config.state_dtype == "bfloat16" ? at::kBFloat16 : p.param.scalar_type());
    widened_states_ = widened_states_ || state.dtype() != p.param.dtype();
    if (muon_[i]) {
      muon_index_.push_back(i);
      momentum_[i] = at::zeros_like(p.param, state, at::MemoryFormat::Preserve);
    } else {
      exp_avg_[i] = at::zeros_like(p.param, state, at::MemoryFormat::Preserve);
      exp_avg_sq_[i] = at::zeros_like(p.param, state, at::MemoryFormat::Preserve);
    }
  }
}

std::vector<MuonMatrix> Optimizer::muon_matrices() const {
  std::vector<MuonMatrix> out;
  for (size_t i : muon_index_) {
    out.push_back({params_[i].name, params_[i].box, params_[i].param.sizes().vec()});
  }
  return out;
}

void Optimizer::set_muon_orthogonalizer(std::unique_ptr<MuonOrthogonalizer> orthogonalizer) {
  TITAN_CHECK(orthogonalizer != nullptr, "set_muon_orthogonalizer: null");
  orthogonalizer_ = std::move(orthogonalizer);
}

void Optimizer::step_muon(double lr) {
  if (!orthogonalizer_) orthogonalizer_ = std::make_unique<LocalOrthogonalizer>(muon_matrices());
  const OptimizerSection& c = muon_config_;
  std::vector<at::Tensor> updates;
  updates.reserve(muon_index_.size());
  for (size_t i : muon_index_) {
    const at::Tensor& p = params_[i].param;
    if (!p.grad().defined()) {
      // Skipped, as torch.optim skips it; a zero update keeps the exchange's shapes.
      updates.push_back(at::zeros(p.sizes(), p.options().dtype(at::kBFloat16)));
      continue;
    }
    const at::Tensor& g = p.grad();
    // A bf16 buffer of a float32 parameter: float32 math, rounded once as it is stored.
    const bool widen = momentum_[i].scalar_type() != p.scalar_type();
    at::Tensor buf = widen ? momentum_[i].to(p.scalar_type()) : momentum_[i];
    buf.lerp_(g, 1.0 - c.muon_momentum);
    const at::Tensor u = c.muon_nesterov ? g.lerp(buf, c.muon_momentum) : buf;
    updates.push_back(u.to(at::kBFloat16));
    if (widen) momentum_[i].copy_(buf);
  }
  orthogonalizer_->run(updates, NewtonSchulz::of(c), [&](size_t k, const at::Tensor& o) {
    const NamedParam& np = params_[muon_index_[k]];
    at::Tensor p = np.param;
    if (!p.grad().defined()) return;
    const std::vector<int64_t>& shape = np.box.global_shape;
    const double adjusted =
        muon_adjusted_lr(lr, c.muon_adjust_lr_fn, shape[shape.size() - 2], shape.back());
    p.mul_(1.0 - lr * c.weight_decay);
    p.add_(o, -adjusted);
  });
}

void Optimizer::step(double muon_lr, const at::Tensor& grad_scale) {
  at::NoGradGuard no_grad;
  ++step_count_;
  if (params_.empty()) return;
  const double lr = muon_lr * adamw_lr_ratio_;
  const bool cpu = params_.front().param.device().is_cpu();
  const FusedKernel kernel =
      fused_kernel_override.value_or(cpu ? FusedKernel::kTitan : FusedKernel::kAten);
  // Which parameters the fused kernel takes (it applies grad_scale as it reads): ATen's, dense
  // tensors sharing one layout; titan's, that on the CPU in float32 or bf16. The others run ATen
  // ops on gradients scaled in place first; so do titan's under Adam's L2 decay, whose
  // g * scale + wd * p the compiler would contract differently from ATen's rounded g * scale
  // (an ulp that a cancelling sum turns into a visible difference).
  const bool kernel_scales =
      kernel == FusedKernel::kAten || decoupled_ || config_.weight_decay == 0;
  std::vector<bool> fused(params_.size(), false);
  std::vector<at::Tensor> scaled;
  for (size_t i = 0; i < params_.size(); ++i) {
    const at::Tensor& p = params_[i].param;
    if (!p.grad().defined()) continue;
    if (muon_[i]) {
      scaled.push_back(p.grad());
      continue;
    }
    const std::array<const at::Tensor*, 4> four = {&p, &p.grad(), &exp_avg_[i], &exp_avg_sq_[i]};
    fused[i] = implementation_ == Implementation::kFused &&
               (kernel == FusedKernel::kAten
                    ? p.is_non_overlapping_and_dense() &&
                          std::all_of(four.begin(), four.end(),
                                      [&](const at::Tensor* t) {
                                        return t->strides() == p.strides() &&
                                               t->scalar_type() == p.scalar_type();
                                      })
                    : kernels::adam_step_supported(p, p.grad(), exp_avg_[i], exp_avg_sq_[i]));
    if (!fused[i] || !kernel_scales) scaled.push_back(p.grad());
  }
  scale_in_place(scaled, grad_scale);
  if (!muon_index_.empty()) step_muon(muon_lr);
  if (implementation_ == Implementation::kForeach) {
    step_foreach(lr);
    return;
  }
  if (implementation_ == Implementation::kFused && kernel == FusedKernel::kAten) {
    step_aten_fused(lr, grad_scale, fused);
  }
  kernels::AdamStepOptions options;
  options.lr = lr;
  options.beta1 = config_.beta1;
  options.beta2 = config_.beta2;
  options.eps = config_.eps;
  options.weight_decay = config_.weight_decay;
  options.decoupled = decoupled_;
  options.step = step_count_;
  if (kernel_scales) options.grad_scale = grad_scale;
  for (size_t i = 0; i < params_.size(); ++i) {
    const at::Tensor& p = params_[i].param;
    if (!p.grad().defined() || muon_[i]) continue;
    if (!fused[i]) {
      step_param_aten(i, lr);
    } else if (kernel == FusedKernel::kTitan) {
      kernels::adam_step(p, p.grad(), exp_avg_[i], exp_avg_sq_[i], options);
    }
  }
}

Optimizer::Lists Optimizer::with_grads(const std::vector<bool>* only) const {
  Lists l;
  for (size_t i = 0; i < params_.size(); ++i) {
    const at::Tensor& p = params_[i].param;
    if (!p.grad().defined() || muon_[i] || (only != nullptr && !(*only)[i])) continue;
    l.params.push_back(p);
    l.grads.push_back(p.grad());
    l.exp_avgs.push_back(exp_avg_[i]);
    l.exp_avg_sqs.push_back(exp_avg_sq_[i]);
  }
  return l;
}

void Optimizer::step_aten_fused(double lr, const at::Tensor& grad_scale,
                                const std::vector<bool>& only) {
  auto [params, grads, exp_avgs, exp_avg_sqs] = with_grads(&only);
  if (params.empty()) return;
  std::vector<at::Tensor> steps;
  // The kernels read the (already incremented) step from a float tensor per parameter, as
  // torch.optim keeps it; one shared tensor, filled from the host count, serves them all.
  if (!step_tensor_.defined()) {
    step_tensor_ = at::zeros({}, at::TensorOptions(at::kFloat).device(params.front().device()));
  }
  step_tensor_.fill_(static_cast<double>(step_count_));
  steps.assign(params.size(), step_tensor_);
  // ATen divides every gradient by grad_scale (its gradient-scaler contract).
  std::optional<at::Tensor> divide_by;
  if (grad_scale.defined()) divide_by = grad_scale.to(at::kFloat).reciprocal();
  const auto& c = config_;
  if (decoupled_) {
    at::_fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, /*max_exp_avg_sqs=*/{}, steps, lr,
                      c.beta1, c.beta2, c.weight_decay, c.eps, /*amsgrad=*/false,
                      /*maximize=*/false, divide_by, /*found_inf=*/std::nullopt);
  } else {
    at::_fused_adam_(params, grads, exp_avgs, exp_avg_sqs, /*max_exp_avg_sqs=*/{}, steps, lr,
                     c.beta1, c.beta2, c.weight_decay, c.eps, /*amsgrad=*/false,
                     /*maximize=*/false, divide_by, /*found_inf=*/std::nullopt);
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
  // bf16 moments of float32 parameters (optimizer.state_dtype): float32 math, one rounding as
  // each moment is stored.
  const bool widen = exp_avg_[i].scalar_type() != p.scalar_type();
  at::Tensor m = widen ? exp_avg_[i].to(p.scalar_type()) : exp_avg_[i];
  at::Tensor v = widen ? exp_avg_sq_[i].to(p.scalar_type()) : exp_avg_sq_[i];
  m.lerp_(g, 1.0 - config_.beta1);
  v.mul_(config_.beta2).addcmul_(g, g, 1.0 - config_.beta2);
  at::Tensor denom = (v.sqrt() / bc.bias2_sqrt).add_(config_.eps);
  p.addcdiv_(m, denom, -bc.step_size);
  if (widen) {
    exp_avg_[i].copy_(m);
    exp_avg_sq_[i].copy_(v);
  }
}

// torch.optim's _multi_tensor_adam. It first groups tensors by device and dtype, which ATen's CUDA
// fast path needs; here all parameters share one (and a mixed list still runs, per tensor).
void Optimizer::step_foreach(double lr) {
  if (widened_states_) {
    // The multi-tensor ops take one dtype: bf16 moments of float32 parameters go one by one.
    for (size_t i = 0; i < params_.size(); ++i) {
      if (params_[i].param.grad().defined() && !muon_[i]) step_param_aten(i, lr);
    }
    return;
  }
  auto [params, grads, exp_avgs, exp_avg_sqs] = with_grads();
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
    if (muon_[i]) {
      out.emplace_back(params_[i].name + ".momentum_buffer", momentum_[i]);
      continue;
    }
    out.emplace_back(params_[i].name + ".exp_avg", exp_avg_[i]);
    out.emplace_back(params_[i].name + ".exp_avg_sq", exp_avg_sq_[i]);
  }
  return out;
}

}  // namespace titan
