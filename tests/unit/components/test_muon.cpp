// Muon (components/muon.h, optimizer.h): against torch.optim.Muon (a fixture written by
// tests/e2e/muon_reference.py, run by test_muon_reference.sh), Newton–Schulz's properties, the
// learning-rate rules, which parameters take Muon, its state names, and the local
// orthogonalizer's refusal of pieces.
#include "titan/checkpoint/safetensors.h"
#include "titan/components/muon.h"
#include "titan/components/optimizer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace titan {
namespace muon_test {

double max_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

OptimizerSection muon_config() {
  OptimizerSection c;
  c.name = "Muon";
  c.lr = 0.02;
  c.weight_decay = 0.1;
  return c;
}

TEST(Muon, MatchesTorch) {
  const char* path = std::getenv("TITAN_MUON_FIXTURE");
  if (path == nullptr) GTEST_SKIP() << "run by tests/e2e/test_muon_reference.sh";
  const ckpt::SafetensorsReader file(path);
  const int64_t cases = file.read("cases").item<int64_t>();
  const char* rules[] = {"original", "match_rms_adamw", "spectral_unclamped"};
  double worst_2d = 0, worst_stack = 0;
  for (int64_t i = 0; i < cases; ++i) {
    const std::string c = "case" + std::to_string(i) + ".";
    const at::Tensor s = file.read(c + "settings");
    const auto v = [&](int k) { return s[k].item<double>(); };
    OptimizerSection cfg = muon_config();
    cfg.lr = v(0);
    cfg.weight_decay = v(1);
    cfg.muon_momentum = v(2);
    cfg.muon_nesterov = v(3) != 0;
    cfg.muon_adjust_lr_fn = rules[static_cast<int>(v(4))];
    cfg.muon_ns_a = v(5);
    cfg.muon_ns_b = v(6);
    cfg.muon_ns_c = v(7);
    cfg.muon_ns_steps = static_cast<int64_t>(v(8));
    cfg.muon_eps = v(9);
    at::Tensor w = file.read(c + "p0").clone().set_requires_grad(true);
    NamedParam p{"layers.0.feed_forward.w1.weight", w};
    p.matrix = true;
    Optimizer opt({p}, cfg);
    ASSERT_EQ(opt.muon_matrices().size(), 1u);
    for (int t = 0; t < 3; ++t) {
      w.mutable_grad() = file.read(c + "grad" + std::to_string(t));
      opt.step(cfg.lr);
      const double d = max_diff(w, file.read(c + "after" + std::to_string(t)));
      // 2-D: the same ATen kernels as torch (bit-identical here); a stack of experts runs as
      // batched GEMMs, whose roundings may differ from torch's one matrix at a time.
      EXPECT_LT(d, w.dim() == 2 ? 1e-7 : 2e-5) << c << "step " << t;
      (w.dim() == 2 ? worst_2d : worst_stack) = std::max(w.dim() == 2 ? worst_2d : worst_stack, d);
    }
    const at::Tensor buf = opt.state_tensors().front().second;
    EXPECT_EQ(opt.state_tensors().front().first, "layers.0.feed_forward.w1.weight.momentum_buffer");
    EXPECT_LT(max_diff(buf, file.read(c + "momentum_buffer")), 1e-7) << c;
  }
  std::printf(
      "Muon vs torch.optim.Muon: %lld cases x 3 steps, max |titan - torch| %.3g (matrices), "
      "%.3g (expert stacks)\n",
      static_cast<long long>(cases), worst_2d, worst_stack);
}

TEST(Muon, NewtonSchulzOrthogonalizes) {
  // The quintic iteration leaves singular values roughly in (0.5, 1.5), whatever the input's.
  at::manual_seed(3);
  for (const auto& shape : {std::vector<int64_t>{16, 48}, std::vector<int64_t>{48, 16}}) {
    const at::Tensor g = at::randn(shape) * 7;
    const at::Tensor o = newton_schulz(g, NewtonSchulz{});
    EXPECT_EQ(o.scalar_type(), at::kBFloat16);
    EXPECT_EQ(o.sizes(), g.sizes());
    const at::Tensor sv = at::linalg_svdvals(o.to(at::kFloat));
    EXPECT_GT(sv.min().item<double>(), 0.3) << shape;
    EXPECT_LT(sv.max().item<double>(), 1.6) << shape;
  }
  // A batch is each matrix on its own (within bf16 GEMM rounding).
  const at::Tensor stack = at::randn({3, 8, 12});
  const at::Tensor batched = newton_schulz(stack, NewtonSchulz{});
  for (int64_t e = 0; e < 3; ++e) {
    EXPECT_LT(max_diff(batched[e], newton_schulz(stack[e], NewtonSchulz{})), 2e-2) << e;
  }
}

TEST(Muon, AdjustedLearningRates) {
  EXPECT_DOUBLE_EQ(muon_adjusted_lr(0.01, "original", 64, 16), 0.02);
  EXPECT_DOUBLE_EQ(muon_adjusted_lr(0.01, "original", 16, 64), 0.01);
  EXPECT_DOUBLE_EQ(muon_adjusted_lr(0.01, "match_rms_adamw", 16, 64), 0.01 * 0.2 * 8);
  EXPECT_DOUBLE_EQ(muon_adjusted_lr(0.01, "spectral_unclamped", 16, 64), 0.005);
  EXPECT_THROW(muon_adjusted_lr(0.01, "rms", 2, 2), std::exception);
}

TEST(Muon, WhichParametersTakeMuon) {
  EXPECT_TRUE(muon_excluded("output.weight", {"output", "moe.gate"}));
  EXPECT_TRUE(muon_excluded("layers.1.moe.gate.weight", {"output", "moe.gate"}));
  EXPECT_FALSE(muon_excluded("layers.1.moe.shared_gate.weight", {"output", "moe.gate"}));
  EXPECT_FALSE(muon_excluded("layers.1.attention.output_proj.weight", {"output"}));
  EXPECT_FALSE(muon_excluded("layers.1.attention.wq.weight", {}));

  const auto param = [](const std::string& name, std::vector<int64_t> shape, bool matrix) {
    NamedParam p{name, at::randn(shape).set_requires_grad(true)};
    p.matrix = matrix;
    return p;
  };
  std::vector<NamedParam> params = {
      param("tok_embeddings.weight", {32, 8}, false),
      param("layers.0.attention.wq.weight", {8, 8}, true),
      param("layers.0.attention_norm.weight", {8}, false),
      param("layers.0.moe.experts.w1.weight", {4, 6, 8}, true),
      param("layers.0.moe.gate.weight", {4, 8}, true),
      param("output.weight", {32, 8}, true),
  };
  Optimizer opt(params, muon_config());
  std::vector<std::string> muon;
  for (const MuonMatrix& m : opt.muon_matrices()) muon.push_back(m.name);
  EXPECT_EQ(muon, (std::vector<std::string>{"layers.0.attention.wq.weight",
                                            "layers.0.moe.experts.w1.weight"}));
  std::vector<std::string> states;
  for (const auto& [name, t] : opt.state_tensors()) states.push_back(name);
  EXPECT_EQ(states, (std::vector<std::string>{
                        "tok_embeddings.weight.exp_avg", "tok_embeddings.weight.exp_avg_sq",
                        "layers.0.attention.wq.weight.momentum_buffer",
                        "layers.0.attention_norm.weight.exp_avg",
                        "layers.0.attention_norm.weight.exp_avg_sq",
                        "layers.0.moe.experts.w1.weight.momentum_buffer",
                        "layers.0.moe.gate.weight.exp_avg", "layers.0.moe.gate.weight.exp_avg_sq",
                        "output.weight.exp_avg", "output.weight.exp_avg_sq"}));

  // The AdamW group's own learning rate and weight decay: an AdamW optimizer with them moves
  // the embedding the same way.
  OptimizerSection cfg = muon_config();
  cfg.muon_adamw_lr = 1e-3;
  cfg.muon_adamw_weight_decay = 0.05;
  NamedParam a = param("tok_embeddings.weight", {32, 8}, false);
  NamedParam b{a.name, a.param.detach().clone().set_requires_grad(true)};
  Optimizer with_muon({a}, cfg);
  OptimizerSection adamw;
  adamw.name = "AdamW";
  adamw.lr = 1e-3;
  adamw.weight_decay = 0.05;
  Optimizer plain({b}, adamw);
  const at::Tensor g = at::randn({32, 8});
  a.param.mutable_grad() = g.clone();
  b.param.mutable_grad() = g.clone();
  with_muon.step(cfg.lr);
  plain.step(adamw.lr);
  EXPECT_LT(max_diff(a.param, b.param), 1e-9);
}

TEST(Muon, GradScaleAndParametersWithoutGradient) {
  // grad_scale multiplies the gradient (the clipping coefficient); a parameter without a
  // gradient keeps its value and momentum.
  at::manual_seed(5);
  NamedParam a{"layers.0.attention.wq.weight", at::randn({8, 12}).set_requires_grad(true)};
  a.matrix = true;
  NamedParam b{a.name, a.param.detach().clone().set_requires_grad(true)};
  b.matrix = true;
  NamedParam idle{"layers.0.attention.wk.weight", at::randn({8, 12}).set_requires_grad(true)};
  idle.matrix = true;
  const at::Tensor before = idle.param.detach().clone();
  Optimizer scaled({a, idle}, muon_config());
  Optimizer reference({b}, muon_config());
  const at::Tensor g = at::randn({8, 12});
  a.param.mutable_grad() = g * 4;
  b.param.mutable_grad() = g * 2;
  scaled.step(0.02, at::full({}, 0.5));
  reference.step(0.02);
  EXPECT_TRUE(at::equal(a.param, b.param));
  EXPECT_TRUE(at::equal(idle.param, before));
  EXPECT_EQ(scaled.state_tensors()[1].second.abs().sum().item<double>(), 0.0);
}

TEST(Muon, Bf16MomentumFollowsFloat32Math) {
  // optimizer.state_dtype = "bfloat16": the buffer is bf16; each step equals a float32-buffer
  // step from the same (widened) buffer, and the stored buffer is that step's rounded once.
  at::manual_seed(9);
  OptimizerSection cfg = muon_config();
  cfg.state_dtype = "bfloat16";
  NamedParam p{"layers.0.attention.wq.weight", at::randn({16, 24}).set_requires_grad(true)};
  p.matrix = true;
  Optimizer opt({p}, cfg);
  ASSERT_EQ(opt.state_tensors()[0].second.scalar_type(), at::kBFloat16);
  for (int t = 0; t < 3; ++t) {
    NamedParam q{p.name, p.param.detach().clone().set_requires_grad(true)};
    q.matrix = true;
    Optimizer reference({q}, muon_config());
    reference.state_tensors()[0].second.copy_(opt.state_tensors()[0].second);
    const at::Tensor g = at::randn({16, 24});
    p.param.mutable_grad() = g.clone();
    q.param.mutable_grad() = g.clone();
    opt.step(0.02);
    reference.step(0.02);
    EXPECT_TRUE(at::equal(p.param, q.param)) << "step " << t;
    EXPECT_TRUE(at::equal(opt.state_tensors()[0].second,
                          reference.state_tensors()[0].second.to(at::kBFloat16)))
        << "step " << t;
  }
}

TEST(Muon, LocalOrthogonalizerRefusesPieces) {
  NamedParam p{"layers.3.feed_forward.w2.weight", at::randn({4, 8}).set_requires_grad(true)};
  p.matrix = true;
  p.box = ShardBox{{8, 8}, {4, 0}};  // rows 4..7 of an 8 x 8 matrix
  Optimizer opt({p}, muon_config());
  p.param.mutable_grad() = at::randn({4, 8});
  try {
    opt.step(0.02);
    FAIL() << "a piece was orthogonalized as if whole";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("holds a piece [4, 8] of layers.3.feed_forward.w2.weight "
                                         "[8, 8]"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace muon_test
}  // namespace titan
