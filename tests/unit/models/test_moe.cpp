// The mixture-of-experts layer: routing (top-k, normalization, scale, the bias steering only the
// choice, group-limited routing, forced balance), the layer against a per-token reference with
// and without shared experts and with the weights applied before or after the experts, exact
// gradients (finite differences in float64), the grouped GEMM against the loop, and the
// auxiliary-loss-free bias update.
#include "titan/common/check.h"
#include "titan/common/cpu.h"
#include "titan/common/device.h"
#include "titan/models/common/init.h"
#include "titan/models/common/moe.h"

#include "../op_counter.h"
#include "finite_difference.h"

#include <gtest/gtest.h>

#include <cmath>
#include <optional>
#include <vector>

namespace titan {
namespace test_moe {

MoEArgs small_args() {
  MoEArgs a;
  a.num_experts = 4;
  a.top_k = 2;
  a.hidden_dim = 6;
  return a;
}

std::shared_ptr<MoE> make_moe(const MoEArgs& args, int64_t dim = 8,
                              at::ScalarType dtype = at::kFloat) {
  auto moe = std::make_shared<MoE>(dim, args);
  at::manual_seed(3);
  for (auto& p : moe->parameters()) {
    at::NoGradGuard no_grad;
    p.set_data(at::randn(p.sizes()).mul_(0.3).to(dtype));
  }
  return moe;
}

// expert e of `moe` on x (n, dim): w2 (silu(w1 x) * w3 x), in x's dtype.
at::Tensor expert(const MoE& moe, int64_t e, const at::Tensor& x) {
  const auto& ex = *moe.experts;
  return at::linear(at::silu(at::linear(x, ex.w1->weight[e])) * at::linear(x, ex.w3->weight[e]),
                    ex.w2->weight[e]);
}

// The layer's output token by token from its routing.
at::Tensor reference(MoE& moe, const at::Tensor& x) {
  const at::Tensor tokens = x.reshape({-1, x.size(-1)});
  const Routing r = moe.route(tokens);
  std::vector<at::Tensor> rows;
  for (int64_t t = 0; t < tokens.size(0); ++t) {
    const at::Tensor xt = tokens.narrow(0, t, 1);
    at::Tensor y = at::zeros_like(xt);
    for (int64_t j = 0; j < r.experts.size(1); ++j) {
      const int64_t e = r.experts[t][j].item<int64_t>();
      const at::Tensor w = r.weights[t][j].to(x.scalar_type());
      y = y + (moe.args().score_before_experts ? expert(moe, e, xt * w) : expert(moe, e, xt) * w);
    }
    if (moe.shared_experts) y = y + moe.shared_experts->forward(xt);
    rows.push_back(y);
  }
  return at::cat(rows, 0).view(x.sizes());
}

TEST(MoE, RoutingPicksTopKAndNormalizes) {
  MoEArgs a = small_args();
  a.route_norm = true;
  a.route_scale = 2.5;
  auto moe = make_moe(a);
  const at::Tensor x = at::randn({5, 8});
  const Routing r = moe->route(x);
  const at::Tensor scores = moe->gate->forward(x).softmax(-1);
  const auto [top, idx] = scores.topk(2, -1);
  EXPECT_TRUE(at::equal(r.experts, idx));
  EXPECT_TRUE(at::allclose(r.weights, top / top.sum(-1, true) * 2.5));
  EXPECT_TRUE(at::allclose(r.weights.sum(-1), at::full({5}, 2.5)));
  // The bias steers the choice but the weights stay the scores of the chosen experts.
  {
    at::NoGradGuard no_grad;
    moe->expert_bias.copy_(at::tensor({0.0f, 0.0f, 0.0f, 10.0f}));
  }
  const Routing biased = moe->route(x);
  EXPECT_TRUE((biased.experts == 3).any(1).all().item<bool>());
  EXPECT_TRUE(at::allclose(
      biased.weights,
      scores.gather(1, biased.experts) / scores.gather(1, biased.experts).sum(-1, true) * 2.5));
  // Forced balance: choices round-robin over the experts.
  moe->force_load_balance = true;
  EXPECT_TRUE(
      at::equal(moe->route(x).experts, at::arange(10, at::kLong).remainder(4).view({5, 2})));
}

TEST(MoE, GroupLimitedRoutingStaysInTheBestGroups) {
  MoEArgs a = small_args();
  a.num_experts = 8;
  a.top_k = 2;
  a.score_func = MoEArgs::Score::kSigmoid;
  a.num_expert_groups = 4;
  a.num_limited_groups = 1;
  auto moe = make_moe(a);
  const at::Tensor x = at::randn({16, 8});
  const Routing r = moe->route(x);
  const at::Tensor scores = moe->gate->forward(x).sigmoid();
  // The best group by the sum of its two best scores (groups of 2: the group's sum).
  const at::Tensor group = scores.view({16, 4, 2}).sum(-1).argmax(-1);
  for (int64_t t = 0; t < 16; ++t) {
    for (int64_t j = 0; j < 2; ++j) {
      EXPECT_EQ(r.experts[t][j].item<int64_t>() / 2, group[t].item<int64_t>()) << "token " << t;
    }
  }
  a.num_limited_groups = 3;
  a.top_k = 7;
  try {
    a.validate();
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("(3 x 2 = 6)"), std::string::npos) << e.what();
  }
}

TEST(MoE, LayerMatchesPerTokenReference) {
  for (bool before : {true, false}) {
    for (int64_t shared : {0, 1}) {
      MoEArgs a = small_args();
      a.score_before_experts = before;
      a.num_shared_experts = shared;
      a.route_norm = true;
      auto moe = make_moe(a);
      const at::Tensor x = at::randn({2, 5, 8});
      const at::Tensor got = moe->forward(x);
      EXPECT_TRUE(at::allclose(got, reference(*moe, x), 1e-5, 1e-6))
          << "before " << before << " shared " << shared;
      // Counts: every token once per choice.
      EXPECT_EQ(moe->tokens_per_expert.sum().item<double>(), 2 * 5 * 2);
    }
  }
}

// Central differences in float64 against autograd for the input, the router and the experts.
TEST(MoE, GradientsAreExact) {
  MoEArgs a = small_args();
  a.num_shared_experts = 1;
  a.route_norm = true;
  a.load_balance_coeff = 0;
  auto moe = make_moe(a, 8, at::kDouble);
  const at::Tensor x = at::randn({1, 6, 8}, at::kDouble).requires_grad_();
  const at::Tensor probe = at::randn({1, 6, 8}, at::kDouble);
  const auto loss = [&] { return (moe->forward(x) * probe).sum(); };
  loss().backward();
  std::vector<at::Tensor> checked = {x, moe->gate->weight, moe->experts->w1->weight,
                                     moe->experts->w2->weight, moe->shared_experts->w3->weight};
  const auto value = [&] { return loss().item<double>(); };
  for (size_t i = 0; i < checked.size(); ++i) {
    const at::Tensor& p = checked[i];
    const at::Tensor g = p.grad().clone().view({-1});
    for (int64_t j = 0; j < p.numel(); j += std::max<int64_t>(1, p.numel() / 7)) {
      EXPECT_NEAR(g[j].item<double>(), test::central_difference(p, j, value), 1e-6)
          << "tensor " << i << " element " << j;
    }
  }
}

TEST(MoE, GroupedGemmMatchesTheLoop) {
  MoEArgs a = small_args();
  a.hidden_dim = 8;  // the grouped kernel needs 16-byte row strides
  auto moe = make_moe(a);
  const at::Tensor x = at::randn({23, 8});
  const std::vector<int64_t> counts = {5, 0, 17, 1};
  at::NoGradGuard no_grad;
  const at::Tensor loop = moe->experts->forward_loop(x, counts);
  at::Tensor grouped;
  try {
    grouped = moe->experts->forward_grouped(x, counts);
  } catch (const c10::Error& e) {
    GTEST_SKIP() << "this libtorch has no CPU grouped GEMM: " << e.what_without_backtrace();
  }
  EXPECT_TRUE(at::allclose(grouped, loop, 1e-5, 1e-5)) << (grouped - loop).abs().max();
}

// The grouped GEMM's backward (libtorch's, CPU included) gives the loop's gradients.
TEST(MoE, GroupedGemmGradientsMatchTheLoop) {
  MoEArgs a = small_args();
  a.hidden_dim = 8;
  auto moe = make_moe(a);
  const std::vector<int64_t> counts = {5, 0, 17, 1};
  const at::Tensor x0 = at::randn({23, 8});
  const at::Tensor g = at::randn({23, 8});
  std::vector<at::Tensor> grads[2];
  for (int grouped = 0; grouped < 2; ++grouped) {
    moe->zero_grad();
    const at::Tensor x = x0.clone().requires_grad_(true);
    at::Tensor y;
    try {
      y = grouped ? moe->experts->forward_grouped(x, counts)
                  : moe->experts->forward_loop(x, counts);
      y.backward(g);
    } catch (const c10::Error& e) {
      GTEST_SKIP() << "this libtorch has no CPU grouped GEMM backward: "
                   << e.what_without_backtrace();
    }
    grads[grouped] = {x.grad(), moe->experts->w1->weight.grad().clone(),
                      moe->experts->w2->weight.grad().clone(),
                      moe->experts->w3->weight.grad().clone()};
  }
  for (size_t i = 0; i < grads[0].size(); ++i) {
    EXPECT_TRUE(at::allclose(grads[1][i], grads[0][i], 1e-5, 1e-5))
        << i << ": " << (grads[1][i] - grads[0][i]).abs().max();
  }
}

// bf16 experts on a CPU without fast bf16 GEMMs: the grouped GEMMs run in float32 on the rounded
// operands with the activation in between fused (widened_weight, widened_swiglu: no bf16 silu,
// no pass that casts a whole weight to bf16); the loop runs the unfused casts and bf16 ops. The
// two agree, forward and every gradient, within bf16 rounding.
TEST(MoE, WidenedGroupedExpertsMatchTheLoop) {
  override_fast_bf16_matmul_for_testing(false);
  at::manual_seed(6);
  const int64_t experts = 4, dim = 64, hidden = 32;
  GroupedExperts ex(experts, dim, hidden, at::kBFloat16, /*use_grouped_mm=*/true);
  for (auto* w : {ex.w1.get(), ex.w2.get(), ex.w3.get()}) {
    w->weight.set_data(at::randn(w->weight.sizes()).mul_(0.2));
  }
  const std::vector<int64_t> counts = {37, 0, 90, 5};
  const at::Tensor x0 = at::randn({132, dim}).to(at::kBFloat16);
  const at::Tensor g = at::randn({132, dim}).to(at::kBFloat16);
  std::vector<at::Tensor> results[2];
  for (int grouped = 0; grouped < 2; ++grouped) {
    ex.zero_grad();
    const at::Tensor x = x0.clone().requires_grad_(true);
    at::Tensor y;
    {
      const test::OpCounter silu("aten::silu");
      try {
        y = grouped ? ex.forward_grouped(x, counts) : ex.forward_loop(x, counts);
      } catch (const c10::Error& e) {
        override_fast_bf16_matmul_for_testing(std::nullopt);
        GTEST_SKIP() << "this libtorch has no CPU grouped GEMM: " << e.what_without_backtrace();
      }
      EXPECT_EQ(silu.count(), grouped ? 0 : 3) << (grouped ? "grouped" : "loop");
    }
    y.backward(g);
    results[grouped] = {y.to(at::kFloat), x.grad().to(at::kFloat), ex.w1->weight.grad().clone(),
                        ex.w2->weight.grad().clone(), ex.w3->weight.grad().clone()};
  }
  {
    // fp16 widens too, but the fused SwiGLU rounds to bf16: fp16 experts take the casts.
    GroupedExperts half(experts, dim, hidden, at::kHalf, /*use_grouped_mm=*/true);
    const test::OpCounter silu("aten::silu");
    half.forward_grouped(x0.to(at::kHalf), counts);
    EXPECT_EQ(silu.count(), 1) << "fp16 grouped";
  }
  override_fast_bf16_matmul_for_testing(std::nullopt);
  const char* names[] = {"output", "grad x", "grad w1", "grad w2", "grad w3"};
  for (size_t i = 0; i < results[0].size(); ++i) {
    const double scale = results[0][i].abs().max().item<double>();
    EXPECT_LT((results[1][i] - results[0][i]).abs().max().item<double>(), 2e-2 * scale) << names[i];
  }
}

// LoRA adapters on the experts (ExpertWeight::lora_a / lora_b, w3 sharing w1's A): the loop and
// the grouped GEMMs compute W + s B A per expert, forward and backward (against the experts with
// those weights written out in autograd).
TEST(MoE, ExpertAdaptersAreTheLowRankUpdate) {
  MoEArgs a = small_args();
  a.hidden_dim = 8;
  auto moe = make_moe(a);
  GroupedExperts& ex = *moe->experts;
  const int64_t r = 3;  // the grouped path pads it to 8 (16-byte rows)
  at::manual_seed(5);
  const auto adapter = [&](int64_t out, int64_t in) {
    auto w = std::make_shared<ExpertWeight>(4, out, in);
    w->weight.set_data(at::randn({4, out, in}).mul_(0.3));
    w->is_adapter = true;
    return w;
  };
  ex.w1->lora_a = adapter(r, 8);
  ex.w1->lora_b = adapter(8, r);
  ex.w3->lora_a = ex.w1->lora_a;
  ex.w3->lora_b = adapter(8, r);
  ex.w2->lora_a = adapter(r, 8);
  ex.w2->lora_b = adapter(8, r);
  ex.lora_scaling = 0.5;
  const std::vector<int64_t> counts = {5, 0, 17, 1};
  const at::Tensor x0 = at::randn({23, 8});
  const at::Tensor g = at::randn({23, 8});
  const std::vector<at::Tensor> leaves = {ex.w1->lora_a->weight, ex.w1->lora_b->weight,
                                          ex.w3->lora_b->weight, ex.w2->lora_a->weight,
                                          ex.w2->lora_b->weight, ex.w1->weight};
  const auto run = [&](int path) {
    for (const at::Tensor& l : leaves) l.mutable_grad() = at::Tensor();
    const at::Tensor x = x0.clone().requires_grad_(true);
    at::Tensor y;
    if (path == 0) {
      // The reference: each expert's weight W + s B A, no adapters.
      auto plain = std::make_shared<GroupedExperts>(4, 8, 8, at::kFloat, false);
      const auto eff = [&](const std::shared_ptr<ExpertWeight>& w) {
        return w->weight + ex.lora_scaling * at::matmul(w->lora_b->weight, w->lora_a->weight);
      };
      plain->w1->weight = eff(ex.w1);
      plain->w2->weight = eff(ex.w2);
      plain->w3->weight = eff(ex.w3);
      y = plain->forward_loop(x, counts);
    } else {
      y = path == 1 ? ex.forward_loop(x, counts) : ex.forward_grouped(x, counts);
    }
    y.backward(g);
    std::vector<at::Tensor> out = {y.detach(), x.grad()};
    for (const at::Tensor& l : leaves) out.push_back(l.grad().clone());
    return out;
  };
  for (const at::Tensor& l : leaves) l.requires_grad_(true);
  const std::vector<at::Tensor> want = run(0);
  for (int path = 1; path <= 2; ++path) {
    std::vector<at::Tensor> got;
    try {
      got = run(path);
    } catch (const c10::Error& e) {
      if (path == 2) GTEST_SKIP() << "no CPU grouped GEMM: " << e.what_without_backtrace();
      throw;
    }
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_TRUE(at::allclose(got[i], want[i], 1e-4, 1e-5))
          << "path " << path << ", output " << i << ": " << (got[i] - want[i]).abs().max();
    }
  }
}

// The grouped GEMMs in bf16 on `cuda` (the device under test) with adapters of rank 4 (padded to
// 8 for the kernel's 16-byte rows) against the experts with W + s B A written out in float32,
// forward and the adapters' gradients, within bf16 rounding.
void check_grouped_bf16_adapters(const at::Device& cuda) {
  at::manual_seed(8);
  const int64_t experts = 4, dim = 64, hidden = 32, r = 4;
  GroupedExperts ex(experts, dim, hidden, at::kBFloat16, /*use_grouped_mm=*/true);
  const auto weight = [&](int64_t out, int64_t in, bool adapter) {
    auto w = std::make_shared<ExpertWeight>(experts, out, in);
    w->weight.set_data(at::randn({experts, out, in}).mul_(0.2).to(cuda));
    w->is_adapter = adapter;
    return w;
  };
  ex.w1 = weight(hidden, dim, false);
  ex.w3 = weight(hidden, dim, false);
  ex.w2 = weight(dim, hidden, false);
  ex.w1->lora_a = weight(r, dim, true);
  ex.w1->lora_b = weight(hidden, r, true);
  ex.w3->lora_a = ex.w1->lora_a;
  ex.w3->lora_b = weight(hidden, r, true);
  ex.w2->lora_a = weight(r, hidden, true);
  ex.w2->lora_b = weight(dim, r, true);
  ex.lora_scaling = 2.0;
  ASSERT_TRUE(ex.groups_on_device());
  const std::vector<at::Tensor> adapters = {ex.w1->lora_a->weight, ex.w1->lora_b->weight,
                                            ex.w3->lora_b->weight, ex.w2->lora_a->weight,
                                            ex.w2->lora_b->weight};
  for (const at::Tensor& a : adapters) a.requires_grad_(true);
  const at::Tensor counts = at::tensor(std::vector<int64_t>{37, 0, 90, 5}, at::kLong).to(cuda);
  const at::Tensor x = at::randn({132, dim}).to(cuda);
  const at::Tensor g = at::randn({132, dim}).to(cuda);
  const auto grads = [&](const at::Tensor& y) {
    for (const at::Tensor& a : adapters) a.mutable_grad() = at::Tensor();
    y.backward(g.to(y.scalar_type()));
    std::vector<at::Tensor> out;
    for (const at::Tensor& a : adapters) out.push_back(a.grad().to(at::kFloat).cpu());
    return out;
  };
  const at::Tensor y = ex.forward_grouped(x, counts);
  const std::vector<at::Tensor> got = grads(y);
  // The reference: float32 loop over the merged weights.
  GroupedExperts plain(experts, dim, hidden, at::kFloat, /*use_grouped_mm=*/false);
  const auto eff = [&](const std::shared_ptr<ExpertWeight>& w) {
    return w->weight + ex.lora_scaling * at::matmul(w->lora_b->weight, w->lora_a->weight);
  };
  plain.w1->weight = eff(ex.w1);
  plain.w2->weight = eff(ex.w2);
  plain.w3->weight = eff(ex.w3);
  const at::Tensor want = plain.forward_loop(x, {37, 0, 90, 5});
  const std::vector<at::Tensor> want_grads = grads(want);
  const at::Tensor yf = y.to(at::kFloat).cpu(), wf = want.cpu();
  EXPECT_LT((yf - wf).abs().max().item<double>(), 3e-2 * wf.abs().max().item<double>());
  for (size_t i = 0; i < got.size(); ++i) {
    const double scale = want_grads[i].abs().max().item<double>();
    EXPECT_LT((got[i] - want_grads[i]).abs().max().item<double>(), 3e-2 * scale) << "adapter " << i;
  }
}

TEST(MoE, GroupedBf16AdaptersMatchTheMergedWeights) {
  try {
    check_grouped_bf16_adapters(at::kCPU);
  } catch (const c10::Error& e) {
    GTEST_SKIP() << "no CPU grouped GEMM: " << e.what_without_backtrace();
  }
}

// On a GPU (scripts/gpu_check.sh): the same with CUDA's grouped kernel.
TEST(ExpertLoraCuda, GroupedBf16AdaptersMatchTheMergedWeights) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  check_grouped_bf16_adapters(at::Device(at::kCUDA, 0));
}

TEST(MoE, BiasMovesTowardUnderloadedExperts) {
  MoEArgs a = small_args();
  a.load_balance_coeff = 0.01;
  auto moe = make_moe(a);
  {
    at::NoGradGuard no_grad;
    moe->tokens_per_expert.copy_(at::tensor({10.0f, 0.0f, 5.0f, 5.0f}));
  }
  EXPECT_DOUBLE_EQ(load_imbalance(moe->tokens_per_expert).item<double>(), 2.0);
  moe->update_expert_bias();
  EXPECT_TRUE(at::allclose(moe->expert_bias, at::tensor({-0.01f, 0.01f, 0.0f, 0.0f})));
  EXPECT_EQ(moe->tokens_per_expert.sum().item<double>(), 0.0);
}

}  // namespace test_moe
}  // namespace titan
