// Fault-tolerant replica groups (TorchFT's model): which replica groups take part in a step.
//
// Each replica group is an ordinary titan job; before every step its rank 0 asks the lighthouse
// (lighthouse.h) for a quorum, and the groups in it average their gradients over a process group
// of their own (manager.h). The lighthouse decides with QuorumRules from what it knows of every
// replica: whether it still beats, whether it is asking, and the step it has committed.
//
//   QuorumRules rules(/*min_replicas=*/1, /*join_timeout=*/1000ms);
//   std::optional<Quorum> q = rules.decide(views, previous, now, &why);   // nullopt: wait
//
// A quorum forms once at least min_replicas live replicas ask and every live member of the last
// quorum asks: a member is waited for until it asks or stops beating (going on without a live
// member could let it form a quorum of its own at the same step, and the replicas would part
// ways). A live replica that was not a member (one starting, or coming back) is waited for at
// most join_timeout after the oldest request; it joins at a later step. The quorum's id changes
// whenever its members change (a restarted replica is a new member: its incarnation differs),
// which is when the replicas rebuild their process group.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace titan::ft {

using Clock = std::chrono::steady_clock;

// One replica group in a quorum.
struct Participant {
  int64_t replica_id = 0;
  // Differs between two runs of the same replica id (a restart): a new member.
  int64_t incarnation = 0;
  // Steps it has committed; -1: its state is not valid (a recovery broke off).
  int64_t step = 0;
  // Has not been in a quorum since it started: it takes the state of a peer before training
  // (unless it is the one the others take it from).
  bool fresh = false;
};

struct Quorum {
  int64_t quorum_id = 0;
  std::vector<Participant> participants;  // by replica id, increasing

  int64_t max_step() const;
  // Position of `replica_id` among the participants, or -1.
  int index_of(int64_t replica_id) const;
  // Where replicas that recover take the state from: the lowest replica id at max_step that is
  // not fresh, else the lowest at max_step (every member fresh: the start of a job).
  int source_index() const;
  // Whether participant i must take the state of source_index() before this step: it is behind,
  // or fresh and not the source.
  bool recovers(int i) const;
  bool same_members(const Quorum& other) const;
  // "replicas 0 (step 12), 1 (step 12)"
  std::string describe() const;
  std::string to_json() const;
  // Throws std::runtime_error naming what is malformed.
  static Quorum from_json(const std::string& text);
};

// What the lighthouse knows of a replica when it decides.
struct ReplicaView {
  Participant self;
  bool alive = false;   // beat within the heartbeat timeout, and has not left
  bool asking = false;  // has a request that is not answered yet
  Clock::time_point asked_at{};
  // Its cross-replica group broke: the quorum takes a new id even if its members stay.
  bool new_group = false;
};

class QuorumRules {
 public:
  QuorumRules(int64_t min_replicas, std::chrono::milliseconds join_timeout);

  // The quorum to announce to every participant now, or nullopt (then `why_waiting`, if given,
  // says what it waits for). `previous`: the last quorum announced (nullptr: none yet); the id
  // stays when the members are the same.
  std::optional<Quorum> decide(const std::vector<ReplicaView>& replicas, const Quorum* previous,
                               Clock::time_point now, std::string* why_waiting = nullptr) const;

  int64_t min_replicas() const { return min_replicas_; }

 private:
  int64_t min_replicas_;
  std::chrono::milliseconds join_timeout_;
};

}  // namespace titan::ft
