// Process groups and collectives: one small interface over c10d's backends, so that FSDP, DDP, TP
// and (later) PP/CP/EP are written once and run on Gloo (CPU) and NCCL (CUDA).
//
//   auto world = dist::Group::create(store, rank, world_size, options);   // every rank
//   dist::Work w = world->all_reduce(grad, dist::ReduceOp::kAvg);         // issued, async
//   ...overlap compute...
//   w.wait();                                  // result valid; throws CommError on failure
//
// Where Gloo's own implementation of an op is slow or missing, it is built here on what is fast
// (GlooOps picks, per op, native or built; bench/comm_bench compares the two on this machine):
//   - reduce_scatter_tensor: Gloo's _reduce_scatter_base is an all-reduce of the whole input
//     followed by a local chunk (twice the bytes of a reduce-scatter on the wire). Built: an
//     all_to_all_single of the size chunks + a local reduction of the chunks received, in rank
//     order (the bytes of a ring reduce-scatter, plus a receive buffer as large as the input);
//     bf16/fp16 chunks move as 16-bit and sum in fp32.
//   - all_gather_into_tensor: Gloo's _allgather_base gathers into a list and copies. Built: an
//     all_to_all_single of `size` copies of the input straight into the output (the bytes of a
//     ring all-gather, plus a send buffer as large as the output).
//   - all_reduce AVG (SUM, then a local divide) and bf16/fp16 all_reduce (reduce an fp32 copy,
//     round once): native in the Gloo of libtorch 2.x, which sums 16-bit values in 16 bits at
//     each hop (one rounding per rank instead of one in all).
//   - small all_reduce (GlooOps::small_all_reduce_bytes): Gloo's all-reduce runs in two phases,
//     two network round trips even for one value (the gradient norm, the loss); over a link
//     with latency that is what such an op costs. Built: an all_to_all_single of `size` copies
//     of the tensor (one round trip) and a local reduction in rank order, the same on every
//     rank (16-bit values sum in fp32); `size` times the bytes, so only up to the threshold.
//   - int16 (Gloo lacks it) moves as fp16 bits: no arithmetic, bit-exact.
//     Built ops take their buffers from a per-group pool and reuse them (see ScratchPool):
//     fresh large allocations cost page faults on every call.
//   CUDA tensors on Gloo (GroupOptions::stage_cuda_tensors, the shared-device test mode of
//     titan/common/device.h): each is copied to page-locked host memory when the op is issued
//     (the host waits until the current stream has produced it), the op runs on the copies, and
//     wait() copies the results back without blocking, ordered on the stream current then. So,
//     as with NCCL, an op reads what the current stream queued before it and its results are
//     ordered before what the waiting stream queues after wait().
//   NCCL (CUDA builds)     every op is native. wait() makes the current CUDA stream wait for the
//     op instead of blocking the CPU, and c10d's NCCL watchdog enforces the timeout (set_timeout
//     included): a peer that fails or hangs makes the watchdog abort this process, so the job
//     ends with an error instead of a hang. The CPU test suite compiles this path but does not
//     run it.
//
// Misuse is caught before anything is issued, because a failed Gloo collective leaves the group
// unusable. Checked locally, always, for free: tensors defined, contiguous, on the backend's
// device, dtype supported by the op, output/input shapes consistent with the group size, splits
// well formed, roots/peers in range. Checked across ranks:
//   - at creation (always): every member agrees on the group's name, size, backend and the
//     caller's `fingerprint` (e.g. the parallelism config), through the store;
//   - per collective, only with GroupOptions::check_agreement (or TITAN_COMM_CHECK=1): before
//     each collective the ranks all-gather a small descriptor (sequence number, op, dtype, numel,
//     root / reduce op, all-to-all splits) and every rank throws the same clear error on any
//     disagreement; the group stays usable. It costs one small extra collective per op and makes
//     issuing synchronous with the peers, so it is a debugging and testing aid, off by default.
//   Not checked: send/recv pairing (a recv with no matching send waits for the timeout).
// A collective that fails or outlives the group's timeout throws CommError naming the op, the
// group and the rank, and marks the group broken: later ops on it throw at once. With a flight
// recorder in the options, every op is recorded and the recorder is dumped before that throw.
//
// Threading: like c10d, one thread issues a group's ops, in the same order on every member.
#pragma once

#include <ATen/Tensor.h>
#include <c10/core/Device.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace titan::dist {

enum class ReduceOp { kSum, kAvg, kMax, kMin };
const char* to_string(ReduceOp op);

enum class Backend { kGloo, kNccl };
const char* to_string(Backend backend);
// True when this build can make NCCL groups (TITAN_HAS_NCCL in titan/common/torch_compat.h).
bool nccl_available();

// A collective failed: a peer crashed, hung or called a different collective, or the transport
// broke. The message names the op, the group and the rank. Fatal for the group.
struct CommError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class Work;
class FlightRecorder;  // flight_recorder.h

// Which Gloo ops go to Gloo's own implementation (true) and which are built on others here
// (false); see the top of this file. The defaults are the faster of the two as measured by
// bench/comm_bench on 2-core CPUs (docs/speed.md, "Collectives on Gloo"), and for small
// all-reduces the round trips across a link with latency (bench/fsdp_latency_bench.sh);
// TITAN_GLOO_OPS=native or =built sets them all for a process (benchmarks, tests).
struct GlooOps {
  bool all_reduce_avg = true;
  bool all_reduce_low_precision = true;
  bool reduce_scatter = false;
  bool all_gather = false;
  // All-reduces of at most this many bytes are built on one all-to-all; 0: always Gloo's.
  int64_t small_all_reduce_bytes = 16384;
  static GlooOps all_native() { return {true, true, true, true, 0}; }
  static GlooOps all_built() { return {false, false, false, false, 16384}; }
};

struct GroupOptions {
  // Shown in errors ("world", "dp_shard", ...); also the store prefix, so create a top-level
  // group of a given name once per store.
  std::string name = "world";
  Backend backend = Backend::kGloo;
  // Bounds the rendezvous and every collective (comm.init_timeout_seconds at start-up).
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
  // Every member must pass the same string, or creation fails with both values in the message.
  std::string fingerprint;
  // Per-collective cross-rank agreement check (see above). TITAN_COMM_CHECK=1 also turns it on.
  bool check_agreement = false;
  // Gloo: the address this rank's sockets bind to. Empty: the interfaces in GLOO_SOCKET_IFNAME
  // (comma-separated) when set, else c10d's default device (this host's name, else loopback).
  // Single-node jobs and tests pass "127.0.0.1".
  std::string gloo_hostname;
  // Gloo worker threads (each can run one collective at a time).
  int gloo_threads = 2;
  // Gloo: native or built implementation per op. Sub-groups inherit it.
  GlooOps gloo_ops;
  // Gloo: also take CUDA tensors, staged through host memory (see the top of this file); off, a
  // CUDA tensor is an error. Sub-groups inherit it.
  bool stage_cuda_tensors = false;
  // Records every op of the group (and its sub-groups) and is dumped when one fails (null: off).
  std::shared_ptr<FlightRecorder> recorder;
  // Called with the group's world ranks when an op fails; what it returns (who is unreachable,
  // e.g. Liveness::diagnoser in liveness.h) goes into the CommError. Sub-groups inherit it.
  std::function<std::string(const std::vector<int>& world_ranks)> diagnose;
};

// One process group: `size` ranks that run collectives together. Create with Group::create on
// every rank (or new_subgroup). Tensors passed to an op must stay alive, and must not be written,
// until its Work has been waited for.
class Group {
 public:
  // Rendezvous through `store` (TCPStore for jobs; HashStore or FileStore in tests) and build the
  // backend. Blocks until all `size` ranks have called it, at most options.timeout; throws
  // CommError naming the ranks that did not arrive, and c10::Error listing every member's view
  // when they disagree (size, backend, fingerprint).
  static std::shared_ptr<Group> create(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                       int size, GroupOptions options = {});

  // A group of `ranks` (ranks of this group, strictly increasing), named `name`. Only members
  // rendezvous (the store prefix is derived from name and ranks), so non-members may call it or
  // not; they get nullptr. Members must create their shared sub-groups in the same order.
  std::shared_ptr<Group> new_subgroup(const std::string& name, const std::vector<int>& ranks);

  ~Group();
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;

  int rank() const;
  int size() const;
  const std::string& name() const;
  Backend backend() const;
  // This group's members as ranks of the world group it was created from: ranks()[rank()] is
  // this process's world rank.
  const std::vector<int>& ranks() const;
  std::chrono::milliseconds timeout() const;
  // Bounds waits from now on (e.g. comm.train_timeout_seconds after the first step), on this
  // group and on every living sub-group made from it, at any depth (a pipeline's pp_up / pp_down,
  // CP's ring directions, ...); sub-groups made later start with it. Gloo keeps its own transport
  // timeout from creation; a wait that passes the new bound throws as a failure of the op.
  void set_timeout(std::chrono::milliseconds timeout);
  // The living sub-groups made from this group, at any depth, depth first in creation order.
  std::vector<std::shared_ptr<Group>> subgroups() const;
  // Where this group's tensors live: the CPU (Gloo), or the current CUDA device (NCCL). A Gloo
  // group with stage_cuda_tensors takes CUDA tensors too; this stays the CPU.
  at::Device device() const;
  // "'dp_shard' (rank 1 of 2, world ranks [2, 3], gloo)"
  std::string describe() const;
  // False once an op on this group failed; ops then throw CommError at once.
  bool healthy() const;

  // In place over the group. AVG divides the sum by size() (floating dtypes only).
  Work all_reduce(const at::Tensor& tensor, ReduceOp op = ReduceOp::kSum);
  // output = the inputs of ranks 0..size-1 concatenated along dim 0: output is (size * n0, ...)
  // for an input (n0, ...), or (size, n0, ...). Same dtype.
  Work all_gather_into_tensor(const at::Tensor& output, const at::Tensor& input);
  // The converse: input is (size * n0, ...) or (size, n0, ...), output (n0, ...); rank r gets
  // op over ranks of chunk r.
  Work reduce_scatter_tensor(const at::Tensor& output, const at::Tensor& input,
                             ReduceOp op = ReduceOp::kSum);
  // Rows (dim 0) of `input` go to ranks in order: input_splits[j] rows to rank j; output receives
  // output_splits[j] rows from rank j. Empty splits mean equal splits. Rank i's input_splits[j]
  // must equal rank j's output_splits[i]; trailing dims of input and output must match.
  Work all_to_all_single(const at::Tensor& output, const at::Tensor& input,
                         const std::vector<int64_t>& output_splits = {},
                         const std::vector<int64_t>& input_splits = {});
  // `tensor` of rank `root` (a rank of this group) is copied to every rank's `tensor`.
  Work broadcast(const at::Tensor& tensor, int root);
  // Host values of rank `root` on every rank (the same count on every rank), through one
  // broadcast on the group's device; blocking. For decisions one rank makes for all (a seed, an
  // outcome, a checkpoint step), not for tensors.
  std::vector<int64_t> broadcast_ints(const std::vector<int64_t>& values, int root);
  int64_t broadcast_int(int64_t value, int root);
  // Rank `root`'s text on every rank (other ranks pass anything): its length, then its bytes.
  std::string broadcast_string(const std::string& text, int root);
  // Point to point with a group rank; `tag` tells apart concurrent messages between two ranks.
  Work send(const at::Tensor& tensor, int dst, int tag = 0);
  Work recv(const at::Tensor& tensor, int src, int tag = 0);
  // Completes when every rank has reached it (and this rank's earlier ops have finished).
  Work barrier();

  struct State;  // implementation, shared with the Work handles

 private:
  explicit Group(std::shared_ptr<State> state);
  std::shared_ptr<State> state_;
};

// An issued op. wait() blocks until it has completed (at most the group's timeout), finishes the
// local part of emulated ops (cast back, divide, local reduction) and throws CommError on failure.
// Results are only valid after wait(). Waiting twice is a no-op; a default Work is complete.
class Work {
 public:
  Work();
  void wait();
  // True once wait() has returned (or for a default Work).
  bool done() const;

  struct Impl;
  explicit Work(std::shared_ptr<Impl> impl);

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace titan::dist
