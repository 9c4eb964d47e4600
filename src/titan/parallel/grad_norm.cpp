// Global-norm clipping over sharded gradients (see grad_norm.h).
#include "titan/parallel/grad_norm.h"

#include <cmath>

namespace titan {

double clip_grad_norm_sharded(const std::vector<at::Tensor>& grads,
                              const std::vector<double>& weights,
                              const std::vector<dist::Group*>& groups, double max_norm) {
  at::NoGradGuard no_grad;
  at::Device device = at::kCPU;
  for (const auto& g : grads) {
    if (g.defined()) device = g.device();
  }
  at::Tensor sq = at::zeros({1}, at::TensorOptions().dtype(at::kDouble).device(device));
  for (size_t i = 0; i < grads.size(); ++i) {
    if (!grads[i].defined() || grads[i].numel() == 0) continue;
    sq += grads[i].to(at::kDouble).pow(2).sum() * weights[i];
  }
  for (dist::Group* g : groups) {
    if (g != nullptr && g->size() > 1) g->all_reduce(sq, dist::ReduceOp::kSum).wait();
  }
  const double total = std::sqrt(sq.item<double>());
  if (max_norm > 0 && std::isfinite(total)) {
    const double coef = max_norm / (total + 1e-6);
    if (coef < 1.0) {
      for (const auto& g : grads) {
        if (g.defined()) g.mul_(coef);
      }
    }
  }
  return total;
}

}  // namespace titan
