// Warmup-stable-decay schedule with TorchTitan's step indexing: the factor for 0-indexed step s
// in warmup is (s + 1) / (warmup + 1); decay progress is (s + 1 - (warmup + stable)) /
// (decay + 1), so the lr never reaches exactly 0 before the run ends.
#include "titan/components/lr_scheduler.h"

#include "titan/common/check.h"
#include "titan/common/logging.h"

#include <algorithm>
#include <cmath>

namespace titan {

LRScheduler::LRScheduler(const LRSchedulerSection& config, double base_lr, int64_t training_steps)
    : base_lr_(base_lr), decay_type_(config.decay_type), min_lr_factor_(config.min_lr_factor) {
  // lr_scheduler.total_steps, when set, is the schedule's length whatever the run's length.
  const bool own_length = config.total_steps > 0;
  const int64_t total = own_length ? config.total_steps : training_steps;
  const std::string total_name =
      std::string(own_length ? "lr_scheduler.total_steps(" : "training.steps(") +
      std::to_string(total) + ")";
  // A short run of a long config (e.g. --training.steps 10) shrinks warmup, then decay, to fit,
  // with a warning, as TorchTitan does.
  warmup_steps_ = std::min(config.warmup_steps, total);
  if (warmup_steps_ < config.warmup_steps) {
    log_warning("lr_scheduler.warmup_steps(", config.warmup_steps, ") > ", total_name,
                "; warming up over all ", total, " steps");
  }
  if (config.decay_ratio >= 0) {
    decay_steps_ = std::llround(static_cast<double>(total) * config.decay_ratio);
    if (warmup_steps_ + decay_steps_ > total) {
      log_warning("lr_scheduler.warmup_steps(", warmup_steps_, ") + decay steps(round(", total_name,
                  " * decay_ratio(", config.decay_ratio, ")) = ", decay_steps_, ") > ", total_name,
                  "; decaying over the last ", total - warmup_steps_, " steps instead");
      decay_steps_ = total - warmup_steps_;
    }
  } else {
    decay_steps_ = total - warmup_steps_;
  }
  stable_steps_ = total - warmup_steps_ - decay_steps_;
  TITAN_CHECK(decay_type_ == "linear" || decay_type_ == "sqrt" || decay_type_ == "cosine",
              "unknown lr_scheduler.decay_type '", decay_type_, "'");
}

double LRScheduler::factor(int64_t step) const {
  const int64_t warmup_stable = warmup_steps_ + stable_steps_;
  // Past the last step the schedule is undefined; hold the final value.
  step = std::min(step, warmup_stable + decay_steps_);
  if (step < warmup_steps_) {
    return static_cast<double>(step + 1) / static_cast<double>(warmup_steps_ + 1);
  }
  if (step < warmup_stable || decay_steps_ == 0) {
    return 1.0;
  }
  const double progress =
      static_cast<double>(step + 1 - warmup_stable) / static_cast<double>(decay_steps_ + 1);
  double adjustment = 0.0;
  if (decay_type_ == "linear") {
    adjustment = 1.0 - progress;
  } else if (decay_type_ == "sqrt") {
    adjustment = 1.0 - std::sqrt(progress);
  } else {
    adjustment = 0.5 * (1.0 + std::cos(M_PI * progress));
  }
  return min_lr_factor_ + (1.0 - min_lr_factor_) * adjustment;
}

}  // namespace titan
