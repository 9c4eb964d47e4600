// AdamW / Adam over float32 master parameters (or bfloat16 ones under training.dtype =
// "bfloat16", with bf16 states), and gradient clipping by global norm.
//
// optimizer.implementation picks how the update runs, as in torch.optim: "fused" (one pass per
// parameter through titan::kernels::adam_step on CPU), "foreach" (ATen's multi-tensor
// _foreach_* ops over all parameters at once) or "for-loop" (ATen ops per parameter, the
// reference). All three compute the same update.
//
// The optimizer only ever sees the tensors it is given (this rank's shards under FSDP or tensor
// parallelism), keeps its state (exp_avg, exp_avg_sq, step) per parameter, and exposes it by name
// for checkpointing.
#pragma once

#include "titan/config/job_config.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <vector>

namespace titan {

struct NamedParam {
  std::string name;
  at::Tensor param;  // float32 (or bfloat16) leaf tensor with requires_grad
};

class Optimizer {
 public:
  Optimizer(std::vector<NamedParam> params, const OptimizerSection& config);

  // One update with learning rate `lr`; parameters without a gradient are skipped.
  void step(double lr);
  void zero_grad();

  int64_t step_count() const { return step_count_; }
  const std::vector<NamedParam>& params() const { return params_; }
  // State tensors by "<param name>.exp_avg" / ".exp_avg_sq" (for checkpoints and tests).
  // The tensors are the optimizer's own: copying into them restores a checkpoint.
  std::vector<std::pair<std::string, at::Tensor>> state_tensors() const;
  // Restores the step count (bias correction) from a checkpoint.
  void set_step_count(int64_t steps) { step_count_ = steps; }

 private:
  enum class Implementation { kFused, kForeach, kForLoop };

  // One parameter through ATen ops (for-loop, and fused's fallback for what it cannot take).
  void step_param_aten(size_t i, double lr);
  void step_foreach(double lr);

  std::vector<NamedParam> params_;
  std::vector<at::Tensor> exp_avg_;
  std::vector<at::Tensor> exp_avg_sq_;
  OptimizerSection config_;
  bool decoupled_;  // AdamW (decoupled weight decay) vs Adam (L2 added to the gradient)
  Implementation implementation_;
  int64_t step_count_ = 0;
};

// Total L2 norm of all gradients (before clipping). When max_norm > 0 and the norm exceeds it,
// scales every gradient by max_norm / (norm + 1e-6), as torch.nn.utils.clip_grad_norm_.
double clip_grad_norm(const std::vector<at::Tensor>& params, double max_norm);

}  // namespace titan
