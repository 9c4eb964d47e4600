// The quorum rules of the lighthouse and the quorum's wire form (see quorum.h).
#include "titan/distributed/ft/quorum.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <sstream>
#include <stdexcept>

namespace titan::ft {

int64_t Quorum::max_step() const {
  int64_t best = -1;
  for (const Participant& p : participants) best = std::max(best, p.step);
  return best;
}

int Quorum::index_of(int64_t replica_id) const {
  for (size_t i = 0; i < participants.size(); ++i) {
    if (participants[i].replica_id == replica_id) return static_cast<int>(i);
  }
  return -1;
}

int Quorum::source_index() const {
  const int64_t best = max_step();
  int fallback = -1;
  for (size_t i = 0; i < participants.size(); ++i) {
    if (participants[i].step != best) continue;
    if (!participants[i].fresh) return static_cast<int>(i);
    if (fallback < 0) fallback = static_cast<int>(i);
  }
  return fallback;
}

bool Quorum::recovers(int i) const {
  const Participant& p = participants.at(static_cast<size_t>(i));
  return p.step < max_step() || (p.fresh && i != source_index());
}

bool Quorum::same_members(const Quorum& other) const {
  if (participants.size() != other.participants.size()) return false;
  for (size_t i = 0; i < participants.size(); ++i) {
    if (participants[i].replica_id != other.participants[i].replica_id ||
        participants[i].incarnation != other.participants[i].incarnation) {
      return false;
    }
  }
  return true;
}

std::string Quorum::describe() const {
  std::ostringstream os;
  os << (participants.size() == 1 ? "replica " : "replicas ");
  for (size_t i = 0; i < participants.size(); ++i) {
    os << (i ? ", " : "") << participants[i].replica_id << " (step " << participants[i].step
       << (participants[i].fresh ? ", new" : "") << ")";
  }
  return os.str();
}

std::string Quorum::to_json() const {
  nlohmann::json j;
  j["quorum_id"] = quorum_id;
  j["participants"] = nlohmann::json::array();
  for (const Participant& p : participants) {
    j["participants"].push_back({{"replica_id", p.replica_id},
                                 {"incarnation", p.incarnation},
                                 {"step", p.step},
                                 {"fresh", p.fresh}});
  }
  return j.dump();
}

Quorum Quorum::from_json(const std::string& text) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("quorum_id") || !j["quorum_id"].is_number_integer() ||
      !j.contains("participants") || !j["participants"].is_array()) {
    throw std::runtime_error("malformed quorum from the lighthouse: '" + text.substr(0, 200) + "'");
  }
  Quorum q;
  q.quorum_id = j["quorum_id"].get<int64_t>();
  for (const nlohmann::json& p : j["participants"]) {
    const bool ok = p.is_object() && p.contains("replica_id") &&
                    p["replica_id"].is_number_integer() && p.contains("incarnation") &&
                    p["incarnation"].is_number_integer() && p.contains("step") &&
                    p["step"].is_number_integer() && p.contains("fresh") && p["fresh"].is_boolean();
    if (!ok) {
      throw std::runtime_error("malformed participant in the quorum from the lighthouse: '" +
                               p.dump().substr(0, 200) + "'");
    }
    q.participants.push_back({p["replica_id"].get<int64_t>(), p["incarnation"].get<int64_t>(),
                              p["step"].get<int64_t>(), p["fresh"].get<bool>()});
  }
  return q;
}

QuorumRules::QuorumRules(int64_t min_replicas, std::chrono::milliseconds join_timeout)
    : min_replicas_(min_replicas), join_timeout_(join_timeout) {
  if (min_replicas < 1) throw std::invalid_argument("min_replicas must be >= 1");
}

std::optional<Quorum> QuorumRules::decide(const std::vector<ReplicaView>& replicas,
                                          const Quorum* previous, Clock::time_point now,
                                          std::string* why_waiting) const {
  const auto in_previous = [previous](const Participant& p) {
    if (previous == nullptr) return false;
    for (const Participant& m : previous->participants) {
      if (m.replica_id == p.replica_id && m.incarnation == p.incarnation) return true;
    }
    return false;
  };
  std::vector<const ReplicaView*> asking;
  std::vector<int64_t> members_silent, newcomers_silent;
  Clock::time_point oldest = now;
  for (const ReplicaView& r : replicas) {
    if (!r.alive) continue;
    if (r.asking) {
      asking.push_back(&r);
      oldest = std::min(oldest, r.asked_at);
    } else if (in_previous(r.self)) {
      members_silent.push_back(r.self.replica_id);
    } else {
      newcomers_silent.push_back(r.self.replica_id);
    }
  }
  const auto names = [](const std::vector<int64_t>& ids) {
    std::string out = ids.size() > 1 ? "replicas " : "replica ";
    for (size_t i = 0; i < ids.size(); ++i) out += (i ? ", " : "") + std::to_string(ids[i]);
    return out;
  };
  const auto say = [&](const std::string& text) {
    if (why_waiting != nullptr) *why_waiting = text;
    return std::nullopt;
  };
  if (static_cast<int64_t>(asking.size()) < min_replicas_) {
    return say(std::to_string(asking.size()) + " of min_replicas " + std::to_string(min_replicas_) +
               " live replicas asking");
  }
  // A live member of the last quorum is waited for until it asks or stops beating: going on
  // without it could let it form a quorum of its own at the same step, and the replicas would
  // part ways.
  if (!members_silent.empty()) {
    return say("waiting for " + names(members_silent) + " of the last quorum");
  }
  if (!newcomers_silent.empty() && now - oldest < join_timeout_) {
    return say("waiting up to the join timeout for " + names(newcomers_silent));
  }
  Quorum q;
  bool new_group = false;
  for (const ReplicaView* r : asking) {
    q.participants.push_back(r->self);
    new_group = new_group || r->new_group;
  }
  std::sort(q.participants.begin(), q.participants.end(),
            [](const Participant& a, const Participant& b) { return a.replica_id < b.replica_id; });
  q.quorum_id = previous == nullptr ? 1 : previous->quorum_id;
  if (previous != nullptr && (new_group || !q.same_members(*previous))) ++q.quorum_id;
  return q;
}

}  // namespace titan::ft
