// Global-norm gradient clipping over gradients held in pieces across ranks (FSDP shards,
// tensor-parallel boxes, both), as torch.nn.utils.clip_grad_norm_ computes it on the whole model.
#pragma once

#include "titan/distributed/comm.h"

#include <ATen/ATen.h>

#include <vector>

namespace titan {

// L2 norm of gradients held in pieces across ranks: each rank sums weight * |g|^2 over its pieces
// (weight < 1 for pieces several ranks of a group hold, e.g. 1 / tp for TP-replicated
// parameters), the sums are all-reduced over `groups`, and when max_norm > 0 and the norm exceeds
// it the gradients are scaled by max_norm / (norm + 1e-6) (torch.nn.utils.clip_grad_norm_).
double clip_grad_norm_sharded(const std::vector<at::Tensor>& grads,
                              const std::vector<double>& weights,
                              const std::vector<dist::Group*>& groups, double max_norm);

}  // namespace titan
