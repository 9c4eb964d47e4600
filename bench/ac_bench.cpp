// Activation checkpointing on this CPU: for each mode (none, selective op, selective 2, full),
// tokens/s of training steps (forward + loss + backward; no optimizer, whose cost AC does not
// change) and memory, on model (b) of docs/speed.md (flavor bench_medium: dim 512,
// 8 layers, 8 heads, vocab 32000, seq 512, batch 4) and on a deeper one (the same with
// --deep-layers layers). The modes take turns step by step on one model, so slow phases of the
// machine hit them alike, and ratios to "none" are within one run. Memory comes from
// CpuMemoryProbe (bytes of live CPU tensors): "peak" is the highest during a step above what was
// live before it (weights; gradients are dropped before each step, so they count), "kept" what
// forward + loss leave alive for backward. A benchmark: it prints, it never fails on speed.
//
//   ac_bench [--steps 3] [--threads 2] [--deep-layers 24] [--dtype fp32|bf16|both]
//            [--models b|deep|both] [--seq 512] [--batch 4]
#include "titan/common/cpu.h"
#include "titan/common/memory_probe.h"
#include "titan/components/loss.h"
#include "titan/models/llama3/args.h"
#include "titan/models/llama3/model.h"
#include "titan/parallel/activation_checkpoint.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

namespace {

struct Mode {
  const char* name;
  const char* mode;    // activation_checkpoint.mode
  const char* option;  // selective_ac_option
};
const Mode kModes[] = {{"none", "none", "2"},
                       {"selective op", "selective", "op"},
                       {"selective 2", "selective", "2"},
                       {"full", "full", "2"}};
constexpr int kNumModes = 4;

struct Totals {
  double seconds = 0;
  int64_t peak = 0;  // bytes, the largest over steps
  int64_t kept = 0;  // bytes
};

double mib(int64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

// One forward + backward; adds its time and memory to `t`.
void step(titan::llama3::Transformer& model, const at::Tensor& inputs, const at::Tensor& labels,
          Totals& t) {
  for (auto& p : model.parameters()) p.mutable_grad() = at::Tensor();
  const int64_t before = titan::CpuMemoryProbe::live_bytes();
  titan::CpuMemoryProbe::reset_peak();
  const auto t0 = std::chrono::steady_clock::now();
  at::Tensor loss = titan::lm_cross_entropy_loss(model.forward(inputs), labels);
  const int64_t kept = titan::CpuMemoryProbe::live_bytes() - before;
  loss.backward();
  t.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  t.peak = std::max(t.peak, titan::CpuMemoryProbe::peak_bytes() - before);
  t.kept = kept;
}

void bench(const std::string& label, titan::llama3::Llama3Args args, at::ScalarType dtype,
           int64_t batch, int64_t seq, int steps) {
  args.max_seq_len = seq;
  auto model = std::make_shared<titan::llama3::Transformer>(args, dtype);
  model->init_weights(/*seed=*/0);
  at::manual_seed(0);
  const at::Tensor inputs = at::randint(0, args.vocab_size, {batch, seq}, at::kLong);
  const at::Tensor labels = at::randint(0, args.vocab_size, {batch, seq}, at::kLong);
  std::vector<Totals> totals(kNumModes);
  // Step 0 warms every mode up (allocator, kernels) and is not counted.
  for (int s = 0; s <= steps; ++s) {
    for (int m = 0; m < kNumModes; ++m) {
      titan::ActivationCheckpointSection config;
      config.mode = kModes[m].mode;
      config.selective_ac_option = kModes[m].option;
      auto ac = titan::apply_activation_checkpointing(*model, config);
      Totals t;
      step(*model, inputs, labels, t);
      if (s == 0) continue;
      totals[m].seconds += t.seconds;
      totals[m].peak = std::max(totals[m].peak, t.peak);
      totals[m].kept = t.kept;
    }
  }
  const double tokens = static_cast<double>(batch * seq * steps);
  const Totals& none = totals[0];
  for (int m = 0; m < kNumModes; ++m) {
    const Totals& t = totals[m];
    std::printf("| %s | %s | %s | %.0f | %.2f | %.0f | %.2f | %.0f | %.2f |\n", label.c_str(),
                dtype == at::kFloat ? "fp32" : "bf16", kModes[m].name, tokens / t.seconds,
                none.seconds / t.seconds, mib(t.peak), static_cast<double>(t.peak) / none.peak,
                mib(t.kept), static_cast<double>(t.kept) / none.kept);
    std::fflush(stdout);
  }
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 3;
  int64_t threads = 2, deep_layers = 24, seq = 512, batch = 4;
  std::string dtypes = "both", models = "both";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const std::string value = argv[i + 1];
    if (flag == "--steps") steps = std::atoi(value.c_str());
    else if (flag == "--threads") threads = std::atoll(value.c_str());
    else if (flag == "--deep-layers") deep_layers = std::atoll(value.c_str());
    else if (flag == "--dtype") dtypes = value;
    else if (flag == "--models") models = value;
    else if (flag == "--seq") seq = std::atoll(value.c_str());
    else if (flag == "--batch") batch = std::atoll(value.c_str());
    else {
      std::fprintf(stderr,
                   "usage: ac_bench [--steps N] [--threads T] [--deep-layers L] "
                   "[--dtype fp32|bf16|both] [--models b|deep|both] [--seq S] [--batch B]\n");
      return 2;
    }
  }
  titan::configure_cpu_allocator();
  titan::CpuMemoryProbe::install();
  const std::string threads_line = titan::configure_threads(threads);
  std::printf(
      "ac_bench: forward + loss + backward, %d timed steps per mode (modes alternate "
      "step by step), seq %lld, batch %lld; %s\n",
      steps, static_cast<long long>(seq), static_cast<long long>(batch), threads_line.c_str());
  std::printf(
      "| model | dtype | AC | tokens/s | vs none | peak MiB | vs none | kept MiB | "
      "vs none |\n|---|---|---|---|---|---|---|---|---|\n");
  std::vector<at::ScalarType> dtype_list;
  if (dtypes == "fp32" || dtypes == "both") dtype_list.push_back(at::kFloat);
  if (dtypes == "bf16" || dtypes == "both") dtype_list.push_back(at::kBFloat16);
  const titan::llama3::Llama3Args b = titan::llama3::args_for_flavor("bench_medium");
  titan::llama3::Llama3Args deep = b;
  deep.n_layers = deep_layers;
  for (at::ScalarType dtype : dtype_list) {
    if (models != "deep") bench("(b) 8 layers", b, dtype, batch, seq, steps);
    if (models != "b") {
      bench("(b) " + std::to_string(deep_layers) + " layers", deep, dtype, batch, seq, steps);
    }
  }
  return 0;
}
