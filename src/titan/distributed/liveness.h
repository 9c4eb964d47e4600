// Heartbeats through the job's store, so that a failed collective can say who is unreachable.
//
// A collective that times out only knows that its peers did not answer. Across hosts the common
// cause is a host whose network went away (or whose processes were stopped): its ranks stop
// beating, while ranks that are merely stuck in another collective go on beating. Every rank
// counts a store key up once a second from a background thread (on its own store connection, so
// it never queues behind the training thread's store calls). When a collective fails, the failing
// rank reads its peers' counters twice, a few beats apart, and names the silent ranks with the
// host they registered; when it cannot reach the store at all, the store's host (rank 0's node)
// is the one it has lost.
//
//   auto liveness = dist::Liveness::start(store, rank, world, "node 1, 10.0.0.2",
//   "10.0.0.1:29500"); options.diagnose = liveness->diagnoser();   // Group::State::fail appends
//   what it says
#pragma once

#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace titan::dist {

// Set (once, compareSet) by a node's `titan run` when it stops the job, e.g. "node 1 (host gpu7):
// rank 3 (pid 812) was killed by SIGKILL"; every rank's heartbeat reads it, so the ranks of the
// other nodes end within a beat instead of at their next collective's timeout.
inline constexpr const char* kJobStoppedKey = "titan/job/stopped";
// The words of the line a rank logs when it ends because of that key; a `titan run` that sees
// them from its own rank knows the job was stopped elsewhere and does not announce it again.
inline constexpr const char* kJobStoppedBy = "the job was stopped by ";

// Says which of the given world ranks look unreachable from here ("" when they all beat).
using Diagnoser = std::function<std::string(const std::vector<int>& world_ranks)>;

class Liveness {
 public:
  struct Options {
    // One beat per interval; a rank is silent when its count has not moved for kSilentBeats.
    std::chrono::milliseconds interval{1000};
    // "10.0.0.1:29500": where the store lives, for the message when it cannot be reached.
    std::string store_address;
    // Called once, on the heartbeat thread, when kJobStoppedKey appears (with its text); null:
    // the key is not read.
    std::function<void(const std::string& why)> on_job_stopped;
  };
  static constexpr int kSilentBeats = 2;

  // Publishes where this rank runs ("node 1, 10.0.0.2"), beats once synchronously (so every
  // rank's counter exists once all have started) and starts the heartbeat thread. The store is
  // cloned twice (a connection for the beats, one for the diagnosis); `store` itself is not used
  // afterwards.
  static std::shared_ptr<Liveness> start(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                         int world_size, const std::string& where, Options options);
  ~Liveness();
  Liveness(const Liveness&) = delete;
  Liveness& operator=(const Liveness&) = delete;

  // Stops the heartbeat (at most one interval's wait; a beat stuck on a lost store is left to
  // finish on its own). Ranks still running see this rank as silent afterwards.
  void stop();

  // What the silent ranks among `world_ranks` (this rank excluded) are and where they run, e.g.
  // "no heartbeat from ranks 2, 3 (node 1, 10.0.0.2) for 2.0 s: ...", or a sentence saying the
  // store itself did not answer; "" when every rank beats. Takes about kSilentBeats + 1
  // intervals; never longer than `budget` (then it blames the store).
  std::string diagnose(const std::vector<int>& world_ranks, std::chrono::milliseconds budget);
  // diagnose() with a budget of kSilentBeats + 2 intervals, as GroupOptions::diagnose wants it.
  Diagnoser diagnoser();

  int rank() const;

  struct State;  // shared with the threads, which may outlive this object

 private:
  explicit Liveness(std::shared_ptr<State> state);
  std::shared_ptr<State> state_;
};

}  // namespace titan::dist
