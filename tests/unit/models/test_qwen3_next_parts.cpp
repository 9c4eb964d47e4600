// The pieces of Qwen3-Next besides its linear attention (toward model "qwen3_next"): the
// zero-centred RMSNorm, the MoE's gated shared expert, and the gated full attention (output gate,
// partial RoPE, zero-centred q/k norms) by hand and against transformers' Qwen3NextAttention on
// the same weights (the fixture tests/e2e/test_gated_delta_reference.sh writes; skipped without).
#include "titan/checkpoint/safetensors.h"
#include "titan/models/common/attention.h"
#include "titan/models/common/moe.h"
#include "titan/models/common/norms.h"
#include "titan/models/common/rope.h"
#include "titan/models/llama3/hf_adapter.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

namespace titan {
namespace test_qwen3_next_parts {

double max_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

TEST(Qwen3NextParts, ZeroCenteredNormScalesByOnePlusWeight) {
  RMSNorm norm(6, 1e-6, /*zero_centered=*/true);
  EXPECT_TRUE(at::equal(norm.weight, at::zeros({6})));  // starts as the identity scale
  {
    at::NoGradGuard no_grad;
    norm.weight.copy_(at::randn({6}));
  }
  const at::Tensor x = at::randn({3, 6}, at::kDouble);
  const at::Tensor w = norm.weight.to(at::kDouble);
  const at::Tensor want = x * at::rsqrt(x.square().mean(-1, true) + 1e-6) * (1 + w);
  EXPECT_LT(max_diff(norm.forward(x.to(at::kFloat)), want), 1e-5);
  const auto [h, hn] = norm.forward_add(x.to(at::kFloat), x.to(at::kFloat));
  EXPECT_LT(max_diff(hn, norm.forward(h)), 1e-6);
  // The gradient reaches the weight as through a plain norm of weight 1 + w.
  norm.forward(x.to(at::kFloat)).sum().backward();
  RMSNorm plain(6, 1e-6);
  {
    at::NoGradGuard no_grad;
    plain.weight.copy_(norm.weight + 1);
  }
  plain.forward(x.to(at::kFloat)).sum().backward();
  EXPECT_LT(max_diff(norm.weight.grad(), plain.weight.grad()), 1e-5);
}

TEST(Qwen3NextParts, SharedExpertGate) {
  MoEArgs args;
  args.num_experts = 4;
  args.top_k = 2;
  args.hidden_dim = 8;
  args.num_shared_experts = 1;
  args.route_norm = true;
  args.score_before_experts = false;
  args.load_balance_coeff = 0;
  args.shared_expert_gate = true;
  MoE gated(16, args, at::kFloat);
  MoEArgs plain_args = args;
  plain_args.shared_expert_gate = false;
  MoE plain(16, plain_args, at::kFloat);
  {
    at::NoGradGuard no_grad;
    for (auto& item : gated.named_parameters()) {
      item.value().copy_(at::randn(item.value().sizes()) * 0.3);
    }
    for (auto& item : plain.named_parameters()) {
      item.value().copy_(gated.named_parameters()[item.key()]);
    }
  }
  EXPECT_EQ(gated.shared_gate->weight.sizes(), (std::vector<int64_t>{1, 16}));
  const at::Tensor x = at::randn({2, 5, 16});
  at::NoGradGuard no_grad;
  const at::Tensor shared = gated.shared_experts->forward(x.reshape({-1, 16})).view({2, 5, 16});
  const at::Tensor g = at::sigmoid(at::matmul(x, gated.shared_gate->weight.t()));  // (2, 5, 1)
  // gated = routed + g * shared, plain = routed + shared.
  EXPECT_LT(max_diff(gated.forward(x), plain.forward(x) + (g - 1) * shared), 1e-5);
  MoEArgs bad = args;
  bad.num_shared_experts = 0;
  EXPECT_THROW(bad.validate(), ConfigError);
}

AttentionExtras gated_extras(int64_t rope_dim) {
  AttentionExtras e;
  e.output_gate = true;
  e.rope_dim = rope_dim;
  e.zero_centered_norm = true;
  return e;
}

TEST(Qwen3NextParts, OutputGateMultipliesEachHead) {
  // Gated and ungated attention with the same q, k, v and an identity wo: the gated output is
  // the ungated one times sigmoid(gate rows of wq applied to x).
  const int64_t dim = 16, heads = 2, hd = 8;
  Attention gated(dim, heads, heads, hd, at::kFloat, true, 1e-6, gated_extras(4));
  AttentionExtras plain_extras;
  plain_extras.rope_dim = 4;
  plain_extras.zero_centered_norm = true;
  Attention plain(dim, heads, heads, hd, at::kFloat, true, 1e-6, plain_extras);
  RotaryEmbedding rope(4, 32, 10000.0, nullptr);
  at::NoGradGuard no_grad;
  const at::Tensor wq = at::randn({heads * 2 * hd, dim}) / 4;
  gated.wq->weight.copy_(wq);
  // The q rows of each head (the first hd of its 2 hd).
  plain.wq->weight.copy_(wq.view({heads, 2, hd, dim}).select(1, 0).reshape({heads * hd, dim}));
  for (Attention* a : {&gated, &plain}) {
    a->wk->weight.copy_(wq.narrow(0, 0, heads * hd) * 0.5);
    a->wv->weight.copy_(wq.narrow(0, heads * hd, heads * hd));
    a->wo->weight.copy_(at::eye(dim));
    a->q_norm->weight.fill_(0.1);
    a->k_norm->weight.fill_(-0.2);
  }
  const at::Tensor x = at::randn({2, 7, dim});
  const at::Tensor gates =
      at::matmul(x, wq.view({heads, 2, hd, dim}).select(1, 1).reshape({heads * hd, dim}).t());
  EXPECT_LT(max_diff(gated.forward(x, rope), plain.forward(x, rope) * at::sigmoid(gates)), 1e-5);
}

TEST(Qwen3NextParts, AttentionMatchesTransformers) {
  const char* path = std::getenv("TITAN_GATED_DELTA_FIXTURE");
  if (path == nullptr) GTEST_SKIP() << "run by tests/e2e/test_gated_delta_reference.sh";
  const ckpt::SafetensorsReader file(path);
  const int64_t dim = 32, heads = 4, kv_heads = 2, hd = 8, rope_dim = 4;
  Attention attention(dim, heads, kv_heads, hd, at::kFloat, true, 1e-6, gated_extras(rope_dim));
  RotaryEmbedding rope(rope_dim, 64, 10000.0, nullptr);
  at::NoGradGuard no_grad;
  // transformers rotates the halves of the first rope_dim dimensions of each head, we their
  // interleaved pairs: those rows (and norm entries) move; q_proj's rows per head are
  // [q (hd), gate (hd)].
  const auto read = [&](const std::string& name) { return file.read("attention." + name); };
  attention.wq->weight.copy_(
      llama3::permute_rotary_from_hf(read("q_proj.weight"), heads, 2 * hd, rope_dim));
  attention.wk->weight.copy_(
      llama3::permute_rotary_from_hf(read("k_proj.weight"), kv_heads, hd, rope_dim));
  attention.wv->weight.copy_(read("v_proj.weight"));
  attention.wo->weight.copy_(read("o_proj.weight"));
  attention.q_norm->weight.copy_(
      llama3::permute_rotary_from_hf(read("q_norm.weight"), 1, hd, rope_dim));
  attention.k_norm->weight.copy_(
      llama3::permute_rotary_from_hf(read("k_norm.weight"), 1, hd, rope_dim));
  // The permutation and its inverse.
  EXPECT_TRUE(at::equal(llama3::permute_rotary_to_hf(attention.wq->weight, heads, 2 * hd, rope_dim),
                        read("q_proj.weight")));
  const double diff =
      max_diff(attention.forward(file.read("attention_x"), rope), file.read("attention_out"));
  EXPECT_LT(diff, 1e-5);
  std::printf("Qwen3-Next gated attention vs transformers: max |titan - transformers| %.3g\n",
              diff);
}

}  // namespace test_qwen3_next_parts
}  // namespace titan
