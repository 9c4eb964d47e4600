// Where a training step's time goes (`titan bench --breakdown`): wall time per phase of the step
// (titan/common/phase.h: data, forward, backward, optimizer, collective; exclusive, so the phases
// add up to the step) and, over the forward and backward, per family of ops: matmuls, attention,
// norms, RoPE, activations (SwiGLU), the loss, embeddings, dtype casts, gradient accumulation,
// other ops (the slowest named), with the FLOPs of the matmuls to compare their speed with the
// GEMM probe.
//
// How ops are attributed: a global RecordFunction callback times every top-level ATen op (ops
// they call run inside them) and every autograd node of the backward. A forward op belongs to the
// innermost family span the model opened around it ("rmsnorm", "rope", "attention", "swiglu",
// "loss": TraceSpans in the model code), else to a family by its name (mm, addmm, linear, bmm,
// matmul, _grouped_mm: matmul; embedding, ...); a backward node belongs to the family its name
// names (MmBackward0: matmul), else to that of the forward op that created it (autograd's
// sequence number: MulBackward0 in RoPE is rope).
// Activation checkpointing's recomputation counts in the backward, op by op. The callback costs
// a few microseconds per op, so a breakdown step is slower than a plain one; both are printed.
// One breakdown at a time per process.
#pragma once

#include "titan/common/phase.h"

#include <ATen/record_function.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace titan {

enum class OpFamily : uint8_t {
  kMatmul,
  kAttention,
  kNorm,
  kRope,
  kActivation,
  kLoss,
  kEmbedding,
  kCast,        // dtype conversions (mixed precision's casts and their gradients)
  kAccumulate,  // autograd's accumulation of parameter gradients
  kOther,
};
constexpr int kNumOpFamilies = 10;
const char* to_string(OpFamily family);
// The family of an op or autograd node by its name ("aten::addmm", "MmBackward0", ...), and of a
// model span ("rope", ...); kOther when the name says nothing.
OpFamily op_family_of_name(const std::string& name);

struct BreakdownReport {
  int64_t steps = 0;
  double step_s = 0.0;                            // mean wall time of a step
  std::array<double, kNumPhases> phase_s{};       // mean per step, exclusive
  std::array<double, kNumOpFamilies> family_s{};  // mean per step, forward + backward
  double matmul_flops = 0.0;  // per step: 3x the forward matmuls' (their two backward products)
  // The slowest ops of the kOther family, by name (mean seconds per step), slowest first.
  std::vector<std::pair<std::string, double>> top_other;
};

class StepBreakdown final : public PhaseListener {
 public:
  // Installs the op callback and the phase listener (none may be installed already).
  StepBreakdown();
  ~StepBreakdown() override;
  StepBreakdown(const StepBreakdown&) = delete;
  StepBreakdown& operator=(const StepBreakdown&) = delete;

  void begin_step();
  void end_step();
  BreakdownReport report() const;

  void on_phase_change(Phase from, Phase to) override;

  // For the callback (breakdown.cpp).
  struct Impl;

 private:
  using Clock = std::chrono::steady_clock;
  mutable std::mutex mutex_;
  bool in_step_ = false;
  Clock::time_point step_start_;
  Clock::time_point phase_start_;
  int64_t steps_ = 0;
  double step_s_ = 0.0;
  std::array<double, kNumPhases> phase_s_{};
  std::array<double, kNumOpFamilies> family_s_{};
  double forward_matmul_flops_ = 0.0;
  std::unordered_map<int64_t, OpFamily> family_of_seq_;  // forward op -> its backward node
  std::unordered_map<std::string, double> other_s_;      // kOther ops by name
  at::CallbackHandle handle_ = 0;
};

// The report as a table: phases (ms, % of the step), op families (ms, % of the step) and the
// matmuls' achieved TFLOP/s against `probe_flops`; `plain_step_s` is a step's time without the
// callback (0: unknown).
std::string format_breakdown(const BreakdownReport& report, double plain_step_s,
                             double probe_flops);

}  // namespace titan
