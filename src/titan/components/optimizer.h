// AdamW / Adam over float32 master parameters (or bfloat16 ones under training.dtype =
// "bfloat16", with bf16 states); or Muon (components/muon.h) for the weight matrices with AdamW
// for the other parameters, as one optimizer.
//
// optimizer.implementation picks how the update runs, as in torch.optim: "fused" (on the CPU one
// pass per parameter through titan::kernels::adam_step; on a GPU ATen's fused multi-tensor
// AdamW, at::_fused_adamw_, one kernel launch for all parameters), "foreach" (ATen's
// multi-tensor _foreach_* ops over all parameters at once) or "for-loop" (ATen ops per parameter,
// the reference). All compute the same update. No implementation reads a value back from the
// device: the step count and learning rate are host numbers, the clipping coefficient a device
// tensor.
//
// optimizer.state_dtype = "bfloat16" keeps the states (moments, Muon's momentum) in bf16 with
// float32 math, each state rounded once as it is stored: titan's fused CPU kernel takes that mix;
// ATen's kernels do not, and the parameters then go one by one through ATen ops.
//
// The optimizer only ever sees the tensors it is given (this rank's shards under FSDP or tensor
// parallelism), keeps its state (exp_avg, exp_avg_sq, step) per parameter, and exposes it by name
// for checkpointing.
#pragma once

#include "titan/common/shard_box.h"
#include "titan/components/muon.h"
#include "titan/config/job_config.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace titan {

struct NamedParam {
  std::string name;
  at::Tensor param;  // float32 (or bfloat16) leaf tensor with requires_grad
  // Where `param` sits in the whole tensor; empty global_shape: it is the whole.
  ShardBox box;
  // A weight matrix (a Linear's, or a stack of expert matrices): Muon takes it unless
  // optimizer.muon_adamw_fqns names it.
  bool matrix = false;
};

class Optimizer {
 public:
  Optimizer(std::vector<NamedParam> params, const OptimizerSection& config);

  // One update with learning rate `lr`; parameters without a gradient are skipped. `grad_scale`
  // (a 0-d float32 tensor on the parameters' device, e.g. GradNorm::clip_coef) multiplies every
  // gradient as the update reads it; undefined: 1. The fused paths apply it inside their pass
  // (the gradients keep their values), the others scale the gradients in place first.
  // Under Muon `lr` is the Muon group's (optimizer.lr as scheduled); the AdamW group's is it times
  // muon_adamw_lr / lr.
  void step(double lr, const at::Tensor& grad_scale = at::Tensor());
  void zero_grad();

  int64_t step_count() const { return step_count_; }
  const std::vector<NamedParam>& params() const { return params_; }
  // Muon's matrices as this rank holds them (empty unless optimizer.name is Muon), in the order
  // a MuonOrthogonalizer gets their updates. Orthogonalized locally unless one is set: a sharded
  // run sets the distributed one (parallel/muon_exchange.h) before the first step.
  std::vector<MuonMatrix> muon_matrices() const;
  void set_muon_orthogonalizer(std::unique_ptr<MuonOrthogonalizer> orthogonalizer);
  // State tensors by "<param name>.exp_avg" / ".exp_avg_sq" (AdamW, Adam and Muon's AdamW group)
  // and ".momentum_buffer" (Muon's matrices), for checkpoints and tests.
  // The tensors are the optimizer's own: copying into them restores a checkpoint.
  std::vector<std::pair<std::string, at::Tensor>> state_tensors() const;
  // Restores the step count (bias correction) from a checkpoint.
  void set_step_count(int64_t steps) { step_count_ = steps; }

  // Which kernel "fused" runs: titan's one-pass CPU kernel or ATen's fused multi-tensor AdamW
  // (every device; the one CUDA takes). Tests force ATen's on the CPU (nullopt: by device).
  enum class FusedKernel { kTitan, kAten };
  static void override_fused_kernel_for_testing(std::optional<FusedKernel> kernel);

 private:
  enum class Implementation { kFused, kForeach, kForLoop };

  // One parameter through ATen ops (for-loop, and fused's fallback for what it cannot take).
  void step_param_aten(size_t i, double lr);
  // Muon's matrices: momentum, orthogonalized updates, the parameters updated.
  void step_muon(double lr);
  void step_foreach(double lr);
  // The parameters with a gradient (and `only[i]`, when given), with their gradients and
  // states, as lists.
  struct Lists {
    std::vector<at::Tensor> params, grads, exp_avgs, exp_avg_sqs;
  };
  Lists with_grads(const std::vector<bool>* only = nullptr) const;
  // ATen's _fused_adamw_ / _fused_adam_ over the parameters `only` marks.
  void step_aten_fused(double lr, const at::Tensor& grad_scale, const std::vector<bool>& only);

  std::vector<NamedParam> params_;
  std::vector<at::Tensor> exp_avg_;
  std::vector<at::Tensor> exp_avg_sq_;
  // Muon: which parameters it takes (the others are the AdamW group), their momentum buffers
  // (undefined for the others), its settings; the AdamW group's lr as a ratio to Muon's.
  std::vector<bool> muon_;
  std::vector<size_t> muon_index_;
  std::vector<at::Tensor> momentum_;
  std::unique_ptr<MuonOrthogonalizer> orthogonalizer_;
  OptimizerSection muon_config_;
  double adamw_lr_ratio_ = 1.0;
  // The AdamW group's settings (weight_decay: Muon's AdamW group's own).
  OptimizerSection config_;
  bool decoupled_;  // AdamW (decoupled weight decay) vs Adam (L2 added to the gradient)
  // optimizer.state_dtype bfloat16 on float32 parameters: states narrower than the parameters.
  bool widened_states_ = false;
  Implementation implementation_;
  int64_t step_count_ = 0;
  // ATen's fused kernels read the step count from a tensor on the parameters' device (one,
  // shared by every parameter, set from step_count_ without a host read).
  at::Tensor step_tensor_;
};

}  // namespace titan
