// Global-norm gradient clipping over gradients held in pieces across ranks (FSDP shards,
// tensor-parallel boxes, both), as torch.nn.utils.clip_grad_norm_ computes it on the whole model,
// without reading anything back to the host: the norm and the clipping coefficient stay on the
// gradients' device, and the optimizer applies the coefficient as it reads each gradient
// (Optimizer::step's grad_scale), so a training step neither waits for the device nor makes a
// pass over the gradients to scale them.
//
//   GradNorm n = global_grad_norm(grads, weights, {shard_group, tp_group}, max_norm);
//   optimizer.step(lr, n.clip_coef);       // gradients times the coefficient
//   ...on a logged step: host_item<double>(n.norm)
#pragma once

#include "titan/distributed/comm.h"

#include <ATen/ATen.h>

#include <vector>

namespace titan {

struct GradNorm {
  // 0-d float64 on the gradients' device: the L2 norm of all gradients before clipping.
  at::Tensor norm;
  // 0-d float32 on that device: min(1, max_norm / (norm + 1e-6)), or 1 when the norm is not
  // finite (nothing to scale by; the trainer stops on it). Undefined when max_norm <= 0.
  at::Tensor clip_coef;
};

// L2 norm of gradients held in pieces across ranks, the one norm every caller uses (the
// parallelized model, the tools, the tests): each rank sums weight * |g|^2 over its pieces
// (weight < 1 for pieces several ranks of a group hold, e.g. 1 / tp for TP-replicated
// parameters; `weights` empty: all 1), the sums are all-reduced over `groups` (null entries and
// groups of one are skipped). Each gradient's norm is one reduction in float32 (ATen's
// multi-tensor norm; no wider copy of any gradient), combined in float64. Undefined or empty
// gradients count as zero.
GradNorm global_grad_norm(const std::vector<at::Tensor>& grads, const std::vector<double>& weights,
                          const std::vector<dist::Group*>& groups, double max_norm);

// Multiplies every gradient by `coef` (a 0-d tensor from global_grad_norm) in place; a no-op
// for an undefined coefficient.
void scale_grads(const std::vector<at::Tensor>& grads, const at::Tensor& coef);

// global_grad_norm, then the gradients scaled in place, as torch.nn.utils.clip_grad_norm_; returns
// the norm before clipping, read from the device (one counted host read: for tests and tools, not
// the training step).
double clip_grad_norm(const std::vector<at::Tensor>& grads, double max_norm,
                      const std::vector<dist::Group*>& groups = {},
                      const std::vector<double>& weights = {});

// The gradients of `params` (undefined where none).
std::vector<at::Tensor> grads_of(const std::vector<at::Tensor>& params);

}  // namespace titan
