// Mixture-of-experts experts on this CPU: one GEMM per expert (GroupedExperts::forward_loop)
// against one grouped GEMM per weight (forward_grouped, at::_grouped_mm), on a whole MoE model
// (Qwen3 debugmodel_moe by default: dim 256, 8 layers, 64 experts of hidden 768, top 8), for
// compute dtypes bf16 and fp32 (float32 parameters, as the trainer's mixed precision keeps them).
// Per variant it times training steps (forward + loss + backward, then an AdamW step unless
// --optimizer none) and prints:
//   tokens/s    over the whole step
//   MFU         ModelStats::flops_per_token (TorchTitan's formula on the ACTIVE parameters: the
//               top_k chosen experts, not all of them) x tokens/s over the peak FLOP/s the
//               trainer uses on a CPU (probe_peak_flops: a 1024^3 GEMM in the compute dtype)
//   fwd+bwd ms, AdamW ms   per step
//   peak MiB    CpuMemoryProbe: the largest live CPU tensor bytes during a step above what was
//               live before it (weights, AdamW states; gradients are dropped before each step,
//               so they count)
//   vs loop     tokens/s of the variant over the loop's, same dtype
// The variants set use_grouped_mm on every MoE layer's experts, as the trainer would. The model's
// forward takes the grouped kernel for 16-bit compute only; in fp32 the grouped row forces
// forward_grouped through an ExpertRunner so that both kernels are measured in both dtypes.
// The variants take turns step by step on one model, so slow phases of a shared machine hit them
// alike. Before timing, one forward + backward per variant on the same weights and tokens checks
// that they agree (largest |grouped - loop| of the logits and of the expert weights' gradients).
// Routing is forced even (MoE::force_load_balance, debug.moe_force_load_balance) unless
// --routing router. A benchmark: it prints, it never fails on speed.
//
//   moe_bench [--flavor debugmodel_moe] [--seq 512] [--batch 1] [--steps 3] [--warmup 1]
//             [--threads 2] [--dtype bf16|fp32|both] [--routing forced|router]
//             [--optimizer adamw|none] [--experts loop|grouped|both]
#include "titan/common/cpu.h"
#include "titan/common/memory_probe.h"
#include "titan/components/loss.h"
#include "titan/components/metrics.h"
#include "titan/components/optimizer.h"
#include "titan/models/llama3/model.h"
#include "titan/models/registry.h"

#include <ATen/ATen.h>

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}
double mib(int64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

// Runs a layer's experts with the kernel the variant names, whatever the compute dtype (the
// model's own forward takes the grouped kernel for 16-bit compute only).
class ChosenExperts final : public titan::ExpertRunner {
 public:
  explicit ChosenExperts(bool grouped) : grouped_(grouped) {}
  at::Tensor run(titan::GroupedExperts& experts, const at::Tensor& x,
                 const at::Tensor& counts) override {
    return grouped_ ? experts.forward_grouped(x, counts)
                    : experts.forward_loop(x, titan::host_counts(counts));
  }

 private:
  bool grouped_;
};

struct Variant {
  const char* name;
  bool grouped;
};
constexpr Variant kVariants[] = {{"loop", false}, {"grouped", true}};
constexpr int kNumVariants = 2;

// Sets every MoE layer of `model` to the variant: use_grouped_mm, and in fp32 a runner that
// forces the grouped kernel (the model's runner otherwise).
void select(titan::llama3::Transformer& model, const Variant& v, bool routing_forced) {
  const bool forced_runner = v.grouped && model.compute_dtype() == at::kFloat;
  for (auto& layer : model.layers) {
    if (!layer->moe) continue;
    layer->moe->experts->use_grouped_mm = v.grouped;
    layer->moe->force_load_balance = routing_forced;
    if (forced_runner) {
      layer->moe->runner = std::make_shared<ChosenExperts>(/*grouped=*/true);
    } else {
      layer->moe->runner = std::make_shared<titan::LocalExperts>();
    }
  }
}

void drop_grads(titan::llama3::Transformer& model) {
  for (auto& p : model.parameters()) p.mutable_grad() = at::Tensor();
}

// The gradients of every MoE layer's expert weights, flattened into one tensor.
at::Tensor expert_grads(titan::llama3::Transformer& model) {
  std::vector<at::Tensor> grads;
  for (auto& layer : model.layers) {
    if (!layer->moe) continue;
    for (const auto& w :
         {layer->moe->experts->w1, layer->moe->experts->w2, layer->moe->experts->w3}) {
      grads.push_back(w->weight.grad().flatten());
    }
  }
  return at::cat(grads);
}

struct Totals {
  double fwd_bwd_s = 0;
  double optim_s = 0;
  int64_t peak = 0;  // bytes, the largest over steps
};

// One training step; adds its times and memory to `t`.
void step(titan::llama3::Transformer& model, titan::Optimizer* optimizer, const at::Tensor& inputs,
          const at::Tensor& labels, Totals& t) {
  drop_grads(model);
  const int64_t before = titan::CpuMemoryProbe::live_bytes();
  titan::CpuMemoryProbe::reset_peak();
  const auto t0 = Clock::now();
  titan::lm_cross_entropy_loss(model.forward(inputs), labels).backward();
  t.fwd_bwd_s += seconds_since(t0);
  if (optimizer != nullptr) {
    const auto t1 = Clock::now();
    optimizer->step(/*lr=*/1e-4);
    t.optim_s += seconds_since(t1);
  }
  t.peak = std::max(t.peak, titan::CpuMemoryProbe::peak_bytes() - before);
}

// Busy and total jiffies of the whole machine ("cpu" line of /proc/stat).
std::pair<double, double> machine_jiffies() {
  std::ifstream in("/proc/stat");
  std::string cpu;
  double user = 0, nice = 0, sys = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0;
  in >> cpu >> user >> nice >> sys >> idle >> iowait >> irq >> softirq >> steal;
  const double busy = user + nice + sys + irq + softirq + steal;
  return {busy, busy + idle + iowait};
}

double process_cpu_seconds() {
  struct rusage u {};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

std::string load_average() {
  std::ifstream in("/proc/loadavg");
  std::string a, b, c;
  in >> a >> b >> c;
  return a + " " + b + " " + c;
}

struct Options {
  std::string flavor = "debugmodel_moe";
  int64_t seq = 512, batch = 1, threads = 2;
  int steps = 3, warmup = 1;
  bool routing_forced = true, adamw = true;
  std::string experts = "both";  // loop, grouped or both
  bool runs(const Variant& v) const { return experts == "both" || experts == v.name; }
};

// Appends the variants' table rows to `rows`; prints the agreement and machine notes.
void bench(const Options& o, at::ScalarType dtype, std::vector<std::string>& rows) {
  const char* dtype_name = dtype == at::kFloat ? "fp32" : "bf16";
  const titan::ModelSpec& spec = titan::get_model_spec("qwen3");
  titan::ModelBuildOptions build;
  build.max_seq_len = o.seq;
  build.compute_dtype = dtype;
  build.seed = 0;
  auto model = std::dynamic_pointer_cast<titan::llama3::Transformer>(spec.build(o.flavor, build));
  const titan::ModelStats stats = model->stats(o.batch, o.seq);
  const double flops_per_token = stats.flops_per_token(o.seq);
  const double peak_flops = titan::probe_peak_flops(dtype);
  at::manual_seed(0);
  const int64_t vocab = stats.vocab_size;
  const at::Tensor inputs = at::randint(0, vocab, {o.batch, o.seq}, at::kLong);
  const at::Tensor labels = at::randint(0, vocab, {o.batch, o.seq}, at::kLong);

  // Agreement, on the initial weights: the loop's logits and expert gradients are the reference.
  at::Tensor logits[kNumVariants], grads[kNumVariants];
  for (int v = 0; v < kNumVariants && o.experts == "both"; ++v) {
    select(*model, kVariants[v], o.routing_forced);
    drop_grads(*model);
    at::Tensor out = model->forward(inputs);
    titan::lm_cross_entropy_loss(out, labels).backward();
    logits[v] = out.detach().to(at::kFloat);
    grads[v] = expert_grads(*model).to(at::kFloat);
  }
  if (o.experts == "both") {
    std::printf(
        "# %s agreement (grouped vs loop, same weights and tokens): max |diff| logits %.3g "
        "(max |logit| %.3g), expert weight grads %.3g (max |grad| %.3g)\n",
        dtype_name, (logits[1] - logits[0]).abs().max().item<double>(),
        logits[0].abs().max().item<double>(), (grads[1] - grads[0]).abs().max().item<double>(),
        grads[0].abs().max().item<double>());
  }
  std::printf("# %s peak FLOP/s for MFU: %.1f GFLOP/s (1024^3 GEMM probe, as the trainer)\n",
              dtype_name, peak_flops / 1e9);
  std::fflush(stdout);

  std::unique_ptr<titan::Optimizer> optimizer;
  if (o.adamw) {
    std::vector<titan::NamedParam> named;
    for (const auto& p : model->named_parameters()) named.push_back({p.key(), p.value()});
    optimizer = std::make_unique<titan::Optimizer>(std::move(named), titan::OptimizerSection{});
  }
  std::vector<Totals> totals(kNumVariants);
  const auto jiffies0 = machine_jiffies();
  const double cpu0 = process_cpu_seconds();
  const auto wall0 = Clock::now();
  // The first `warmup` rounds (allocator, kernels, AdamW states) are not counted.
  for (int s = 0; s < o.warmup + o.steps; ++s) {
    for (int v = 0; v < kNumVariants; ++v) {
      if (!o.runs(kVariants[v])) continue;
      select(*model, kVariants[v], o.routing_forced);
      Totals t;
      step(*model, optimizer.get(), inputs, labels, t);
      if (s < o.warmup) continue;
      totals[v].fwd_bwd_s += t.fwd_bwd_s;
      totals[v].optim_s += t.optim_s;
      totals[v].peak = std::max(totals[v].peak, t.peak);
    }
  }
  const double wall = seconds_since(wall0);
  const double own_cores = (process_cpu_seconds() - cpu0) / wall;
  const auto jiffies1 = machine_jiffies();
  const double busy_cores = static_cast<double>(sysconf(_SC_NPROCESSORS_ONLN)) *
                            (jiffies1.first - jiffies0.first) /
                            std::max(1.0, jiffies1.second - jiffies0.second);

  const double tokens = static_cast<double>(o.batch * o.seq * o.steps);
  const double loop_tps = tokens / (totals[0].fwd_bwd_s + totals[0].optim_s);
  for (int v = 0; v < kNumVariants; ++v) {
    if (!o.runs(kVariants[v])) continue;
    const Totals& t = totals[v];
    const double tps = tokens / (t.fwd_bwd_s + t.optim_s);
    const bool forced = kVariants[v].grouped && dtype == at::kFloat;
    char row[256];
    char ratio[32] = "-";
    if (o.experts == "both") std::snprintf(ratio, sizeof(ratio), "%.2f", tps / loop_tps);
    std::snprintf(row, sizeof(row), "| %s | %s%s | %.1f | %.2f | %.0f | %.0f | %.0f | %s |",
                  dtype_name, kVariants[v].name, forced ? " (forced)" : "", tps,
                  100.0 * flops_per_token * tps / peak_flops, 1e3 * t.fwd_bwd_s / o.steps,
                  1e3 * t.optim_s / o.steps, mib(t.peak), ratio);
    rows.push_back(row);
  }
  std::printf(
      "# %s: %.1f s for %d rounds; this process used %.2f cores, the machine %.2f (others "
      "%.2f); load average %s\n",
      dtype_name, wall, o.warmup + o.steps, own_cores, busy_cores,
      std::max(0.0, busy_cores - own_cores), load_average().c_str());
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  std::string dtypes = "both";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const std::string value = argv[i + 1];
    if (flag == "--flavor") o.flavor = value;
    else if (flag == "--seq") o.seq = std::atoll(value.c_str());
    else if (flag == "--batch") o.batch = std::atoll(value.c_str());
    else if (flag == "--steps") o.steps = std::atoi(value.c_str());
    else if (flag == "--warmup") o.warmup = std::atoi(value.c_str());
    else if (flag == "--threads") o.threads = std::atoll(value.c_str());
    else if (flag == "--dtype") dtypes = value;
    else if (flag == "--routing") o.routing_forced = value != "router";
    else if (flag == "--optimizer") o.adamw = value != "none";
    else if (flag == "--experts") o.experts = value;
    else {
      std::fprintf(stderr,
                   "usage: moe_bench [--flavor debugmodel_moe] [--seq S] [--batch B] [--steps N] "
                   "[--warmup W] [--threads T] [--dtype bf16|fp32|both] [--routing forced|router] "
                   "[--optimizer adamw|none] [--experts loop|grouped|both]\n");
      return 2;
    }
  }
  titan::configure_cpu_allocator();
  titan::CpuMemoryProbe::install();
  const std::string threads_line = titan::configure_threads(o.threads);
  const titan::ModelStats stats =
      titan::get_model_spec("qwen3").describe(o.flavor, o.batch, o.seq, at::kFloat);
  std::printf(
      "moe_bench: qwen3 %s, %lld parameters, %lld active per token, %.1f MFLOP per token "
      "(active); seq %lld, batch %lld, %s routing, forward + loss + backward%s, %d timed steps per "
      "variant after %d warm-up (variants alternate step by step); %s; load average %s\n",
      o.flavor.c_str(), static_cast<long long>(stats.n_params),
      static_cast<long long>(stats.active_params()), stats.flops_per_token(o.seq) / 1e6,
      static_cast<long long>(o.seq), static_cast<long long>(o.batch),
      o.routing_forced ? "forced even" : "router", o.adamw ? " + AdamW" : "", o.steps, o.warmup,
      threads_line.c_str(), load_average().c_str());
  std::fflush(stdout);
  std::vector<std::string> rows;
  if (dtypes == "bf16" || dtypes == "both") bench(o, at::kBFloat16, rows);
  if (dtypes == "fp32" || dtypes == "both") bench(o, at::kFloat, rows);
  std::printf(
      "| dtype | experts | tokens/s | MFU %% (active) | fwd+bwd ms | AdamW ms | peak MiB | vs loop "
      "|\n|---|---|---|---|---|---|---|---|\n");
  for (const std::string& row : rows) std::printf("%s\n", row.c_str());
  std::printf("# peak RSS of the process %.2f GiB\n",
              static_cast<double>(titan::peak_rss_bytes()) / (1024.0 * 1024.0 * 1024.0));
  return 0;
}
