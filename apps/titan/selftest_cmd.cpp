// `titan selftest`: checks a multi-process launch without training. Every rank joins the job
// (init_distributed), exchanges values through the store (an all-gather and a barrier built from
// set/wait), runs all_reduce and all_gather over a Gloo process group, and prints what it got
// against the closed form. Fault injection (--fail_rank/--fail_mode/--fail_at) lets the
// launcher tests make one rank throw, exit, abort, crash, be killed or hang.
//
// Usually started as `titan run --nproc_per_node N -- selftest`, or by hand with torchrun/SLURM/
// OpenMPI variables. Config overrides (--comm.init_timeout_seconds ...) are accepted.
#include "commands.h"
#include "flags.h"

#include "titan/common/check.h"
#include "titan/common/cpu.h"
#include "titan/common/logging.h"
#include "titan/config/config_manager.h"
#include "titan/distributed/comm.h"
#include "titan/distributed/init.h"

#include <ATen/ATen.h>

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <set>

namespace titan {
namespace {

struct FaultOptions {
  int64_t rank = -1;               // -1: no fault
  std::string mode = "exception";  // exception, exit, abort, segv, kill9, hang
  std::string at = "exchange";     // rendezvous (before joining), exchange (after), collective
};

FlagTable selftest_flags(FaultOptions& f) {
  return FlagTable(
             "titan selftest [--fail_rank R] [--fail_mode MODE] [--fail_at WHEN]\n"
             "                      [--section.key value ...]",
             "Joins the job described by the launch environment (titan run, torchrun, srun,\n"
             "mpirun), exchanges values through the store, runs collectives over Gloo and checks\n"
             "the results.")
      .value("--fail_rank", "R", "rank R fails in the way --fail_mode says",
             [&f](const std::string& v) {
               const std::optional<int64_t> rank = parse_int64(v);
               TITAN_CONFIG_CHECK(rank && *rank >= 0, "--fail_rank '", v, "' is not a rank");
               f.rank = *rank;
             })
      .value("--fail_mode", "MODE", "exception (default), exit, abort, segv, kill9 or hang",
             [&f](const std::string& v) {
               static const std::set<std::string> kModes = {"exception", "exit",  "abort",
                                                            "segv",      "kill9", "hang"};
               TITAN_CONFIG_CHECK(kModes.count(v), "--fail_mode '", v,
                                  "' is not one of exception, exit, abort, segv, kill9, hang");
               f.mode = v;
             })
      .value("--fail_at", "WHEN",
             "rendezvous (before joining), exchange (after; default) or collective\n"
             "(between the all_reduce and the all_gather)",
             [&f](const std::string& v) {
               TITAN_CONFIG_CHECK(v == "rendezvous" || v == "exchange" || v == "collective",
                                  "--fail_at '", v, "' is not rendezvous, exchange or collective");
               f.at = v;
             })
      .epilogue(
          "Config keys as `titan train` takes them; the timeouts: --comm.init_timeout_seconds\n"
          "(joining), --comm.train_timeout_seconds (exchanges).");
}

void maybe_fail(const FaultOptions& f, const std::string& at, int64_t rank) {
  if (f.rank != rank || f.at != at) return;
  // The wall-clock time lets tests measure how fast the launcher brings the job down.
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  std::fprintf(stderr, "selftest: rank %lld: injected failure '%s' at %s (t=%.3f)\n",
               static_cast<long long>(rank), f.mode.c_str(), at.c_str(), now);
  std::fflush(stderr);
  if (f.mode == "exception") throw std::runtime_error("selftest: injected exception");
  if (f.mode == "exit") std::exit(1);
  if (f.mode == "abort") std::abort();
  if (f.mode == "segv") raise(SIGSEGV);
  if (f.mode == "kill9") raise(SIGKILL);
  if (f.mode == "hang") {
    for (;;) pause();
  }
}

std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }

// Waits for `key` (written by rank `from`), naming that rank when the timeout passes.
std::string get_from(c10d::Store& store, const std::string& key, int64_t from,
                     std::chrono::milliseconds timeout) {
  const auto start = std::chrono::steady_clock::now();
  try {
    store.wait({key}, timeout);
  } catch (const std::exception& e) {
    if (std::chrono::steady_clock::now() - start < timeout) {  // not a timeout: the store broke
      throw std::runtime_error("selftest: lost the store while waiting for rank " +
                               std::to_string(from) + " (rank 0 hosts it; did it fail?)");
    }
    throw std::runtime_error("selftest: no value from rank " + std::to_string(from) + " within " +
                             std::to_string(timeout.count() / 1000) +
                             " s (comm.train_timeout_seconds); rank " + std::to_string(from) +
                             " failed or hangs");
  }
  const std::vector<uint8_t> v = store.get(key);
  return {v.begin(), v.end()};
}

// All-gather of r*r + 1 through the store, then a barrier. Returns the sum.
int64_t store_exchange(c10d::Store& store, int64_t rank, int64_t world,
                       std::chrono::milliseconds timeout) {
  store.set("selftest/value/" + std::to_string(rank), bytes(std::to_string(rank * rank + 1)));
  int64_t sum = 0;
  for (int64_t q = 0; q < world; ++q) {
    sum += std::stoll(get_from(store, "selftest/value/" + std::to_string(q), q, timeout));
  }
  // Barrier: the last rank to arrive opens it.
  if (store.add("selftest/barrier", 1) == world) store.set("selftest/barrier_open", bytes("1"));
  try {
    store.wait({"selftest/barrier_open"}, timeout);
  } catch (const std::exception&) {
    throw std::runtime_error("selftest: barrier not reached by every rank within " +
                             std::to_string(timeout.count() / 1000) +
                             " s (comm.train_timeout_seconds)");
  }
  return sum;
}

}  // namespace

int run_selftest(const std::vector<std::string>& args) {
  FaultOptions fault;
  const FlagTable flags = selftest_flags(fault);
  if (FlagTable::wants_help(args)) {
    std::fputs(flags.usage().c_str(), stdout);
    return 0;
  }
  const std::vector<std::string> rest = flags.parse(args, /*pass_config_keys=*/true);
  const JobConfig config = parse_job_config(rest);
  const LaunchEnv env = detect_launch_env();

  maybe_fail(fault, "rendezvous", env.rank);
  DistributedContext dist = init_distributed(config.comm, env);
  const int64_t threads = rank_num_threads(config.training.num_threads, env, process_env());
  log_info("selftest: ", env.describe(),
           "; threads: ", configure_threads(threads, env.local_world_size));
  maybe_fail(fault, "exchange", env.rank);
  if (!dist.store) {
    log_info("selftest: single process, nothing to exchange; selftest passed");
    return 0;
  }

  const int64_t rank = dist.rank(), world = dist.world_size();
  const auto timeout = std::chrono::milliseconds(config.comm.train_timeout_seconds * 1000);
  dist.store->setTimeout(timeout);
  const int64_t sum = store_exchange(*dist.store, rank, world, timeout);
  const int64_t expected = (world - 1) * world * (2 * world - 1) / 6 + world;  // sum of r^2 + 1
  TITAN_CHECK(sum == expected, "selftest: store all-gather on rank ", rank, " summed to ", sum,
              ", expected ", expected);
  log_info("selftest: store all-gather of r^2+1 over ", world, " ranks: ", sum, " (expected ",
           expected, ")");

  dist::GroupOptions options = world_group_options(dist, config.comm);  // selftest: Gloo (CPU)
  options.timeout = timeout;
  options.recorder = start_flight_recorder(config.comm, config.job.dump_folder, rank, world);
  auto group =
      dist::Group::create(dist.store, static_cast<int>(rank), static_cast<int>(world), options);
  at::Tensor t = at::full({4}, static_cast<double>(rank + 1), at::kFloat);
  group->all_reduce(t).wait();
  maybe_fail(fault, "collective", rank);  // between two collectives: the flight recorder's case
  const double want = static_cast<double>(world * (world + 1) / 2);
  TITAN_CHECK(at::allclose(t, at::full({4}, want, at::kFloat)), "selftest: all_reduce on rank ",
              rank, " gave ", t[0].item<double>(), ", expected ", want);
  at::Tensor gathered = at::empty({world}, at::kLong);
  group->all_gather_into_tensor(gathered, at::full({1}, rank, at::kLong)).wait();
  TITAN_CHECK(at::equal(gathered, at::arange(world, at::kLong)), "selftest: all_gather on rank ",
              rank, " did not return the ranks in order");
  group->barrier().wait();
  log_info("selftest: gloo all_reduce of rank+1: ", t[0].item<double>(), " (expected ", want,
           "), all_gather of ranks ok");
  group.reset();

  finalize_distributed(dist, config.comm);
  log_info("selftest passed (rank ", rank, " of ", world, ")");
  return 0;
}

}  // namespace titan
