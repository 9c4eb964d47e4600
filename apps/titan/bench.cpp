// `titan bench`: times the trainer's own training steps (Trainer::train_step: forward, backward,
// clip, AdamW at the scheduled learning rate) on the configured model, so the figure is the speed
// `titan train` trains at. Prints one line with tokens/s, achieved TFLOP/s, MFU against a GEMM
// probe, and peak RSS. Run each variant in its own process (bench/run_bench.sh) so peak memory
// belongs to one variant. Batches come from the configured dataset through the trainer's loader
// (tokenized ahead of the model, a small share of a step); the trainer's outputs go to a temporary
// job.dump_folder, removed at the end, so a bench never touches a training run's folder.
//
// --breakdown: after the timed steps, runs the same number of steps again under a StepBreakdown
// (titan/components/breakdown.h) and prints where a step's time goes: per phase and per family of
// ops, with the matmuls' achieved FLOP/s against the GEMM probe.
#include "commands.h"
#include "flags.h"

#include "titan/common/check.h"
#include "titan/common/cpu.h"
#include "titan/common/device.h"
#include "titan/common/format.h"
#include "titan/components/breakdown.h"
#include "titan/components/metrics.h"
#include "titan/config/config_manager.h"
#include "titan/trainer/trainer.h"

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include <stdlib.h>
#include <sys/resource.h>

namespace titan {

namespace {

// A fresh folder under the system's temporary directory, removed with everything in it.
struct ScratchFolder {
  std::string path;
  ScratchFolder() {
    std::string pattern = (std::filesystem::temp_directory_path() / "titan-bench-XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr) {
      throw DataError("cannot create the temporary folder " + pattern + ": " +
                      std::strerror(errno) + ". HINT: set TMPDIR to a writable folder");
    }
    path = pattern;
  }
  ~ScratchFolder() {
    std::error_code ignored;
    std::filesystem::remove_all(path, ignored);
  }
};

// This process's CPU time (user + system) and minor page faults so far.
struct ProcessUsage {
  double cpu_s = 0;
  int64_t minor_faults = 0;
};
ProcessUsage process_usage() {
  struct rusage u {};
  getrusage(RUSAGE_SELF, &u);
  const auto seconds = [](const timeval& t) { return t.tv_sec + 1e-6 * t.tv_usec; };
  return {seconds(u.ru_utime) + seconds(u.ru_stime), static_cast<int64_t>(u.ru_minflt)};
}

}  // namespace

int run_bench(const std::vector<std::string>& all_args) {
  bool breakdown = false;
  // Every config key works as in `titan train` (its help, without the usage line, ends ours).
  const std::string config_help = render_help("bench");
  const size_t keys = config_help.find("\n\n");
  FlagTable flags(
      "titan bench [--breakdown] [--job.config_file FILE] [--section.key value ...]",
      "Times the trainer's own training steps on the configured model (2 warm-up steps, then\n"
      "training.steps timed ones) and prints one line: tokens/s, TFLOP/s, MFU against a GEMM\n"
      "probe, peak RSS, and each step's wall time, CPU time and page faults.");
  flags
      .toggle("--breakdown",
              "then as many steps again under a step breakdown: where a step's time goes, per\n"
              "phase and per family of ops, with the matmuls' FLOP/s against the probe",
              &breakdown)
      .epilogue(keys == std::string::npos ? config_help : config_help.substr(keys + 2));
  if (FlagTable::wants_help(all_args)) {
    std::fputs(flags.usage().c_str(), stdout);
    return 0;
  }
  JobConfig config = parse_job_config(flags.parse(all_args, /*pass_config_keys=*/true));
  const int64_t steps = config.training.steps;
  const int64_t warmup = 2;
  // The learning-rate schedule spans the warm-up (and the breakdown's steps) too.
  config.training.steps = warmup + steps * (breakdown ? 2 : 1);
  if (config.debug.seed < 0) config.debug.seed = 0;
  // Threads first, so that the GEMM probe runs with the trainer's thread settings; the trainer
  // then takes the probe's figure (metrics.peak_flops) instead of probing again.
  const std::string threads = configure_threads(config.training.num_threads);
  const auto& t = config.training;
  if (config.metrics.peak_flops <= 0) {
    config.metrics.peak_flops = probe_peak_flops(dtype_from_name(t.mixed_precision_param));
  }
  const double peak = config.metrics.peak_flops;
  ScratchFolder dump_folder;
  config.job.dump_folder = dump_folder.path;

  Trainer trainer(config);
  const ModelStats stats = trainer.model().stats(t.local_batch_size, t.seq_len);
  // Every step's wall time, the warm-up's too (how soon the step reaches its speed). On a GPU
  // the host queues steps ahead of the device: those are host times, and only the total (after
  // a synchronisation) is the device's.
  // With them, the process's CPU seconds and minor page faults per step (first touches of
  // fresh memory), which say where a slow first step goes.
  std::vector<double> step_times, step_cpu, step_faults;
  const auto timed_step = [&](int64_t step) {
    const ProcessUsage u0 = process_usage();
    const auto s0 = std::chrono::steady_clock::now();
    trainer.train_step(step);
    step_times.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - s0).count());
    const ProcessUsage u1 = process_usage();
    step_cpu.push_back(u1.cpu_s - u0.cpu_s);
    step_faults.push_back(static_cast<double>(u1.minor_faults - u0.minor_faults));
  };
  for (int64_t step = 1; step <= warmup; ++step) timed_step(step);
  synchronize_device(trainer.device());
  auto t0 = std::chrono::steady_clock::now();
  for (int64_t step = warmup + 1; step <= warmup + steps; ++step) timed_step(step);
  synchronize_device(trainer.device());
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const auto joined = [](const std::vector<double>& values, const char* format) {
    std::string out;
    for (double v : values) {
      char buf[32];
      std::snprintf(buf, sizeof(buf), format, v);
      out += (out.empty() ? "" : ",") + std::string(buf);
    }
    return out;
  };

  const int64_t tokens_per_step = t.local_batch_size * trainer.accumulation_steps() * t.seq_len;
  const double tps = static_cast<double>(steps * tokens_per_step) / seconds;
  const double flops = stats.flops_per_token(t.seq_len) * tps;
  std::printf(
      "bench model=%s flavor=%s dtype=%s batch=%lld seq=%lld params=%lld steps=%lld "
      "tokens_per_s=%.1f tflops=%.4f peak_tflops=%.4f mfu_pct=%.2f peak_rss_gib=%.3f "
      "step_s=%.4f step_times=%s step_cpu=%s step_faults=%s threads=\"%s\"\n",
      config.model.name.c_str(), config.model.flavor.c_str(), t.mixed_precision_param.c_str(),
      (long long)t.local_batch_size, (long long)t.seq_len, (long long)stats.n_params,
      (long long)steps, tps, flops / 1e12, peak / 1e12, 100.0 * flops / peak,
      static_cast<double>(peak_rss_bytes()) / (1024.0 * 1024.0 * 1024.0),
      seconds / static_cast<double>(steps), joined(step_times, "%.4f").c_str(),
      joined(step_cpu, "%.3f").c_str(), joined(step_faults, "%.0f").c_str(), threads.c_str());
  if (breakdown) {
    StepBreakdown b;
    for (int64_t step = warmup + steps + 1; step <= warmup + 2 * steps; ++step) {
      b.begin_step();
      trainer.train_step(step);
      synchronize_device(trainer.device());
      b.end_step();
    }
    std::printf("%s",
                format_breakdown(b.report(), seconds / static_cast<double>(steps), peak).c_str());
  }
  return 0;
}

}  // namespace titan
