// Trainer behaviour on the real corpus with the tiny flavor: bit-reproducible runs, gradient
// accumulation equal to the larger batch, clipping, divergence detection, validation.
#include "titan/trainer/trainer.h"

#include "titan/common/check.h"
#include "titan/components/data/dataset.h"

#include "../test_util.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <limits>

namespace titan {
namespace trainer_test {

JobConfig tiny_config(const std::string& tag) {
  JobConfig c = test::tiny_training_config(
      (std::filesystem::temp_directory_path() / ("titan_trainer_test_" + tag)).string());
  c.training.local_batch_size = 8;
  c.training.steps = 3;
  c.lr_scheduler.warmup_steps = 1;
  c.debug.seed = 7;
  return c;
}

bool corpus_available() { return std::filesystem::exists(default_dataset_path("sotu")); }

#define REQUIRE_CORPUS() \
  if (!corpus_available()) GTEST_SKIP() << "sotu corpus missing; run scripts/setup.sh"

TEST(Trainer, SameSeedGivesIdenticalLosses) {
  REQUIRE_CORPUS();
  auto a = Trainer(tiny_config("seed_a")).train();
  auto b = Trainer(tiny_config("seed_b")).train();
  ASSERT_EQ(a.losses.size(), 3u);
  for (size_t i = 0; i < a.losses.size(); ++i) {
    EXPECT_EQ(a.losses[i], b.losses[i]) << "step " << i + 1;  // bitwise
    EXPECT_EQ(a.grad_norms[i], b.grad_norms[i]);
  }
  JobConfig other = tiny_config("seed_c");
  other.debug.seed = 8;
  auto c = Trainer(other).train();
  EXPECT_NE(a.losses[0], c.losses[0]);
}

TEST(Trainer, GradientAccumulationMatchesLargerBatch) {
  REQUIRE_CORPUS();
  JobConfig big = tiny_config("accum_big");
  JobConfig small = tiny_config("accum_small");
  small.training.local_batch_size = 4;
  small.training.global_batch_size = 8;  // 2 accumulation steps
  Trainer tb(big), ts(small);
  EXPECT_EQ(tb.accumulation_steps(), 1);
  EXPECT_EQ(ts.accumulation_steps(), 2);
  auto rb = tb.train();
  auto rs = ts.train();
  for (size_t i = 0; i < rb.losses.size(); ++i) {
    EXPECT_NEAR(rb.losses[i], rs.losses[i], 1e-5) << "step " << i + 1;
    EXPECT_NEAR(rb.grad_norms[i], rs.grad_norms[i], 1e-4 * rb.grad_norms[i]) << "step " << i + 1;
  }
  auto pb = tb.model().named_parameters();
  auto ps = ts.model().named_parameters();
  for (const auto& item : pb) {
    const at::Tensor& other = ps[item.key()];
    EXPECT_TRUE(at::allclose(item.value(), other, /*rtol=*/1e-4, /*atol=*/1e-5)) << item.key();
  }
}

TEST(Trainer, ClippingBoundsTheAppliedGradient) {
  REQUIRE_CORPUS();
  JobConfig c = tiny_config("clip");
  c.training.max_norm = 0.01;
  // The fused AdamW applies the clipping coefficient as it reads each gradient; the for-loop
  // scales the gradients in place first (torch.nn.utils.clip_grad_norm_), so its gradients show
  // the bound. Both make the same update.
  JobConfig loop = tiny_config("clip_loop");
  loop.training.max_norm = 0.01;
  loop.optimizer.implementation = "for-loop";
  Trainer fused(c), reference(loop);
  const StepResult a = fused.train_step(1);
  const StepResult b = reference.train_step(1);
  const double norm = a.grad_norm.item<double>();
  EXPECT_GT(norm, 0.01);  // the reported norm is taken before clipping
  EXPECT_DOUBLE_EQ(norm, b.grad_norm.item<double>());
  double total = 0;
  for (const auto& p : reference.model().parameters()) {
    total += p.grad().pow(2).sum().item<double>();
  }
  EXPECT_NEAR(std::sqrt(total), 0.01, 1e-4);
  const auto mine = fused.model().named_parameters();
  for (const auto& item : reference.model().named_parameters()) {
    EXPECT_TRUE(at::allclose(mine[item.key()], item.value(), /*rtol=*/1e-6, /*atol=*/1e-7))
        << item.key();
  }
}

TEST(Trainer, NonFiniteLossStopsTheRunWhenItIsRead) {
  REQUIRE_CORPUS();
  JobConfig c = tiny_config("nan");
  c.job.dump_folder = test::fresh_test_dir("titan_trainer_nan").string();
  c.checkpoint.enable = true;  // nothing may be saved after the non-finite step
  Trainer t(c);
  {
    at::NoGradGuard no_grad;
    t.model().parameters()[0].fill_(std::numeric_limits<float>::quiet_NaN());
  }
  // The step itself reads nothing back (it returns the loss on the device)...
  const StepResult step = t.train_step(5);
  EXPECT_TRUE(std::isnan(step.loss.item<double>()));
  // ...the run stops on the first step it reads (step 1 is always logged).
  const std::string message = test::message_of([&] { t.train(); });
  EXPECT_NE(message.find("loss is NaN at step 1"), std::string::npos) << message;
  EXPECT_FALSE(std::filesystem::exists(std::filesystem::path(c.job.dump_folder) /
                                       c.checkpoint.folder / "step-1"));
}

TEST(Trainer, ValidationLossIsFiniteAndRecorded) {
  REQUIRE_CORPUS();
  JobConfig c = tiny_config("val");
  c.validation.enable = true;
  c.validation.seq_len = 32;
  c.validation.local_batch_size = 4;
  c.validation.steps = 3;
  c.validation.freq = 2;
  auto r = Trainer(c).train();
  ASSERT_EQ(r.validation_losses.size(), 2u);  // steps 2 and 3 (the last)
  for (double v : r.validation_losses) {
    EXPECT_TRUE(std::isfinite(v));
    EXPECT_GT(v, 0.0);
  }
}

TEST(Trainer, RejectsMultiRankDegrees) {
  JobConfig c = tiny_config("degrees");
  c.parallelism.tensor_parallel_degree = 2;
  EXPECT_THROW(Trainer{c}, ConfigError);
}

// (issue 37) Activation checkpointing settings that would do nothing are refused on a whole
// model, naming what they miss: an every-Nth option past the block count (0 blocks
// checkpointed), a force-recompute name that matches no module. TorchTitan's default name (the
// MoE router) is no error on a dense model.
TEST(Trainer, ActivationCheckpointingThatWouldDoNothingIsRefused) {
  REQUIRE_CORPUS();
  JobConfig c = tiny_config("ac_nothing");
  c.activation_checkpoint.mode = "selective";
  c.activation_checkpoint.selective_ac_option = "100";
  const std::string every = test::message_of([&] { Trainer t{c}; });
  EXPECT_TRUE(test::contains(every,
                             "selective_ac_option 100 checkpoints every 100th block, and "
                             "there are 2 blocks: none would be checkpointed"))
      << every;
  c.activation_checkpoint.selective_ac_option = "2";
  EXPECT_NO_THROW(Trainer{c});
  c.activation_checkpoint.selective_ac_option = "op";
  c.activation_checkpoint.per_op_sac_force_recompute_mm_shapes_by_fqns = {"moe.router.gate",
                                                                          "feed_forward.w9"};
  const std::string fqn = test::message_of([&] { Trainer t{c}; });
  EXPECT_TRUE(test::contains(fqn,
                             "entry 'feed_forward.w9' matches no module of the model; did "
                             "you mean"))
      << fqn;
  c.activation_checkpoint.per_op_sac_force_recompute_mm_shapes_by_fqns = {"moe.router.gate"};
  EXPECT_NO_THROW(Trainer{c});
}

}  // namespace trainer_test
}  // namespace titan
