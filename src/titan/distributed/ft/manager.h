// A replica group's side of fault tolerance: the quorum of each step, the cross-replica process
// group, gradient averaging over the live replicas and recovery of the state from a peer.
//
// Every rank of a replica group holds a Manager. Rank r of every group in the quorum joins one
// cross-replica Gloo group ("ft_replicas", one per group rank: the same shards under FSDP/TP/PP,
// since every group runs the same layout), rebuilt when the quorum's members change. A step:
//
//   if (!manager.start_step(committed)) ...;            // quorum: rank 0 asks, the group learns it
//   if (manager.recovering() || manager.is_source())
//     manager.transfer_state(state_tensors, blob);       // the source's state to whoever is behind
//   ... forward / backward ...
//   bool ok = manager.average(grads);                    // sum / participants over the quorum
//   if (manager.agree(ok)) optimizer.step(); else ...;   // every rank of the group decides alike
//
// Failures of the cross-replica ops (a peer died, hung past `timeout`, its link went down) are
// returned as false with error(), never thrown: the step is not committed, the next start_step
// asks for a new quorum (without the dead) and rebuilds the group. What is thrown ends the
// replica group: no quorum within quorum_timeout, a lighthouse that cannot be reached.
#pragma once

#include "titan/distributed/comm.h"
#include "titan/distributed/ft/quorum.h"

#include <ATen/Tensor.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace titan::ft {

struct ManagerOptions {
  int64_t replica_id = 0;
  std::string lighthouse;  // "host:port" (TITAN_FT_LIGHTHOUSE)
  // Cross-replica ops and the group's rendezvous (fault_tolerance.process_group_timeout_ms).
  std::chrono::milliseconds timeout{10000};
  // How long rank 0 waits for the lighthouse to announce a quorum.
  std::chrono::milliseconds quorum_timeout{std::chrono::seconds(300)};
  // Every replica group must pass the same text (the layout and model): checked when the
  // cross-replica group is built.
  std::string fingerprint;
  // The address the cross-replica group binds to (e.g. address_towards(lighthouse)).
  std::string gloo_hostname;
  std::chrono::milliseconds beat_interval{100};
};

// The lighthouse cannot be reached, or announced no quorum in time: the replica group ends.
struct QuorumError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class Manager {
 public:
  // Collective over `group` (the replica group's world; null for a group of one rank). Rank 0
  // registers with the lighthouse and starts beating.
  Manager(ManagerOptions options, dist::Group* group);
  // Rank 0 tells the lighthouse that this replica left, so that the others go on at once.
  ~Manager();
  Manager(const Manager&) = delete;
  Manager& operator=(const Manager&) = delete;

  // The quorum of the next step: rank 0 asks with `committed` (the steps this replica has
  // committed; -1: its state is not valid) and every rank of the group learns the answer, then
  // the cross-replica group is rebuilt if its members changed. False (error()) when building it
  // failed: the step cannot commit. Throws QuorumError when no quorum comes.
  bool start_step(int64_t committed);
  const Quorum& quorum() const { return quorum_; }
  int64_t participants() const { return static_cast<int64_t>(quorum_.participants.size()); }
  // This replica takes the state of the quorum's source this step.
  bool recovering() const;
  // This replica gives its state to those recovering this step.
  bool is_source() const;
  // The source sends `tensors` (the same shapes and dtypes on every replica) and `blob` to every
  // recovering replica, which receives them in place (blob replaced). False on failure (the
  // receivers' tensors may be partly overwritten).
  bool transfer_state(const std::vector<at::Tensor>& tensors, std::string& blob);
  // Sum over the quorum divided by its size, in place; tensors of any floating dtype. False on
  // failure. With `contribute` false this replica adds zeros and keeps its tensors (it recovers
  // after the average, semi-synchronous training); `contributors` (-1: every participant) is then
  // the divisor.
  bool average(const std::vector<at::Tensor>& tensors, bool contribute = true,
               int64_t contributors = -1);
  // Participants that do not recover this round (semi-synchronous training averages over them).
  int64_t contributors() const;
  // True when `ok` on every rank of the replica group (collective over it).
  bool agree(bool ok);
  // Why the last false was returned.
  const std::string& error() const { return error_; }
  // "replica 1 (incarnation 123)".
  std::string describe() const;

  struct Heartbeat;

 private:
  bool fail(const std::string& what, const std::exception& e);

  ManagerOptions options_;
  dist::Group* group_;
  int64_t rank_ = 0;  // in the replica group
  int64_t incarnation_ = 0;
  std::string key_;  // "<replica_id>:<incarnation>"
  c10::intrusive_ptr<c10d::Store> store_;
  std::unique_ptr<Heartbeat> heartbeat_;
  int64_t seq_ = 0;
  bool fresh_ = true;
  bool group_broken_ = false;
  Quorum quorum_;
  int64_t group_quorum_id_ = -1;  // the quorum the cross-replica group was built for
  std::shared_ptr<dist::Group> replicas_;
  std::string error_;
};

// "host:port" from TITAN_FT_LIGHTHOUSE, else TORCHFT_LIGHTHOUSE (TorchFT's, "http://host:port"
// accepted); "" when neither is set.
std::string lighthouse_from_env();
// "host:port" -> (host, port); QuorumError naming the address when it is not that.
std::pair<std::string, int> split_lighthouse_address(const std::string& address);

}  // namespace titan::ft
