// Profiler traces and memory timelines (see profiling.h).
#include "titan/components/profiling.h"

#include "titan/common/check.h"
#include "titan/common/file_io.h"
#include "titan/common/logging.h"
#include "titan/common/memory_probe.h"
#include "titan/common/torch_compat.h"

#include <torch/csrc/autograd/profiler_kineto.h>

#if TITAN_HAS_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <torch/csrc/cuda/memory_snapshot.h>
#endif

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <new>
#include <system_error>

#include <unistd.h>

namespace titan {

namespace fs = std::filesystem;
namespace kp = torch::autograd::profiler;
namespace pi = torch::profiler::impl;

namespace {

std::string join(const std::string& a, const std::string& b) { return (fs::path(a) / b).string(); }

void make_folder(const std::string& path) {
  std::error_code ec;
  fs::create_directories(path, ec);
  if (ec) throw DataError(path + ": cannot create the folder: " + ec.message());
}

double seconds_between(std::chrono::steady_clock::time_point a,
                       std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

// --- schedule -------------------------------------------------------------------------------

namespace {

int64_t checked_freq(const ProfilingSection& c) {
  if (c.profile_freq < 1) {
    throw ConfigError(message("profiling.profile_freq must be >= 1, got ", c.profile_freq));
  }
  return c.profile_freq;
}

}  // namespace

ProfileSchedule ProfileSchedule::from_config(const ProfilingSection& c) {
  ProfileSchedule s{checked_freq(c), c.profiler_warmup, c.profiler_active};
  if (s.active < 1) {
    throw ConfigError(message("profiling.profiler_active must be >= 1, got ", s.active));
  }
  if (s.warmup < 0) {
    throw ConfigError(message("profiling.profiler_warmup must be >= 0, got ", s.warmup));
  }
  // Compared without forming the sum (huge values must not overflow into passing).
  if (s.warmup > s.freq - s.active) {
    int64_t sum = 0;
    const std::string total = __builtin_add_overflow(s.warmup, s.active, &sum)
                                  ? std::string("more than 2^63")
                                  : std::to_string(sum);
    throw ConfigError(
        message("profiling.profiler_warmup(", s.warmup, ") + profiler_active(", s.active,
                ") = ", total, " > profile_freq(", s.freq,
                "): a window of profile_freq steps must hold the warm-up and the recorded "
                "steps. HINT: raise profiling.profile_freq or lower the other two"));
  }
  return s;
}

ProfileSchedule::Action ProfileSchedule::action(int64_t step) const {
  const int64_t r = step % freq;
  const int64_t pos = r == 0 ? freq : r;  // 1..freq within the window
  if (pos > freq - active) return Action::kRecord;
  if (pos > freq - active - warmup) return Action::kWarmup;
  return Action::kNone;
}

std::string profile_window_folder(int64_t step, bool exit) {
  return "iteration_" + std::to_string(step) + (exit ? "_exit" : "");
}

// --- traces ---------------------------------------------------------------------------------

namespace {

pi::ProfilerConfig kineto_config() {
  // Input shapes on, as TorchTitan records them; no memory events or stacks (costly).
  return pi::ProfilerConfig(pi::ProfilerState::KINETO, /*report_input_shapes=*/true,
                            /*profile_memory=*/false, /*with_stack=*/false,
                            /*with_flops=*/false, /*with_modules=*/false);
}

std::set<pi::ActivityType> kineto_activities(bool cuda) {
  std::set<pi::ActivityType> a{pi::ActivityType::CPU};
  if (cuda) a.insert(pi::ActivityType::CUDA);
  return a;
}

}  // namespace

TraceProfiler::TraceProfiler(const ProfilingSection& config, const std::string& dump_folder,
                             int64_t rank, const at::Device& device)
    : schedule_(ProfileSchedule::from_config(config)),
      folder_(join(dump_folder, config.save_traces_folder)),
      rank_(rank),
      cuda_(device.is_cuda()) {
  // Kineto logs each start and stop, and on a machine without a GPU an error about counting
  // GPUs; keep its errors on CUDA and nothing on the CPU, unless the user chose a level.
  ::setenv("KINETO_LOG_LEVEL", cuda_ ? "4" : "6", /*overwrite=*/0);
  log_info("profiling: steps ", schedule_.freq - schedule_.active + 1, "-", schedule_.freq,
           " of every ", schedule_.freq, " recorded after ", schedule_.warmup,
           " warm-up steps; traces in ", folder_, "/iteration_<N>/rank", rank_, "_trace.json");
}

TraceProfiler::~TraceProfiler() {
  step_span_.reset();
  if (state_ == State::kRecording) {
    try {
      kp::disableProfiler();
    } catch (const std::exception&) {  // unwinding already: nothing more to report
    }
  }
}

namespace {

// Runs a Kineto call; its failure (a libtorch built without Kineto, say) as a ConfigError.
template <class F>
void kineto_call(const char* what, F&& call) {
  try {
    call();
  } catch (const c10::Error& e) {
    throw ConfigError(
        message("profiling.enable_profiling: libtorch's profiler (Kineto) "
                "cannot ",
                what, ": ", e.what_without_backtrace()));
  }
}

}  // namespace

void TraceProfiler::prepare() {
  kineto_call("start", [&] { kp::prepareProfiler(kineto_config(), kineto_activities(cuda_)); });
  state_ = State::kWarm;
}

void TraceProfiler::start() {
  if (state_ == State::kIdle) prepare();
  kineto_call("record", [&] { kp::enableProfiler(kineto_config(), kineto_activities(cuda_)); });
  state_ = State::kRecording;
}

void TraceProfiler::begin_step(int64_t step) {
  const ProfileSchedule::Action a = schedule_.action(step);
  if (a == ProfileSchedule::Action::kWarmup && state_ == State::kIdle) prepare();
  if (a == ProfileSchedule::Action::kRecord) {
    if (state_ != State::kRecording) start();
    step_span_ = std::make_unique<TraceSpan>("ProfilerStep#" + std::to_string(step));
  }
}

std::optional<std::string> TraceProfiler::end_step(int64_t step) {
  step_span_.reset();
  if (state_ != State::kRecording || !schedule_.ends_window(step)) return std::nullopt;
  std::unique_ptr<kp::ProfilerResult> result = kp::disableProfiler();
  state_ = State::kIdle;
  const std::string dir = join(folder_, profile_window_folder(step));
  make_folder(dir);
  const std::string path = join(dir, "rank" + std::to_string(rank_) + "_trace.json");
  const std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  const auto t0 = std::chrono::steady_clock::now();
  result->save(tmp);
  std::error_code ec;
  if (!fs::is_regular_file(tmp, ec) || fs::file_size(tmp, ec) == 0) {
    fs::remove(tmp, ec);
    throw DataError(path + ": the profiler wrote no trace");
  }
  fs::rename(tmp, path, ec);
  if (ec) {
    fs::remove(tmp, ec);
    throw DataError(path + ": cannot rename the trace into place: " + ec.message());
  }
  log_info("profiling: step ", step, " trace written to ", path, " (",
           seconds_between(t0, std::chrono::steady_clock::now()), "s)");
  return path;
}

// --- memory ---------------------------------------------------------------------------------

std::string memory_timeline_json(const std::vector<MemoryStep>& steps, int64_t rank,
                                 const std::string& device, bool peak_exact) {
  nlohmann::json out = {{"format", "titan-memory-timeline"},
                        {"version", 1},
                        {"rank", rank},
                        {"device", device},
                        {"peak_exact", peak_exact}};
  nlohmann::json rows = nlohmann::json::array();
  for (const MemoryStep& s : steps) {
    nlohmann::json phases = nlohmann::json::object();
    for (int p = 0; p < kNumPhases; ++p) {
      const MemoryStep::PhaseTotals& t = s.phases[p];
      if (t.entries == 0) continue;
      phases[to_string(static_cast<Phase>(p))] = {{"peak_bytes", t.peak_bytes},
                                                  {"net_bytes", t.net_bytes},
                                                  {"seconds", t.seconds},
                                                  {"entries", t.entries}};
    }
    nlohmann::json segments = nlohmann::json::array();
    for (const MemoryStep::Segment& g : s.segments) {
      segments.push_back({{"phase", to_string(g.phase)},
                          {"start_s", g.start_s},
                          {"seconds", g.seconds},
                          {"start_bytes", g.start_bytes},
                          {"end_bytes", g.end_bytes},
                          {"peak_bytes", g.peak_bytes}});
    }
    rows.push_back({{"step", s.step},
                    {"seconds", s.seconds},
                    {"start_bytes", s.start_bytes},
                    {"end_bytes", s.end_bytes},
                    {"peak_bytes", s.peak_bytes},
                    {"phases", std::move(phases)},
                    {"segments", std::move(segments)},
                    {"segments_dropped", s.segments_dropped}});
  }
  out["steps"] = std::move(rows);
  return out.dump(1) + "\n";
}

MemoryProfiler::MemoryProfiler(const ProfilingSection& config, const std::string& dump_folder,
                               int64_t rank, const at::Device& device)
    : schedule_{checked_freq(config), /*warmup=*/0, /*active=*/1},
      folder_(join(dump_folder, config.save_memory_snapshot_folder)),
      rank_(rank),
      device_(device) {
  if (device_.is_cpu()) {
    CpuMemoryProbe::install();
#if TITAN_HAS_CUDA
  } else if (device_.is_cuda()) {
    // TorchTitan's 100,000 entries, with the C++ stacks of the allocations.
    torch::cuda::_record_memory_history(std::optional<std::string>("all"),
                                        std::optional<std::string>("all"), "all",
                                        /*max_entries=*/100000);
#endif
  } else {
    throw ConfigError(message("profiling.enable_memory_snapshot works on the CPU and CUDA, not on ",
                              device_.str()));
  }
  segment_start_ = std::chrono::steady_clock::now();
  segment_start_bytes_ = segment_peak_bytes_ = bytes_now();
  set_phase_listener(this);
  log_info("memory snapshots: every ", schedule_.freq, " steps to ", folder_, "/iteration_<N>/rank",
           rank_, "_memory_timeline.json",
           device_.is_cuda() ? " and rank" + std::to_string(rank_) + "_memory_snapshot.pickle"
                             : std::string());
}

MemoryProfiler::~MemoryProfiler() {
  set_phase_listener(nullptr);
#if TITAN_HAS_CUDA
  if (device_.is_cuda()) {
    try {
      torch::cuda::_record_memory_history(std::optional<std::string>(),
                                          std::optional<std::string>(), "all", /*max_entries=*/0);
    } catch (const std::exception&) {
    }
  }
#endif
}

int64_t MemoryProfiler::bytes_now() const {
#if TITAN_HAS_CUDA
  if (device_.is_cuda()) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device_.index());
    constexpr size_t kAll = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    return stats.allocated_bytes[kAll].current;
  }
#endif
  return CpuMemoryProbe::live_bytes();
}

void MemoryProfiler::close_segment(Phase phase) {
  const auto now = std::chrono::steady_clock::now();
  const int64_t bytes = bytes_now();
  int64_t peak = std::max(segment_peak_bytes_, bytes);
  if (device_.is_cpu()) {
    peak = std::max(peak, CpuMemoryProbe::peak_bytes());
    CpuMemoryProbe::reset_peak();
  }
  // Stretches outside the named phases (between two scopes) are kept only when memory moved.
  const bool idle =
      phase == Phase::kOther && bytes == segment_start_bytes_ && peak == segment_start_bytes_;
  if (in_step_ && !idle) {
    MemoryStep& s = steps_.back();
    MemoryStep::PhaseTotals& t = s.phases[static_cast<int>(phase)];
    const double seconds = seconds_between(segment_start_, now);
    t.peak_bytes = std::max(t.peak_bytes, peak);
    t.net_bytes += bytes - segment_start_bytes_;
    t.seconds += seconds;
    t.entries += 1;
    s.peak_bytes = std::max(s.peak_bytes, peak);
    if (s.segments.size() < MemoryStep::kMaxSegments) {
      s.segments.push_back({phase, seconds_between(step_start_, segment_start_), seconds,
                            segment_start_bytes_, bytes, peak});
    } else {
      ++s.segments_dropped;
    }
  }
  segment_start_ = now;
  segment_start_bytes_ = segment_peak_bytes_ = bytes;
}

void MemoryProfiler::on_phase_change(Phase from, Phase /*to*/) {
  const std::lock_guard<std::mutex> lock(mutex_);
  close_segment(from);
}

void MemoryProfiler::begin_step(int64_t step) {
  const std::lock_guard<std::mutex> lock(mutex_);
  close_segment(current_phase());  // what ran between steps is not part of a step
  MemoryStep s;
  s.step = step;
  s.start_bytes = s.peak_bytes = segment_start_bytes_;
  steps_.push_back(std::move(s));
  step_start_ = segment_start_;
  in_step_ = true;
}

bool MemoryProfiler::close_step() {
  const std::lock_guard<std::mutex> lock(mutex_);
  if (!in_step_) return false;
  close_segment(current_phase());
  MemoryStep& s = steps_.back();
  s.end_bytes = segment_start_bytes_;
  s.seconds = seconds_between(step_start_, segment_start_);
  in_step_ = false;
  return true;
}

std::optional<std::string> MemoryProfiler::end_step(int64_t step) {
  if (!close_step() || !schedule_.ends_window(step)) return std::nullopt;
  return write(step, /*exit=*/false);
}

std::string MemoryProfiler::dump_after_error(int64_t step) {
  close_step();
  return write(step, /*exit=*/true);
}

std::string MemoryProfiler::write(int64_t step, bool exit) {
  const std::string dir = join(folder_, profile_window_folder(step, exit));
  make_folder(dir);
  std::vector<MemoryStep> steps;
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    steps.swap(steps_);
  }
  const std::string prefix = join(dir, "rank" + std::to_string(rank_));
  replace_file(prefix + "_memory_timeline.json",
               memory_timeline_json(steps, rank_, device_.str(), /*peak_exact=*/device_.is_cpu()));
#if TITAN_HAS_CUDA
  if (device_.is_cuda()) {
    replace_file(prefix + "_memory_snapshot.pickle", torch::cuda::_memory_snapshot_pickled());
  }
#endif
  log_info("memory snapshot: step ", step, exit ? " (after the error)" : "", " written to ", dir);
  return dir;
}

bool is_out_of_memory(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const c10::OutOfMemoryError&) {
    return true;
  } catch (const std::bad_alloc&) {
    return true;
  } catch (...) {
    return false;
  }
}

}  // namespace titan
