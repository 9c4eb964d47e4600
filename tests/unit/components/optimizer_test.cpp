// AdamW / Adam updates against a scalar reference written out in double precision, and
// gradient clipping by global norm.
#include "titan/components/optimizer.h"

#include <gtest/gtest.h>

#include <cmath>

namespace titan {
namespace {

// Reference AdamW/Adam for one scalar over several steps with given gradients.
double reference_adam(double p, const std::vector<double>& grads, double lr, double b1, double b2,
                      double eps, double wd, bool decoupled) {
  double m = 0, v = 0;
  for (size_t t = 1; t <= grads.size(); ++t) {
    double g = grads[t - 1];
    if (decoupled) {
      p *= 1 - lr * wd;
    } else {
      g += wd * p;
    }
    m = b1 * m + (1 - b1) * g;
    v = b2 * v + (1 - b2) * g * g;
    const double mhat = m / (1 - std::pow(b1, t));
    const double vhat_sqrt = std::sqrt(v) / std::sqrt(1 - std::pow(b2, t));
    p -= lr * mhat / (vhat_sqrt + eps);
  }
  return p;
}

void run_case(const std::string& name) {
  OptimizerSection cfg;
  cfg.name = name;
  cfg.lr = 1e-2;
  cfg.weight_decay = 0.1;
  at::Tensor w = at::tensor({0.5f, -1.0f, 2.0f}).set_requires_grad(true);
  Optimizer opt({{"w", w}}, cfg);
  const std::vector<std::vector<double>> grads = {
      {0.1, -0.2, 0.3}, {0.05, 0.4, -0.1}, {1.0, 0.0, 0.2}};
  for (const auto& g : grads) {
    w.mutable_grad() = at::tensor({(float)g[0], (float)g[1], (float)g[2]});
    opt.step(cfg.lr);
  }
  const double init[3] = {0.5, -1.0, 2.0};
  for (int i = 0; i < 3; ++i) {
    std::vector<double> gi = {grads[0][i], grads[1][i], grads[2][i]};
    const double ref = reference_adam(init[i], gi, cfg.lr, cfg.beta1, cfg.beta2, cfg.eps,
                                      cfg.weight_decay, name == "AdamW");
    EXPECT_NEAR(w[i].item<double>(), ref, 1e-6) << name << " element " << i;
  }
  EXPECT_EQ(opt.step_count(), 3);
}

TEST(Optimizer, AdamWMatchesReference) { run_case("AdamW"); }
TEST(Optimizer, AdamMatchesReference) { run_case("Adam"); }

TEST(Optimizer, ZeroGradClearsAndSkipsParamsWithoutGrad) {
  OptimizerSection cfg;
  at::Tensor a = at::ones({2}).set_requires_grad(true);
  at::Tensor b = at::ones({2}).set_requires_grad(true);
  Optimizer opt({{"a", a}, {"b", b}}, cfg);
  a.mutable_grad() = at::ones({2});
  opt.step(1e-3);
  EXPECT_FALSE(at::equal(a, at::ones({2})));
  EXPECT_TRUE(at::equal(b, at::ones({2})));  // no grad: untouched, even by weight decay
  opt.zero_grad();
  EXPECT_FALSE(a.grad().defined());
  EXPECT_EQ(opt.state_tensors().size(), 4u);
}

TEST(ClipGradNorm, ScalesOnlyAboveMaxNorm) {
  at::Tensor a = at::zeros({2}).set_requires_grad(true);
  at::Tensor b = at::zeros({1}).set_requires_grad(true);
  a.mutable_grad() = at::tensor({3.0f, 0.0f});
  b.mutable_grad() = at::tensor({4.0f});
  const double norm = clip_grad_norm({a, b}, /*max_norm=*/1.0);
  EXPECT_NEAR(norm, 5.0, 1e-6);  // reported before clipping
  const double after =
      std::sqrt(std::pow(a.grad()[0].item<double>(), 2) + std::pow(b.grad()[0].item<double>(), 2));
  EXPECT_NEAR(after, 1.0, 1e-5);
  EXPECT_NEAR(a.grad()[0].item<double>() / b.grad()[0].item<double>(), 0.75, 1e-6);

  // Below the threshold nothing changes; max_norm <= 0 disables clipping.
  a.mutable_grad() = at::tensor({0.3f, 0.4f});
  EXPECT_NEAR(clip_grad_norm({a}, 1.0), 0.5, 1e-6);
  EXPECT_FLOAT_EQ(a.grad()[0].item<float>(), 0.3f);
  a.mutable_grad() = at::tensor({30.0f, 40.0f});
  EXPECT_NEAR(clip_grad_norm({a}, 0.0), 50.0, 1e-4);
  EXPECT_FLOAT_EQ(a.grad()[1].item<float>(), 40.0f);
}

}  // namespace
}  // namespace titan
