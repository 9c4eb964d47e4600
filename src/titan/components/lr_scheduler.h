// Learning-rate schedule, as TorchTitan's LambdaLR-based warmup-stable-decay: linear warmup, a
// stable phase at the peak lr, then linear / sqrt / cosine decay to min_lr_factor * lr, over
// lr_scheduler.total_steps when set, else over the run's training.steps.
#pragma once

#include "titan/config/job_config.h"

#include <cstdint>
#include <string>

namespace titan {

class LRScheduler {
 public:
  LRScheduler(const LRSchedulerSection& config, double base_lr, int64_t training_steps);

  // Multiplier of the base lr for 0-indexed scheduler step `step` (the lr used by training step
  // step + 1).
  double factor(int64_t step) const;
  // Learning rate used by 1-indexed training step `train_step`.
  double lr_at(int64_t train_step) const { return base_lr_ * factor(train_step - 1); }

  int64_t warmup_steps() const { return warmup_steps_; }
  int64_t stable_steps() const { return stable_steps_; }
  int64_t decay_steps() const { return decay_steps_; }

 private:
  double base_lr_;
  int64_t warmup_steps_;
  int64_t stable_steps_;
  int64_t decay_steps_;
  std::string decay_type_;
  double min_lr_factor_;
};

}  // namespace titan
