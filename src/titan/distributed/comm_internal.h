// Internals shared by comm.cpp (groups, waits), comm_ops.cpp (the collectives) and
// comm_check.cpp (local and cross-rank checks). Not part of the API: include comm.h instead.
#pragma once

#include "titan/common/torch_compat.h"
#include "titan/distributed/comm.h"
#include "titan/distributed/flight_recorder.h"

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <functional>
#include <map>
#include <mutex>

namespace gloo::transport {
class Device;
}

namespace titan::dist {

// Scratch memory for the local parts of emulated ops (fp32 copies of bf16 tensors, receive
// buffers, accumulators). Freshly allocated large tensors cost page faults on every call (tens
// of ms per 16 MB on some machines), so buffers are kept and handed out again once nothing
// references them any more (the views given out, and c10d's work that holds them, are gone).
// Keeps at most kMaxBuffers buffers, each as large as the largest request it served.
class ScratchPool {
 public:
  // An uninitialised contiguous tensor of `numel` elements of `dtype`.
  at::Tensor get(int64_t numel, at::ScalarType dtype);

 private:
  static constexpr size_t kMaxBuffers = 8;
  std::mutex mutex_;
  std::vector<at::Tensor> buffers_;  // 1-D uint8
};

struct Group::State : std::enable_shared_from_this<Group::State> {
  c10::intrusive_ptr<c10d::Store> root_store;  // the job's store, without this group's prefix
  std::string prefix;                          // this group's keys live under it
  c10::intrusive_ptr<c10d::Backend> pg;
  std::vector<std::shared_ptr<::gloo::transport::Device>> gloo_devices;  // shared with sub-groups
  GroupOptions options;
  int rank = 0;
  int size = 1;
  std::vector<int> ranks;  // world rank of each member
  std::atomic<int64_t> timeout_ms{0};
  int64_t collective_seq = 0;  // collectives issued so far (p2p not counted)
  ScratchPool scratch;
  std::map<std::string, int> subgroup_count;  // sub-groups made per (name, ranks), for prefixes
  // The sub-groups made from this group (new_subgroup), while they live; under `mutex`.
  std::vector<std::weak_ptr<State>> children;

  mutable std::mutex mutex;
  bool broken = false;
  std::string broken_reason;
  // An op was dropped unwaited and unfinished (an exception unwound past its Work).
  std::atomic<bool> abandoned_work{false};
  // Flight-recorder id of the op being issued (begin_collective / p2p -> make_work); -1: none.
  int64_t fr_pending = -1;
  int64_t fr_checking = -1;  // the op whose agreement check is running

  // A broken group, or one with abandoned work, may have backend threads stuck in an op until
  // the timeout it was issued with (comm.init_timeout_seconds for ops of the first step); the
  // backend's destructor would join them. Such a backend is left to the process's exit.
  ~State();

  std::chrono::milliseconds timeout() const { return std::chrono::milliseconds(timeout_ms.load()); }
  // This group's timeout, then its living sub-groups' (recursively).
  void set_timeout(std::chrono::milliseconds timeout);
  // The living sub-groups made from this one, recursively, in creation order (depth first).
  std::vector<std::shared_ptr<State>> descendants() const;
  std::string describe() const;
  // Throws CommError when an earlier op failed.
  void check_healthy(const std::string& op) const;
  void mark_broken(const std::string& reason);
  // The CommError for `op` failing with `cause` after `seconds`; also marks the group broken.
  [[noreturn]] void fail(const std::string& op, const std::string& cause, double seconds);
};

struct Work::Impl {
  std::shared_ptr<Group::State> group;
  c10::intrusive_ptr<c10d::Work> work;  // null when nothing was issued (empty tensors)
  std::function<void()> finish;         // local part of an emulated op, after success
  std::string op;                       // "all_reduce #12", for errors
  std::chrono::steady_clock::time_point issued;
  int64_t fr_id = -1;  // its flight-recorder entry
  bool done = false;
  ~Impl();  // marks the group's abandoned_work when dropped while the op may still run
};

// Issued op -> Work handle. `work` null: nothing was issued, wait() only runs `finish`.
Work make_work(const std::shared_ptr<Group::State>& state, std::string op,
               c10::intrusive_ptr<c10d::Work> work, std::function<void()> finish = {});

enum class OpKind : int64_t {
  kAllReduce = 1,
  kAllGather,
  kReduceScatter,
  kAllToAll,
  kBroadcast,
  kBarrier,
};
const char* to_string(OpKind kind);

// What a collective is, as every rank must agree on it.
struct OpDesc {
  OpKind kind = OpKind::kBarrier;
  at::ScalarType dtype = at::kFloat;
  int64_t numel = 0;                                   // all-to-all: elements per row (dim 0)
  int64_t aux = 0;                                     // ReduceOp or broadcast root
  const std::vector<int64_t>* input_splits = nullptr;  // all-to-all, resolved (never empty)
  const std::vector<int64_t>* output_splits = nullptr;
  at::IntArrayRef shape;  // recorded by the flight recorder (the input's, or the output's)
};

// Local checks (comm_check.cpp). Each throws c10::Error naming op, argument, value and the fix.
void check_tensor(const Group::State& s, const char* op, const char* arg, const at::Tensor& t);
void check_dtype(const Group::State& s, const char* op, const at::Tensor& t, bool reduction,
                 ReduceOp reduce_op);
void check_same_dtype(const Group::State& s, const char* op, const at::Tensor& output,
                      const at::Tensor& input);
// output is `size` inputs along dim 0: (size * n0, ...) or (size, n0, ...).
void check_gathered_shape(const Group::State& s, const char* op, const char* big_name,
                          const at::Tensor& big, const char* small_name, const at::Tensor& small);
// Fills empty splits with equal splits; checks counts, signs and sums against dim 0.
std::vector<int64_t> resolve_splits(const Group::State& s, const char* arg,
                                    const std::vector<int64_t>& splits, const at::Tensor& t);
void check_peer(const Group::State& s, const char* op, const char* arg, int peer, bool allow_self);

// Starts collective number collective_seq (returns its label, "all_reduce #3") and, when
// check_agreement is on, verifies that every rank issues the same one (comm_check.cpp).
std::string begin_collective(Group::State& s, const OpDesc& desc);
// Records a send/recv with the flight recorder (when there is one) for the next make_work.
void record_p2p(Group::State& s, const char* op, int peer, const at::Tensor& tensor);

}  // namespace titan::dist
