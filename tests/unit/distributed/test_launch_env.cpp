// Launch-environment detection with fake environments (titan run, torchrun, hand-written env://,
// SLURM, OpenMPI, none), the SLURM hostlist and tasks-per-node parsers, LOG_RANK, `titan run`
// argument parsing, and the TCPStore rendezvous with one thread per rank.
#include "../scoped_env.h"
#include "titan/common/check.h"
#include "titan/distributed/init.h"
#include "titan/distributed/launch_env.h"
#include "titan/distributed/launcher.h"

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <future>
#include <map>
#include <thread>

namespace titan {
namespace test_launch_env {

EnvLookup fake(std::map<std::string, std::string> vars) {
  return [vars](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

// The message of the ConfigError that `fn` throws ("" when it does not throw).
template <class Fn>
std::string config_error(Fn fn) {
  try {
    fn();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(LaunchEnv, NoLauncherIsOneProcess) {
  LaunchEnv e = detect_launch_env(fake({{"HOME", "/root"}}));
  EXPECT_EQ(e.source, "single process");
  EXPECT_EQ(e.rank, 0);
  EXPECT_EQ(e.world_size, 1);
  EXPECT_FALSE(e.distributed());
}

TEST(LaunchEnv, TitanRunChild) {
  LaunchEnv e = detect_launch_env(fake({{"RANK", "5"},
                                        {"LOCAL_RANK", "1"},
                                        {"WORLD_SIZE", "8"},
                                        {"LOCAL_WORLD_SIZE", "4"},
                                        {"GROUP_RANK", "1"},
                                        {"MASTER_ADDR", "node0"},
                                        {"MASTER_PORT", "29600"},
                                        {"TITAN_RUN", "1"}}));
  EXPECT_EQ(e.source, "titan run");
  EXPECT_EQ(e.rank, 5);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.world_size, 8);
  EXPECT_EQ(e.local_world_size, 4);
  EXPECT_EQ(e.node_rank, 1);
  EXPECT_EQ(e.master_addr, "node0");
  EXPECT_EQ(e.master_port, 29600);
  EXPECT_FALSE(e.agent_store);
  EXPECT_TRUE(contains(e.describe(), "rank 5/8 (local 1/4, node 1), launched by titan run"));
}

TEST(LaunchEnv, Torchrun) {
  LaunchEnv e = detect_launch_env(fake({{"RANK", "2"},
                                        {"LOCAL_RANK", "2"},
                                        {"WORLD_SIZE", "4"},
                                        {"LOCAL_WORLD_SIZE", "4"},
                                        {"GROUP_RANK", "0"},
                                        {"MASTER_ADDR", "127.0.0.1"},
                                        {"MASTER_PORT", "29500"},
                                        {"TORCHELASTIC_RUN_ID", "none"}}));
  EXPECT_EQ(e.source, "torchrun");
  EXPECT_EQ(e.rank, 2);
  EXPECT_FALSE(e.agent_store);
}

TEST(LaunchEnv, TorchrunAgentStore) {
  LaunchEnv e = detect_launch_env(fake({{"RANK", "0"},
                                        {"WORLD_SIZE", "2"},
                                        {"MASTER_ADDR", "h"},
                                        {"MASTER_PORT", "29400"},
                                        {"TORCHELASTIC_RUN_ID", "x"},
                                        {"TORCHELASTIC_USE_AGENT_STORE", "True"},
                                        {"TORCHELASTIC_RESTART_COUNT", "3"}}));
  EXPECT_TRUE(e.agent_store);
  EXPECT_EQ(e.store_prefix, "/worker/attempt_3");
}

TEST(LaunchEnv, HandWrittenEnvDefaultsToOneNode) {
  LaunchEnv e =
      detect_launch_env(fake({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "1234"}}));
  EXPECT_EQ(e.source, "env");
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_world_size, 2);
  EXPECT_EQ(e.node_rank, 0);
  EXPECT_EQ(e.master_addr, "127.0.0.1");
}

TEST(LaunchEnv, TorchStyleErrorsNameTheVariable) {
  EXPECT_TRUE(contains(config_error([] {
                         detect_launch_env(fake({{"RANK", "0"}}));
                       }),
                       "WORLD_SIZE is not set"));
  EXPECT_TRUE(contains(config_error([] {
                         detect_launch_env(fake({{"WORLD_SIZE", "2"}}));
                       }),
                       "RANK is not set"));
  EXPECT_TRUE(contains(config_error([] {
                         detect_launch_env(fake({{"RANK", "x1"}, {"WORLD_SIZE", "2"}}));
                       }),
                       "RANK='x1' is not an integer"));
  EXPECT_TRUE(contains(
      config_error([] {
        detect_launch_env(fake({{"RANK", "4"}, {"WORLD_SIZE", "4"}, {"MASTER_PORT", "1"}}));
      }),
      "RANK=4 is not in [0, WORLD_SIZE=4)"));
  EXPECT_TRUE(contains(config_error([] {
                         detect_launch_env(fake({{"RANK", "0"}, {"WORLD_SIZE", "2"}}));
                       }),
                       "MASTER_PORT is not set"));
  EXPECT_TRUE(contains(
      config_error([] {
        detect_launch_env(fake(
            {{"RANK", "0"}, {"WORLD_SIZE", "4"}, {"LOCAL_WORLD_SIZE", "2"}, {"MASTER_PORT", "1"}}));
      }),
      "MASTER_ADDR is not set"));
  EXPECT_TRUE(contains(config_error([] {
                         detect_launch_env(fake({{"RANK", "0"},
                                                 {"WORLD_SIZE", "2"},
                                                 {"LOCAL_RANK", "2"},
                                                 {"LOCAL_WORLD_SIZE", "2"},
                                                 {"MASTER_PORT", "1"}}));
                       }),
                       "LOCAL_RANK=2 is not in [0, LOCAL_WORLD_SIZE=2)"));
  EXPECT_TRUE(contains(
      config_error([] {
        detect_launch_env(fake({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "70000"}}));
      }),
      "MASTER_PORT=70000"));
}

TEST(LaunchEnv, Slurm) {
  LaunchEnv e = detect_launch_env(fake({{"SLURM_PROCID", "9"},
                                        {"SLURM_NTASKS", "16"},
                                        {"SLURM_LOCALID", "1"},
                                        {"SLURM_NODEID", "1"},
                                        {"SLURM_STEP_TASKS_PER_NODE", "8(x2)"},
                                        {"SLURM_JOB_NODELIST", "gpu[007-008]"},
                                        {"SLURM_JOB_ID", "123456"}}));
  EXPECT_EQ(e.source, "slurm");
  EXPECT_EQ(e.rank, 9);
  EXPECT_EQ(e.world_size, 16);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_world_size, 8);
  EXPECT_EQ(e.node_rank, 1);
  EXPECT_EQ(e.master_addr, "gpu007");
  EXPECT_EQ(e.master_port, 15000 + 123456 % 20000);
}

TEST(LaunchEnv, SlurmMasterOverridesAndUnevenNodes) {
  LaunchEnv e = detect_launch_env(fake({{"SLURM_PROCID", "4"},
                                        {"SLURM_NTASKS", "5"},
                                        {"SLURM_LOCALID", "0"},
                                        {"SLURM_NODEID", "2"},
                                        {"SLURM_TASKS_PER_NODE", "2(x2),1"},
                                        {"SLURM_NODELIST", "a,b,c"},
                                        {"MASTER_ADDR", "10.0.0.1"},
                                        {"MASTER_PORT", "29999"}}));
  EXPECT_EQ(e.local_world_size, 1);
  EXPECT_EQ(e.master_addr, "10.0.0.1");
  EXPECT_EQ(e.master_port, 29999);
}

TEST(LaunchEnv, SlurmErrors) {
  EXPECT_TRUE(contains(config_error([] {
                         detect_launch_env(fake({{"SLURM_PROCID", "0"}}));
                       }),
                       "SLURM_NTASKS is not set"));
  EXPECT_TRUE(contains(config_error([] {
                         detect_launch_env(fake({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}}));
                       }),
                       "SLURM_LOCALID is not set"));
  EXPECT_TRUE(
      contains(config_error([] {
                 detect_launch_env(
                     fake({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "0"}}));
               }),
               "SLURM_JOB_NODELIST is not set"));
  EXPECT_TRUE(contains(config_error([] {
                         detect_launch_env(fake({{"SLURM_PROCID", "3"},
                                                 {"SLURM_NTASKS", "2"},
                                                 {"SLURM_LOCALID", "0"},
                                                 {"SLURM_NODELIST", "n1"}}));
                       }),
                       "SLURM_PROCID=3 is not in [0, SLURM_NTASKS=2)"));
  EXPECT_TRUE(contains(config_error([] {
                         detect_launch_env(fake({{"SLURM_PROCID", "0"},
                                                 {"SLURM_NTASKS", "2"},
                                                 {"SLURM_LOCALID", "0"},
                                                 {"SLURM_NODEID", "3"},
                                                 {"SLURM_TASKS_PER_NODE", "1(x2)"},
                                                 {"SLURM_NODELIST", "n[1-2]"}}));
                       }),
                       "SLURM_NODEID=3 but SLURM_TASKS_PER_NODE='1(x2)' lists 2 node(s)"));
  EXPECT_TRUE(contains(config_error([] {
                         detect_launch_env(fake({{"SLURM_PROCID", "0"},
                                                 {"SLURM_NTASKS", "2"},
                                                 {"SLURM_LOCALID", "0"},
                                                 {"SLURM_JOB_NODELIST", "n[1-2"}}));
                       }),
                       "unbalanced '['"));
}

TEST(LaunchEnv, OpenMpi) {
  LaunchEnv e = detect_launch_env(fake({{"OMPI_COMM_WORLD_RANK", "3"},
                                        {"OMPI_COMM_WORLD_SIZE", "4"},
                                        {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                        {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                                        {"MASTER_ADDR", "host0"}}));
  EXPECT_EQ(e.source, "openmpi");
  EXPECT_EQ(e.rank, 3);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_world_size, 2);
  EXPECT_EQ(e.node_rank, 1);
  EXPECT_EQ(e.master_addr, "host0");
  EXPECT_EQ(e.master_port, 29500);
  EXPECT_TRUE(contains(config_error([] {
                         detect_launch_env(fake({{"OMPI_COMM_WORLD_RANK", "0"},
                                                 {"OMPI_COMM_WORLD_SIZE", "4"},
                                                 {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}}));
                       }),
                       "mpirun -x MASTER_ADDR"));
  EXPECT_TRUE(contains(config_error([] {
                         detect_launch_env(fake({{"OMPI_COMM_WORLD_RANK", "0"}}));
                       }),
                       "OMPI_COMM_WORLD_SIZE is not set"));
}

TEST(LaunchEnv, TorchVariablesWinOverSlurm) {
  // `titan run` (or torchrun) inside an allocation: the children's RANK describes them.
  LaunchEnv e = detect_launch_env(fake({{"RANK", "1"},
                                        {"WORLD_SIZE", "2"},
                                        {"MASTER_PORT", "5"},
                                        {"SLURM_PROCID", "0"},
                                        {"SLURM_NTASKS", "1"}}));
  EXPECT_EQ(e.source, "env");
  EXPECT_EQ(e.rank, 1);
}

TEST(Hostlist, Expands) {
  using V = std::vector<std::string>;
  EXPECT_EQ(expand_hostlist("node[01-03,07],gpu5"),
            (V{"node01", "node02", "node03", "node07", "gpu5"}));
  EXPECT_EQ(expand_hostlist("single"), (V{"single"}));
  EXPECT_EQ(expand_hostlist("n[8-11]"), (V{"n8", "n9", "n10", "n11"}));
  EXPECT_EQ(expand_hostlist("n[098-100]"), (V{"n098", "n099", "n100"}));
  EXPECT_EQ(expand_hostlist("rack[1-2]-n[1,3]"),
            (V{"rack1-n1", "rack1-n3", "rack2-n1", "rack2-n3"}));
  EXPECT_EQ(expand_hostlist("a,b[2],c.d.e"), (V{"a", "b2", "c.d.e"}));
  EXPECT_EQ(expand_hostlist(""), V{});
}

TEST(Hostlist, RejectsMalformed) {
  EXPECT_TRUE(contains(config_error([] { expand_hostlist("n[1-2"); }), "unbalanced '['"));
  EXPECT_TRUE(contains(config_error([] { expand_hostlist("n1-2]"); }), "unbalanced ']'"));
  EXPECT_TRUE(contains(config_error([] { expand_hostlist("n[3-1]"); }), "bad range '3-1'"));
  EXPECT_TRUE(contains(config_error([] { expand_hostlist("n[a-b]"); }), "'a-b' is not a number"));
  EXPECT_TRUE(contains(config_error([] { expand_hostlist("n[]"); }), "empty brackets"));
}

TEST(TasksPerNode, Expands) {
  using V = std::vector<int64_t>;
  EXPECT_EQ(expand_tasks_per_node("8"), (V{8}));
  EXPECT_EQ(expand_tasks_per_node("2(x3),1"), (V{2, 2, 2, 1}));
  EXPECT_TRUE(contains(config_error([] { expand_tasks_per_node("2(3)"); }), "expected N or N(xM)"));
  EXPECT_TRUE(contains(config_error([] { expand_tasks_per_node("x"); }), "is not an integer"));
}

TEST(LogRank, Parses) {
  using V = std::vector<bool>;
  EXPECT_EQ(parse_log_ranks("", 3), (V{true, false, false}));
  EXPECT_EQ(parse_log_ranks("0,2", 3), (V{true, false, true}));
  EXPECT_EQ(parse_log_ranks("1-3", 4), (V{false, true, true, true}));
  EXPECT_EQ(parse_log_ranks("all", 2), (V{true, true}));
  EXPECT_TRUE(contains(config_error([] { parse_log_ranks("3", 3); }), "LOG_RANK='3'"));
  EXPECT_TRUE(
      contains(config_error([] { parse_log_ranks("a", 3); }), "LOG_RANK='a' is not an integer"));
}

TEST(LaunchArgs, Parses) {
  LaunchOptions o =
      parse_launch_args({"--nproc_per_node", "4", "--nnodes=2", "--node-rank", "1", "--master_addr",
                         "n0", "--master_port=1234", "--", "train", "--training.steps", "5"});
  EXPECT_EQ(o.nproc_per_node, 4);
  EXPECT_EQ(o.nnodes, 2);
  EXPECT_EQ(o.node_rank, 1);
  EXPECT_EQ(o.master_addr, "n0");
  EXPECT_EQ(o.master_port, 1234);
  EXPECT_EQ(o.world_size(), 8);
  EXPECT_EQ(o.command, (std::vector<std::string>{"train", "--training.steps", "5"}));
  // Without "--" the first non-option starts the command.
  o = parse_launch_args({"--nproc_per_node=2", "selftest", "--fail_rank", "1"});
  EXPECT_EQ(o.command.front(), "selftest");
  EXPECT_EQ(o.master_port, 0);
  EXPECT_TRUE(parse_launch_args({"--help"}).help);
  EXPECT_TRUE(is_titan_command("train"));
  EXPECT_FALSE(is_titan_command("/bin/sh"));
}

TEST(LaunchArgs, Errors) {
  EXPECT_TRUE(contains(config_error([] {
                         parse_launch_args({"--nproc_per_node", "2"});
                       }),
                       "no command"));
  EXPECT_TRUE(contains(config_error([] {
                         parse_launch_args({"--nproc", "2", "--", "train"});
                       }),
                       "unknown option '--nproc'"));
  EXPECT_TRUE(contains(config_error([] {
                         parse_launch_args({"--nproc_per_node", "0", "--", "x"});
                       }),
                       "--nproc_per_node 0 is not in [1, 1024]"));
  EXPECT_TRUE(contains(config_error([] {
                         parse_launch_args({"--nproc_per_node", "two", "--", "x"});
                       }),
                       "'two' is not an integer"));
  EXPECT_TRUE(contains(config_error([] {
                         parse_launch_args({"--nnodes", "2", "--node_rank", "2", "--", "x"});
                       }),
                       "--node_rank 2 is not below --nnodes 2"));
  EXPECT_TRUE(contains(config_error([] {
                         parse_launch_args({"--nnodes", "2", "--", "x"});
                       }),
                       "needs --master_addr"));
  EXPECT_TRUE(contains(config_error([] { parse_launch_args({"--nnodes"}); }), "needs a value"));
}

TEST(Threads, RankBudget) {
  LaunchEnv one;
  LaunchEnv four;
  four.world_size = 4;
  four.local_world_size = 4;
  EXPECT_EQ(rank_num_threads(3, four, fake({{"OMP_NUM_THREADS", "1"}})), 3);
  EXPECT_EQ(rank_num_threads(0, four, fake({{"OMP_NUM_THREADS", "2"}})), 2);
  EXPECT_EQ(rank_num_threads(0, four, fake({})), 0);
  EXPECT_EQ(rank_num_threads(0, one, fake({{"OMP_NUM_THREADS", "2"}})), 0);
  EXPECT_TRUE(contains(config_error([&] {
                         rank_num_threads(0, four, fake({{"OMP_NUM_THREADS", "0"}}));
                       }),
                       "OMP_NUM_THREADS='0'"));
  // As training.num_threads: capped, so a typo cannot stall start-up spawning threads.
  EXPECT_TRUE(contains(config_error([&] {
                         rank_num_threads(0, four, fake({{"OMP_NUM_THREADS", "100000"}}));
                       }),
                       "OMP_NUM_THREADS='100000' is not a positive integer of at most 1024"));
}

// ---- rendezvous over a real TCPStore, one thread per rank ----

int64_t unused_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  EXPECT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  close(fd);
  return ntohs(addr.sin_port);
}

LaunchEnv rank_env(int64_t rank, int64_t world, int64_t port) {
  LaunchEnv e;
  e.source = "test";
  e.rank = rank;
  e.world_size = world;
  e.local_rank = rank;
  e.local_world_size = world;
  e.master_port = port;
  return e;
}

// Runs rendezvous for `ranks` (each with world size `worlds[i]`) in threads; returns each
// rank's error message ("" on success).
std::vector<std::string> run_ranks(const std::vector<int64_t>& ranks,
                                   const std::vector<int64_t>& worlds,
                                   std::chrono::milliseconds timeout) {
  const int64_t port = unused_port();
  std::vector<std::string> errors(ranks.size());
  std::vector<c10::intrusive_ptr<c10d::Store>> stores(ranks.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < ranks.size(); ++i) {
    threads.emplace_back([&, i] {
      // Rank 0 hosts the store; give it a head start so clients do not race its bind.
      if (ranks[i] != 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
      try {
        stores[i] = rendezvous(rank_env(ranks[i], worlds[i], port), timeout);
      } catch (const std::exception& e) {
        errors[i] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

TEST(Rendezvous, AllRanksJoin) {
  auto errors = run_ranks({0, 1, 2}, {3, 3, 3}, std::chrono::seconds(20));
  for (const auto& e : errors) EXPECT_EQ(e, "");
}

TEST(Rendezvous, TimeoutNamesMissingRank) {
  auto errors = run_ranks({0, 2}, {3, 3}, std::chrono::milliseconds(1500));
  for (const auto& e : errors) {
    EXPECT_TRUE(contains(e, "rendezvous timed out after 1.5 s")) << e;
    EXPECT_TRUE(contains(e, "2 of 3 ranks arrived")) << e;
    EXPECT_TRUE(contains(e, "missing: rank 1")) << e;
  }
}

TEST(Rendezvous, DuplicateRankAndWorldMismatch) {
  auto errors = run_ranks({0, 1, 1}, {3, 3, 3}, std::chrono::milliseconds(1500));
  int duplicates = 0;
  for (const auto& e : errors) duplicates += contains(e, "two processes were started as rank 1");
  EXPECT_EQ(duplicates, 1);
  errors = run_ranks({0, 1}, {2, 3}, std::chrono::milliseconds(1500));
  EXPECT_TRUE(
      contains(errors[1], "started with world size 3 but another rank registered world size 2"))
      << errors[1];
}

TEST(Rendezvous, UnreachableStoreIsBounded) {
  const auto start = std::chrono::steady_clock::now();
  auto errors = run_ranks({1}, {2}, std::chrono::milliseconds(1000));
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_TRUE(contains(errors[0], "rank 1 could not reach the store")) << errors[0];
  EXPECT_LT(s, 15.0);
}

// An unresolvable store host is reported as such (rank 0 used to hint that another job may
// hold the port). ".invalid" never resolves (RFC 2606).
TEST(Rendezvous, UnresolvableMasterAddrIsNamed) {
  addrinfo* found = nullptr;
  const int rc = getaddrinfo("no-such-host.invalid", nullptr, nullptr, &found);
  if (found != nullptr) freeaddrinfo(found);
  if (rc == EAI_AGAIN) GTEST_SKIP() << "no name resolution on this machine";
  for (int64_t rank : {0, 1}) {
    LaunchEnv env = rank_env(rank, 2, unused_port());
    env.master_addr = "no-such-host.invalid";
    const std::string msg = config_error([&] { rendezvous(env, std::chrono::seconds(5)); });
    EXPECT_TRUE(contains(msg, "MASTER_ADDR 'no-such-host.invalid' (rank " + std::to_string(rank) +
                                  "'s store host) cannot be resolved"))
        << msg;
    EXPECT_FALSE(contains(msg, "port")) << msg;
  }
}

// A rank that hangs after its last collective (SIGSTOP) must not keep the job alive: rank 0's exit
// barrier is bounded by the training timeout and fails naming it (it used to wait the init
// timeout and then return as if all was well, leaving the launcher waiting on the frozen rank).
TEST(ExitBarrier, MissingRankFailsWithinTheTrainTimeout) {
  const int64_t port = unused_port();
  CommSection comm;
  comm.init_timeout_seconds = 20;
  comm.train_timeout_seconds = 1;
  std::string error0 = "(no exception)";
  double seconds = 0;
  std::promise<void> rank0_done;
  std::thread rank1([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    DistributedContext dist;
    dist.env = rank_env(1, 2, port);
    dist.store = rendezvous(dist.env, std::chrono::seconds(comm.init_timeout_seconds));
    rank0_done.get_future().wait();  // frozen: never reaches the exit barrier
  });
  {
    DistributedContext dist;
    dist.env = rank_env(0, 2, port);
    dist.store = rendezvous(dist.env, std::chrono::seconds(comm.init_timeout_seconds));
    const auto start = std::chrono::steady_clock::now();
    try {
      finalize_distributed(dist, comm);
    } catch (const dist::CommError& e) {
      error0 = e.what();
    }
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  rank0_done.set_value();
  rank1.join();
  EXPECT_TRUE(contains(error0, "exit barrier: 1 of 2 ranks finished; rank 1 did not arrive"))
      << error0;
  EXPECT_TRUE(contains(error0, "(comm.train_timeout_seconds 1 s)")) << error0;
  EXPECT_LT(seconds, 5.0);
}

TEST(ExitBarrier, AllRanksLeaveTogether) {
  const int64_t port = unused_port();
  CommSection comm;
  comm.train_timeout_seconds = 5;
  std::vector<std::string> errors(2);
  std::vector<std::thread> threads;
  for (int64_t r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      if (r != 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
      try {
        DistributedContext dist;
        dist.env = rank_env(r, 2, port);
        dist.store = rendezvous(dist.env, std::chrono::seconds(20));
        finalize_distributed(dist, comm);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
}

TEST(WorldGroupOptions, GlooBindsWhereTheRouteToTheMasterLeaves) {
  // The kernel's route to a loopback master leaves from loopback.
  EXPECT_EQ(address_towards("127.0.0.1", 29500), "127.0.0.1");
  EXPECT_EQ(address_towards("localhost", 29500).rfind("127.", 0) == 0 ||
                address_towards("localhost", 29500) == "::1",
            true);
  ::unsetenv("GLOO_SOCKET_IFNAME");
  DistributedContext dist;
  dist.env.world_size = 4;
  dist.env.local_world_size = 4;
  dist.env.master_addr = "localhost";
  EXPECT_EQ(world_group_options(dist, CommSection{}).gloo_hostname, "127.0.0.1");
  // A single-node master named otherwise (this host's own name) binds where its route leaves.
  char host[256] = {};
  ASSERT_EQ(gethostname(host, sizeof(host) - 1), 0);
  dist.env.master_addr = host;
  EXPECT_EQ(world_group_options(dist, CommSection{}).gloo_hostname,
            address_towards(host, dist.env.master_port));
  // Several nodes whose master resolves to loopback here: Gloo's host-name default stays.
  if (address_towards(host, dist.env.master_port).rfind("127.", 0) == 0) {
    dist.env.local_world_size = 2;
    EXPECT_EQ(world_group_options(dist, CommSection{}).gloo_hostname, "");
  }
  // GLOO_SOCKET_IFNAME wins over the route.
  ::setenv("GLOO_SOCKET_IFNAME", "lo", 1);
  EXPECT_EQ(world_group_options(dist, CommSection{}).gloo_hostname, "");
  ::unsetenv("GLOO_SOCKET_IFNAME");
}

TEST(WorldGroupOptions, GlooSocketIfnameMustNameAnInterfaceThatCanReachTheOtherNodes) {
  DistributedContext dist;
  dist.env.world_size = 4;
  dist.env.local_world_size = 2;
  dist.env.master_addr = "127.0.0.1";
  dist.env.master_port = 29500;
  // Not an interface of this host: the message lists the ones it has.
  ::setenv("GLOO_SOCKET_IFNAME", "nosuch0", 1);
  dist.env.master_addr = "localhost";
  try {
    (void)world_group_options(dist, CommSection{});  // a loopback master: the variable is unused
  } catch (const std::exception& e) {
    ADD_FAILURE() << e.what();
  }
  // Any address of this host that is not loopback stands for a master on the network.
  std::string other;
  ifaddrs* list = nullptr;
  ASSERT_EQ(getifaddrs(&list), 0);
  for (const ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
    if ((a->ifa_flags & IFF_LOOPBACK) != 0 || (a->ifa_flags & IFF_UP) == 0) continue;
    char text[INET_ADDRSTRLEN] = {};
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(a->ifa_addr)->sin_addr, text,
              sizeof(text));
    other = text;
  }
  freeifaddrs(list);
  if (other.empty()) GTEST_SKIP() << "this host has no non-loopback IPv4 address";
  dist.env.master_addr = other;
  try {
    (void)world_group_options(dist, CommSection{});
    ADD_FAILURE() << "GLOO_SOCKET_IFNAME=nosuch0 was accepted";
  } catch (const dist::CommError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("GLOO_SOCKET_IFNAME=nosuch0: this host has no interface nosuch0"),
              std::string::npos)
        << what;
    EXPECT_NE(what.find("lo 127.0.0.1"), std::string::npos) << what;
  }
  // Loopback cannot reach the other nodes when the master is reached over the network.
  ::setenv("GLOO_SOCKET_IFNAME", "lo", 1);
  try {
    (void)world_group_options(dist, CommSection{});
    ADD_FAILURE() << "GLOO_SOCKET_IFNAME=lo was accepted for a master on the network";
  } catch (const dist::CommError& e) {
    EXPECT_NE(std::string(e.what()).find("lo is the loopback interface"), std::string::npos)
        << e.what();
  }
  // ... but carries a job on one node.
  dist.env.local_world_size = 4;
  EXPECT_EQ(world_group_options(dist, CommSection{}).gloo_hostname, "");
  ::unsetenv("GLOO_SOCKET_IFNAME");
}

// NCCL when the ranks compute on GPUs; Gloo on the CPU; Gloo with the CUDA tensors staged through
// the host when the ranks share GPUs (TITAN_SHARED_DEVICE=1). No GPU is needed: only the options.
TEST(WorldGroupOptions, BackendFollowsTheDeviceAndTheSharedDeviceMode) {
  DistributedContext dist;
  dist.env.world_size = 2;
  dist.env.local_world_size = 2;
  dist.env.master_addr = "127.0.0.1";
  const at::Device cpu(at::kCPU), cuda(at::kCUDA, 0);
  {
    test::ScopedEnv off("TITAN_SHARED_DEVICE", nullptr);
    const dist::GroupOptions on_cpu = world_group_options(dist, CommSection{}, "", cpu);
    EXPECT_EQ(on_cpu.backend, dist::Backend::kGloo);
    EXPECT_FALSE(on_cpu.stage_cuda_tensors);
    const dist::GroupOptions on_gpu = world_group_options(dist, CommSection{}, "", cuda);
    EXPECT_EQ(on_gpu.backend, dist::Backend::kNccl);
    EXPECT_FALSE(on_gpu.stage_cuda_tensors);
  }
  {
    test::ScopedEnv on("TITAN_SHARED_DEVICE", "1");
    const dist::GroupOptions shared = world_group_options(dist, CommSection{}, "", cuda);
    EXPECT_EQ(shared.backend, dist::Backend::kGloo);
    EXPECT_TRUE(shared.stage_cuda_tensors);
    EXPECT_EQ(shared.gloo_hostname, "127.0.0.1");
    const dist::GroupOptions on_cpu = world_group_options(dist, CommSection{}, "", cpu);
    EXPECT_EQ(on_cpu.backend, dist::Backend::kGloo);
    EXPECT_FALSE(on_cpu.stage_cuda_tensors);
  }
  test::ScopedEnv bad("TITAN_SHARED_DEVICE", "2");
  EXPECT_THROW(world_group_options(dist, CommSection{}, "", cuda), ConfigError);
}

}  // namespace test_launch_env
}  // namespace titan
