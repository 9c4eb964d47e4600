// Phases and spans (see phase.h).
#include "titan/common/phase.h"

#include <atomic>

namespace titan {
namespace {

std::atomic<PhaseListener*> g_listener{nullptr};
std::atomic<Phase> g_phase{Phase::kOther};

void change_phase(Phase from, Phase to) {
  g_phase.store(to, std::memory_order_relaxed);
  if (PhaseListener* l = g_listener.load(std::memory_order_acquire)) {
    if (from != to) l->on_phase_change(from, to);
  }
}

}  // namespace

const char* to_string(Phase phase) {
  switch (phase) {
    case Phase::kOther: return "other";
    case Phase::kData: return "data";
    case Phase::kForward: return "forward";
    case Phase::kBackward: return "backward";
    case Phase::kOptimizer: return "optimizer";
    case Phase::kCollective: return "collective";
    case Phase::kValidation: return "validation";
    case Phase::kCheckpoint: return "checkpoint";
  }
  return "?";
}

void set_phase_listener(PhaseListener* listener) {
  g_listener.store(listener, std::memory_order_release);
}

Phase current_phase() { return g_phase.load(std::memory_order_relaxed); }

TraceSpan::TraceSpan(std::string_view name, std::string_view detail, std::string_view more)
    : record_(at::RecordScope::USER_SCOPE) {
  if (!record_.isActive()) return;
  name_ = name;
  for (std::string_view part : {detail, more}) {
    if (part.empty()) continue;
    name_ += ' ';
    name_ += part;
  }
  record_.before(name_.c_str(), c10::ArrayRef<const c10::IValue>{});
}

PhaseScope::PhaseScope(Phase phase, const char* name, std::string_view detail,
                       std::string_view more)
    : span_(name != nullptr ? name : to_string(phase), detail, more), previous_(current_phase()) {
  change_phase(previous_, phase);
}

PhaseScope::~PhaseScope() { change_phase(current_phase(), previous_); }

}  // namespace titan
