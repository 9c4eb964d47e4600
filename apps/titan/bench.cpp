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
#include <system_error>

#include <stdlib.h>

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

}  // namespace

int run_bench(const std::vector<std::string>& all_args) {
  std::vector<std::string> args;
  bool breakdown = false;
  for (const std::string& a : all_args) {
    if (a == "--breakdown") {
      breakdown = true;
    } else {
      args.push_back(a);
    }
  }
  JobConfig config = parse_job_config(args);
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
  for (int64_t step = 1; step <= warmup; ++step) trainer.train_step(step);
  synchronize_device(trainer.device());
  auto t0 = std::chrono::steady_clock::now();
  for (int64_t step = warmup + 1; step <= warmup + steps; ++step) trainer.train_step(step);
  synchronize_device(trainer.device());  // the steps are queued on a GPU, not done
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  const int64_t tokens_per_step = t.local_batch_size * trainer.accumulation_steps() * t.seq_len;
  const double tps = static_cast<double>(steps * tokens_per_step) / seconds;
  const double flops = stats.flops_per_token(t.seq_len) * tps;
  std::printf(
      "bench model=%s flavor=%s dtype=%s batch=%lld seq=%lld params=%lld steps=%lld "
      "tokens_per_s=%.1f tflops=%.4f peak_tflops=%.4f mfu_pct=%.2f peak_rss_gib=%.3f "
      "step_s=%.4f threads=\"%s\"\n",
      config.model.name.c_str(), config.model.flavor.c_str(), t.mixed_precision_param.c_str(),
      (long long)t.local_batch_size, (long long)t.seq_len, (long long)stats.n_params,
      (long long)steps, tps, flops / 1e12, peak / 1e12, 100.0 * flops / peak,
      static_cast<double>(peak_rss_bytes()) / (1024.0 * 1024.0 * 1024.0),
      seconds / static_cast<double>(steps), threads.c_str());
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
