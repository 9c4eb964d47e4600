// `titan bench --breakdown`'s accounting: names to op families, and one forward + backward of the
// tiny Llama 3 under a StepBreakdown: the phases add up to the step, every family the model has
// gets time (through the model's spans and autograd's sequence numbers), and the matmul FLOPs
// equal 3 x 2 x tokens x the linear layers' weights, counted from the model's parameters.
#include "titan/common/phase.h"
#include "titan/components/breakdown.h"
#include "titan/components/loss.h"
#include "titan/models/llama3/model.h"

#include <gtest/gtest.h>

namespace titan {
namespace breakdown_test {

TEST(Breakdown, OpNamesMapToFamilies) {
  EXPECT_EQ(op_family_of_name("aten::addmm"), OpFamily::kMatmul);
  EXPECT_EQ(op_family_of_name("aten::linear"), OpFamily::kMatmul);
  EXPECT_EQ(op_family_of_name("MmBackward0"), OpFamily::kMatmul);
  EXPECT_EQ(op_family_of_name("BmmBackward0"), OpFamily::kMatmul);
  EXPECT_EQ(op_family_of_name("aten::_scaled_dot_product_flash_attention_for_cpu"),
            OpFamily::kAttention);
  EXPECT_EQ(op_family_of_name("ScaledDotProductFlashAttentionForCpuBackward0"),
            OpFamily::kAttention);
  EXPECT_EQ(op_family_of_name("torch::autograd::CppNode<titan::RMSNormFunction>"), OpFamily::kNorm);
  EXPECT_EQ(op_family_of_name("rope"), OpFamily::kRope);
  EXPECT_EQ(op_family_of_name("swiglu"), OpFamily::kActivation);
  EXPECT_EQ(op_family_of_name("SiluBackward0"), OpFamily::kActivation);
  EXPECT_EQ(op_family_of_name("NllLossBackward0"), OpFamily::kLoss);
  EXPECT_EQ(op_family_of_name("aten::embedding"), OpFamily::kEmbedding);
  EXPECT_EQ(op_family_of_name("ToCopyBackward0"), OpFamily::kCast);
  EXPECT_EQ(op_family_of_name("aten::_to_copy"), OpFamily::kCast);
  // titan's one-pass casts and widened SwiGLU (models/common/linear.cpp, fused_ops.cpp).
  EXPECT_EQ(op_family_of_name("titan::round_to_bf16"), OpFamily::kCast);
  EXPECT_EQ(
      op_family_of_name("torch::autograd::CppNode<titan::(anonymous namespace)::RoundToBf16>"),
      OpFamily::kCast);
  EXPECT_EQ(op_family_of_name("titan::widened_swiglu"), OpFamily::kActivation);
  EXPECT_EQ(
      op_family_of_name("torch::autograd::CppNode<titan::(anonymous namespace)::WidenedSwiGLU>"),
      OpFamily::kActivation);
  EXPECT_EQ(op_family_of_name("torch::autograd::AccumulateGrad"), OpFamily::kAccumulate);
  EXPECT_EQ(op_family_of_name("MulBackward0"), OpFamily::kOther);
  EXPECT_EQ(op_family_of_name("aten::mul"), OpFamily::kOther);
  EXPECT_EQ(op_family_of_name("forward"), OpFamily::kOther);
}

TEST(Breakdown, ForwardBackwardOfTheTinyModel) {
  llama3::Llama3Args args = llama3::args_for_flavor("tiny");
  args.max_seq_len = 32;
  auto model = std::make_shared<llama3::Transformer>(args, at::kFloat);
  model->init_weights(0);
  at::manual_seed(1);
  const int64_t bs = 2, seqlen = 32;
  const at::Tensor tokens = at::randint(args.vocab_size, {bs, seqlen}, at::kLong);
  const at::Tensor labels = at::randint(args.vocab_size, {bs, seqlen}, at::kLong);

  BreakdownReport r;
  {
    StepBreakdown b;
    b.begin_step();
    at::Tensor loss;
    {
      const PhaseScope phase(Phase::kForward);
      const at::Tensor logits = model->forward(tokens);
      const TraceSpan span("loss");
      loss = lm_cross_entropy_loss(logits, labels);
    }
    {
      const PhaseScope phase(Phase::kBackward);
      loss.backward();
    }
    b.end_step();
    r = b.report();
  }
  ASSERT_EQ(r.steps, 1);
  double phases = 0.0;
  for (double s : r.phase_s) phases += s;
  EXPECT_NEAR(phases, r.step_s, 1e-3 * r.step_s);
  EXPECT_GT(r.phase_s[static_cast<int>(Phase::kForward)], 0.0);
  EXPECT_GT(r.phase_s[static_cast<int>(Phase::kBackward)], 0.0);
  for (OpFamily f : {OpFamily::kMatmul, OpFamily::kAttention, OpFamily::kNorm, OpFamily::kRope,
                     OpFamily::kActivation, OpFamily::kLoss, OpFamily::kEmbedding}) {
    EXPECT_GT(r.family_s[static_cast<int>(f)], 0.0) << to_string(f);
  }
  double families = 0.0;
  for (double s : r.family_s) families += s;
  EXPECT_LE(families, r.phase_s[static_cast<int>(Phase::kForward)] +
                          r.phase_s[static_cast<int>(Phase::kBackward)]);
  // Every 2-D weight but the embedding's is a linear layer's.
  double linear_weights = 0.0;
  for (const auto& p : model->named_parameters()) {
    if (p.value().dim() == 2 && p.key().find("tok_embeddings") == std::string::npos) {
      linear_weights += static_cast<double>(p.value().numel());
    }
  }
  EXPECT_EQ(r.matmul_flops, 3.0 * 2.0 * static_cast<double>(bs * seqlen) * linear_weights);
  // RoPE's backward multiplies are rope's (autograd's sequence numbers), not other ops'.
  for (const auto& [name, seconds] : r.top_other) EXPECT_NE(name, "MulBackward0") << seconds;
}

}  // namespace breakdown_test
}  // namespace titan
