// AdamW / Adam updates against a scalar reference written out in double precision; the fused and
// foreach implementations against the for-loop; gradient clipping by global norm.
#include "titan/components/optimizer.h"

#include "titan/kernels/adamw.h"
#include "titan/parallel/grad_norm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace titan {
namespace optimizer_test {

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
  const double norm = clip_grad_norm(grads_of({a, b}), /*max_norm=*/1.0);
  EXPECT_NEAR(norm, 5.0, 1e-6);  // reported before clipping
  const double after =
      std::sqrt(std::pow(a.grad()[0].item<double>(), 2) + std::pow(b.grad()[0].item<double>(), 2));
  EXPECT_NEAR(after, 1.0, 1e-5);
  EXPECT_NEAR(a.grad()[0].item<double>() / b.grad()[0].item<double>(), 0.75, 1e-6);

  // Below the threshold nothing changes; max_norm <= 0 disables clipping.
  a.mutable_grad() = at::tensor({0.3f, 0.4f});
  EXPECT_NEAR(clip_grad_norm(grads_of({a}), 1.0), 0.5, 1e-6);
  EXPECT_FLOAT_EQ(a.grad()[0].item<float>(), 0.3f);
  a.mutable_grad() = at::tensor({30.0f, 40.0f});
  EXPECT_NEAR(clip_grad_norm(grads_of({a}), 0.0), 50.0, 1e-4);
  EXPECT_FLOAT_EQ(a.grad()[1].item<float>(), 40.0f);
}

// --- optimizer.implementation: fused and foreach against the for-loop ---------------------------

// Initial values of a parameter set with odd sizes: a single element, fewer than a vector, one
// that spans several parallel_for tasks and blocks with a ragged tail, and a transposed layout.
std::vector<at::Tensor> make_initial_params(at::ScalarType dtype) {
  at::manual_seed(0);
  std::vector<at::Tensor> out;
  for (int64_t n : {1, 7, 1000003}) out.push_back(at::randn({n}).to(dtype));
  // (5, 3) stored column-major: dense, not contiguous.
  out.push_back(at::randn({3, 5}).to(dtype).t());
  // Gets a contiguous gradient although it is transposed: layouts differ, so fused falls back.
  out.push_back(at::randn({4, 6}).to(dtype).t());
  return out;
}

// Index of the parameter above whose gradient's layout differs from its own.
constexpr size_t kFallbackParam = 4;

struct OptimizerRun {
  std::vector<at::Tensor> params;
  std::unique_ptr<Optimizer> optimizer;
};

OptimizerRun make_run(const std::vector<at::Tensor>& initial, const OptimizerSection& cfg) {
  OptimizerRun run;
  std::vector<NamedParam> named;
  for (size_t i = 0; i < initial.size(); ++i) {
    // clone keeps the strides of a dense tensor, so the transposed ones stay transposed.
    at::Tensor p = initial[i].clone().set_requires_grad(true);
    run.params.push_back(p);
    named.push_back({std::string("p").append(std::to_string(i)), p});
  }
  run.optimizer = std::make_unique<Optimizer>(std::move(named), cfg);
  return run;
}

// Gradient of step `step` for parameter i: same values in every run; none for parameter 1 on
// step 2 (skipped: neither updated nor decayed).
at::Tensor make_grad(const at::Tensor& param, size_t i, int step) {
  if (i == 1 && step == 2) return at::Tensor();
  at::manual_seed(1000 * step + static_cast<int64_t>(i));
  at::Tensor g = at::randn(param.sizes()).mul_(0.1 * step).to(param.scalar_type());
  if (i == 3) g = at::empty_like(param).copy_(g);  // the parameter's own transposed layout
  return g;
}

void set_grads(OptimizerRun& run, int step) {
  for (size_t i = 0; i < run.params.size(); ++i) {
    run.params[i].mutable_grad() = make_grad(run.params[i], i, step);
  }
}

OptimizerSection implementation_config(const std::string& name, const std::string& impl) {
  OptimizerSection cfg;
  cfg.name = name;
  cfg.lr = 1e-2;
  cfg.weight_decay = 0.1;
  cfg.implementation = impl;
  return cfg;
}

// Largest |a - b| / (|b| + floor * mean |b|) over all elements, in double. The floor keeps
// results that cancel to near zero (p - update, m + w (g - m)) from dividing a rounding error of
// their operands by a tiny value: such an error is relative to the operands, not the result.
double max_relative_error(const at::Tensor& a, const at::Tensor& b, double floor = 0.01) {
  const at::Tensor ad = a.to(at::kDouble), bd = b.to(at::kDouble);
  const double scale = floor * bd.abs().mean().item<double>();
  return ((ad - bd).abs() / (bd.abs() + scale)).max().item<double>();
}

class OptimizerImplementation : public ::testing::TestWithParam<std::string> {};

// The clipping coefficient the trainer passes on odd steps (undefined on even ones: no scaling).
at::Tensor grad_scale_of(int step) {
  return step % 2 == 1 ? at::full({}, 0.5f - 0.1f * static_cast<float>(step)) : at::Tensor();
}

// float32: fused (titan's kernel, and ATen's fused kernel as a GPU runs it) and foreach follow
// the for-loop over four steps (the bias corrections change every step, and so does lr; odd steps
// scale the gradients) to 1e-6 relative, parameters and both moments.
TEST_P(OptimizerImplementation, Float32MatchesForLoop) {
  const std::string name = GetParam();
  const std::vector<at::Tensor> initial = make_initial_params(at::kFloat);
  for (const std::string impl : {"fused", "aten fused", "foreach"}) {
    SCOPED_TRACE(name + " " + impl);
    const bool aten = impl == "aten fused";
    Optimizer::override_fused_kernel_for_testing(aten ? std::optional(Optimizer::FusedKernel::kAten)
                                                      : std::nullopt);
    OptimizerRun reference = make_run(initial, implementation_config(name, "for-loop"));
    OptimizerRun run = make_run(initial, implementation_config(name, aten ? "fused" : impl));
    at::Tensor after_step1;
    for (int step = 1; step <= 4; ++step) {
      const double lr = 1e-2 / step;
      set_grads(reference, step);
      set_grads(run, step);
      reference.optimizer->step(lr, grad_scale_of(step));
      run.optimizer->step(lr, grad_scale_of(step));
      // Parameter 1 has no gradient on step 2: neither updated nor decayed.
      if (step == 1) after_step1 = run.params[1].clone();
      if (step == 2) {
        EXPECT_TRUE(at::equal(run.params[1], after_step1));
      }
      const auto ref_state = reference.optimizer->state_tensors();
      const auto state = run.optimizer->state_tensors();
      for (size_t i = 0; i < initial.size(); ++i) {
        SCOPED_TRACE("step " + std::to_string(step) + " param " + std::to_string(i));
        EXPECT_EQ(run.params[i].strides(), initial[i].strides());
        // Floor 1: relative to |b| + mean |b|, since FMA contraction (fused's, and ATen's own
        // vectorized lerp) moves a result by an ulp of its operands, not of itself.
        EXPECT_LE(max_relative_error(run.params[i], reference.params[i], 1.0), 1e-6);
        EXPECT_LE(max_relative_error(state[2 * i].second, ref_state[2 * i].second, 1.0), 1e-6);
        EXPECT_LE(max_relative_error(state[2 * i + 1].second, ref_state[2 * i + 1].second, 1.0),
                  1e-6);
      }
    }
    Optimizer::override_fused_kernel_for_testing(std::nullopt);
  }
}

// bfloat16 (full-bf16 training: bf16 parameters, gradients and moments): each fused step, taken
// from the bf16 state it is in, matches the for-loop's step taken in float32 from the same state
// and rounded to bf16, to one bf16 ulp (2^-7 relative: the two float computations may differ by a
// float ulp, which can carry a result across a bf16 rounding boundary; results that cancel to near
// zero get a floor of 1% of the tensor's mean magnitude). foreach runs the for-loop's ops, so it
// matches the bf16 for-loop exactly.
TEST_P(OptimizerImplementation, BFloat16MatchesForLoopInFloat32) {
  const std::string name = GetParam();
  const std::vector<at::Tensor> initial = make_initial_params(at::kBFloat16);
  OptimizerRun fused = make_run(initial, implementation_config(name, "fused"));
  OptimizerRun foreach_run = make_run(initial, implementation_config(name, "foreach"));
  OptimizerRun loop = make_run(initial, implementation_config(name, "for-loop"));
  constexpr double kUlp = 1.0 / 128;
  for (int step = 1; step <= 4; ++step) {
    const double lr = 1e-2 / step;
    // The float32 reference starts from fused's current bf16 state.
    std::vector<at::Tensor> start;
    for (const auto& p : fused.params) start.push_back(p.detach().to(at::kFloat));
    OptimizerRun reference = make_run(start, implementation_config(name, "for-loop"));
    const auto fused_state = fused.optimizer->state_tensors();
    const auto ref_state = reference.optimizer->state_tensors();
    for (size_t k = 0; k < fused_state.size(); ++k)
      ref_state[k].second.copy_(fused_state[k].second);
    reference.optimizer->set_step_count(step - 1);
    set_grads(fused, step);
    set_grads(foreach_run, step);
    set_grads(loop, step);
    for (size_t i = 0; i < start.size(); ++i) {
      const at::Tensor g = fused.params[i].grad();
      if (g.defined()) reference.params[i].mutable_grad() = g.to(at::kFloat);
    }
    fused.optimizer->step(lr);
    foreach_run.optimizer->step(lr);
    loop.optimizer->step(lr);
    reference.optimizer->step(lr);

    const auto state = fused.optimizer->state_tensors();
    const auto ref_after = reference.optimizer->state_tensors();
    const auto loop_state = loop.optimizer->state_tensors();
    const auto foreach_state = foreach_run.optimizer->state_tensors();
    for (size_t i = 0; i < start.size(); ++i) {
      SCOPED_TRACE(name + " step " + std::to_string(step) + " param " + std::to_string(i));
      EXPECT_TRUE(at::equal(foreach_run.params[i], loop.params[i]));
      for (size_t k = 2 * i; k < 2 * i + 2; ++k) {
        EXPECT_TRUE(at::equal(foreach_state[k].second, loop_state[k].second)) << state[k].first;
      }
      if (i == kFallbackParam) {
        // Its gradient's layout differs from its own: fused runs the for-loop's bf16 ops on it.
        EXPECT_TRUE(at::equal(fused.params[i], loop.params[i]));
        for (size_t k = 2 * i; k < 2 * i + 2; ++k) {
          EXPECT_TRUE(at::equal(state[k].second, loop_state[k].second)) << state[k].first;
        }
        continue;
      }
      const at::Tensor ref_p = reference.params[i].to(at::kBFloat16);
      EXPECT_LE(max_relative_error(fused.params[i], ref_p), kUlp);
      for (size_t k = 2 * i; k < 2 * i + 2; ++k) {
        EXPECT_LE(max_relative_error(state[k].second, ref_after[k].second.to(at::kBFloat16)), kUlp)
            << state[k].first;
      }
    }
  }
}

// optimizer.state_dtype = "bfloat16" on float32 parameters: every implementation's step, taken
// from the bf16 state it is in, matches the float32-state for-loop's step from the same state:
// the parameters to 1e-6 relative (float32 math in both), the states to one bf16 ulp of the
// reference's (each rounded once, on its store). The states are bf16: half the bytes.
TEST_P(OptimizerImplementation, Bf16StatesMatchFloat32MathFromTheirState) {
  const std::string name = GetParam();
  const std::vector<at::Tensor> initial = make_initial_params(at::kFloat);
  constexpr double kUlp = 1.0 / 128;
  for (const std::string impl : {"fused", "aten fused", "foreach", "for-loop"}) {
    SCOPED_TRACE(name + " " + impl);
    const bool aten = impl == "aten fused";
    Optimizer::override_fused_kernel_for_testing(aten ? std::optional(Optimizer::FusedKernel::kAten)
                                                      : std::nullopt);
    OptimizerSection cfg = implementation_config(name, aten ? "fused" : impl);
    cfg.state_dtype = "bfloat16";
    OptimizerRun run = make_run(initial, cfg);
    for (const auto& [state_name, t] : run.optimizer->state_tensors()) {
      EXPECT_EQ(t.scalar_type(), at::kBFloat16) << state_name;
    }
    for (int step = 1; step <= 3; ++step) {
      const double lr = 1e-2 / step;
      OptimizerRun reference = make_run(run.params, implementation_config(name, "for-loop"));
      const auto state = run.optimizer->state_tensors();
      const auto ref_state = reference.optimizer->state_tensors();
      for (size_t k = 0; k < state.size(); ++k) ref_state[k].second.copy_(state[k].second);
      reference.optimizer->set_step_count(step - 1);
      set_grads(run, step);
      set_grads(reference, step);
      run.optimizer->step(lr, grad_scale_of(step));
      reference.optimizer->step(lr, grad_scale_of(step));
      const auto after = run.optimizer->state_tensors();
      const auto ref_after = reference.optimizer->state_tensors();
      for (size_t i = 0; i < initial.size(); ++i) {
        SCOPED_TRACE("step " + std::to_string(step) + " param " + std::to_string(i));
        // Adam's L2 term: where g + wd p cancels to near zero, the normalized step m / sqrt(v)
        // turns a contraction's ulp in that sum into up to 1e-5 of the parameter.
        EXPECT_LE(max_relative_error(run.params[i], reference.params[i], 1.0),
                  name == "Adam" ? 1e-5 : 1e-6);
        for (size_t k = 2 * i; k < 2 * i + 2; ++k) {
          EXPECT_LE(max_relative_error(after[k].second, ref_after[k].second.to(at::kBFloat16)),
                    kUlp)
              << after[k].first;
        }
      }
    }
    Optimizer::override_fused_kernel_for_testing(std::nullopt);
  }
}

// Named Optimizer/... so that --gtest_filter='Optimizer*' runs them with the rest.
INSTANTIATE_TEST_SUITE_P(Optimizer, OptimizerImplementation, ::testing::Values("AdamW", "Adam"),
                         [](const auto& info) { return info.param; });

TEST(OptimizerImplementation, UnknownImplementationIsRejected) {
  at::Tensor w = at::ones({2}).set_requires_grad(true);
  try {
    Optimizer opt({{"w", w}}, implementation_config("AdamW", "fast"));
    FAIL() << "expected an error";
  } catch (const std::exception& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("optimizer.implementation"), std::string::npos) << what;
    EXPECT_NE(what.find("for-loop"), std::string::npos) << what;
  }
}

// What the fused kernel takes; the optimizer runs the rest through the for-loop's ATen ops.
// (float64 cannot reach it: the optimizer holds float32 or bfloat16 parameters only.)
TEST(OptimizerImplementation, FusedKernelTakesDenseFloatAndBFloat16Only) {
  const at::Tensor f = at::zeros({4, 6});
  EXPECT_TRUE(kernels::adam_step_supported(f, f.clone(), f.clone(), f.clone()));
  const at::Tensor b = f.to(at::kBFloat16);
  EXPECT_TRUE(kernels::adam_step_supported(b, b.clone(), b.clone(), b.clone()));
  const at::Tensor t = f.t();  // transposed: dense, fine when all four share its strides
  EXPECT_TRUE(kernels::adam_step_supported(t, t.clone(), t.clone(), t.clone()));
  EXPECT_FALSE(kernels::adam_step_supported(t, t.contiguous(), t.clone(), t.clone()));
  const at::Tensor d = f.to(at::kDouble);
  EXPECT_FALSE(kernels::adam_step_supported(d, d.clone(), d.clone(), d.clone()));
  EXPECT_FALSE(kernels::adam_step_supported(f, b.clone(), f.clone(), f.clone()));
  const at::Tensor s = at::zeros({4, 12}).slice(/*dim=*/1, 0, 6);  // a slice: not dense
  EXPECT_FALSE(kernels::adam_step_supported(s, s.clone(), s.clone(), s.clone()));
}

}  // namespace optimizer_test
}  // namespace titan
