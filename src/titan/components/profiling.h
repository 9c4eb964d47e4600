// [profiling]: profiler traces and memory snapshots, on TorchTitan's schedule and file names.
//
// Both work in windows that end at the steps divisible by profiling.profile_freq; a window's
// files go to iteration_<N>/ under their folder (N: its last step), one file per rank.
//
// Traces (enable_profiling): libtorch's profiler (Kineto) warms up for profiler_warmup steps and
// records the last profiler_active steps of each window, then writes
//   <dump_folder>/<save_traces_folder>/iteration_<N>/rank<R>_trace.json
// in Chrome's trace-event JSON (open it in Perfetto or chrome://tracing). It holds every ATen op
// with its input shapes, the spans of titan/common/phase.h (data, forward, backward, optimizer,
// the issue and the wait of each collective named with its group, validation, checkpoint), one
// "ProfilerStep#<step>" span per recorded step, and on CUDA the kernels and copies. A run resumed
// in the middle of a window records what is left of it.
//
// Memory (enable_memory_snapshot): a timeline of the bytes held by tensors, per step and per
// phase (titan/common/phase.h), written every profile_freq steps to
//   <dump_folder>/<save_memory_snapshot_folder>/iteration_<N>/rank<R>_memory_timeline.json
// covering the steps since the previous file (format in memory_timeline_json below). On the CPU
// the bytes come from a counting wrapper of the CPU allocator (titan/common/memory_probe.h), so
// each phase's peak is exact; on CUDA from the caching allocator's counters, sampled at phase
// changes (the peak of a phase is the larger of its ends), and the allocator also records its
// history (the last 100,000 events with C++ stacks), written beside the timeline as
// rank<R>_memory_snapshot.pickle, the file PyTorch's memory visualizer (pytorch.org/memory_viz)
// opens. After an out-of-memory error both go to iteration_<N>_exit/ (N: the failing step).
#pragma once

#include "titan/common/phase.h"
#include "titan/config/job_config.h"

#include <ATen/ATen.h>

#include <array>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace titan {

// Where a step falls in its profiling window. Windows end at the multiples of `freq`; the last
// `active` steps of a window are recorded, the `warmup` steps before them warm the profiler up.
struct ProfileSchedule {
  enum class Action { kNone, kWarmup, kRecord };
  int64_t freq = 10;
  int64_t warmup = 3;
  int64_t active = 1;

  // ConfigError unless freq >= 1, active >= 1, warmup >= 0 and warmup + active <= freq (the
  // arithmetic in the message).
  static ProfileSchedule from_config(const ProfilingSection& config);
  Action action(int64_t step) const;  // step >= 1
  bool ends_window(int64_t step) const { return step % freq == 0; }
};

// "iteration_<step>" (TorchTitan's folder name), "iteration_<step>_exit" after an error.
std::string profile_window_folder(int64_t step, bool exit = false);

// profiling.enable_profiling (see the top of this file). One per process: Kineto is process-wide.
class TraceProfiler {
 public:
  TraceProfiler(const ProfilingSection& config, const std::string& dump_folder, int64_t rank,
                const at::Device& device);
  // Drops a recording in progress.
  ~TraceProfiler();
  TraceProfiler(const TraceProfiler&) = delete;
  TraceProfiler& operator=(const TraceProfiler&) = delete;

  // Before step `step`: warms up or starts recording as the schedule says; a recorded step gets
  // its "ProfilerStep#<step>" span.
  void begin_step(int64_t step);
  // After step `step`: at the end of a window, stops and writes the trace; returns its path.
  std::optional<std::string> end_step(int64_t step);

 private:
  enum class State { kIdle, kWarm, kRecording };
  void prepare();
  void start();

  ProfileSchedule schedule_;
  std::string folder_;  // <dump_folder>/<save_traces_folder>
  int64_t rank_;
  bool cuda_;
  State state_ = State::kIdle;
  std::unique_ptr<TraceSpan> step_span_;
};

// One step of a memory timeline: bytes held by tensors when it started and ended, its peak, and
// per phase the peak, the bytes it added (allocated minus freed, summed over its stretches), the
// time and how many stretches it had; plus the stretches in order.
struct MemoryStep {
  struct PhaseTotals {
    int64_t peak_bytes = 0;
    int64_t net_bytes = 0;
    double seconds = 0.0;
    int64_t entries = 0;
  };
  struct Segment {
    Phase phase = Phase::kOther;
    double start_s = 0.0;  // since the step began
    double seconds = 0.0;
    int64_t start_bytes = 0;
    int64_t end_bytes = 0;
    int64_t peak_bytes = 0;
  };
  int64_t step = 0;
  double seconds = 0.0;
  int64_t start_bytes = 0;
  int64_t end_bytes = 0;
  int64_t peak_bytes = 0;
  std::array<PhaseTotals, kNumPhases> phases{};
  std::vector<Segment> segments;  // at most kMaxSegments; the rest only counted
  int64_t segments_dropped = 0;
  static constexpr size_t kMaxSegments = 4096;
};

// The timeline file: {"format": "titan-memory-timeline", "version": 1, "rank", "device",
// "peak_exact" (true on the CPU), "steps": [{"step", "seconds", "start_bytes", "end_bytes",
// "peak_bytes", "phases": {"<phase>": {"peak_bytes", "net_bytes", "seconds", "entries"}, ...},
// "segments": [{"phase", "start_s", "seconds", "start_bytes", "end_bytes", "peak_bytes"}, ...],
// "segments_dropped"}, ...]} (phases that did not occur are left out).
std::string memory_timeline_json(const std::vector<MemoryStep>& steps, int64_t rank,
                                 const std::string& device, bool peak_exact);

// profiling.enable_memory_snapshot (see the top of this file). Installed as the process's phase
// listener while it lives; construct it before the model so that the CPU counts its tensors.
class MemoryProfiler final : public PhaseListener {
 public:
  MemoryProfiler(const ProfilingSection& config, const std::string& dump_folder, int64_t rank,
                 const at::Device& device);
  ~MemoryProfiler() override;
  MemoryProfiler(const MemoryProfiler&) = delete;
  MemoryProfiler& operator=(const MemoryProfiler&) = delete;

  void begin_step(int64_t step);
  // After step `step`: every profile_freq steps writes the window's files; returns the folder.
  std::optional<std::string> end_step(int64_t step);
  // After an out-of-memory error in step `step` (a step begun and not ended): writes what was
  // recorded, that step included, to iteration_<step>_exit/; returns the folder.
  std::string dump_after_error(int64_t step);

  void on_phase_change(Phase from, Phase to) override;

 private:
  int64_t bytes_now() const;
  // Closes the stretch of `phase` that ran until now and starts the next one.
  void close_segment(Phase phase);
  // Ends the open step (false when none is open).
  bool close_step();
  std::string write(int64_t step, bool exit);

  ProfileSchedule schedule_;  // only freq: a file every profile_freq steps
  std::string folder_;        // <dump_folder>/<save_memory_snapshot_folder>
  int64_t rank_;
  at::Device device_;
  std::mutex mutex_;
  std::vector<MemoryStep> steps_;  // this window's; the last one is open while in_step_
  bool in_step_ = false;
  std::chrono::steady_clock::time_point step_start_;
  std::chrono::steady_clock::time_point segment_start_;
  int64_t segment_start_bytes_ = 0;
  int64_t segment_peak_bytes_ = 0;  // CUDA: the larger of the samples
};

// True for the exceptions an allocator throws when memory runs out (c10::OutOfMemoryError,
// std::bad_alloc).
bool is_out_of_memory(const std::exception_ptr& error);

}  // namespace titan
