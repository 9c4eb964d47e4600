// Named parts of a training step, for the two tools that look inside one: the profiler (each
// PhaseScope is a user span in Kineto traces, like Python's torch.profiler.record_function) and
// the memory timeline (allocations are counted against the innermost open phase).
//
//   { const PhaseScope scope(Phase::kForward); logits = model.forward(inputs); }
//   { const PhaseScope scope(Phase::kCollective, "all_gather", group_name); ... }
//
// When neither tool is on, a scope costs an inactive at::RecordFunction and one atomic load.
#pragma once

#include <ATen/record_function.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace titan {

enum class Phase : uint8_t {
  kOther,  // outside any named phase (between steps, set-up)
  kData,   // loading the next batch
  kForward,
  kBackward,
  kOptimizer,   // clipping, the optimizer step, MoE load balancing
  kCollective,  // issuing or waiting for a collective (nested in the phases above)
  kValidation,
  kCheckpoint,
};
constexpr int kNumPhases = 8;
const char* to_string(Phase phase);

// Told of every phase change while installed: the memory timeline. At most one, process-wide;
// called on the thread that opens or closes the scope.
class PhaseListener {
 public:
  virtual ~PhaseListener() = default;
  virtual void on_phase_change(Phase from, Phase to) = 0;
};
// nullptr uninstalls. The caller keeps the listener alive while installed.
void set_phase_listener(PhaseListener* listener);
// The innermost open phase (process-wide).
Phase current_phase();

// A user span in profiler traces, named `name` followed by the non-empty details, space-separated
// (the name is built only while a profiler records, so callers on hot paths pass views).
class TraceSpan {
 public:
  explicit TraceSpan(std::string_view name, std::string_view detail = {},
                     std::string_view more = {});
  TraceSpan(const TraceSpan&) = delete;
  TraceSpan& operator=(const TraceSpan&) = delete;

 private:
  std::string name_;  // the span holds a view of it
  at::RecordFunction record_;
};

// A TraceSpan (named after the phase unless `name` is given) that also makes `phase` the current
// phase until it closes, when the enclosing one is current again.
class PhaseScope {
 public:
  explicit PhaseScope(Phase phase, const char* name = nullptr, std::string_view detail = {},
                      std::string_view more = {});
  ~PhaseScope();
  PhaseScope(const PhaseScope&) = delete;
  PhaseScope& operator=(const PhaseScope&) = delete;

 private:
  TraceSpan span_;
  Phase previous_;
};

}  // namespace titan
