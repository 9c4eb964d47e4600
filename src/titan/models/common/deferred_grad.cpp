// Deferred weight gradients (see deferred_grad.h).
#include "titan/models/common/deferred_grad.h"

#include "titan/common/check.h"
#include "titan/models/common/linear.h"

#include <ATen/core/grad_mode.h>

#include <utility>

namespace titan {

void DeferredGrads::add_weight_grad(WeightLayer* layer, std::function<at::Tensor()> compute) {
  TITAN_CHECK(layer != nullptr, "DeferredGrads: a weight gradient without its layer");
  events_.push_back({layer, std::move(compute), {}, nullptr});
  ++pending_;
}

void DeferredGrads::add_consumer(std::vector<const at::Tensor*> slots, Consumer take) {
  events_.push_back({nullptr, nullptr, std::move(slots), std::move(take)});
}

void DeferredGrads::run() {
  at::NoGradGuard no_grad;
  // Computed sums by layer, in the order layers first appeared.
  std::vector<std::pair<WeightLayer*, at::Tensor>> sums;
  const auto find = [&](const at::Tensor* slot) {
    for (auto it = sums.begin(); it != sums.end(); ++it) {
      if (&it->first->weight == slot) return it;
    }
    return sums.end();
  };
  for (Event& e : events_) {
    if (e.layer != nullptr) {
      at::Tensor g = e.compute();
      auto it = find(&e.layer->weight);
      if (it == sums.end()) {
        sums.emplace_back(e.layer, std::move(g));
      } else {
        it->second = it->second + g;
      }
      --pending_;
      continue;
    }
    std::vector<at::Tensor> got;
    for (const at::Tensor* slot : e.slots) {
      auto it = find(slot);
      if (it == sums.end()) {
        got.emplace_back();
        continue;
      }
      got.push_back(std::move(it->second));
      sums.erase(it);
    }
    e.take(std::move(got));
  }
  events_.clear();
  for (auto& [layer, g] : sums) {
    at::Tensor& param = layer->registered_weight();
    TITAN_CHECK(param.requires_grad() && param.sizes() == g.sizes(),
                "deferred weight gradients: the gradient ", g.sizes(), " of a ", layer->name(),
                " has no parameter to go to (its parameter has shape ", param.sizes(),
                param.requires_grad() ? "" : " and needs no gradient",
                "). HINT: a parallelism that installs the layer's weight must take its deferred "
                "gradient (DeferredGrads::add_consumer)");
    at::Tensor cast = g.to(param.scalar_type());
    if (param.grad().defined()) {
      param.mutable_grad().add_(cast);
    } else {
      param.mutable_grad() = std::move(cast);
    }
  }
}

}  // namespace titan
