// `titan run`: starts the local ranks of a job as child processes and supervises them, like
// torchrun's static launch. Each child gets the torchrun variables (RANK, LOCAL_RANK, WORLD_SIZE,
// LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT), TITAN_RUN=1 and a thread budget
// (OMP_NUM_THREADS = cores / local ranks unless already set).
//
// Output: every line a child writes is printed by the parent as "[rank N] line". stdout lines
// are shown for the ranks in LOG_RANK (default "0"); stderr lines, and titan's WARNING/ERROR log
// lines, are shown for every rank.
//
// Failure: when a child exits non-zero or dies from a signal, the parent names the rank, sends
// SIGTERM to the other ranks, SIGKILL after kGraceSeconds, and exits non-zero (the child's exit
// code, or 128 + signal). SIGINT/SIGTERM sent to the parent are forwarded to every child. Children
// die with the parent (PR_SET_PDEATHSIG).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace titan {

struct LaunchOptions {
  int64_t nproc_per_node = 1;
  int64_t nnodes = 1;
  int64_t node_rank = 0;
  std::string master_addr = "127.0.0.1";
  bool master_addr_set = false;
  int64_t master_port = 0;  // 0: a free port (one node) or 29500 (several nodes)
  // The command each rank runs: a titan subcommand (`train ...`, run by this same binary) or a
  // program path / name.
  std::vector<std::string> command;
  bool help = false;  // --help / -h before the command

  int64_t world_size() const { return nnodes * nproc_per_node; }
};

// Seconds between SIGTERM and SIGKILL when the job is brought down.
constexpr double kGraceSeconds = 3.0;

// Parses `titan run` arguments: [--nproc_per_node N] [--nnodes M] [--node_rank R]
// [--master_addr A] [--master_port P] -- command... (`--opt=value` and dashed spellings like
// --nproc-per-node are accepted; --help before the command sets `help` and stops). Throws
// ConfigError naming the bad option.
LaunchOptions parse_launch_args(const std::vector<std::string>& args);

// The help text of `titan run`.
std::string launch_usage();

// True when `name` is a titan subcommand, so the child runs `self_exe name ...`.
bool is_titan_command(const std::string& name);

// Starts the local ranks of `opts`, relays their output filtered by `log_rank` (LOG_RANK), and
// returns the job's exit code. `self_exe` is this binary (for titan subcommands).
int launch(const LaunchOptions& opts, const std::string& self_exe, const std::string& log_rank);

}  // namespace titan
