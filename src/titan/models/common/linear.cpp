// Mixed-precision dense layers (see linear.h).
#include "titan/models/common/linear.h"

#include "titan/common/check.h"
#include "titan/models/common/init.h"
#include "titan/models/common/savable_ops.h"

#include <algorithm>
#include <map>

namespace titan {

void HookedModule::add_forward_hook(std::shared_ptr<ForwardHook> hook) {
  TITAN_CHECK(hook != nullptr, "add_forward_hook: null hook");
  hooks_.push_back(std::move(hook));
}

void HookedModule::remove_forward_hook(const ForwardHook* hook) {
  hooks_.erase(std::remove_if(hooks_.begin(), hooks_.end(),
                              [hook](const auto& h) { return h.get() == hook; }),
               hooks_.end());
}

at::Tensor HookedModule::hooked(const at::Tensor& x, const ForwardBody& body) {
  if (hooks_.empty()) return body(x);
  // hooks_[depth - 1] around the inner ones, down to the body itself.
  std::function<at::Tensor(size_t, const at::Tensor&)> chain = [&](size_t depth,
                                                                   const at::Tensor& in) {
    if (depth == 0) return body(in);
    return hooks_[depth - 1]->run(
        *this, in, [&chain, depth](const at::Tensor& y) { return chain(depth - 1, y); });
  };
  return chain(hooks_.size(), x);
}

std::vector<ParamSlot> parameter_slots(torch::nn::Module& root) {
  std::map<std::string, at::Tensor*> by_name;
  for (const auto& item : root.named_modules()) {
    if (auto* layer = dynamic_cast<WeightLayer*>(item.value().get())) {
      const std::string prefix = item.key().empty() ? "" : item.key() + ".";
      by_name[prefix + "weight"] = &layer->weight;
    }
  }
  std::vector<ParamSlot> slots;
  for (const auto& item : root.named_parameters()) {
    auto it = by_name.find(item.key());
    TITAN_CHECK(it != by_name.end() &&
                    it->second->unsafeGetTensorImpl() == item.value().unsafeGetTensorImpl(),
                "parameter ", item.key(), " is not the weight member of a WeightLayer, so a ",
                "parallelism cannot rebind it; hold parameters in WeightLayer subclasses");
    slots.push_back({item.key(), it->second});
  }
  return slots;
}

at::Tensor mixed_linear(const at::Tensor& x, const at::Tensor& weight,
                        at::ScalarType compute_dtype) {
  const at::Tensor xc = to_compute(x, compute_dtype);
  const at::Tensor wc = to_compute(weight, compute_dtype);
  if (xc.numel() == xc.size(-1) && xc.dim() > 1 && !is_reduced_float(xc.scalar_type())) {
    // A single row (a decode step of one sequence): a matrix-vector product. As a 1-row GEMM,
    // BLAS would repack the whole weight matrix on every call, which dominated decoding.
    std::vector<int64_t> sizes = xc.sizes().vec();
    sizes.back() = wc.size(0);
    return at::mv(wc, xc.reshape({-1})).view(sizes);
  }
  return savable_linear(xc, wc);  // at::linear, unless a block is checkpointed op by op
}

void WeightLayer::replace_weight(const at::Tensor& w) {
  at::Tensor& registered = parameters_["weight"];
  if (weight.defined() && weight.is_same(registered)) weight = w;
  registered = w;
}

Linear::Linear(int64_t in_features, int64_t out_features, at::ScalarType compute_dtype)
    : compute_dtype(compute_dtype) {
  // Values are set by the owning model's init_weights(); empty keeps construction cheap.
  weight = register_parameter("weight", new_parameter({out_features, in_features}));
}

at::Tensor Linear::forward(const at::Tensor& x) {
  return hooked(x, [this](const at::Tensor& in) {
    if (float8) {
      return float8_linear(to_compute(in, compute_dtype), to_compute(weight, compute_dtype),
                           *float8, float8_weight ? &*float8_weight : nullptr);
    }
    return mixed_linear(in, weight, compute_dtype);
  });
}

std::vector<std::pair<std::string, Linear*>> float8_linears(torch::nn::Module& root) {
  std::vector<std::pair<std::string, Linear*>> out;
  for (const auto& item : root.named_modules()) {
    auto* linear = dynamic_cast<Linear*>(item.value().get());
    if (linear == nullptr || !linear->float8) continue;
    out.emplace_back(item.key().empty() ? "weight" : item.key() + ".weight", linear);
  }
  return out;
}

void Linear::pretty_print(std::ostream& stream) const {
  const at::Tensor& w = named_parameters(/*recurse=*/false)["weight"];
  stream << "titan::Linear(in_features=" << w.size(1) << ", out_features=" << w.size(0);
  if (float8) {
    stream << ", float8=" << float8_recipe_name(float8->recipe)
           << (float8->emulate ? " emulated" : "");
  }
  stream << ")";
}

Embedding::Embedding(int64_t num_embeddings, int64_t dim) {
  weight = register_parameter("weight", new_parameter({num_embeddings, dim}));
}

at::Tensor Embedding::forward(const at::Tensor& tokens) {
  return hooked(tokens, [this](const at::Tensor& in) { return at::embedding(weight, in); });
}

}  // namespace titan
