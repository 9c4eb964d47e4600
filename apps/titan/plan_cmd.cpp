// `titan plan`: the layout planner (src/titan/plan/planner.h) from the command line. The
// model, sizes and fixed keys come as a job config (--job.config_file plus --section.key
// overrides); the cluster and the search as the flags of plan_flags(). With --cpu the device is one
// rank's share of this machine, its peak and link measured here. Bad usage throws ConfigError.
#include "commands.h"
#include "flags.h"

#include "titan/common/check.h"
#include "titan/common/cpu.h"
#include "titan/common/format.h"
#include "titan/components/metrics.h"
#include "titan/components/training_dtype.h"
#include "titan/config/config_manager.h"
#include "titan/distributed/comm.h"
#include "titan/models/registry.h"
#include "titan/plan/planner.h"

#include <ATen/Parallel.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <mutex>
#include <sstream>
#include <thread>

namespace titan {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

struct Flags {
  int64_t nodes = 1;
  int64_t gpus_per_node = -1;
  std::string gpu = "h100";
  bool gpu_given = false;
  bool cpu = false;
  double memory_gib = -1, peak_tflops = -1, intra_gbps = -1, inter_gbps = -1, reserved_gib = -1;
  double latency_us = -1;
  double mfu = 0.4;
  int64_t top = 5;
  std::vector<std::string> ac, schedules;
  std::vector<std::string> config_args;
};

int64_t positive_int(const std::string& flag, const std::string& text) {
  const std::optional<int64_t> n = parse_int64(text);
  if (!n || *n < 1)
    throw ConfigError(message(flag, " expects a positive integer, got '", text, "'"));
  return *n;
}

double number(const std::string& flag, const std::string& text) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size() || !(v >= 0) || !std::isfinite(v)) {
    throw ConfigError(message(flag, " expects a non-negative number, got '", text, "'"));
  }
  return v;
}

std::vector<std::string> list(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream fields(text);
  std::string field;
  while (std::getline(fields, field, ',')) {
    if (!field.empty()) out.push_back(field);
  }
  return out;
}

FlagTable plan_flags(Flags& f) {
  FlagTable flags(
      "titan plan [--job.config_file FILE] [--section.key value ...] [flags]",
      "Enumerates the layouts of a training job over nodes x gpus_per_node devices (dp_replicate,\n"
      "dp_shard, cp, tp, pp with its schedule, ep and etp for MoE models, activation checkpointing,\n"
      "local batch and gradient accumulation), keeps those the trainer accepts and that fit, and\n"
      "prints the fastest with per-device memory (the estimate `titan inspect` and `titan train`\n"
      "use), step time (compute, bubble, exposed communication per dimension), tokens/s per device,\n"
      "MFU and the reason, then the rejected layouts counted by reason and where the config's own\n"
      "layout ranks. The cost model is in src/titan/plan/planner.h.\n"
      "\n"
      "The job config gives the model (--model.name, --model.flavor), --training.seq_len,\n"
      "--training.global_batch_size (-1: local_batch_size x dp of the config's layout), the dtypes\n"
      "and the pipeline keys. A parallelism degree, --training.local_batch_size,\n"
      "--activation_checkpoint.mode or --parallelism.pipeline_parallel_schedule given on the command\n"
      "line is held fixed; the rest is searched.");
  const auto number_of = [](const char* flag, double* out) {
    return [flag, out](const std::string& v) { *out = number(flag, v); };
  };
  flags
      .value("--nodes", "N", "nodes (default 1; nodes x gpus_per_node at most 1048576)",
             [&f](const std::string& v) { f.nodes = positive_int("--nodes", v); })
      .value("--gpus_per_node", "N",
             "devices per node (default 8; with --cpu: ranks on this machine,\ndefault its cores)",
             [&f](const std::string& v) { f.gpus_per_node = positive_int("--gpus_per_node", v); })
      .value("--gpu", "NAME",
             "h100 (80 GiB, 989 TFLOP/s bf16), h200 (141 GiB, 989), a100 (80 GiB,\n"
             "312); NVLink 450 GB/s (A100 300) and 50 GB/s across nodes (A100 25)\n"
             "per device; 20 us per collective; a tenth of the memory reserved\n"
             "(default h100)",
             [&f](const std::string& v) {
               f.gpu = v;
               f.gpu_given = true;
             })
      .toggle("--cpu",
              "this machine: each of gpus_per_node ranks gets its share of the\n"
              "memory and of the GEMM probe's FLOP/s (as the trainer's MFU), links\n"
              "at a measured Gloo loopback all-gather bandwidth and latency (4 KB),\n"
              "reserved memory the resident size of this process, no overlap of\n"
              "communication",
              &f.cpu)
      .value("--gpu_memory_gib", "G", "overrides the device's memory (GiB)",
             number_of("--gpu_memory_gib", &f.memory_gib))
      .value("--peak_tflops", "F", "overrides its peak (TFLOP/s)",
             number_of("--peak_tflops", &f.peak_tflops))
      .value("--intra_node_gbps", "B", "overrides its link bandwidth in a node (GB/s per device)",
             number_of("--intra_node_gbps", &f.intra_gbps))
      .value("--inter_node_gbps", "B", "... across nodes (GB/s per device)",
             number_of("--inter_node_gbps", &f.inter_gbps))
      .value("--reserved_gib", "G", "overrides the reserved memory (GiB)",
             number_of("--reserved_gib", &f.reserved_gib))
      .value("--latency_us", "U", "overrides the per-collective latency (us)",
             number_of("--latency_us", &f.latency_us))
      .value("--mfu", "M", "compute efficiency, recomputation included (default 0.4)",
             number_of("--mfu", &f.mfu))
      .value("--top", "N", "layouts printed (default 5)",
             [&f](const std::string& v) { f.top = positive_int("--top", v); })
      .value("--ac", "LIST",
             "activation checkpointing modes searched (default none,2,op,full:\n"
             "an integer k checkpoints every k-th block)",
             [&f](const std::string& v) { f.ac = list(v); })
      .value("--pp_schedules", "LIST", "pipeline schedules searched (default 1F1B,Interleaved1F1B)",
             [&f](const std::string& v) { f.schedules = list(v); });
  return flags;
}

Flags parse_flags(const std::vector<std::string>& args) {
  Flags f;
  f.config_args = plan_flags(f).parse(args, /*pass_config_keys=*/true);
  TITAN_CONFIG_CHECK(!(f.cpu && f.gpu_given), "--cpu and --gpu name two devices; give one");
  return f;
}

// Whether the command line (not the TOML) sets `key`.
bool given(const std::vector<std::string>& args, const std::string& key) {
  const std::string flag = "--" + key;
  return std::any_of(args.begin(), args.end(), [&](const std::string& a) {
    return a == flag || a.rfind(flag + "=", 0) == 0;
  });
}

struct LinkProbe {
  double bytes_per_s = 0;
  double latency_s = 0;
};

// Bus bandwidth (bytes/s) of a 16 MB float32 all-gather between two ranks of this process over
// Gloo on loopback, what the collectives of ranks on this machine move per second, and the time
// of a 4 KB one, their latency.
LinkProbe measure_loopback() {
  constexpr int kRanks = 2;
  constexpr int64_t kNumel = 4 * 1024 * 1024;
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<double> seconds(kRanks, 0), small_seconds(kRanks, 0);
  std::vector<std::thread> threads;
  std::string error;
  std::mutex mutex;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      try {
        at::set_num_threads(1);
        dist::GroupOptions options;
        options.name = "plan_probe";
        options.gloo_hostname = "127.0.0.1";
        options.timeout = std::chrono::seconds(60);
        auto group = dist::Group::create(store, r, kRanks, options);
        at::Tensor full = at::empty({kNumel});
        at::Tensor shard = at::randn({kNumel / kRanks});
        group->all_gather_into_tensor(full, shard).wait();  // connections, buffers
        const auto best_of = [&](at::Tensor& out, const at::Tensor& in, int iters) {
          double best = 1e30;
          for (int i = 0; i < iters; ++i) {
            group->barrier().wait();
            const auto start = std::chrono::steady_clock::now();
            group->all_gather_into_tensor(out, in).wait();
            const auto end = std::chrono::steady_clock::now();
            best = std::min(best, std::chrono::duration<double>(end - start).count());
          }
          return best;
        };
        seconds[r] = best_of(full, shard, 4);
        at::Tensor small_full = at::empty({1024});
        at::Tensor small_shard = at::randn({1024 / kRanks});
        small_seconds[r] = best_of(small_full, small_shard, 8);
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(mutex);
        error = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  if (!error.empty()) {
    throw ConfigError(message("--cpu could not measure the loopback bandwidth (", error,
                              "). HINT: give --intra_node_gbps"));
  }
  const double t = *std::max_element(seconds.begin(), seconds.end());
  LinkProbe probe;
  probe.bytes_per_s = static_cast<double>(kNumel) * 4.0 * (kRanks - 1) / kRanks / t;
  probe.latency_s = *std::max_element(small_seconds.begin(), small_seconds.end());
  return probe;
}

Hardware build_hardware(const Flags& f, const JobConfig& config, int64_t gpus_per_node) {
  Hardware h;
  if (f.cpu) {
    const double cores = static_cast<double>(std::max(1u, std::thread::hardware_concurrency()));
    const double ranks = static_cast<double>(gpus_per_node);
    h.name = "this CPU (1/" + std::to_string(gpus_per_node) + " of it per rank)";
    h.memory_bytes = machine_memory_bytes() / ranks;
    h.reserved_bytes = static_cast<double>(peak_rss_bytes());
    h.comm_overlaps_compute = false;
    // Ranks share the cores: each gets 1/ranks of the machine's GEMM rate, and of the copy rate
    // that Gloo's loopback transfers run at once they outnumber the cores.
    if (f.peak_tflops < 0) {
      h.peak_flops = probe_peak_flops(training_compute_dtype(config.training)) / ranks;
    }
    if (f.intra_gbps < 0 || f.latency_us < 0) {
      const LinkProbe probe = measure_loopback();
      h.intra_node_bps = probe.bytes_per_s * std::min(1.0, cores / ranks);
      h.latency_s = probe.latency_s * std::max(1.0, ranks / cores);
    }
  } else {
    h = gpu_preset(f.gpu);
  }
  if (f.memory_gib >= 0) {
    h.memory_bytes = f.memory_gib * kGiB;
    if (!f.cpu && f.reserved_gib < 0) h.reserved_bytes = 0.1 * h.memory_bytes;
  }
  if (f.reserved_gib >= 0) h.reserved_bytes = f.reserved_gib * kGiB;
  if (f.peak_tflops >= 0) h.peak_flops = f.peak_tflops * 1e12;
  if (f.intra_gbps >= 0) h.intra_node_bps = f.intra_gbps * 1e9;
  if (f.inter_gbps >= 0) h.inter_node_bps = f.inter_gbps * 1e9;
  if (f.latency_us >= 0) h.latency_s = f.latency_us * 1e-6;
  // One machine: its ranks all talk over loopback.
  if (f.cpu && f.inter_gbps < 0) h.inter_node_bps = h.intra_node_bps;
  return h;
}

std::string seconds_text(double s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), s < 0.01 ? "%.3g" : "%.3f", s);
  return buf;
}

std::string fmt_percent(double fraction, const char* format) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), format, 100 * fraction);
  return buf;
}

void print_prediction(const std::string& label, const Prediction& p, const Prediction* best) {
  std::printf("%s %s\n", label.c_str(), p.layout.describe().c_str());
  std::string step = "   step " + seconds_text(p.step) + " s = compute " + seconds_text(p.compute);
  if (p.bubble > 0) {
    step += " + bubble " + seconds_text(p.bubble) +
            fmt_percent(p.bubble_fraction, " (%.1f%% of the pipeline)");
  }
  for (const Collective& c : p.comm) {
    step += " + " + c.dim + " " + seconds_text(c.exposed);
  }
  std::printf("%s\n", step.c_str());
  std::string traffic;
  for (const Collective& c : p.comm) {
    char buf[160];
    std::snprintf(buf, sizeof(buf), "%s%s %.3g GB in %.4g ops %s-node, %s s on the link",
                  traffic.empty() ? "" : "; ", c.dim.c_str(), c.bytes / 1e9, c.count,
                  c.inter_node ? "inter" : "intra", seconds_text(c.seconds).c_str());
    traffic += buf;
  }
  if (!traffic.empty()) std::printf("   traffic per device per step: %s\n", traffic.c_str());
  std::printf("   tokens/s per device %s, MFU %.1f%%",
              with_commas(std::llround(p.tokens_per_device)).c_str(), 100 * p.mfu);
  if (best != nullptr && best->step > 0) {
    std::printf(" (%.1f%% slower than #1)", 100 * (p.step / best->step - 1));
  }
  std::printf("\n");
  std::printf("   memory per device %s (%s usable): %s\n", gib_text(p.memory.total()).c_str(),
              gib_text(p.usable_bytes).c_str(), p.memory.breakdown().c_str());
  std::printf("   why: %s\n", p.reasoning.c_str());
  std::printf("   config: %s\n", p.layout.overrides().c_str());
}

}  // namespace

int run_plan(const std::vector<std::string>& args) {
  if (FlagTable::wants_help(args)) {
    Flags unused;
    std::fputs(plan_flags(unused).usage().c_str(), stdout);
    return 0;
  }
  const Flags f = parse_flags(args);
  PlanRequest request;
  request.config = parse_job_config(f.config_args);
  const ModelSpec& spec = get_model_spec(request.config.model.name);
  check_flavor(spec, request.config.model.flavor);
  if (spec.objective != ModelObjective::kNextToken) {
    throw ConfigError(message(
        "titan plan's cost and memory models are a text decoder's; the ",
        spec.objective == ModelObjective::kFlowMatching ? "flow-matching" : "vision-language",
        " model '", spec.name,
        "' has none yet. HINT: lay it out by hand: data parallelism (FSDP, HSDP, DDP) and "
        "tensor parallelism, with activation checkpointing"));
  }
  request.nodes = f.nodes;
  request.gpus_per_node =
      f.gpus_per_node > 0
          ? f.gpus_per_node
          : (f.cpu ? static_cast<int64_t>(std::max(1u, std::thread::hardware_concurrency())) : 8);
  request.mfu = f.mfu;
  if (!f.ac.empty()) request.ac_modes = f.ac;
  if (!f.schedules.empty()) request.schedules = f.schedules;
  const auto& a = f.config_args;
  request.fix_dp_replicate = given(a, "parallelism.data_parallel_replicate_degree");
  request.fix_dp_shard = given(a, "parallelism.data_parallel_shard_degree");
  request.fix_cp = given(a, "parallelism.context_parallel_degree");
  request.fix_tp = given(a, "parallelism.tensor_parallel_degree");
  request.fix_pp = given(a, "parallelism.pipeline_parallel_degree");
  request.fix_ep = given(a, "parallelism.expert_parallel_degree");
  request.fix_etp = given(a, "parallelism.expert_tensor_parallel_degree");
  request.fix_local_batch = given(a, "training.local_batch_size");
  request.fix_ac = given(a, "activation_checkpoint.mode") ||
                   given(a, "activation_checkpoint.selective_ac_option");
  request.fix_schedule = given(a, "parallelism.pipeline_parallel_schedule");
  request.hardware = build_hardware(f, request.config, request.gpus_per_node);

  const Plan plan = plan_layouts(request);
  const JobConfig& c = request.config;
  const Hardware& h = request.hardware;
  const ModelStats s =
      spec.describe(c.model.flavor, 1, c.training.seq_len, training_compute_dtype(c.training));
  const int64_t world = request.nodes * request.gpus_per_node;
  std::printf("titan plan: %s %s (%s parameters%s), seq_len %lld, %s compute\n",
              c.model.name.c_str(), c.model.flavor.c_str(), with_commas(s.n_params).c_str(),
              s.active_params() != s.n_params
                  ? (", " + with_commas(s.active_params()) + " active").c_str()
                  : "",
              (long long)c.training.seq_len, at::toString(training_compute_dtype(c.training)));
  std::printf(
      "cluster: %lld node%s x %lld = %lld devices, %s: %s (%s reserved), %.4g TFLOP/s peak "
      "at MFU %.0f%%, %.4g GB/s in a node, %.4g GB/s across nodes, %.3g us per collective%s\n",
      (long long)request.nodes, request.nodes == 1 ? "" : "s", (long long)request.gpus_per_node,
      (long long)world, h.name.c_str(), gib_text(h.memory_bytes).c_str(),
      gib_text(h.reserved_bytes).c_str(), h.peak_flops / 1e12, 100 * request.mfu,
      h.intra_node_bps / 1e9, h.inter_node_bps / 1e9, h.latency_s * 1e6,
      h.comm_overlaps_compute ? "; FSDP/DP traffic overlaps compute"
                              : "; no communication overlaps compute");
  std::vector<std::pair<std::string, int64_t>> reasons(plan.rejected.begin(), plan.rejected.end());
  std::sort(reasons.begin(), reasons.end(),
            [](const auto& x, const auto& y) { return x.second > y.second; });
  std::vector<std::string> rejected;
  for (const auto& [reason, n] : reasons) rejected.push_back(reason + ": " + with_commas(n));
  std::printf("searched %s layouts: %s valid and fitting; rejected: %s\n",
              with_commas(plan.considered).c_str(), with_commas(plan.fitting).c_str(),
              rejected.empty() ? "none" : join(rejected).c_str());
  const size_t shown = std::min<size_t>(plan.ranked.size(), static_cast<size_t>(f.top));
  for (size_t i = 0; i < shown; ++i) {
    std::printf("\n");
    print_prediction("#" + std::to_string(i + 1), plan.ranked[i],
                     i > 0 ? &plan.ranked[0] : nullptr);
  }
  if (plan.ranked.empty()) {
    std::printf(
        "\nno layout fits. HINT: more devices, a smaller training.seq_len or "
        "global_batch_size, or a smaller model.flavor\n");
  }
  std::printf("\n");
  if (plan.config_layout && plan.config_rank >= 0) {
    print_prediction("the config's layout, rank " + std::to_string(plan.config_rank + 1) + " of " +
                         std::to_string(plan.fitting) + ":",
                     *plan.config_layout, plan.ranked.empty() ? nullptr : &plan.ranked[0]);
  } else if (plan.config_layout) {
    print_prediction("the config's layout does not fit:", *plan.config_layout, nullptr);
  } else {
    std::printf("the config's layout is not valid here: %s\n", plan.config_rejection.c_str());
  }
  return 0;
}

}  // namespace titan
