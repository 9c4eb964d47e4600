// The pipeline schedule simulator (see schedule_simulator.h).
#include "titan/plan/schedule_simulator.h"

#include "titan/common/check.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <numeric>
#include <set>
#include <string>
#include <tuple>

namespace titan::pp {
namespace {

// (stage, kind, microbatch). Names here are unique among the sources a unity batch may join
// (pipeline_schedule_table.cpp has its own key for the send/recv pass).
using SimKey = std::tuple<int64_t, ActionKind, int64_t>;
SimKey sim_key(const Action& a) { return {a.stage, a.kind, a.microbatch}; }

}  // namespace

double SimulationResult::bubble_fraction() const {
  if (busy.empty() || makespan <= 0) return 0;
  const double idle_sum = std::accumulate(idle.begin(), idle.end(), 0.0);
  return idle_sum / (static_cast<double>(busy.size()) * makespan);
}

namespace {

double cost_of(const Action& a, const ActionCosts& costs) {
  switch (a.kind) {
    case ActionKind::kForward: return costs.forward;
    case ActionKind::kFullBackward: return costs.full_backward;
    case ActionKind::kBackwardInput: return costs.backward_input;
    case ActionKind::kBackwardWeight: return costs.backward_weight;
    case ActionKind::kOverlapForwardBackward: {
      double sum = 0;
      for (const Action& sub : a.sub_actions) sum += cost_of(sub, costs);
      return sum;
    }
    default: return 0;
  }
}

// The state of a simulation: finish times of what has run, and who owns each stage. Times sit
// in a flat array over (stage, kind, microbatch), NaN until known: the planner simulates
// thousands of tables.
struct Simulator {
  const ScheduleTable& table;
  const ActionCosts& costs;
  std::map<int64_t, int64_t> owner;  // stage -> rank
  int64_t n_stages = 0;
  bool with_comms = false;
  // The kinds whose times are kept: F, B, I, W, SEND_F, RECV_F, SEND_B, RECV_B.
  static constexpr int64_t kKinds = static_cast<int64_t>(ActionKind::kRecvBackward) + 1;
  int64_t stage_bound = 0, microbatch_bound = 0;  // beyond the largest in the table
  std::vector<double> finished;                   // finish time (receives: arrival time)
  std::vector<uint8_t> posted;                    // receives posted (arrival may be unknown yet)
  std::vector<SimKey> pending;                    // posted receives whose arrival is unknown

  void size_for(const std::vector<std::vector<Action>>& todo) {
    const auto see = [&](const Action& a) {
      stage_bound = std::max(stage_bound, a.stage + 1);
      microbatch_bound = std::max(microbatch_bound, a.microbatch + 1);
    };
    for (const auto& rank : todo) {
      for (const Action& a : rank) {
        see(a);
        for (const Action& sub : a.sub_actions) see(sub);
      }
    }
    constexpr double kMaxEntries = 1 << 25;
    if (static_cast<double>(stage_bound) * static_cast<double>(microbatch_bound) * kKinds >
        kMaxEntries) {
      throw ConfigError(message("the pipeline schedule is too large to simulate: stages up to ",
                                stage_bound - 1, " and microbatches up to ", microbatch_bound - 1));
    }
    const size_t n = static_cast<size_t>(stage_bound * microbatch_bound * kKinds);
    finished.assign(n, std::numeric_limits<double>::quiet_NaN());
    posted.assign(n, 0);
  }

  // The slot of (stage, kind, microbatch), or -1 for what is not kept (FSDP bookkeeping).
  int64_t index(int64_t stage, ActionKind kind, int64_t mb) const {
    const auto k = static_cast<int64_t>(kind);
    if (stage < 0 || stage >= stage_bound || mb < 0 || mb >= microbatch_bound || k >= kKinds) {
      return -1;
    }
    return (stage * kKinds + k) * microbatch_bound + mb;
  }
  int64_t index(const SimKey& key) const {
    return index(std::get<0>(key), std::get<1>(key), std::get<2>(key));
  }

  std::optional<double> finish(int64_t stage, ActionKind kind, int64_t mb) const {
    const int64_t i = index(stage, kind, mb);
    if (i < 0 || std::isnan(finished[i])) return std::nullopt;
    return finished[i];
  }
  void record(const Action& a, double t) {
    const int64_t i = index(a.stage, a.kind, a.microbatch);
    if (i >= 0) finished[i] = t;
  }
  void post(const Action& a) {
    const int64_t i = index(a.stage, a.kind, a.microbatch);
    if (i < 0 || posted[i]) return;
    posted[i] = 1;
    pending.push_back(sim_key(a));
  }

  // When `a` (on `rank`) may start as far as its inputs go, or nullopt; with `waiting`, the
  // missing input is written there (names are built only then).
  std::optional<double> inputs_ready(const Action& a, int64_t rank, std::string* waiting) const {
    double t = 0;
    const auto need = [&](std::optional<double> when, const auto& what) {
      if (!when) {
        if (waiting != nullptr && waiting->empty()) *waiting = what();
        return false;
      }
      t = std::max(t, *when);
      return true;
    };
    const auto name = [](int64_t s, const char* k, int64_t mb) {
      return [=] { return std::to_string(s) + k + std::to_string(mb); };
    };
    const auto from_peer = [&](int64_t peer_stage, ActionKind recv_kind, int64_t stage,
                               std::optional<double> producer, const auto& what) {
      const auto it = owner.find(peer_stage);
      const bool same_rank = it != owner.end() && it->second == rank;
      if (same_rank) return need(producer, what);
      if (!with_comms) {
        return need(producer ? std::optional<double>(*producer + costs.comm) : std::nullopt, what);
      }
      const int64_t recv = index(stage, recv_kind, a.microbatch);
      const auto recv_name = name(stage, action_kind_name(recv_kind), a.microbatch);
      if (recv < 0 || !posted[recv]) {
        return need(std::nullopt,
                    [&] { return recv_name() + " (not posted on this rank before it)"; });
      }
      return need(std::isnan(finished[recv]) ? std::nullopt : std::optional<double>(finished[recv]),
                  [&] { return recv_name() + " (its send " + what() + " has not run)"; });
    };
    const int64_t s = a.stage;
    const int64_t mb = a.microbatch;
    switch (a.kind) {
      case ActionKind::kForward:
        if (s == 0) return t;
        if (!from_peer(s - 1, ActionKind::kRecvForward, s, finish(s - 1, ActionKind::kForward, mb),
                       name(s - 1, "F", mb))) {
          return std::nullopt;
        }
        return t;
      case ActionKind::kFullBackward:
      case ActionKind::kBackwardInput: {
        if (!need(finish(s, ActionKind::kForward, mb), name(s, "F", mb))) return std::nullopt;
        if (s == n_stages - 1) return t;
        std::optional<double> next = finish(s + 1, ActionKind::kFullBackward, mb);
        if (!next) next = finish(s + 1, ActionKind::kBackwardInput, mb);
        if (!from_peer(s + 1, ActionKind::kRecvBackward, s, next, name(s + 1, "B/I", mb))) {
          return std::nullopt;
        }
        return t;
      }
      case ActionKind::kBackwardWeight:
        if (!need(finish(s, ActionKind::kBackwardInput, mb), name(s, "I", mb))) return std::nullopt;
        return t;
      case ActionKind::kSendForward:
        if (!need(finish(s, ActionKind::kForward, mb), name(s, "F", mb))) return std::nullopt;
        return t;
      case ActionKind::kSendBackward: {
        std::optional<double> b = finish(s, ActionKind::kFullBackward, mb);
        if (!b) b = finish(s, ActionKind::kBackwardInput, mb);
        if (!need(b, name(s, "B/I", mb))) return std::nullopt;
        return t;
      }
      case ActionKind::kOverlapForwardBackward:
        for (const Action& sub : a.sub_actions) {
          const std::optional<double> ready = inputs_ready(sub, rank, waiting);
          if (!ready) return std::nullopt;
          t = std::max(t, *ready);
        }
        return t;
      default: return t;  // receives post without waiting; FSDP bookkeeping is free
    }
  }

  // Arrival times of receives whose sends have run.
  void settle_receives() {
    for (size_t i = 0; i < pending.size();) {
      const auto [stage, kind, mb] = pending[i];
      const bool fwd = kind == ActionKind::kRecvForward;
      const auto send = finish(fwd ? stage - 1 : stage + 1,
                               fwd ? ActionKind::kSendForward : ActionKind::kSendBackward, mb);
      if (!send) {
        ++i;
        continue;
      }
      finished[index(pending[i])] = *send + costs.comm;
      pending[i] = pending.back();
      pending.pop_back();
    }
  }
};

void record_owner(std::map<int64_t, int64_t>& owner, const Action& a, int64_t rank) {
  if (a.kind == ActionKind::kOverlapForwardBackward) {
    for (const Action& sub : a.sub_actions) record_owner(owner, sub, rank);
    return;
  }
  const auto [it, inserted] = owner.emplace(a.stage, rank);
  if (!inserted && it->second != rank) {
    throw ConfigError(message("stage ", a.stage, " appears on rank ", it->second, " and rank ",
                              rank, " of the pipeline schedule"));
  }
}

}  // namespace

SimulationResult simulate_schedule(const ScheduleTable& table, const ActionCosts& costs) {
  Simulator sim{table, costs};
  const int64_t n_ranks = static_cast<int64_t>(table.size());
  std::vector<std::vector<Action>> todo(n_ranks);
  for (int64_t r = 0; r < n_ranks; ++r) {
    for (const Slot& slot : table[r]) {
      if (!slot) continue;
      todo[r].push_back(*slot);
      if (is_comm(slot->kind)) sim.with_comms = true;
      if (slot->stage >= 0 || slot->kind == ActionKind::kOverlapForwardBackward) {
        record_owner(sim.owner, *slot, r);
      }
    }
  }
  for (const auto& [stage, rank] : sim.owner) sim.n_stages = std::max(sim.n_stages, stage + 1);
  sim.size_for(todo);

  SimulationResult result;
  result.busy.assign(n_ranks, 0);
  std::vector<double> clock(n_ranks, 0);
  std::vector<size_t> next(n_ranks, 0);
  while (true) {
    bool remaining = false;
    bool progress = false;
    for (int64_t r = 0; r < n_ranks; ++r) {
      while (next[r] < todo[r].size()) {
        const Action& a = todo[r][next[r]];
        const std::optional<double> ready = sim.inputs_ready(a, r, nullptr);
        if (!ready) break;
        const double start = std::max(clock[r], *ready);
        const double cost = cost_of(a, costs);
        clock[r] = start + cost;
        result.busy[r] += cost;
        ++result.n_actions;
        if (a.kind == ActionKind::kRecvForward || a.kind == ActionKind::kRecvBackward) {
          sim.post(a);
        } else if (a.kind == ActionKind::kOverlapForwardBackward) {
          for (const Action& sub : a.sub_actions) sim.record(sub, clock[r]);
        } else {
          sim.record(a, clock[r]);
        }
        sim.settle_receives();
        ++next[r];
        progress = true;
      }
      if (next[r] < todo[r].size()) remaining = true;
    }
    if (!remaining) break;
    if (!progress) {
      std::string stuck;
      for (int64_t r = 0; r < n_ranks; ++r) {
        if (next[r] >= todo[r].size()) continue;
        std::string waiting;
        sim.inputs_ready(todo[r][next[r]], r, &waiting);
        stuck += "\n  rank " + std::to_string(r) + ": " + todo[r][next[r]].str() + " (action " +
                 std::to_string(next[r]) + " of its table) waits for " + waiting;
      }
      throw ConfigError(
          message("the pipeline schedule deadlocks: every unfinished rank waits for an "
                  "input that no rank can produce",
                  stuck, "\n", format_schedule_table(table)));
    }
  }
  result.makespan = *std::max_element(clock.begin(), clock.end());
  for (int64_t r = 0; r < n_ranks; ++r) result.idle.push_back(result.makespan - result.busy[r]);
  return result;
}

}  // namespace titan::pp
