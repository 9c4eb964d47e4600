// The fused CPU kernels (titan/kernels/fused_layers.h, as autograd ops in fused_ops.h) against
// float64 compositions of ATen ops: forward and both gradients, float32 (1e-5 relative) and
// bfloat16 (a bf16 rounding of the float64 result, one unit in the last place), odd sizes,
// non-contiguous inputs; and the tiny Llama 3 with compile.enable's switches on against off.
#include "titan/common/cpu.h"
#include "titan/config/job_config.h"
#include "titan/models/common/feed_forward.h"
#include "titan/models/common/fused_ops.h"
#include "titan/models/converters.h"
#include "titan/models/llama3/model.h"

#include "../op_counter.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <tuple>
#include <utility>
#include <vector>

namespace titan {
namespace test_fused_ops {

// max |a - b| / max(1, max |b|), in float64.
double rel_error(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor bd = b.to(at::kDouble);
  const double scale = std::max(1.0, bd.abs().max().item<double>());
  return (a.to(at::kDouble) - bd).abs().max().item<double>() / scale;
}

double tolerance(at::ScalarType dtype) { return dtype == at::kFloat ? 1e-5 : 1.0 / 128; }

// Runs `fused` on inputs in `dtype` and `reference` on float64 copies; compares the outputs and
// the gradients of every input for one random upstream gradient.
void check_against_reference(
    const std::vector<at::Tensor>& inputs, at::ScalarType dtype,
    const std::function<at::Tensor(const std::vector<at::Tensor>&)>& fused,
    const std::function<at::Tensor(const std::vector<at::Tensor>&)>& reference,
    const std::string& what) {
  std::vector<at::Tensor> mine, ref;
  for (const at::Tensor& t : inputs) {
    mine.push_back(t.to(dtype).detach().requires_grad_());
    // The reference starts from the same (rounded) values.
    ref.push_back(t.to(dtype).to(at::kDouble).detach().requires_grad_());
  }
  const at::Tensor out = fused(mine);
  const at::Tensor expected = reference(ref);
  ASSERT_EQ(out.scalar_type(), dtype) << what;
  ASSERT_EQ(out.sizes(), expected.sizes()) << what;
  EXPECT_LT(rel_error(out, expected), tolerance(dtype)) << what << " forward";
  const at::Tensor grad = at::randn(expected.sizes(), at::kDouble);
  out.backward(grad.to(dtype));
  expected.backward(grad.to(dtype).to(at::kDouble));
  for (size_t i = 0; i < mine.size(); ++i) {
    ASSERT_TRUE(mine[i].grad().defined()) << what << " input " << i;
    EXPECT_EQ(mine[i].grad().scalar_type(), dtype);
    EXPECT_LT(rel_error(mine[i].grad(), ref[i].grad()), 2 * tolerance(dtype))
        << what << " grad of input " << i;
  }
}

at::Tensor rms_reference(const std::vector<at::Tensor>& in) {
  const at::Tensor& x = in[0];
  return x * at::rsqrt(x.square().mean(-1, /*keepdim=*/true) + 1e-5) * in[1];
}

TEST(FusedOps, RmsNormMatchesTheComposition) {
  at::manual_seed(0);
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    for (const std::vector<int64_t>& shape :
         std::vector<std::vector<int64_t>>{{1, 1}, {3, 7}, {2, 5, 33}, {4, 64, 256}}) {
      const at::Tensor x = at::randn(shape);
      const at::Tensor w = at::rand({shape.back()}) + 0.5;
      check_against_reference(
          {x, w}, dtype,
          [](const std::vector<at::Tensor>& in) { return fused_rms_norm(in[0], in[1], 1e-5); },
          rms_reference, "rmsnorm " + c10::str(shape));
    }
    // Non-contiguous: every other row of a larger tensor, and a transposed one.
    const at::Tensor big = at::randn({6, 40});
    check_against_reference(
        {big.slice(0, 0, 6, 2), at::rand({40}) + 0.5}, dtype,
        [](const std::vector<at::Tensor>& in) {
          return fused_rms_norm(in[0].slice(0, 0, in[0].size(0)), in[1], 1e-5);
        },
        rms_reference, "rmsnorm strided");
    const at::Tensor t = at::randn({9, 5});
    check_against_reference(
        {t, at::rand({9}) + 0.5}, dtype,
        [](const std::vector<at::Tensor>& in) { return fused_rms_norm(in[0].t(), in[1], 1e-5); },
        [](const std::vector<at::Tensor>& in) {
          return rms_reference({in[0].t(), in[1]});
        },
        "rmsnorm transposed");
  }
}

TEST(FusedOps, AddRmsNormMatchesTheComposition) {
  at::manual_seed(5);
  // Both outputs in one tensor, so that one upstream gradient reaches h and y.
  const auto both = [](const at::Tensor& h, const at::Tensor& y) {
    return at::cat({h.flatten(), y.flatten()});
  };
  const auto fused = [&](const std::vector<at::Tensor>& in) {
    auto [h, y] = fused_add_rms_norm(in[0], in[1], in[2], 1e-5);
    return both(h, y);
  };
  const auto reference = [&](const std::vector<at::Tensor>& in) {
    const at::Tensor h = in[0] + in[1];
    return both(h, rms_reference({h, in[2]}));
  };
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    for (const std::vector<int64_t>& shape :
         std::vector<std::vector<int64_t>>{{1, 1}, {3, 7}, {2, 5, 33}, {4, 64, 256}}) {
      check_against_reference({at::randn(shape), at::randn(shape), at::rand({shape.back()}) + 0.5},
                              dtype, fused, reference, "add+rmsnorm " + c10::str(shape));
    }
    // Non-contiguous x (every other row) and a transposed delta.
    const at::Tensor big = at::randn({10, 40});
    check_against_reference(
        {big, at::randn({40, 5}), at::rand({40}) + 0.5}, dtype,
        [&](const std::vector<at::Tensor>& in) {
          return fused({in[0].slice(0, 0, 10, 2), in[1].t(), in[2]});
        },
        [&](const std::vector<at::Tensor>& in) {
          return reference({in[0].slice(0, 0, 10, 2), in[1].t(), in[2]});
        },
        "add+rmsnorm strided");
    // Only one of the outputs used: the other's gradient is undefined in backward.
    const std::vector<at::Tensor> in = {at::randn({3, 9}), at::randn({3, 9}), at::rand({9}) + 0.5};
    const at::Tensor weight = in[2].to(dtype);  // a constant here: y, unused, gives it no grad
    check_against_reference(
        {in[0], in[1]}, dtype,
        [&](const std::vector<at::Tensor>& t) {
          return fused_add_rms_norm(t[0], t[1], weight, 1e-5).first * 1.5;
        },
        [](const std::vector<at::Tensor>& t) { return (t[0] + t[1]) * 1.5; }, "add+rmsnorm h only");
    check_against_reference(
        in, dtype,
        [](const std::vector<at::Tensor>& t) {
          return fused_add_rms_norm(t[0], t[1], t[2], 1e-5).second;
        },
        [](const std::vector<at::Tensor>& t) {
          return rms_reference({t[0] + t[1], t[2]});
        },
        "add+rmsnorm y only");
  }
}

TEST(FusedOps, SwiGLUMatchesTheComposition) {
  at::manual_seed(1);
  const auto ref = [](const std::vector<at::Tensor>& in) { return at::silu(in[0]) * in[1]; };
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    for (int64_t n : {1, 7, 1000, 70001}) {
      // Large gates too: exp saturates without NaNs.
      const at::Tensor gate = at::randn({n}) * 8;
      check_against_reference(
          {gate, at::randn({n})}, dtype,
          [](const std::vector<at::Tensor>& in) { return fused_swiglu(in[0], in[1]); }, ref,
          "swiglu " + std::to_string(n));
    }
    const at::Tensor wide = at::randn({4, 6, 50});
    check_against_reference(
        {wide, at::randn({4, 6, 50})}, dtype,
        [](const std::vector<at::Tensor>& in) {
          return fused_swiglu(in[0].narrow(-1, 3, 31), in[1].narrow(-1, 3, 31));
        },
        [&](const std::vector<at::Tensor>& in) {
          return ref({in[0].narrow(-1, 3, 31), in[1].narrow(-1, 3, 31)});
        },
        "swiglu narrowed");
  }
  // Extremes: silu(-100) = 0 and silu(100) = 100 exactly enough, gradients finite.
  const at::Tensor g = at::tensor({-100.0f, -30.0f, 0.0f, 30.0f, 100.0f}).requires_grad_();
  const at::Tensor h = fused_swiglu(g, at::ones({5}));
  h.sum().backward();
  EXPECT_TRUE(at::isfinite(g.grad()).all().item<bool>());
  EXPECT_NEAR(h[4].item<double>(), 100.0, 1e-4);
  EXPECT_NEAR(h[0].item<double>(), 0.0, 1e-30);
}

// Elements of `a` that differ from `b` (float32 tensors holding bf16 values), and whether every
// difference is at most one bf16 step of b (2^-7 relative: one rounding landing on the other side
// of a boundary).
std::pair<int64_t, bool> bf16_steps_apart(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor diff = (a - b).abs();
  const int64_t differing = diff.gt(0).sum().item<int64_t>();
  const bool one_step = diff.le(b.abs() / 128 + 1e-30).all().item<bool>();
  return {differing, one_step};
}

// The widened SwiGLU (float32 products of bf16-rounded operands in, bf16 values in float32 out)
// against the casts and bf16 ops it replaces, forward and backward: the same values (on 2-core
// AVX-512 Xeon: every element of every case) but for the rare element one bf16 step away, where
// titan's sigmoid and ATen's could put an intermediate on the two sides of a rounding boundary.
TEST(FusedOps, WidenedSwiGLUIsTheBf16Composition) {
  at::manual_seed(4);
  for (int64_t n : {1, 7, 513, 70001}) {
    const at::Tensor gate = (at::randn({n}) * 4).requires_grad_();
    const at::Tensor up = at::randn({n}).requires_grad_();
    const at::Tensor ref_gate = gate.detach().clone().requires_grad_();
    const at::Tensor ref_up = up.detach().clone().requires_grad_();
    const at::Tensor h = widened_swiglu(gate, up);
    const at::Tensor want =
        (at::silu(ref_gate.to(at::kBFloat16)) * ref_up.to(at::kBFloat16)).to(at::kFloat);
    ASSERT_EQ(h.scalar_type(), at::kFloat);
    EXPECT_TRUE(at::equal(h, h.to(at::kBFloat16).to(at::kFloat))) << "h holds bf16 values";
    const at::Tensor grad = at::randn({n});
    h.backward(grad);
    want.backward(grad);
    const std::string what = "n " + std::to_string(n);
    for (const auto& [got, expected, name] :
         {std::tuple{h, want, "h"}, std::tuple{gate.grad(), ref_gate.grad(), "grad gate"},
          std::tuple{up.grad(), ref_up.grad(), "grad up"}}) {
      const auto [differing, one_step] = bf16_steps_apart(got, expected);
      EXPECT_LE(differing, std::max<int64_t>(1, n / 10000)) << what << " " << name;
      EXPECT_TRUE(one_step) << what << " " << name;
    }
  }
  EXPECT_THROW(widened_swiglu(at::randn({3}).to(at::kBFloat16), at::randn({3})), c10::Error);
  EXPECT_THROW(widened_swiglu(at::randn({3}), at::randn({4})), c10::Error);
}

// A bf16 feed-forward on a CPU whose bf16 GEMMs are slow keeps its float32 products through
// widened_swiglu (no aten::silu): the output and w2's gradient are the cast-around-each-op path's
// bit for bit, the other gradients agree but for a rare bf16 step (x's: its w1 and w3 parts are
// now summed in float32 before one rounding). Few rows, a hook on a layer or the fused switch off
// keep the casts.
TEST(FusedOps, WidenedFeedForwardKeepsItsProductsInFloat32) {
  override_fast_bf16_matmul_for_testing(false);
  at::manual_seed(8);
  FeedForward ffn(64, 96, at::kBFloat16);
  for (auto* w : {ffn.w1.get(), ffn.w2.get(), ffn.w3.get()}) {
    w->weight.set_data(at::randn(w->weight.sizes()).mul_(0.2));
  }
  const at::Tensor x0 = at::randn({2, 9, 64}).to(at::kBFloat16);
  const at::Tensor g = at::randn({2, 9, 64}).to(at::kBFloat16);
  // Runs the block (fused switch, input) and returns {y, grad x, grad w1, grad w2, grad w3} in
  // float32 and the aten::silu calls its forward made.
  const auto run = [&](bool fused, const at::Tensor& input) {
    ffn.fused = fused;
    ffn.zero_grad();
    const at::Tensor x = input.clone().requires_grad_(true);
    const test::OpCounter silu("aten::silu");
    const at::Tensor y = ffn.forward(x);
    const int64_t calls = silu.count();
    y.backward(g.narrow(1, 0, input.size(1)));
    return std::pair{std::vector<at::Tensor>{
                         y.to(at::kFloat), x.grad().to(at::kFloat), ffn.w1->weight.grad().clone(),
                         ffn.w2->weight.grad().clone(), ffn.w3->weight.grad().clone()},
                     calls};
  };
  const auto [casts, casts_silu] = run(false, x0);
  const auto [widened, widened_silu] = run(true, x0);
  EXPECT_EQ(casts_silu, 1);
  EXPECT_EQ(widened_silu, 0);
  EXPECT_EQ(widened[0].scalar_type(), at::kFloat);
  EXPECT_TRUE(at::equal(widened[0], casts[0])) << "output";
  EXPECT_TRUE(at::equal(widened[3], casts[3])) << "grad w2";
  const char* names[] = {"output", "grad x", "grad w1", "grad w2", "grad w3"};
  for (size_t i = 1; i < casts.size(); ++i) {
    EXPECT_LT(rel_error(widened[i], casts[i]), 1.0 / 128) << names[i];
  }
  EXPECT_EQ(run(true, x0.narrow(1, 0, 3)).second, 1) << "6 rows: below the rows that widen";
  struct PassThrough : ForwardHook {
    at::Tensor run(HookedModule&, const at::Tensor& x, const ForwardBody& body) override {
      return body(x);
    }
  };
  const auto hook = std::make_shared<PassThrough>();
  ffn.w2->add_forward_hook(hook);
  EXPECT_EQ(run(true, x0).second, 1) << "a hook on w2";
  ffn.w2->remove_forward_hook(hook.get());
  override_fast_bf16_matmul_for_testing(true);
  EXPECT_EQ(run(true, x0).second, 1) << "fast bf16 GEMMs: nothing widens";
  override_fast_bf16_matmul_for_testing(std::nullopt);
}

// RoPE on interleaved pairs, as models/common/rope.cpp's apply_rotary_emb.
at::Tensor rope_reference(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t bs = x.size(0), seqlen = x.size(1), heads = x.size(2), half = x.size(3) / 2;
  const at::Tensor c = cos.narrow(0, 0, seqlen).unsqueeze(1).to(x.scalar_type());
  const at::Tensor s = sin.narrow(0, 0, seqlen).unsqueeze(1).to(x.scalar_type());
  const at::Tensor pairs = x.reshape({bs, seqlen, heads, half, 2});
  const at::Tensor x0 = pairs.select(-1, 0), x1 = pairs.select(-1, 1);
  return at::stack({x0 * c - x1 * s, x0 * s + x1 * c}, -1).view({bs, seqlen, heads, 2 * half});
}

TEST(FusedOps, RopeMatchesTheComposition) {
  at::manual_seed(2);
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    for (const std::vector<int64_t>& shape :
         std::vector<std::vector<int64_t>>{{1, 1, 1, 2}, {2, 5, 3, 6}, {2, 17, 4, 64}}) {
      const int64_t half = shape[3] / 2;
      const at::Tensor angles = at::outer(at::arange(shape[1] + 3, at::kFloat),
                                          at::rand({half}));  // a longer table than needed
      const at::Tensor cos = angles.cos(), sin = angles.sin();
      check_against_reference(
          {at::randn(shape)}, dtype,
          [&](const std::vector<at::Tensor>& in) { return fused_rope(in[0], cos, sin); },
          [&](const std::vector<at::Tensor>& in) { return rope_reference(in[0], cos, sin); },
          "rope " + c10::str(shape));
    }
    // (bs, n_heads, seqlen, head_dim) transposed to (bs, seqlen, n_heads, head_dim).
    const at::Tensor angles = at::outer(at::arange(8, at::kFloat), at::rand({4}));
    check_against_reference(
        {at::randn({2, 3, 8, 8})}, dtype,
        [&](const std::vector<at::Tensor>& in) {
          return fused_rope(in[0].transpose(1, 2), angles.cos(), angles.sin());
        },
        [&](const std::vector<at::Tensor>& in) {
          return rope_reference(in[0].transpose(1, 2), angles.cos(), angles.sin());
        },
        "rope transposed");
  }
}

TEST(FusedOps, RefusesWhatItCannotTake) {
  const at::Tensor x = at::randn({2, 4}, at::kDouble);
  EXPECT_THROW(fused_rms_norm(x, at::ones({4}, at::kDouble), 1e-5), c10::Error);
  EXPECT_THROW(fused_rms_norm(at::randn({2, 4}), at::ones({5}), 1e-5), c10::Error);
  EXPECT_THROW(fused_swiglu(at::randn({3}), at::randn({4})), c10::Error);
  EXPECT_THROW(fused_rope(at::randn({1, 9, 1, 4}), at::ones({8, 2}), at::ones({8, 2})), c10::Error);
}

// The tiny model with the compile switches on against off: same loss and gradients.
TEST(FusedOps, CompileSwitchesKeepTheTinyModelsNumbers) {
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    llama3::Llama3Args args = llama3::args_for_flavor("tiny");
    args.max_seq_len = 32;
    auto plain = std::make_shared<llama3::Transformer>(args, dtype);
    auto fused = std::make_shared<llama3::Transformer>(args, dtype);
    plain->init_weights(3);
    fused->init_weights(3);
    CompileSection compile;
    compile.enable = true;
    compile.components = {"model"};
    // RMSNorms (2 per layer + the final one), SwiGLUs (1 per layer), one RoPE table.
    EXPECT_EQ(apply_compile(*fused, compile, at::kCPU), 2 * args.n_layers + 1 + args.n_layers + 1);
    at::manual_seed(4);
    const at::Tensor tokens = at::randint(args.vocab_size, {2, 32}, at::kLong);
    const at::Tensor labels = at::randint(args.vocab_size, {2, 32}, at::kLong);
    std::vector<double> losses;
    for (auto* m : {plain.get(), fused.get()}) {
      const at::Tensor logits = m->forward(tokens);
      const at::Tensor loss =
          at::cross_entropy_loss(logits.flatten(0, 1).to(at::kFloat), labels.flatten(0, 1));
      loss.backward();
      losses.push_back(loss.item<double>());
    }
    const double tol = dtype == at::kFloat ? 1e-5 : 2e-2;
    EXPECT_NEAR(losses[0], losses[1], tol * losses[0]) << dtype;
    const auto a = plain->named_parameters(), b = fused->named_parameters();
    for (const auto& p : a) {
      const at::Tensor& other = b[p.key()];
      ASSERT_TRUE(p.value().grad().defined() && other.grad().defined()) << p.key();
      EXPECT_LT(rel_error(other.grad(), p.value().grad()), dtype == at::kFloat ? 1e-4 : 5e-2)
          << p.key() << " " << dtype;
    }
  }
}

}  // namespace test_fused_ops
}  // namespace titan
