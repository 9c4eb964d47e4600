// [profiling]: the window schedule (TorchTitan's wait/warmup/active cycle), the memory timeline's
// bytes per phase against allocations of known sizes (exact on the CPU), its out-of-memory dump
// under a CPU limit, and a Kineto trace written and read back with our spans in it.
#include "titan/common/check.h"
#include "titan/common/memory_probe.h"
#include "titan/common/phase.h"
#include "titan/components/profiling.h"

#include "../test_util.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <limits>
#include <set>

namespace titan {
namespace profiling_test {

namespace fs = std::filesystem;
using test::contains;
using test::message_of;

nlohmann::json read_json(const fs::path& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  return nlohmann::json::parse(in);
}

ProfilingSection profiling(int64_t freq, int64_t warmup, int64_t active) {
  ProfilingSection p;
  p.profile_freq = freq;
  p.profiler_warmup = warmup;
  p.profiler_active = active;
  return p;
}

TEST(Profiling, ScheduleMatchesTorchTitansCycle) {
  // TorchTitan: wait = freq - (warmup + active); windows end at the multiples of freq.
  const ProfileSchedule s = ProfileSchedule::from_config(profiling(10, 3, 1));
  using A = ProfileSchedule::Action;
  for (int64_t step = 1; step <= 30; ++step) {
    const int64_t pos = (step - 1) % 10 + 1;
    const A want = pos == 10 ? A::kRecord : pos >= 7 ? A::kWarmup : A::kNone;
    EXPECT_EQ(s.action(step), want) << step;
    EXPECT_EQ(s.ends_window(step), pos == 10) << step;
  }
  const ProfileSchedule two = ProfileSchedule::from_config(profiling(4, 0, 2));
  EXPECT_EQ(two.action(1), A::kNone);
  EXPECT_EQ(two.action(3), A::kRecord);
  EXPECT_EQ(two.action(4), A::kRecord);
  EXPECT_EQ(two.action(5), A::kNone);
  EXPECT_EQ(profile_window_folder(20), "iteration_20");
  EXPECT_EQ(profile_window_folder(7, /*exit=*/true), "iteration_7_exit");
}

TEST(Profiling, ScheduleErrorsShowTheArithmetic) {
  const std::string msg = message_of([] { ProfileSchedule::from_config(profiling(10, 3, 8)); });
  EXPECT_TRUE(contains(msg, "profiler_warmup(3) + profiler_active(8) = 11 > profile_freq(10)"))
      << msg;
  EXPECT_TRUE(contains(message_of([] { ProfileSchedule::from_config(profiling(0, 0, 1)); }),
                       "profile_freq must be >= 1"));
  EXPECT_TRUE(contains(message_of([] { ProfileSchedule::from_config(profiling(5, 0, 0)); }),
                       "profiler_active must be >= 1"));
  EXPECT_TRUE(contains(message_of([] { ProfileSchedule::from_config(profiling(5, -1, 1)); }),
                       "profiler_warmup must be >= 0"));
  // A warm-up near INT64_MAX used to overflow the sum into passing the check.
  const std::string huge = message_of([] {
    ProfileSchedule::from_config(profiling(4, std::numeric_limits<int64_t>::max() - 1, 2));
  });
  EXPECT_TRUE(contains(huge,
                       "profiler_warmup(9223372036854775806) + profiler_active(2) = more "
                       "than 2^63 > profile_freq(4)"))
      << huge;
}

at::Tensor bytes(int64_t n) { return at::empty({n}, at::kByte); }

// One step with allocations of known sizes in each phase; returns what it keeps alive.
std::vector<at::Tensor> run_step(MemoryProfiler& mem, int64_t step) {
  std::vector<at::Tensor> kept;
  mem.begin_step(step);
  {
    const PhaseScope phase(Phase::kForward);
    kept.push_back(bytes(1 << 20));  // activations: kept
  }
  {
    const PhaseScope phase(Phase::kBackward);
    { at::Tensor scratch = bytes(4 << 20); }  // a temporary: peak +4 MiB, net 0
    {
      const PhaseScope phase(Phase::kCollective, "all_reduce", "dp");
      kept.push_back(bytes(2 << 20));
    }
    kept.erase(kept.begin());  // the activations go after the collective
  }
  {
    const PhaseScope phase(Phase::kOptimizer);
    kept.push_back(bytes(512 << 10));
  }
  mem.end_step(step);
  return kept;
}

TEST(Profiling, MemoryTimelineCountsBytesByPhaseExactly) {
  const fs::path dir = test::fresh_test_dir("titan_memory_timeline");
  ProfilingSection p = profiling(2, 0, 1);
  p.save_memory_snapshot_folder = "mem";
  {
    MemoryProfiler mem(p, dir.string(), /*rank=*/3, at::kCPU);
    std::vector<at::Tensor> kept1 = run_step(mem, 1);
    kept1.clear();
    std::vector<at::Tensor> kept2 = run_step(mem, 2);
  }
  const fs::path file = dir / "mem" / "iteration_2" / "rank3_memory_timeline.json";
  ASSERT_TRUE(fs::exists(file));
  const nlohmann::json j = read_json(file);
  EXPECT_EQ(j["format"], "titan-memory-timeline");
  EXPECT_EQ(j["rank"], 3);
  EXPECT_EQ(j["peak_exact"], true);
  ASSERT_EQ(j["steps"].size(), 2u);  // the window: steps 1 and 2
  constexpr int64_t kMiB = 1 << 20;
  for (const nlohmann::json& s : j["steps"]) {
    const int64_t start = s["start_bytes"];
    const nlohmann::json& ph = s["phases"];
    EXPECT_EQ(ph["forward"]["net_bytes"], kMiB);
    EXPECT_EQ(ph["forward"]["peak_bytes"], start + kMiB);
    // Backward: two stretches around the collective; the scratch peak; the activations freed.
    EXPECT_EQ(ph["backward"]["entries"], 2);
    EXPECT_EQ(ph["backward"]["peak_bytes"], start + 5 * kMiB);
    EXPECT_EQ(ph["backward"]["net_bytes"], -kMiB);
    EXPECT_EQ(ph["collective"]["net_bytes"], 2 * kMiB);
    EXPECT_EQ(ph["collective"]["entries"], 1);
    EXPECT_EQ(ph["optimizer"]["net_bytes"], kMiB / 2);
    EXPECT_EQ(s["end_bytes"].get<int64_t>() - start, 2 * kMiB + kMiB / 2);
    EXPECT_EQ(s["peak_bytes"].get<int64_t>(), start + 5 * kMiB);
    // The stretches in order: forward, backward, collective, backward, optimizer.
    std::vector<std::string> order;
    for (const nlohmann::json& g : s["segments"]) order.push_back(g["phase"]);
    EXPECT_EQ(order, (std::vector<std::string>{"forward", "backward", "collective", "backward",
                                               "optimizer"}));
  }
  // Step 1's survivors were freed between the steps: step 2 starts lower than step 1 ended.
  EXPECT_LT(j["steps"][1]["start_bytes"].get<int64_t>(), j["steps"][0]["end_bytes"].get<int64_t>());
}

TEST(Profiling, OutOfMemoryUnderACpuLimitIsDumpedToAnExitFolder) {
  const fs::path dir = test::fresh_test_dir("titan_memory_oom");
  MemoryProfiler mem(profiling(10, 0, 1), dir.string(), /*rank=*/0, at::kCPU);
  CpuMemoryProbe::set_limit(CpuMemoryProbe::live_bytes() + (8 << 20));
  mem.begin_step(3);
  std::exception_ptr error;
  try {
    const PhaseScope phase(Phase::kForward);
    at::Tensor ok = bytes(4 << 20);
    at::Tensor too_much = bytes(8 << 20);
  } catch (...) {
    error = std::current_exception();
  }
  CpuMemoryProbe::set_limit(0);
  ASSERT_TRUE(error);
  EXPECT_TRUE(is_out_of_memory(error));
  EXPECT_TRUE(contains(message_of([&] { std::rethrow_exception(error); }), "CPU out of memory"));
  EXPECT_FALSE(is_out_of_memory(std::make_exception_ptr(DataError("disk full"))));
  const std::string folder = mem.dump_after_error(3);
  EXPECT_EQ(fs::path(folder).filename(), "iteration_3_exit");
  const nlohmann::json j = read_json(fs::path(folder) / "rank0_memory_timeline.json");
  ASSERT_EQ(j["steps"].size(), 1u);
  EXPECT_EQ(j["steps"][0]["step"], 3);
  EXPECT_EQ(j["steps"][0]["phases"]["forward"]["peak_bytes"].get<int64_t>() -
                j["steps"][0]["start_bytes"].get<int64_t>(),
            4 << 20);
}

TEST(Profiling, KinetoTraceHoldsTheRecordedStepsAndOurSpans) {
  const fs::path dir = test::fresh_test_dir("titan_trace");
  ProfilingSection p = profiling(2, 1, 1);
  p.save_traces_folder = "traces";
  TraceProfiler prof(p, dir.string(), /*rank=*/1, at::kCPU);
  const at::Tensor a = at::randn({64, 64});
  std::vector<std::optional<std::string>> written;
  for (int64_t step = 1; step <= 4; ++step) {
    prof.begin_step(step);
    {
      const PhaseScope phase(Phase::kForward);
      at::Tensor b = at::mm(a, a);
      const PhaseScope wait(Phase::kCollective, "wait", "all_reduce #" + std::to_string(step));
    }
    written.push_back(prof.end_step(step));
  }
  EXPECT_FALSE(written[0].has_value());
  EXPECT_FALSE(written[2].has_value());
  ASSERT_TRUE(written[1].has_value());
  ASSERT_TRUE(written[3].has_value());
  EXPECT_EQ(*written[1], (dir / "traces" / "iteration_2" / "rank1_trace.json").string());
  for (int64_t step : {2, 4}) {
    const nlohmann::json j =
        read_json(dir / "traces" / ("iteration_" + std::to_string(step)) / "rank1_trace.json");
    std::set<std::string> names;
    for (const nlohmann::json& e : j["traceEvents"]) {
      if (e.contains("name") && e["name"].is_string()) names.insert(e["name"]);
    }
    EXPECT_TRUE(names.count("ProfilerStep#" + std::to_string(step))) << step;
    EXPECT_FALSE(names.count("ProfilerStep#" + std::to_string(step - 1))) << step;
    EXPECT_TRUE(names.count("forward")) << step;
    EXPECT_TRUE(names.count("aten::mm")) << step;
    EXPECT_TRUE(names.count("wait all_reduce #" + std::to_string(step))) << step;
  }
}

}  // namespace profiling_test
}  // namespace titan
