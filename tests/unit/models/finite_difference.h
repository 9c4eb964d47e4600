// Central differences for gradient checks in float64 tests, and the checks the decoder families'
// tests share (gradients against central differences, KV-cache decoding against the full forward).
#pragma once

#include "titan/models/model.h"
#include "titan/models/registry.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace titan::test {

// d loss / d p[j] by (loss(p[j] + h) - loss(p[j] - h)) / 2h, for a float64 tensor `p` (any
// shape, contiguous; entry j of its flat view); p is restored afterwards.
inline double central_difference(const at::Tensor& p, int64_t j,
                                 const std::function<double()>& loss, double h = 1e-6) {
  at::NoGradGuard no_grad;
  at::Tensor flat = p.view({-1});
  const double keep = flat[j].item<double>();
  flat[j] = keep + h;
  const double up = loss();
  flat[j] = keep - h;
  const double down = loss();
  flat[j] = keep;
  return (up - down) / (2 * h);
}

// For each parameter `names` of `model` (float64, gradients left by one backward of loss()): its
// two entries with the largest gradients against central differences of loss, within 1e-5
// relative (absolute below 1).
inline void expect_top_gradients_match(Model& model, const std::vector<std::string>& names,
                                       const std::function<at::Tensor()>& loss) {
  const auto params = model.named_parameters();
  for (const std::string& name : names) {
    const at::Tensor p = params[name];
    const at::Tensor g = p.grad().clone().view({-1});
    const at::Tensor order = std::get<1>(g.abs().topk(2));
    for (int64_t i = 0; i < 2; ++i) {
      const int64_t j = order[i].item<int64_t>();
      const double want = central_difference(p, j, [&] { return loss().item<double>(); });
      EXPECT_NEAR(g[j].item<double>(), want, 1e-5 * std::max(1.0, std::abs(want)))
          << name << "[" << j << "]";
    }
  }
}

// `tokens` (bs, n) decoded through `cache` (positions [0, prefix) at once, then one at a time)
// give the logits of the full forward within 1e-4. Returns the full forward's logits.
inline at::Tensor expect_cached_decoding_matches(Model& model, const at::Tensor& tokens,
                                                 int64_t prefix, KVCache& cache) {
  at::Tensor full;
  {
    at::NoGradGuard no_grad;
    full = model.forward(tokens);
  }
  std::vector<at::Tensor> steps = {model.forward_cached(tokens.narrow(1, 0, prefix), cache, 0)};
  for (int64_t t = prefix; t < tokens.size(1); ++t) {
    steps.push_back(model.forward_cached(tokens.narrow(1, t, 1), cache, t));
  }
  EXPECT_LT((at::cat(steps, 1) - full).abs().max().item<double>(), 1e-4);
  return full;
}

// The analytic parameter count (stats) of each flavor is the built model's (on the meta device:
// shapes only).
inline void expect_stats_count_parameters(const ModelSpec& spec,
                                          const std::vector<std::string>& flavors) {
  for (const std::string& flavor : flavors) {
    ModelBuildOptions options;
    options.max_seq_len = 16;
    options.meta = true;
    const auto model = spec.build(flavor, options);
    int64_t total = 0;
    for (const auto& item : model->named_parameters()) total += item.value().numel();
    EXPECT_EQ(total, model->stats(1, 16).n_params) << flavor;
  }
}

// Random tensors of the shapes of `model`'s parameters, by name (a Hugging Face round trip's
// input).
inline TensorMap random_tensors_like(Model& model) {
  TensorMap out;
  for (const auto& item : model.named_parameters()) {
    out.emplace(item.key(), at::randn(item.value().sizes()));
  }
  return out;
}

// `got` holds exactly the tensors of `want`, bit for bit.
inline void expect_same_tensors(const TensorMap& want, const TensorMap& got) {
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [name, t] : want) {
    ASSERT_TRUE(got.count(name)) << name;
    EXPECT_TRUE(at::equal(got.at(name), t)) << name;
  }
}

}  // namespace titan::test
