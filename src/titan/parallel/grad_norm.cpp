// Global-norm clipping over sharded gradients (see grad_norm.h).
#include "titan/parallel/grad_norm.h"

#include "titan/common/host_sync.h"

#include <map>

namespace titan {

GradNorm global_grad_norm(const std::vector<at::Tensor>& grads, const std::vector<double>& weights,
                          const std::vector<dist::Group*>& groups, double max_norm) {
  at::NoGradGuard no_grad;
  at::Device device = at::kCPU;
  for (const auto& g : grads) {
    if (g.defined()) device = g.device();
  }
  // Gradients by weight (usually one or two distinct weights): one multi-tensor norm per weight
  // and dtype, squared and summed in float64.
  std::map<std::pair<double, at::ScalarType>, std::vector<at::Tensor>> by_weight;
  for (size_t i = 0; i < grads.size(); ++i) {
    if (!grads[i].defined() || grads[i].numel() == 0) continue;
    const double w = weights.empty() ? 1.0 : weights.at(i);
    by_weight[{w, grads[i].scalar_type()}].push_back(grads[i]);
  }
  at::Tensor sq = at::zeros({1}, at::TensorOptions(at::kDouble).device(device));
  for (const auto& [key, list] : by_weight) {
    const std::vector<at::Tensor> norms = at::_foreach_norm(list, 2, at::kFloat);
    sq += at::stack(norms).to(at::kDouble).square().sum() * key.first;
  }
  for (dist::Group* g : groups) {
    if (g == nullptr || g->size() <= 1) continue;
    at::Tensor on_group = sq.to(g->device());
    g->all_reduce(on_group, dist::ReduceOp::kSum).wait();
    if (!on_group.is_same(sq)) sq.copy_(on_group, /*non_blocking=*/true);
  }
  GradNorm out;
  out.norm = sq.sqrt().squeeze(0);
  if (max_norm > 0) {
    const at::Tensor coef = (max_norm / (out.norm + 1e-6)).clamp_max(1.0);
    out.clip_coef = at::where(out.norm.isfinite(), coef, at::ones_like(coef)).to(at::kFloat);
  }
  return out;
}

void scale_grads(const std::vector<at::Tensor>& grads, const at::Tensor& coef) {
  if (!coef.defined()) return;
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> defined;
  for (const auto& g : grads) {
    if (g.defined() && g.numel() > 0) defined.push_back(g);
  }
  if (!defined.empty()) at::_foreach_mul_(defined, coef);
}

double clip_grad_norm(const std::vector<at::Tensor>& grads, double max_norm,
                      const std::vector<dist::Group*>& groups, const std::vector<double>& weights) {
  const GradNorm n = global_grad_norm(grads, weights, groups, max_norm);
  scale_grads(grads, n.clip_coef);
  return host_item<double>(n.norm);
}

std::vector<at::Tensor> grads_of(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> grads;
  for (const auto& p : params) grads.push_back(p.grad());
  return grads;
}

}  // namespace titan
