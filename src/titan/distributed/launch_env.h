// Which launcher started this process, and where it sits in the job. Every launcher titan.cpp
// supports describes a rank through environment variables; this file reads them into one
// LaunchEnv so the rest of the code never looks at the environment:
//
//   titan run   RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR,
//               MASTER_PORT, plus TITAN_RUN=1
//   torchrun    the same variables (plus TORCHELASTIC_RUN_ID; with TORCHELASTIC_USE_AGENT_STORE
//               the agent already hosts the store and every rank is a client)
//   SLURM srun  SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID, SLURM_STEP_TASKS_PER_NODE
//               / SLURM_TASKS_PER_NODE, SLURM_STEP_NODELIST / SLURM_JOB_NODELIST (master = first
//               host), SLURM_JOB_ID (port, unless MASTER_PORT is set)
//   OpenMPI     OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE; MASTER_ADDR (needed when
//               the job spans nodes), MASTER_PORT
//   none        a single process (rank 0 of 1)
//
// The first family whose rank variable is set wins, in the order above (so `titan run` or
// torchrun inside a SLURM allocation is read as such). A set but malformed or inconsistent variable
// is a ConfigError naming it.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace titan {

struct LaunchEnv {
  std::string source = "single process";  // "titan run", "torchrun", "env", "slurm", "openmpi"
  int64_t rank = 0;
  int64_t local_rank = 0;
  int64_t world_size = 1;
  int64_t local_world_size = 1;
  int64_t node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int64_t master_port = 29500;
  // The store is hosted by the launcher (torchrun's agent), not by rank 0; every rank is a client
  // and keys live under `store_prefix`.
  bool agent_store = false;
  std::string store_prefix;

  bool distributed() const { return world_size > 1; }
  // "rank 3/8 (local 1/4, node 1), torchrun, master node0:29500"
  std::string describe() const;
};

// Looks a variable up; nullopt when unset. Tests pass a map, the app the process environment.
using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;

EnvLookup process_env();

// Reads the launch environment. Throws ConfigError naming the missing, malformed or inconsistent
// variable (e.g. "RANK=4 is not below WORLD_SIZE=4").
LaunchEnv detect_launch_env(const EnvLookup& env);
inline LaunchEnv detect_launch_env() { return detect_launch_env(process_env()); }

// SLURM hostlist expansion: "node[01-03,07],gpu5" -> {node01, node02, node03, node07, gpu5};
// several bracket groups ("rack[1-2]-n[1-2]") expand as a product; zero padding is kept.
// Throws ConfigError on unbalanced brackets or bad ranges.
std::vector<std::string> expand_hostlist(const std::string& hostlist);

// SLURM task counts per node: "2(x3),1" -> {2, 2, 2, 1}. Throws ConfigError when malformed.
std::vector<int64_t> expand_tasks_per_node(const std::string& spec);

// LOG_RANK ("0", "0,2", "0-3", "all"; empty means "0") -> true for the ranks that print.
// Throws ConfigError when malformed.
std::vector<bool> parse_log_ranks(const std::string& spec, int64_t world_size);

}  // namespace titan
