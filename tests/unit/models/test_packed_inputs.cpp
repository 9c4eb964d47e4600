// What packed samples (chat fine-tuning) need from the model side: RoPE positions per row equal
// each row rotated on its own, and the losses over labels with ignored tokens: 0 (not NaN, with
// zero gradients) when nothing is predicted, and token_weighted_loss = the sum over predicted
// tokens times the factor, for the plain and the fused loss.
#include "titan/components/loss.h"
#include "titan/kernels/cross_entropy.h"
#include "titan/models/common/fused_loss.h"
#include "titan/models/common/rope.h"

#include <gtest/gtest.h>

namespace titan {
namespace test_packed_inputs {

TEST(PackedInputs, RopePositionsPerRowRotateEachRowOnItsOwn) {
  const RotaryEmbedding rope(/*head_dim=*/8, /*max_seq_len=*/16, /*theta=*/10000.0, nullptr);
  const at::Tensor x = at::randn({2, 5, 3, 8}, at::kDouble).to(at::kFloat);
  const at::Tensor positions = at::tensor({0, 1, 2, 0, 1, 3, 4, 0, 1, 2}, at::kLong).view({2, 5});
  const at::Tensor both = rope.forward(x, positions);
  for (int64_t r = 0; r < 2; ++r) {
    const at::Tensor one = rope.forward(x.narrow(0, r, 1), positions[r].contiguous());
    EXPECT_TRUE(at::equal(both.narrow(0, r, 1), one)) << "row " << r;
  }
  // Positions restarting at 0 rotate like the start of a sequence.
  EXPECT_TRUE(at::allclose(both.narrow(0, 0, 1).narrow(1, 3, 2),
                           rope.forward(x.narrow(0, 0, 1).narrow(1, 3, 2).contiguous())));
  EXPECT_THROW(rope.forward(x, at::zeros({2, 4}, at::kLong)), c10::Error);
}

TEST(PackedInputs, LossesOverNoPredictedTokenAreZeroWithZeroGradients) {
  const at::Tensor logits = at::randn({2, 3, 11}).requires_grad_(true);
  const at::Tensor none = at::full({2, 3}, kernels::kIgnoreIndex, at::kLong);
  const at::Tensor loss = lm_cross_entropy_loss(logits, none);
  EXPECT_EQ(loss.item<float>(), 0.0f);
  loss.backward();
  EXPECT_EQ(logits.grad().abs().sum().item<float>(), 0.0f);

  const at::Tensor h = at::randn({6, 4}).requires_grad_(true);
  const at::Tensor w = at::randn({11, 4}).requires_grad_(true);
  const at::Tensor fused = fused_linear_cross_entropy(h, w, none.view({6}), at::kFloat);
  EXPECT_EQ(fused.item<float>(), 0.0f);
  fused.backward();
  EXPECT_EQ(h.grad().abs().sum().item<float>(), 0.0f);
  EXPECT_TRUE(w.grad().isfinite().all().item<bool>());
}

TEST(PackedInputs, TokenWeightedLossIsTheSumTimesTheFactor) {
  const at::Tensor logits = at::randn({2, 4, 9}, at::kDouble).to(at::kFloat);
  at::Tensor labels = at::randint(0, 9, {2, 4}, at::kLong);
  labels.index_put_({0, 1}, kernels::kIgnoreIndex);
  labels.index_put_({1, 3}, kernels::kIgnoreIndex);
  const at::Tensor sum = at::cross_entropy_loss(logits.view({8, 9}), labels.view({8}), {},
                                                at::Reduction::Sum, kernels::kIgnoreIndex);
  EXPECT_EQ(predicted_tokens(labels).item<int64_t>(), 6);
  const at::Tensor mean = lm_cross_entropy_loss(logits, labels);
  EXPECT_NEAR(mean.item<double>(), sum.item<double>() / 6, 1e-6);
  EXPECT_NEAR(token_weighted_loss(mean, labels, 0.25).item<double>(), sum.item<double>() * 0.25,
              1e-5);
  // The fused loss: the same mean over the predicted tokens.
  const at::Tensor h = at::randn({8, 5}), w = at::randn({9, 5});
  const at::Tensor fused = fused_linear_cross_entropy(h, w, labels.view({8}), at::kFloat);
  const at::Tensor plain = lm_cross_entropy_loss(at::mm(h, w.t()).view({2, 4, 9}), labels);
  EXPECT_NEAR(fused.item<double>(), plain.item<double>(), 1e-5);
}

}  // namespace test_packed_inputs
}  // namespace titan
