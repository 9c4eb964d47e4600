// The reusable model pieces against direct reference computations: RMSNorm, RoPE (frequencies
// with Llama 3.1 scaling and the pairwise rotation), causal GQA attention, the mixed-precision
// linear layer and the truncated-normal initializer.
#include "titan/common/cpu.h"
#include "titan/models/common/attention.h"
#include "titan/models/common/init.h"
#include "titan/models/common/linear.h"
#include "titan/models/common/norms.h"
#include "titan/models/common/rope.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <vector>

namespace titan {
namespace test_layers {

TEST(RMSNorm, MatchesDirectComputation) {
  at::manual_seed(0);
  RMSNorm norm(/*dim=*/16, /*eps=*/1e-5);
  {
    at::NoGradGuard no_grad;
    norm.weight.uniform_(0.5, 1.5);
  }
  const at::Tensor x = at::randn({3, 5, 16});
  const at::Tensor y = norm.forward(x);
  const auto xa = x.to(at::kDouble).contiguous();
  const auto w = norm.weight.to(at::kDouble);
  at::Tensor expected = at::empty_like(xa);
  for (int64_t i = 0; i < 3; ++i) {
    for (int64_t j = 0; j < 5; ++j) {
      double sum_sq = 0;
      for (int64_t d = 0; d < 16; ++d) {
        sum_sq += std::pow(xa[i][j][d].item<double>(), 2);
      }
      const double inv_rms = 1.0 / std::sqrt(sum_sq / 16 + 1e-5);
      for (int64_t d = 0; d < 16; ++d) {
        expected[i][j][d] = xa[i][j][d].item<double>() * inv_rms * w[d].item<double>();
      }
    }
  }
  EXPECT_TRUE(at::allclose(y.to(at::kDouble), expected, /*rtol=*/1e-5, /*atol=*/1e-6));
}

TEST(RMSNorm, GradientsMatchAutogradOfTheFormula) {
  // The closed-form backward against autograd through the plain composition, in float64.
  at::manual_seed(10);
  RMSNorm norm(/*dim=*/12, /*eps=*/1e-5);
  norm.to(at::kDouble);
  {
    at::NoGradGuard no_grad;
    norm.weight.uniform_(0.5, 1.5);
  }
  const at::Tensor x = at::randn({2, 3, 12}, at::kDouble).set_requires_grad(true);
  const at::Tensor g = at::randn({2, 3, 12}, at::kDouble);
  (norm.forward(x) * g).sum().backward();
  const at::Tensor x_ref = x.detach().clone().set_requires_grad(true);
  const at::Tensor w_ref = norm.weight.detach().clone().set_requires_grad(true);
  const at::Tensor y_ref = x_ref * at::rsqrt(x_ref.square().mean(-1, true) + 1e-5) * w_ref;
  (y_ref * g).sum().backward();
  EXPECT_TRUE(at::allclose(x.grad(), x_ref.grad(), 1e-10, 1e-12));
  EXPECT_TRUE(at::allclose(norm.weight.grad(), w_ref.grad(), 1e-10, 1e-12));
}

TEST(RMSNorm, ReturnsInputDtype) {
  RMSNorm norm(8);
  const at::Tensor x = at::randn({2, 8});
  const at::Tensor y = norm.forward(x.to(at::kBFloat16));
  EXPECT_EQ(y.scalar_type(), at::kBFloat16);
  EXPECT_TRUE(at::allclose(y.to(at::kFloat), norm.forward(x), /*rtol=*/2e-2, /*atol=*/2e-2));
}

// Llama 3.1 scaling of one frequency, written as plain scalar code.
double reference_scaled_frequency(int64_t i, int64_t head_dim, double theta) {
  const double freq = 1.0 / std::pow(theta, 2.0 * i / head_dim);
  const double wavelen = 2 * M_PI / freq;
  const double low_freq_wavelen = 8192 / 1.0;
  const double high_freq_wavelen = 8192 / 4.0;
  if (wavelen < high_freq_wavelen) {
    return freq;
  }
  if (wavelen > low_freq_wavelen) {
    return freq / 8.0;
  }
  const double smooth = (8192 / wavelen - 1.0) / (4.0 - 1.0);
  return (1 - smooth) * freq / 8.0 + smooth * freq;
}

TEST(RoPE, FrequenciesWithLlama31Scaling) {
  const RopeScaling scaling;
  const int64_t head_dim = 128;
  const at::Tensor freqs = rope_frequencies(head_dim, 500000.0, &scaling);
  ASSERT_EQ(freqs.sizes(), at::IntArrayRef({64}));
  int kept = 0, scaled = 0, smoothed = 0;
  for (int64_t i = 0; i < 64; ++i) {
    const double expected = reference_scaled_frequency(i, head_dim, 500000.0);
    EXPECT_NEAR(freqs[i].item<double>(), expected, 1e-5 * expected) << i;
    const double base = 1.0 / std::pow(500000.0, 2.0 * i / head_dim);
    const double wavelen = 2 * M_PI / base;
    kept += wavelen < 2048;
    scaled += wavelen > 8192;
    smoothed += wavelen >= 2048 && wavelen <= 8192;
  }
  // All three bands occur for Llama 3 head dims, so each branch is exercised.
  EXPECT_GT(kept, 0);
  EXPECT_GT(scaled, 0);
  EXPECT_GT(smoothed, 0);
  // Without scaling: plain theta^(-2i/d).
  const at::Tensor plain = rope_frequencies(head_dim, 500000.0, nullptr);
  EXPECT_NEAR(plain[63].item<double>(), std::pow(500000.0, -126.0 / 128), 1e-12);
}

TEST(RoPE, RotatesInterleavedPairs) {
  at::manual_seed(1);
  const RopeScaling scaling;
  const int64_t head_dim = 8;
  const double theta = 10.0;  // small theta: large angles, so a wrong pairing shows
  RotaryEmbedding rope(head_dim, /*max_seq_len=*/12, theta, &scaling);
  const at::Tensor x = at::randn({2, 6, 3, head_dim});
  const at::Tensor y = rope.forward(x);
  ASSERT_EQ(y.sizes(), x.sizes());
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t t = 0; t < 6; ++t) {
      for (int64_t h = 0; h < 3; ++h) {
        for (int64_t i = 0; i < head_dim / 2; ++i) {
          const double angle = t * reference_scaled_frequency(i, head_dim, theta);
          const double x0 = x[b][t][h][2 * i].item<double>();
          const double x1 = x[b][t][h][2 * i + 1].item<double>();
          EXPECT_NEAR(y[b][t][h][2 * i].item<double>(), x0 * std::cos(angle) - x1 * std::sin(angle),
                      1e-5);
          EXPECT_NEAR(y[b][t][h][2 * i + 1].item<double>(),
                      x0 * std::sin(angle) + x1 * std::cos(angle), 1e-5);
        }
      }
    }
  }
  // bf16 in, bf16 out.
  EXPECT_EQ(rope.forward(x.to(at::kBFloat16)).scalar_type(), at::kBFloat16);
}

// Attention as loops: query head h reads kv head h / n_rep, keys 0..t only.
at::Tensor reference_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  const int64_t bs = q.size(0), seqlen = q.size(1), n_heads = q.size(2), head_dim = q.size(3);
  const int64_t n_rep = n_heads / k.size(2);
  auto qa = q.accessor<double, 4>();
  auto ka = k.accessor<double, 4>();
  auto va = v.accessor<double, 4>();
  at::Tensor out = at::zeros(q.sizes(), q.options());
  auto oa = out.accessor<double, 4>();
  for (int64_t b = 0; b < bs; ++b) {
    for (int64_t h = 0; h < n_heads; ++h) {
      const int64_t g = h / n_rep;
      for (int64_t t = 0; t < seqlen; ++t) {
        std::vector<double> scores(t + 1);
        double max_score = -INFINITY;
        for (int64_t s = 0; s <= t; ++s) {
          double dot = 0;
          for (int64_t d = 0; d < head_dim; ++d) {
            dot += qa[b][t][h][d] * ka[b][s][g][d];
          }
          scores[s] = dot / std::sqrt(static_cast<double>(head_dim));
          max_score = std::max(max_score, scores[s]);
        }
        double total = 0;
        for (auto& score : scores) {
          score = std::exp(score - max_score);
          total += score;
        }
        for (int64_t s = 0; s <= t; ++s) {
          for (int64_t d = 0; d < head_dim; ++d) {
            oa[b][t][h][d] += scores[s] / total * va[b][s][g][d];
          }
        }
      }
    }
  }
  return out;
}

TEST(Attention, CausalGqaMatchesReferenceLoop) {
  at::manual_seed(2);
  for (const int64_t n_kv_heads : {4, 2, 1}) {
    const auto options = at::TensorOptions().dtype(at::kDouble);
    const at::Tensor q = at::randn({2, 7, 4, 8}, options);
    const at::Tensor k = at::randn({2, 7, n_kv_heads, 8}, options);
    const at::Tensor v = at::randn({2, 7, n_kv_heads, 8}, options);
    const at::Tensor out = causal_attention(q, k, v);
    ASSERT_EQ(out.sizes(), q.sizes());
    EXPECT_TRUE(out.is_contiguous());
    EXPECT_TRUE(at::allclose(out, reference_attention(q, k, v), /*rtol=*/1e-10, /*atol=*/1e-12))
        << "n_kv_heads " << n_kv_heads;
    // float32 against the same reference.
    const at::Tensor out32 = causal_attention(q.to(at::kFloat), k.to(at::kFloat), v.to(at::kFloat));
    EXPECT_EQ(out32.scalar_type(), at::kFloat);
    EXPECT_TRUE(at::allclose(out32.to(at::kDouble), reference_attention(q, k, v), 1e-5, 1e-5));
  }
}

TEST(Attention, LongSequencesSpanSeveralQueryChunks) {
  // Long enough for several query chunks, the last one partial.
  at::manual_seed(8);
  const auto options = at::TensorOptions().dtype(at::kDouble);
  const at::Tensor q = at::randn({1, 300, 4, 8}, options);
  const at::Tensor k = at::randn({1, 300, 2, 8}, options);
  const at::Tensor v = at::randn({1, 300, 2, 8}, options);
  EXPECT_TRUE(at::allclose(causal_attention(q, k, v), reference_attention(q, k, v), 1e-10, 1e-12));
}

TEST(Attention, Bf16GradientsFollowFloat32) {
  // The 16-bit path keeps bf16 probabilities and rebuilds the softmax gradient from them.
  at::manual_seed(9);
  const at::Tensor q = at::randn({2, 200, 4, 16});
  const at::Tensor k = at::randn({2, 200, 2, 16});
  const at::Tensor v = at::randn({2, 200, 2, 16});
  const at::Tensor g = at::randn({2, 200, 4, 16});
  std::vector<at::Tensor> grads[2];
  for (const int use_bf16 : {0, 1}) {
    const at::ScalarType dtype = use_bf16 ? at::kBFloat16 : at::kFloat;
    std::vector<at::Tensor> inputs;
    for (const auto& t : {q, k, v}) {
      inputs.push_back(t.to(dtype).detach().set_requires_grad(true));
    }
    (causal_attention(inputs[0], inputs[1], inputs[2]).to(at::kFloat) * g).sum().backward();
    for (const auto& t : inputs) {
      grads[use_bf16].push_back(t.grad().to(at::kFloat));
    }
  }
  for (size_t i = 0; i < 3; ++i) {
    const double rel = ((grads[1][i] - grads[0][i]).norm() / grads[0][i].norm()).item<double>();
    EXPECT_LT(rel, 2e-2) << "input " << i;
  }
}

TEST(Attention, MatchesRepeatInterleaveFormulation) {
  // An independent tensor formulation: repeat K/V per query head, full masked softmax.
  at::manual_seed(3);
  const at::Tensor q = at::randn({1, 5, 6, 4});
  const at::Tensor k = at::randn({1, 5, 2, 4});
  const at::Tensor v = at::randn({1, 5, 2, 4});
  const at::Tensor kr = k.repeat_interleave(3, /*dim=*/2).transpose(1, 2);  // (1, 6, 5, 4)
  const at::Tensor vr = v.repeat_interleave(3, /*dim=*/2).transpose(1, 2);
  at::Tensor scores = at::matmul(q.transpose(1, 2), kr.transpose(-2, -1)) / 2.0;  // sqrt(4)
  scores = scores.masked_fill(at::ones({5, 5}, at::kBool).triu(1), -INFINITY);
  const at::Tensor expected = at::matmul(at::softmax(scores, -1), vr).transpose(1, 2);
  EXPECT_TRUE(at::allclose(causal_attention(q, k, v), expected, 1e-5, 1e-6));
}

TEST(Attention, Bf16InputsGiveBf16OutputNearFloat) {
  at::manual_seed(4);
  const at::Tensor q = at::randn({2, 16, 4, 16});
  const at::Tensor k = at::randn({2, 16, 2, 16});
  const at::Tensor v = at::randn({2, 16, 2, 16});
  const at::Tensor out =
      causal_attention(q.to(at::kBFloat16), k.to(at::kBFloat16), v.to(at::kBFloat16));
  EXPECT_EQ(out.scalar_type(), at::kBFloat16);
  EXPECT_LT((out.to(at::kFloat) - causal_attention(q, k, v)).abs().max().item<double>(), 0.1);
}

TEST(Linear, Bf16ComputeKeepsFloat32MasterGradients) {
  at::manual_seed(5);
  Linear linear(/*in_features=*/8, /*out_features=*/4, at::kBFloat16);
  {
    at::NoGradGuard no_grad;
    linear.weight.normal_();
  }
  const at::Tensor x = at::randn({3, 8});
  const at::Tensor y = linear.forward(x);
  EXPECT_EQ(y.scalar_type(), at::kBFloat16);
  EXPECT_TRUE(at::allclose(y.to(at::kFloat), at::matmul(x, linear.weight.t()), 5e-2, 5e-2));
  y.to(at::kFloat).sum().backward();
  ASSERT_TRUE(linear.weight.grad().defined());
  EXPECT_EQ(linear.weight.grad().scalar_type(), at::kFloat);
  // d/dW sum(x W^T) = column sums of x, broadcast over the output rows.
  const at::Tensor expected = x.sum(0).expand({4, 8});
  EXPECT_TRUE(at::allclose(linear.weight.grad(), expected, 5e-2, 5e-2));
}

// mixed_linear in bf16 takes one of two paths by CPU: ATen's bf16 GEMM (AVX-512, oneDNN) or, on
// CPUs where that is a slow generic loop, the bf16-rounded operands multiplied in float32 and
// rounded once. Both are forced here, whatever this CPU has, and must agree with float64 on
// the rounded operands, forward and gradients, for odd sizes and a non-contiguous input.
TEST(Linear, Bf16PathsOnEitherCpuMatchFloat64) {
  struct RestoreDetection {
    ~RestoreDetection() { override_fast_bf16_matmul_for_testing(std::nullopt); }
  } restore;
  at::manual_seed(11);
  const at::Tensor x_base = at::randn({45, 37});
  const at::Tensor w_base = at::randn({29, 45}) * 0.2;
  const at::Tensor g = at::randn({37, 29});
  // The operands as the bf16 compute sees them, in float64.
  const at::Tensor xr = x_base.t().to(at::kBFloat16).to(at::kDouble);
  const at::Tensor wr = w_base.to(at::kBFloat16).to(at::kDouble);
  const at::Tensor y_ref = at::matmul(xr, wr.t());
  const at::Tensor gx_ref = at::matmul(g.to(at::kDouble), wr);
  const at::Tensor gw_ref = at::matmul(g.to(at::kDouble).t(), xr);
  auto rel = [](const at::Tensor& a, const at::Tensor& ref) {
    return (a.to(at::kDouble) - ref).abs().max().item<double>() /
           std::max(1.0, ref.abs().max().item<double>());
  };
  for (const bool fast : {false, true}) {
    SCOPED_TRACE(fast ? "ATen bf16 GEMM" : "float32 on bf16-rounded operands");
    override_fast_bf16_matmul_for_testing(fast);
    const at::Tensor x = x_base.clone().requires_grad_(true);
    const at::Tensor w = w_base.clone().requires_grad_(true);
    const at::Tensor xt = x.t();  // (37, 45), not contiguous
    ASSERT_FALSE(xt.is_contiguous());
    const at::Tensor y = mixed_linear(xt, w, at::kBFloat16);
    EXPECT_EQ(y.scalar_type(), at::kBFloat16);
    EXPECT_LT(rel(y, y_ref), 1e-2);
    if (!fast) {
      // Exactly one rounding: the float32 product of the rounded operands, rounded to bf16.
      const at::Tensor once = at::linear(xr.to(at::kFloat), wr.to(at::kFloat)).to(at::kBFloat16);
      EXPECT_TRUE(at::equal(y, once));
    }
    (y.to(at::kFloat) * g).sum().backward();
    EXPECT_EQ(x.grad().scalar_type(), at::kFloat);
    EXPECT_EQ(w.grad().scalar_type(), at::kFloat);
    EXPECT_LT(rel(x.grad().t(), gx_ref), 2e-2);
    EXPECT_LT(rel(w.grad(), gw_ref), 2e-2);
    {
      at::NoGradGuard no_grad;
      EXPECT_TRUE(at::equal(mixed_linear(xt, w, at::kBFloat16), y));
      // Few rows (a decode step: one; a short prompt) take ATen's bf16 product on either CPU.
      for (const int64_t rows : {1, 3}) {
        const at::Tensor few = mixed_linear(xt.narrow(0, 0, rows).unsqueeze(0), w, at::kBFloat16);
        EXPECT_EQ(few.sizes(), (std::vector<int64_t>{1, rows, 29}));
        EXPECT_LT(rel(few[0], y_ref.narrow(0, 0, rows)), 1e-2) << rows << " rows";
      }
    }
  }
}

TEST(Init, TruncNormalMatchesMomentsAndBounds) {
  at::Tensor t = at::empty({200000});
  init_whole(t, ParamInit::trunc_normal(/*mean=*/0.0, /*std=*/1.0, /*a=*/-1.0, /*b=*/1.0), 6, "t");
  EXPECT_GE(t.min().item<double>(), -1.0);
  EXPECT_LE(t.max().item<double>(), 1.0);
  // Standard normal truncated to [-1, 1]: std = sqrt(1 - 2 phi(1) / (2 Phi(1) - 1)) = 0.5376.
  EXPECT_NEAR(t.std().item<double>(), 0.5376, 5e-3);
  EXPECT_NEAR(t.mean().item<double>(), 0.0, 5e-3);
  // Bounds at +-3 std (the output layer's init): std * 0.98658.
  init_whole(t, ParamInit::trunc_normal(/*mean=*/0.5, /*std=*/2.0, /*a=*/-5.5, /*b=*/6.5), 6, "t");
  EXPECT_GE(t.min().item<double>(), -5.5);
  EXPECT_LE(t.max().item<double>(), 6.5);
  EXPECT_NEAR(t.std().item<double>(), 2.0 * 0.98658, 1e-2);
  EXPECT_NEAR(t.mean().item<double>(), 0.5, 1e-2);
  // The default absolute bounds (-2, 2) leave a small std untouched.
  init_whole(t, ParamInit::trunc_normal(0.0, 0.02), 6, "t");
  EXPECT_NEAR(t.std().item<double>(), 0.02, 2e-4);
  // Plain normal: moments, and no two neighbours alike.
  init_whole(t, ParamInit::normal(1.0, 3.0), 6, "t");
  EXPECT_NEAR(t.mean().item<double>(), 1.0, 3e-2);
  EXPECT_NEAR(t.std().item<double>(), 3.0, 3e-2);
  EXPECT_GT(std::get<0>(at::unique_consecutive(t)).numel(), 199990);
  // Too little mass inside the bounds is refused, not looped on.
  EXPECT_THROW(init_whole(t, ParamInit::trunc_normal(0.0, 1.0, 5.0, 6.0), 6, "t"), c10::Error);
}

TEST(Init, ValuesDependOnSeedNameAndPositionOnly) {
  at::Tensor a = at::empty({6, 10});
  at::Tensor b = at::empty({6, 10});
  const ParamInit rule = ParamInit::trunc_normal(0.0, 0.5, -1.0, 1.0);
  init_whole(a, rule, 7, "w");
  init_whole(b, rule, 7, "w");
  EXPECT_TRUE(at::equal(a, b));  // same seed and name: same values
  init_whole(b, rule, 8, "w");
  EXPECT_FALSE(at::equal(a, b));  // another seed
  init_whole(b, rule, 7, "v");
  EXPECT_FALSE(at::equal(a, b));  // another parameter
  // Any box holds exactly the whole tensor's values there: FSDP row blocks, TP column blocks,
  // and their combination (2D), including empty and single-element ones.
  const std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> boxes = {
      {{0, 0}, {6, 10}}, {{2, 0}, {3, 10}}, {{0, 5}, {6, 5}}, {{4, 5}, {2, 5}},
      {{5, 9}, {1, 1}},  {{6, 0}, {0, 10}}, {{1, 3}, {4, 4}}};
  for (const auto& [offsets, lengths] : boxes) {
    at::Tensor piece = at::empty(lengths);
    init_box(piece, rule, 7, "w", ShardBox{{6, 10}, offsets});
    at::Tensor expected = a;
    for (int d = 0; d < 2; ++d) expected = expected.narrow(d, offsets[d], lengths[d]);
    EXPECT_TRUE(at::equal(piece, expected)) << offsets[0] << "," << offsets[1];
  }
  // Into a strided view, and in bf16 (rounded from the float32 values).
  at::Tensor holder = at::zeros({10, 6});
  at::Tensor view = holder.t();  // (6, 10), not contiguous
  init_whole(view, rule, 7, "w");
  EXPECT_TRUE(at::equal(view, a));
  at::Tensor half = at::empty({6, 10}, at::kBFloat16);
  init_whole(half, rule, 7, "w");
  EXPECT_TRUE(at::equal(half, a.to(at::kBFloat16)));
  // A box outside the tensor is an error.
  at::Tensor piece = at::empty({2, 10});
  EXPECT_THROW(init_box(piece, rule, 7, "w", ShardBox{{6, 10}, {5, 0}}), c10::Error);
}

TEST(Init, ParametersCreatedUnderAMetaGuardHaveNoStorage) {
  {
    ParamDeviceGuard meta(at::kMeta);
    Linear linear(8, 4);
    RMSNorm norm(8);
    EXPECT_TRUE(linear.weight.is_meta());
    EXPECT_TRUE(norm.weight.is_meta());
  }
  RMSNorm norm(8);  // the guard is gone: real, and ones
  EXPECT_TRUE(at::equal(norm.weight, at::ones({8})));
}

}  // namespace test_layers
}  // namespace titan
