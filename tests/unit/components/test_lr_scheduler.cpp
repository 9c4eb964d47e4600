// LR schedule values at chosen steps against hand-computed TorchTitan values.
#include "titan/components/lr_scheduler.h"

#include <gtest/gtest.h>

#include <cmath>

namespace titan {
namespace lr_scheduler_test {

LRSchedulerSection section(int64_t warmup, double decay_ratio, const std::string& type,
                           double min_factor) {
  LRSchedulerSection s;
  s.warmup_steps = warmup;
  s.decay_ratio = decay_ratio;
  s.decay_type = type;
  s.min_lr_factor = min_factor;
  return s;
}

TEST(LRScheduler, WarmupThenLinearDecayToZero) {
  // 10 steps, warmup 2, no decay_ratio: decay over the remaining 8 steps.
  LRScheduler s(section(2, -1, "linear", 0.0), /*base_lr=*/1.0, /*training_steps=*/10);
  EXPECT_EQ(s.warmup_steps(), 2);
  EXPECT_EQ(s.stable_steps(), 0);
  EXPECT_EQ(s.decay_steps(), 8);
  EXPECT_DOUBLE_EQ(s.lr_at(1), 1.0 / 3.0);  // (0 + 1) / (2 + 1)
  EXPECT_DOUBLE_EQ(s.lr_at(2), 2.0 / 3.0);
  // First decay step: progress (2 + 1 - 2) / 9.
  EXPECT_DOUBLE_EQ(s.lr_at(3), 1.0 - 1.0 / 9.0);
  EXPECT_DOUBLE_EQ(s.lr_at(10), 1.0 - 8.0 / 9.0);
  EXPECT_GT(s.lr_at(10), 0.0);
}

TEST(LRScheduler, WarmupStableDecayWithRatio) {
  // 100 steps, warmup 10, decay_ratio 0.2 -> 20 decay steps, 70 stable.
  LRScheduler s(section(10, 0.2, "linear", 0.1), 2e-3, 100);
  EXPECT_EQ(s.decay_steps(), 20);
  EXPECT_EQ(s.stable_steps(), 70);
  EXPECT_DOUBLE_EQ(s.lr_at(10), 2e-3 * 10.0 / 11.0);
  EXPECT_DOUBLE_EQ(s.lr_at(11), 2e-3);
  EXPECT_DOUBLE_EQ(s.lr_at(80), 2e-3);
  // Step 81 is scheduler step 80 = warmup + stable: progress 1/21.
  const double progress = 1.0 / 21.0;
  EXPECT_DOUBLE_EQ(s.lr_at(81), 2e-3 * (0.1 + 0.9 * (1.0 - progress)));
  EXPECT_DOUBLE_EQ(s.lr_at(100), 2e-3 * (0.1 + 0.9 * (1.0 - 20.0 / 21.0)));
}

TEST(LRScheduler, SqrtAndCosineShapes) {
  LRScheduler sq(section(0, 0.5, "sqrt", 0.0), 1.0, 8);
  LRScheduler cs(section(0, 0.5, "cosine", 0.0), 1.0, 8);
  // 4 stable steps (scheduler steps 0..3), then decay over 4 with denominator 5.
  EXPECT_DOUBLE_EQ(sq.lr_at(4), 1.0);
  EXPECT_DOUBLE_EQ(sq.lr_at(6), 1.0 - std::sqrt(2.0 / 5.0));
  EXPECT_DOUBLE_EQ(cs.lr_at(6), 0.5 * (1.0 + std::cos(M_PI * 2.0 / 5.0)));
}

TEST(LRScheduler, NoWarmupNoDecayIsConstant) {
  LRScheduler s(section(0, 0.0, "linear", 0.0), 0.5, 5);
  for (int64_t step = 1; step <= 5; ++step) EXPECT_DOUBLE_EQ(s.lr_at(step), 0.5);
}

TEST(LRScheduler, WarmupLongerThanTrainingIsClamped) {
  LRScheduler s(section(50, -1, "linear", 0.0), 1.0, 10);
  EXPECT_EQ(s.warmup_steps(), 10);
  EXPECT_DOUBLE_EQ(s.lr_at(10), 10.0 / 11.0);
}

TEST(LRScheduler, DecayThatOverlapsWarmupIsShrunk) {
  // warmup 20 + round(30 * 0.8) = 24 > 30: decay over the last 10 steps.
  LRScheduler s(section(20, 0.8, "linear", 0.0), 1.0, 30);
  EXPECT_EQ(s.warmup_steps(), 20);
  EXPECT_EQ(s.decay_steps(), 10);
  EXPECT_EQ(s.stable_steps(), 0);
  EXPECT_DOUBLE_EQ(s.lr_at(21), 1.0 - 1.0 / 11.0);
}

TEST(LRScheduler, TotalStepsSetsTheScheduleLength) {
  // A 5-step run of a 10-step schedule follows the first half of the 10-step curve.
  LRSchedulerSection config = section(2, -1, "linear", 0.0);
  config.total_steps = 10;
  LRScheduler own(config, 1.0, /*training_steps=*/5);
  LRScheduler full(section(2, -1, "linear", 0.0), 1.0, /*training_steps=*/10);
  EXPECT_EQ(own.decay_steps(), 8);
  for (int64_t step = 1; step <= 5; ++step) EXPECT_DOUBLE_EQ(own.lr_at(step), full.lr_at(step));
  EXPECT_GT(own.lr_at(5), 0.5);  // still high: the decay is not squeezed into 5 steps

  // A run longer than the schedule goes on at min_lr_factor * lr after it.
  config.total_steps = 4;
  config.min_lr_factor = 0.1;
  LRScheduler short_schedule(config, 1.0, /*training_steps=*/8);
  EXPECT_EQ(short_schedule.decay_steps(), 2);
  EXPECT_GT(short_schedule.lr_at(4), 0.1);
  EXPECT_DOUBLE_EQ(short_schedule.lr_at(5), 0.1);
  EXPECT_DOUBLE_EQ(short_schedule.lr_at(8), 0.1);

  // Unset (-1): the run's length.
  config.total_steps = -1;
  EXPECT_EQ(LRScheduler(config, 1.0, 7).decay_steps(), 5);
}

}  // namespace lr_scheduler_test
}  // namespace titan
