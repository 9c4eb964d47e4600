// The lighthouse: the small coordinator of fault-tolerant replica groups (`titan ft lighthouse`).
//
// It hosts a c10d TCPStore that every replica group reaches at one address (TITAN_FT_LIGHTHOUSE
// =host:port). Through it the replicas register, beat, ask for quorums and rendezvous their
// cross-replica process groups; a thread of the lighthouse reads the registrations, beats and
// requests every tick and answers with QuorumRules (quorum.h). The keys (ft_keys below) are the
// whole protocol, so a replica needs nothing but a store client.
//
//   ft::LighthouseOptions o;  o.port = 29510;  o.min_replicas = 1;
//   auto lighthouse = ft::Lighthouse::start(o);   // serves until stop() or destruction
//   ... lighthouse->port() ...; lighthouse->stop();
#pragma once

#include "titan/distributed/ft/quorum.h"

#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace titan::ft {

// The store keys of the protocol. A replica is "<replica_id>:<incarnation>".
namespace ft_keys {
// Appended "<replica>;" by each replica when it starts.
inline constexpr const char* kReplicas = "titan/ft/replicas";
// Counted up by the replica's heartbeat.
std::string beat(const std::string& replica);
// "<seq> <step> <fresh 0|1> <new_group 0|1>": the replica's latest request (seq counts up from 1;
// new_group: its cross-replica group broke, so the quorum takes a new id even with the same
// members).
std::string request(const std::string& replica);
// The quorum (Quorum::to_json) answering request `seq`.
std::string answer(const std::string& replica, int64_t seq);
// Set when the replica ends cleanly: it is dropped at once instead of after the heartbeat timeout.
std::string left(const std::string& replica);
// The prefix of quorum `quorum_id`'s process group of replica-group rank `rank`.
std::string process_group(int64_t quorum_id, int64_t rank);
}  // namespace ft_keys

struct LighthouseOptions {
  int port = 29510;  // on every interface; 0: any free port (see Lighthouse::port)
  int64_t min_replicas = 1;
  // How long a replica that was not in the last quorum is waited for (quorum.h).
  std::chrono::milliseconds join_timeout{1000};
  // A replica whose beat has not moved for this long is dead and leaves the quorum.
  std::chrono::milliseconds heartbeat_timeout{5000};
  // How often the requests and beats are read.
  std::chrono::milliseconds tick{5};
  // Each transition (a quorum with other members, a replica that stopped beating, one that
  // registered), as a line; null: log_info.
  std::function<void(const std::string&)> log;
};

class Lighthouse {
 public:
  // Hosts the store and starts the deciding thread. Throws std::runtime_error when the port
  // cannot be bound.
  static std::unique_ptr<Lighthouse> start(LighthouseOptions options);
  ~Lighthouse();
  Lighthouse(const Lighthouse&) = delete;
  Lighthouse& operator=(const Lighthouse&) = delete;

  int port() const;
  // Stops deciding (the store stays up until destruction).
  void stop();
  // Quorums announced so far (each change of members counts once).
  int64_t quorum_changes() const;

  struct State;

 private:
  explicit Lighthouse(std::shared_ptr<State> state);
  std::shared_ptr<State> state_;
};

}  // namespace titan::ft
