// training.dtype (full bf16 training) and metrics.save_for_all_ranks file naming: the parts
// that live in components/ (the trainer's use of them is in tests/unit/trainer).
#include "titan/common/check.h"
#include "titan/components/metrics.h"
#include "titan/components/optimizer.h"
#include "titan/components/training_dtype.h"

#include <gtest/gtest.h>

#include <torch/nn/modules/linear.h>

namespace titan {
namespace training_dtype_test {

TEST(TrainingDtype, ComputeDtypeFollowsTrainingDtypeThenMixedPrecision) {
  TrainingSection t;
  t.mixed_precision_param = "float32";
  EXPECT_EQ(training_compute_dtype(t), at::kFloat);
  t.mixed_precision_param = "bfloat16";
  EXPECT_EQ(training_compute_dtype(t), at::kBFloat16);
  t.dtype = "bfloat16";
  t.mixed_precision_param = "float32";  // bf16 parameters make bf16 matmuls either way
  EXPECT_EQ(training_compute_dtype(t), at::kBFloat16);
}

TEST(TrainingDtype, Bfloat16CastsParametersInPlaceAndKeepsBuffers) {
  torch::nn::Linear linear(4, 3);
  linear->register_buffer("table", at::ones({2}));
  const at::Tensor weight = linear->weight;  // the same parameter, seen from outside
  TrainingSection t;
  apply_training_dtype(*linear, t, /*world_size=*/4, "anything");  // float32: nothing to do
  EXPECT_EQ(weight.scalar_type(), at::kFloat);

  t.dtype = "bfloat16";
  apply_training_dtype(*linear, t, /*world_size=*/1, "none");
  EXPECT_EQ(weight.scalar_type(), at::kBFloat16);
  EXPECT_EQ(linear->bias.scalar_type(), at::kBFloat16);
  EXPECT_TRUE(weight.requires_grad());
  EXPECT_EQ(linear->named_buffers()["table"].scalar_type(), at::kFloat);

  // Gradients and AdamW states follow the parameters.
  linear->forward(at::ones({2, 4}, at::kBFloat16)).sum().backward();
  EXPECT_EQ(weight.grad().scalar_type(), at::kBFloat16);
  OptimizerSection adamw;
  Optimizer optimizer({{"weight", weight}, {"bias", linear->bias}}, adamw);
  optimizer.step(1e-3);
  for (const auto& [name, state] : optimizer.state_tensors()) {
    EXPECT_EQ(state.scalar_type(), at::kBFloat16) << name;
  }
}

TEST(TrainingDtype, Bfloat16WithSeveralRanksIsRefusedNamingTheParallelism) {
  torch::nn::Linear linear(4, 3);
  TrainingSection t;
  t.dtype = "bfloat16";
  try {
    apply_training_dtype(*linear, t, /*world_size=*/2, "dp_shard 2");
    ADD_FAILURE() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("training.dtype = \"bfloat16\" is not supported yet with dp_shard 2 "
                           "(2 ranks)"),
              std::string::npos)
        << message;
    EXPECT_NE(message.find("HINT:"), std::string::npos) << message;
  }
  EXPECT_EQ(linear->weight.scalar_type(), at::kFloat);  // untouched
}

TEST(MetricsFileName, RankZeroOnlyOrEveryRankSuffixed) {
  MetricsSection m;
  EXPECT_EQ(metrics_file_name(m, 0), "metrics.jsonl");
  EXPECT_EQ(metrics_file_name(m, 3), "");
  m.save_for_all_ranks = true;
  EXPECT_EQ(metrics_file_name(m, 0), "metrics_rank_0.jsonl");
  EXPECT_EQ(metrics_file_name(m, 3), "metrics_rank_3.jsonl");
}

}  // namespace training_dtype_test
}  // namespace titan
