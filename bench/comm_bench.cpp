// Collective bandwidth of dist::Group on this machine: N ranks as threads of one process, Gloo
// over loopback (the layout of the multi-rank tests). Prints, per op and dtype, the time per op
// and the bandwidths in nccl-tests' terms: algbw = bytes / time with bytes the full tensor
// (all_reduce: the tensor; all_gather: the output; reduce_scatter: the input), and busbw = algbw
// times 2(n-1)/n (all_reduce) or (n-1)/n (all_gather, reduce_scatter), the per-link rate that
// is comparable across ops and rank counts. Each op runs twice: as Gloo implements it ("native")
// and as dist::Group builds it on all-to-all and fp32 sums ("built"; see comm.h), with the ratio
// native / built of the times, so that dist::GlooOps' defaults follow the faster one.
// A benchmark: it prints, it never fails on speed.
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
  double seconds[2] = {0, 0};  // per op, slowest rank: built, native
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
      options.name = "built";
      options.gloo_ops = titan::dist::GlooOps::all_built();
      std::shared_ptr<Group> groups[2];
      groups[0] = Group::create(store, r, ranks, options);
      options.name = "native";
      options.gloo_ops = titan::dist::GlooOps::all_native();
      groups[1] = Group::create(store, r, ranks, options);
      std::shared_ptr<Group> g;
      // Alternates built and native runs of one op, so that both see the same machine load.
      auto time_op = [&](const std::string& name, double bytes, double bus,
                         const std::function<void()>& op) {
        double total[2] = {0, 0};
        for (int round = 0; round < 2; ++round) {
          for (int mode = 0; mode < 2; ++mode) {
            g = groups[mode];
            for (int i = 0; i < 2; ++i) op();  // warm-up: connections, scratch buffers
            g->barrier().wait();
            auto start = std::chrono::steady_clock::now();
            for (int i = 0; i < iters / 2; ++i) op();
            total[mode] +=
                std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
          }
        }
        std::lock_guard<std::mutex> lock(mutex);
        auto it = std::find_if(results.begin(), results.end(),
                               [&](const Result& x) { return x.name == name; });
        if (it == results.end()) {
          results.push_back({name, bytes, bus, {0, 0}});
          it = results.end() - 1;
        }
        for (int mode = 0; mode < 2; ++mode) {
          it->seconds[mode] = std::max(it->seconds[mode], total[mode] / (2 * (iters / 2)));
        }
      };
      for (auto dtype : {at::kFloat, at::kBFloat16}) {
        const std::string tag = dtype == at::kFloat ? " fp32" : " bf16";
        // The same number of bytes in either dtype.
        const int64_t numel = dtype == at::kFloat ? numel_f32 : 2 * numel_f32;
        const double bytes = static_cast<double>(numel) * at::elementSize(dtype);
        at::Tensor full = at::randn({numel}).to(dtype);
        at::Tensor shard = at::randn({numel / ranks}).to(dtype);
        time_op("all_reduce" + tag, bytes, 2 * (n - 1) / n, [&] { g->all_reduce(full).wait(); });
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

  std::printf(
      "comm_bench: %d ranks (threads, gloo over loopback), %.0f MB per op, %d iters, "
      "1 intra-op thread per rank\n",
      ranks, mb, iters);
  std::printf("%-22s %8s %10s %10s %8s %12s %12s\n", "op", "MB", "built ms", "native ms", "nat/blt",
              "busbw built", "busbw nat");
  for (const Result& x : results) {
    const double bus[2] = {x.bytes / x.seconds[0] / 1e9 * x.bus_factor,
                           x.bytes / x.seconds[1] / 1e9 * x.bus_factor};
    std::printf("%-22s %8.1f %10.2f %10.2f %8.2f %12.2f %12.2f\n", x.name.c_str(),
                x.bytes / 1048576.0, x.seconds[0] * 1e3, x.seconds[1] * 1e3,
                x.seconds[1] / x.seconds[0], bus[0], bus[1]);
  }
  std::printf(
      "(GB/s: busbw; all_to_all and fp32 all_reduce SUM are the same op in both columns)\n");
  return 0;
}
