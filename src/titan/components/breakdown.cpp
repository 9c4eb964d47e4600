// Step breakdown (see breakdown.h).
#include "titan/components/breakdown.h"

#include "titan/common/check.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdio>
#include <memory>
#include <vector>

namespace titan {

const char* to_string(OpFamily family) {
  switch (family) {
    case OpFamily::kMatmul: return "matmul";
    case OpFamily::kAttention: return "attention";
    case OpFamily::kNorm: return "norms";
    case OpFamily::kRope: return "rope";
    case OpFamily::kActivation: return "activations";
    case OpFamily::kLoss: return "loss";
    case OpFamily::kEmbedding: return "embedding";
    case OpFamily::kCast: return "dtype casts";
    case OpFamily::kAccumulate: return "grad accumulation";
    case OpFamily::kOther: return "other ops";
  }
  return "?";
}

OpFamily op_family_of_name(const std::string& full) {
  // "aten::addmm" -> "addmm"; "MmBackward0" -> "mm"; lower case.
  std::string name = full;
  if (name.rfind("aten::", 0) == 0) name = name.substr(6);
  const size_t backward = name.rfind("Backward");
  if (backward != std::string::npos && backward > 0) name = name.substr(0, backward);
  std::transform(name.begin(), name.end(), name.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  static const char* const kMatmuls[] = {"mm",     "addmm",       "bmm",        "baddbmm", "linear",
                                         "matmul", "_grouped_mm", "_scaled_mm", "mv",      "addmv"};
  for (const char* m : kMatmuls) {
    if (name == m) return OpFamily::kMatmul;
  }
  const auto has = [&](const char* part) { return name.find(part) != std::string::npos; };
  if (has("attention")) return OpFamily::kAttention;
  if (has("rmsnorm") || has("rms_norm") || has("layer_norm") || has("layernorm")) {
    return OpFamily::kNorm;
  }
  if (has("rope") || has("rotary")) return OpFamily::kRope;
  if (has("swiglu") || has("silu") || has("gelu")) return OpFamily::kActivation;
  if (has("loss") || has("cross_entropy") || has("softmax")) return OpFamily::kLoss;
  if (has("embedding")) return OpFamily::kEmbedding;
  if (name == "to" || name == "_to_copy" || name == "tocopy" || name == "type_as" ||
      has("round_to_bf16") || has("roundtobf16")) {
    return OpFamily::kCast;
  }
  if (has("accumulategrad")) return OpFamily::kAccumulate;
  return OpFamily::kOther;
}

// --- the callback ---------------------------------------------------------------------------

struct StepBreakdown::Impl {
  static std::atomic<StepBreakdown*> active;

  struct Context : at::ObserverContext {
    enum Kind { kSpan, kTop, kNested } kind = kNested;
    OpFamily family = OpFamily::kOther;
    bool counted = false;  // a top-level op of the forward or the backward
    Clock::time_point start;
    std::string name;  // kOther top-level ops: their time by name
  };

  static thread_local int depth;                    // open counted ops on this thread
  static thread_local std::vector<OpFamily> spans;  // open family spans
  static thread_local OpFamily top_family;

  // Forward FLOPs of a matmul from its input shapes (0 when they are not plain tensors).
  static double matmul_flops(const at::RecordFunction& fn) {
    const c10::ArrayRef<const c10::IValue> in = fn.inputs();
    const std::string name = fn.name();
    const auto tensor = [&](size_t i) -> const at::Tensor* {
      return i < in.size() && in[i].isTensor() ? &in[i].toTensor() : nullptr;
    };
    size_t a = 0, b = 1;
    if (name == "aten::addmm" || name == "aten::baddbmm") a = 1, b = 2;
    const at::Tensor* x = tensor(a);
    const at::Tensor* w = tensor(b);
    if (x == nullptr || w == nullptr || x->dim() < 1 || w->dim() < 1) return 0.0;
    // linear: weight (out, in); the others: (.., k, n).
    const int64_t n = name == "aten::linear" ? w->size(0) : w->size(-1);
    return 2.0 * static_cast<double>(x->numel()) * static_cast<double>(n);
  }

  static std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
    StepBreakdown* b = active.load(std::memory_order_acquire);
    if (b == nullptr) return nullptr;
    const at::RecordScope scope = fn.scope();
    if (scope == at::RecordScope::USER_SCOPE) {
      const OpFamily f = op_family_of_name(fn.name());
      if (f == OpFamily::kOther || f == OpFamily::kMatmul) return nullptr;  // not a model span
      spans.push_back(f);
      auto ctx = std::make_unique<Context>();
      ctx->kind = Context::kSpan;
      return ctx;
    }
    // Wrappers whose insides are recorded on their own: the engine's around each node, and
    // activation checkpointing's node, whose backward recomputes the forward (ops attributed as
    // in the forward) and runs its backward.
    const std::string_view name = fn.name();
    if (name.rfind("autograd::engine::evaluate_function: ", 0) == 0 ||
        name.find("CheckpointFunction") != std::string_view::npos) {
      return nullptr;
    }
    auto ctx = std::make_unique<Context>();
    if (depth++ == 0) {
      ctx->kind = Context::kTop;
      const bool backward = scope == at::RecordScope::BACKWARD_FUNCTION;
      OpFamily f = OpFamily::kOther;
      if (backward) {
        f = op_family_of_name(fn.name());
        if (f == OpFamily::kOther) {
          const std::lock_guard<std::mutex> lock(b->mutex_);
          const auto it = b->family_of_seq_.find(fn.seqNr());
          if (it != b->family_of_seq_.end()) f = it->second;
        }
      } else {
        f = spans.empty() ? op_family_of_name(fn.name()) : spans.back();
      }
      ctx->family = top_family = f;
      if (f == OpFamily::kOther) ctx->name = fn.name();
      const Phase phase = current_phase();
      ctx->counted = phase == Phase::kForward || phase == Phase::kBackward;
      if (ctx->counted && !backward && f == OpFamily::kMatmul) {
        const double flops = matmul_flops(fn);
        const std::lock_guard<std::mutex> lock(b->mutex_);
        b->forward_matmul_flops_ += flops;
      }
      ctx->start = Clock::now();
    }
    if (scope == at::RecordScope::FUNCTION && fn.seqNr() >= 0) {
      const std::lock_guard<std::mutex> lock(b->mutex_);
      b->family_of_seq_[fn.seqNr()] = top_family;
    }
    return ctx;
  }

  static void on_end(const at::RecordFunction& /*fn*/, at::ObserverContext* c) {
    auto* ctx = static_cast<Context*>(c);
    if (ctx == nullptr) return;
    if (ctx->kind == Context::kSpan) {
      if (!spans.empty()) spans.pop_back();
      return;
    }
    --depth;
    StepBreakdown* b = active.load(std::memory_order_acquire);
    if (ctx->kind != Context::kTop || !ctx->counted || b == nullptr) return;
    const double s = std::chrono::duration<double>(Clock::now() - ctx->start).count();
    const std::lock_guard<std::mutex> lock(b->mutex_);
    if (!b->in_step_) return;
    b->family_s_[static_cast<int>(ctx->family)] += s;
    if (!ctx->name.empty()) b->other_s_[ctx->name] += s;
  }
};

std::atomic<StepBreakdown*> StepBreakdown::Impl::active{nullptr};
thread_local int StepBreakdown::Impl::depth = 0;
thread_local std::vector<OpFamily> StepBreakdown::Impl::spans;
thread_local OpFamily StepBreakdown::Impl::top_family = OpFamily::kOther;

// --- the breakdown --------------------------------------------------------------------------

StepBreakdown::StepBreakdown() {
  StepBreakdown* none = nullptr;
  TITAN_CHECK(Impl::active.compare_exchange_strong(none, this),
              "StepBreakdown: another breakdown is running in this process");
  handle_ = at::addGlobalCallback(
      at::RecordFunctionCallback(&Impl::on_start, &Impl::on_end)
          .needsInputs(true)
          .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION,
                   at::RecordScope::USER_SCOPE}));
  set_phase_listener(this);
}

StepBreakdown::~StepBreakdown() {
  set_phase_listener(nullptr);
  at::removeCallback(handle_);
  Impl::active.store(nullptr, std::memory_order_release);
}

void StepBreakdown::on_phase_change(Phase from, Phase /*to*/) {
  const std::lock_guard<std::mutex> lock(mutex_);
  const Clock::time_point now = Clock::now();
  if (in_step_) {
    phase_s_[static_cast<int>(from)] += std::chrono::duration<double>(now - phase_start_).count();
  }
  phase_start_ = now;
}

void StepBreakdown::begin_step() {
  const std::lock_guard<std::mutex> lock(mutex_);
  family_of_seq_.clear();
  in_step_ = true;
  step_start_ = phase_start_ = Clock::now();
}

void StepBreakdown::end_step() {
  const std::lock_guard<std::mutex> lock(mutex_);
  if (!in_step_) return;
  const Clock::time_point now = Clock::now();
  phase_s_[static_cast<int>(current_phase())] +=
      std::chrono::duration<double>(now - phase_start_).count();
  step_s_ += std::chrono::duration<double>(now - step_start_).count();
  ++steps_;
  in_step_ = false;
}

BreakdownReport StepBreakdown::report() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  BreakdownReport r;
  r.steps = steps_;
  if (steps_ == 0) return r;
  const double n = static_cast<double>(steps_);
  r.step_s = step_s_ / n;
  for (int i = 0; i < kNumPhases; ++i) r.phase_s[i] = phase_s_[i] / n;
  for (int i = 0; i < kNumOpFamilies; ++i) r.family_s[i] = family_s_[i] / n;
  r.matmul_flops = 3.0 * forward_matmul_flops_ / n;
  for (const auto& [name, seconds] : other_s_) r.top_other.emplace_back(name, seconds / n);
  std::sort(r.top_other.begin(), r.top_other.end(),
            [](const auto& a, const auto& b) { return a.second > b.second; });
  if (r.top_other.size() > 6) r.top_other.resize(6);
  return r;
}

std::string format_breakdown(const BreakdownReport& r, double plain_step_s, double probe_flops) {
  std::string out;
  char line[256];
  const auto add = [&](const char* fmt, auto... args) {
    std::snprintf(line, sizeof(line), fmt, args...);
    out += line;
  };
  const double step_ms = 1e3 * r.step_s;
  add("breakdown of a step (mean of %lld): %.1f ms with the op callback", (long long)r.steps,
      step_ms);
  if (plain_step_s > 0) add(", %.1f ms without", 1e3 * plain_step_s);
  add("\n  %-22s %10s %7s\n", "phase", "ms", "%");
  for (int i = 0; i < kNumPhases; ++i) {
    if (r.phase_s[i] <= 0) continue;
    add("  %-22s %10.2f %6.1f%%\n", to_string(static_cast<Phase>(i)), 1e3 * r.phase_s[i],
        100.0 * r.phase_s[i] / r.step_s);
  }
  add("  %-22s %10s %7s   (forward + backward)\n", "op family", "ms", "%");
  double ops = 0.0;
  for (int i = 0; i < kNumOpFamilies; ++i) {
    const double s = r.family_s[i];
    ops += s;
    if (s <= 0) continue;
    add("  %-22s %10.2f %6.1f%%", to_string(static_cast<OpFamily>(i)), 1e3 * s,
        100.0 * s / r.step_s);
    if (static_cast<OpFamily>(i) == OpFamily::kMatmul && r.matmul_flops > 0) {
      const double achieved = r.matmul_flops / s;
      add("   %.3f TFLOP/s", achieved / 1e12);
      if (probe_flops > 0) add(" = %.0f%% of the GEMM probe", 100.0 * achieved / probe_flops);
    }
    add("\n");
    if (static_cast<OpFamily>(i) == OpFamily::kOther) {
      for (const auto& [name, seconds] : r.top_other) {
        add("    %-32s %8.2f ms\n", name.c_str(), 1e3 * seconds);
      }
    }
  }
  const double fb =
      r.phase_s[static_cast<int>(Phase::kForward)] + r.phase_s[static_cast<int>(Phase::kBackward)];
  if (fb > ops) {
    add("  %-22s %10.2f %6.1f%%   (forward + backward time outside ops)\n", "between ops",
        1e3 * (fb - ops), 100.0 * (fb - ops) / r.step_s);
  }
  return out;
}

}  // namespace titan
