// Collective bandwidth of dist::Group on this machine: N ranks as threads of one process, Gloo
// over loopback (the layout of the multi-rank tests). Prints, per op and dtype, the time per op
// and the bandwidths in nccl-tests' terms: algbw = bytes / time with bytes the full tensor
// (all_reduce: the tensor; all_gather: the output; reduce_scatter: the input), and busbw = algbw
// times 2(n-1)/n (all_reduce) or (n-1)/n (all_gather, reduce_scatter), the per-link rate that
// is comparable across ops and rank counts. A benchmark: it prints, it never fails on speed.
//
//   comm_bench [--ranks 2] [--mb 16] [--iters 20]
#include "titan/distributed/comm.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

using titan::dist::Group;
using titan::dist::ReduceOp;

struct Result {
  std::string name;
  double bytes = 0;
  double bus_factor = 1;
  double seconds = 0;  // per op, slowest rank
};

}  // namespace

int main(int argc, char** argv) {
  int ranks = 2;
  double mb = 16;
  int iters = 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--ranks")) ranks = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--mb")) mb = std::atof(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--iters")) iters = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: comm_bench [--ranks N] [--mb MB] [--iters K]\n");
      return 2;
    }
  }
  const int64_t numel_f32 = static_cast<int64_t>(mb * 1024 * 1024 / 4) / ranks * ranks;
  const double n = ranks;

  auto store = c10::make_intrusive<c10d::HashStore>();
  std::mutex mutex;
  std::vector<Result> results;
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      at::set_num_threads(1);
      titan::dist::GroupOptions options;
      options.gloo_hostname = "127.0.0.1";
      options.timeout = std::chrono::seconds(120);
      auto g = Group::create(store, r, ranks, options);
      auto time_op = [&](const std::string& name, double bytes, double bus,
                         const std::function<void()>& op) {
        for (int i = 0; i < 3; ++i) op();  // warm-up: connections, scratch buffers
        g->barrier().wait();
        auto start = std::chrono::steady_clock::now();
        for (int i = 0; i < iters; ++i) op();
        double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() /
                   iters;
        std::lock_guard<std::mutex> lock(mutex);
        auto it = std::find_if(results.begin(), results.end(),
                               [&](const Result& x) { return x.name == name; });
        if (it == results.end()) {
          results.push_back({name, bytes, bus, s});
        } else {
          it->seconds = std::max(it->seconds, s);
        }
      };
      for (auto dtype : {at::kFloat, at::kBFloat16}) {
        const std::string tag = dtype == at::kFloat ? " fp32" : " bf16";
        // The same number of bytes in either dtype.
        const int64_t numel = dtype == at::kFloat ? numel_f32 : 2 * numel_f32;
        const double bytes = static_cast<double>(numel) * at::elementSize(dtype);
        at::Tensor full = at::randn({numel}).to(dtype);
        at::Tensor shard = at::randn({numel / ranks}).to(dtype);
        time_op("all_reduce" + tag, bytes, 2 * (n - 1) / n,
                [&] { g->all_reduce(full).wait(); });
        time_op("all_reduce AVG" + tag, bytes, 2 * (n - 1) / n,
                [&] { g->all_reduce(full, ReduceOp::kAvg).wait(); });
        time_op("reduce_scatter" + tag, bytes, (n - 1) / n,
                [&] { g->reduce_scatter_tensor(shard, full).wait(); });
        time_op("all_gather" + tag, bytes, (n - 1) / n,
                [&] { g->all_gather_into_tensor(full, shard).wait(); });
        at::Tensor exchanged = at::empty_like(full);
        time_op("all_to_all" + tag, bytes, (n - 1) / n,
                [&] { g->all_to_all_single(exchanged, full).wait(); });
      }
    });
  }
  for (auto& t : threads) t.join();

  std::printf("comm_bench: %d ranks (threads, gloo over loopback), %.0f MB per op, %d iters, "
              "1 intra-op thread per rank\n",
              ranks, mb, iters);
  std::printf("%-22s %10s %10s %12s %12s\n", "op", "MB", "ms", "algbw GB/s", "busbw GB/s");
  for (const Result& x : results) {
    double algbw = x.bytes / x.seconds / 1e9;
    std::printf("%-22s %10.1f %10.2f %12.2f %12.2f\n", x.name.c_str(), x.bytes / 1048576.0,
                x.seconds * 1e3, algbw, algbw * x.bus_factor);
  }
  return 0;
}
