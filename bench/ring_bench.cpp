// Ring attention's pair kernels on this CPU (context_parallel.h): forward + backward of
// RingAttention computing its chunk pairs with the explicit float32 blocks (the only kernel
// before ATen's fused pairs) and with ATen's fused CPU flash kernel, for cp ranks as threads over
// Gloo (loopback; the ranks share ATen's intra-op threads), head-tail layout, causal and
// block-causal (documents of ~seq / 8 tokens), float32 and bf16. Prints per case the milliseconds
// of one call (forward + backward, the slowest rank, median over iterations after a warm-up),
// explicit / fused, and the largest difference between the two kernels' outputs and gradients.
// A benchmark: it prints, it never fails on speed.
//
//   ring_bench [--seqs 2048,8192] [--cp 1,2] [--heads 8] [--kv-heads 4] [--head-dim 32]
//              [--batch 1] [--iters 3] [--threads 2] [--dtypes float,bf16] [--masks causal,docs]
#include "titan/distributed/comm.h"
#include "titan/parallel/context_parallel.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

using titan::RingKernel;

struct Options {
  std::vector<int64_t> seqs{2048, 8192};
  std::vector<int64_t> cps{1, 2};
  int64_t heads = 8, kv_heads = 4, head_dim = 32, batch = 1, iters = 3, threads = 2;
  std::vector<std::string> dtypes{"float", "bf16"};
  std::vector<std::string> masks{"causal", "docs"};
};

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) out.push_back(item);
  return out;
}

std::vector<int64_t> split_ints(const std::string& text) {
  std::vector<int64_t> out;
  for (const std::string& s : split(text)) out.push_back(std::atoll(s.c_str()));
  return out;
}

struct Run {
  double ms = 0;                    // median per call, slowest rank
  std::vector<at::Tensor> results;  // rank 0's out, dq, dk, dv
};

// forward + backward of `iters` + 1 calls on cp rank threads; the first call is warm-up.
Run run(const Options& o, int64_t cp, int64_t seq, at::ScalarType dtype, bool docs,
        RingKernel kernel) {
  at::manual_seed(1);
  const at::Tensor q = at::randn({o.batch, seq, o.heads, o.head_dim}).to(dtype);
  const at::Tensor k = at::randn({o.batch, seq, o.kv_heads, o.head_dim}).to(dtype);
  const at::Tensor v = at::randn({o.batch, seq, o.kv_heads, o.head_dim}).to(dtype);
  const at::Tensor dout = at::randn({o.batch, seq, o.heads, o.head_dim}).to(dtype);
  const at::Tensor ids =
      docs ? at::rand({o.batch, seq}).lt(8.0 / static_cast<double>(seq)).to(at::kLong).cumsum(1)
           : at::Tensor();
  const titan::SequenceLayout layout =
      titan::SequenceLayout::make(seq, cp, titan::SequenceSharding::kHeadTail);
  auto store = c10::make_intrusive<c10d::HashStore>();
  titan::dist::GroupOptions options;
  options.gloo_hostname = "127.0.0.1";
  options.gloo_threads = 1;
  std::vector<std::vector<double>> times(cp);
  Run result;
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < cp; ++rank) {
    ranks.emplace_back([&, rank] {
      auto world = titan::dist::Group::create(store, rank, static_cast<int>(cp), options);
      titan::RingAttention ring(world, layout, titan::RotateMethod::kAllGather, kernel);
      for (int64_t it = 0; it <= o.iters; ++it) {
        at::Tensor ql = titan::shard_sequence(q, layout, rank).requires_grad_();
        at::Tensor kl = titan::shard_sequence(k, layout, rank).requires_grad_();
        at::Tensor vl = titan::shard_sequence(v, layout, rank).requires_grad_();
        world->barrier().wait();
        const auto start = std::chrono::steady_clock::now();
        const at::Tensor out = ring.forward(ql, kl, vl, ids);
        out.backward(titan::shard_sequence(dout, layout, rank));
        const double ms =
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                .count();
        if (it > 0) times[rank].push_back(ms);
        if (rank == 0 && it == o.iters) result.results = {out, ql.grad(), kl.grad(), vl.grad()};
      }
    });
  }
  for (auto& t : ranks) t.join();
  std::vector<double> slowest(o.iters, 0);
  for (const auto& rank_times : times) {
    for (size_t i = 0; i < rank_times.size(); ++i) slowest[i] = std::max(slowest[i], rank_times[i]);
  }
  std::sort(slowest.begin(), slowest.end());
  result.ms = slowest[slowest.size() / 2];
  return result;
}

double max_diff(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const at::Tensor x = a[i].to(at::kDouble), y = b[i].to(at::kDouble);
    worst = std::max(worst, ((x - y).abs().max() / y.abs().max().clamp_min(1.0)).item<double>());
  }
  return worst;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--seqs") o.seqs = split_ints(value);
    else if (flag == "--cp") o.cps = split_ints(value);
    else if (flag == "--heads") o.heads = std::atoll(value.c_str());
    else if (flag == "--kv-heads") o.kv_heads = std::atoll(value.c_str());
    else if (flag == "--head-dim") o.head_dim = std::atoll(value.c_str());
    else if (flag == "--batch") o.batch = std::atoll(value.c_str());
    else if (flag == "--iters") o.iters = std::atoll(value.c_str());
    else if (flag == "--threads") o.threads = std::atoll(value.c_str());
    else if (flag == "--dtypes") o.dtypes = split(value);
    else if (flag == "--masks") o.masks = split(value);
    else {
      std::fprintf(stderr, "ring_bench: unknown flag %s (see bench/ring_bench.cpp)\n",
                   flag.c_str());
      return 2;
    }
  }
  at::set_num_threads(static_cast<int>(o.threads));
  std::printf(
      "ring attention, forward + backward per call (ms, slowest rank, median of %lld), "
      "heads %lld, kv heads %lld, head_dim %lld, batch %lld, %d intra-op threads\n",
      static_cast<long long>(o.iters), static_cast<long long>(o.heads),
      static_cast<long long>(o.kv_heads), static_cast<long long>(o.head_dim),
      static_cast<long long>(o.batch), at::get_num_threads());
  std::printf("%-6s %-7s %3s %7s %12s %10s %10s %12s\n", "dtype", "mask", "cp", "seq", "explicit",
              "fused", "ratio", "max diff");
  for (const std::string& name : o.dtypes) {
    const at::ScalarType dtype = name == "bf16" ? at::kBFloat16 : at::kFloat;
    for (const std::string& mask : o.masks) {
      for (int64_t cp : o.cps) {
        for (int64_t seq : o.seqs) {
          const bool docs = mask == "docs";
          const Run explicit_run = run(o, cp, seq, dtype, docs, RingKernel::kExplicit);
          const Run fused_run = run(o, cp, seq, dtype, docs, RingKernel::kFused);
          std::printf("%-6s %-7s %3lld %7lld %12.1f %10.1f %10.2f %12.2e\n", name.c_str(),
                      mask.c_str(), static_cast<long long>(cp), static_cast<long long>(seq),
                      explicit_run.ms, fused_run.ms, explicit_run.ms / fused_run.ms,
                      max_diff(fused_run.results, explicit_run.results));
          std::fflush(stdout);
        }
      }
    }
  }
  return 0;
}
