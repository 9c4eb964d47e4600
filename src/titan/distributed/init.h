// Joining a multi-process job: read the launch environment, rendezvous through c10d's TCPStore
// (rank 0 hosts it, or torchrun's agent does), and hand the store to the process-group layer.
//
//   DistributedContext dist = init_distributed(config.comm);   // every rank, early
//   ... build process groups on dist.store ...
//   finalize_distributed(dist, config.comm);                   // before a clean exit
//
// Everything here is bounded by comm.init_timeout_seconds: a rank that never arrives makes the
// others fail with a message naming it, never hang.
#pragma once

#include "titan/config/job_config.h"
#include "titan/distributed/comm.h"
#include "titan/distributed/launch_env.h"
#include "titan/distributed/liveness.h"

#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <memory>
#include <stdexcept>

namespace titan {

struct DistributedContext {
  LaunchEnv env;
  // The job's store once every rank has arrived; null for a single process.
  c10::intrusive_ptr<c10d::Store> store;
  // This rank's heartbeat (liveness.h), started once every rank has arrived; null for a single
  // process. world_group_options hands its diagnoser to the groups, so that a failed collective
  // names the ranks and hosts that went silent.
  std::shared_ptr<dist::Liveness> liveness;

  int64_t rank() const { return env.rank; }
  int64_t world_size() const { return env.world_size; }
  int64_t local_rank() const { return env.local_rank; }
  int64_t local_world_size() const { return env.local_world_size; }
};

// The rendezvous failed: a timeout (naming the ranks that did not arrive), two processes with
// the same rank, disagreeing world sizes, or the store's host going away.
struct RendezvousError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Connects to (rank 0: hosts) the TCPStore at env.master_addr:master_port and waits until all
// env.world_size ranks have registered. Throws RendezvousError on timeout, saying which ranks
// did not arrive (the same message on every rank), and when two processes claim the same rank,
// disagree on the world size or lose the store.
c10::intrusive_ptr<c10d::Store> rendezvous(const LaunchEnv& env, std::chrono::milliseconds timeout);

// detect_launch_env() + rendezvous() when the world has more than one rank. Also makes log lines
// rank-aware when the launcher does not prefix them (see set_log_rank_filter; LOG_RANK).
DistributedContext init_distributed(const CommSection& comm);
DistributedContext init_distributed(const CommSection& comm, const LaunchEnv& env);

// Exit barrier (after stopping the heartbeat): rank 0 hosts the store, so it waits (up to
// comm.train_timeout_seconds) until every rank has reached this point before returning and letting
// its process end; when some never arrive (hung, stopped) it throws dist::CommError naming them, so
// the job ends non-zero instead of waiting on them. No-op for one rank.
void finalize_distributed(DistributedContext& dist, const CommSection& comm);

// The local address this host's routing uses towards host:port (a UDP socket connected there;
// nothing is sent), e.g. "10.0.0.2". dist::CommError when host does not resolve or no route
// reaches it, with a HINT naming GLOO_SOCKET_IFNAME.
std::string address_towards(const std::string& host, int64_t port);

// Options of the job's world group: NCCL when the ranks compute on CUDA `device`s, Gloo on the
// CPU, and Gloo taking CUDA tensors through host copies in the shared-device test mode
// (TITAN_SHARED_DEVICE=1, titan/common/device.h); comm.init_timeout_seconds; Gloo on loopback
// for single-node jobs whose master is this host (127.0.0.1 / localhost); GLOO_SOCKET_IFNAME
// when set; otherwise the local address whose route reaches the master (address_towards), so
// that a host name resolving to loopback cannot strand a node; the heartbeat's diagnoser when
// dist.liveness is set. `fingerprint` must agree on every rank (e.g. a digest of the job config).
dist::GroupOptions world_group_options(const DistributedContext& dist, const CommSection& comm,
                                       const std::string& fingerprint = "",
                                       const at::Device& device = at::kCPU);

// The job's flight recorder (flight_recorder.h) when comm.trace_buf_size > 0, else null: it
// keeps this rank's last trace_buf_size ops of every group made with options that carry it, and
// dumps them to <dump_folder>/<comm.save_traces_folder>/<comm.save_traces_file_prefix><rank>.json
// when a collective fails or times out, on SIGUSR1 (which `titan run` sends to the surviving
// ranks when one fails) and on a fatal error of training (dist::dump_installed_flight_recorder).
std::shared_ptr<dist::FlightRecorder> start_flight_recorder(const CommSection& comm,
                                                            const std::string& dump_folder,
                                                            int64_t rank, int64_t world_size);

// Intra-op threads for this rank, to pass to configure_threads(n, local_world_size):
// `configured` (training.num_threads) when > 0; else, in a multi-process job, OMP_NUM_THREADS
// when set (titan run sets cores / local ranks unless the user set it; torchrun sets 1);
// else 0, which makes configure_threads divide the cores by the local ranks.
int64_t rank_num_threads(int64_t configured, const LaunchEnv& env, const EnvLookup& lookup);

}  // namespace titan
