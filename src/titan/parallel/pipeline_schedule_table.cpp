// Schedule tables as text and as a process: PyTorch's table printer and CSV format, validation of
// a loaded table, the send/recv lowering pass, and the dependency-driven simulator.
#include "titan/common/check.h"
#include "titan/common/file_io.h"
#include "titan/parallel/pipeline_schedule.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <numeric>
#include <set>
#include <sstream>
#include <stdexcept>
#include <tuple>

namespace titan::pp {
namespace {

std::string cell_text(const Slot& slot) { return slot ? slot->str() : std::string(); }

std::string pad(const std::string& text, size_t width) {
  return text.size() >= width ? text : text + std::string(width - text.size(), ' ');
}

}  // namespace

// ---- Printing -------------------------------------------------------------------------------

std::string format_schedule_table(const ScheduleTable& table, std::optional<int64_t> error_step) {
  size_t n_steps = 0;
  for (const auto& rank : table) n_steps = std::max(n_steps, rank.size());
  if (table.empty() || n_steps == 0) return "(empty schedule)\n";
  const size_t digits = std::to_string(n_steps - 1).size();
  std::vector<std::string> labels;
  for (size_t i = 0; i < n_steps; ++i) {
    const std::string number = std::to_string(i);
    labels.push_back("Step " + std::string(digits - number.size(), '0') + number);
  }
  // Column r is as wide as its widest cell and as step label r: PyTorch zips the step labels
  // with the rank columns, so the "Rank r" headers do not count.
  std::vector<size_t> width(table.size(), 0);
  for (size_t r = 0; r < table.size(); ++r) {
    if (r < labels.size()) width[r] = labels[r].size();
    for (const Slot& slot : table[r]) width[r] = std::max(width[r], cell_text(slot).size());
  }
  std::string out(labels[0].size() + 2, ' ');
  for (size_t r = 0; r < table.size(); ++r) {
    out += (r > 0 ? " " : "") + pad("Rank " + std::to_string(r), width[r]);
  }
  out += "\n";
  for (size_t step = 0; step < n_steps; ++step) {
    out += labels[step] + ": ";
    for (size_t r = 0; r < table.size(); ++r) {
      const Slot none;
      const Slot& slot = step < table[r].size() ? table[r][step] : none;
      out += (r > 0 ? " " : "") + pad(cell_text(slot), width[r]);
    }
    if (error_step && *error_step == static_cast<int64_t>(step)) out += " <-- ERROR HERE";
    out += "\n";
  }
  return out;
}

// ---- CSV ----------------------------------------------------------------------------------------

std::string dump_schedule_csv(const ScheduleTable& table) {
  std::string out;
  for (const auto& rank : table) {
    // Python's csv.writer writes a row of one empty field as "" to tell it from an empty row.
    if (rank.size() == 1 && !rank[0]) {
      out += "\"\"\r\n";
      continue;
    }
    for (size_t i = 0; i < rank.size(); ++i) out += (i > 0 ? "," : "") + cell_text(rank[i]);
    out += "\r\n";
  }
  return out;
}

namespace {

// Splits one CSV line into fields (double-quoted fields may hold commas and "" for a quote).
std::vector<std::string> split_csv_line(const std::string& line, const std::string& where) {
  std::vector<std::string> fields;
  if (line.empty()) return fields;  // an empty row: a rank with no actions
  std::string field;
  bool quoted = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quoted) {
      if (c != '"') {
        field += c;
      } else if (i + 1 < line.size() && line[i + 1] == '"') {
        field += '"';
        ++i;
      } else {
        quoted = false;
      }
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      fields.push_back(field);
      field.clear();
    } else {
      field += c;
    }
  }
  if (quoted) throw ConfigError(where + ": a quoted cell is not closed");
  fields.push_back(field);
  return fields;
}

}  // namespace

ScheduleTable parse_schedule_csv(const std::string& text, const std::string& origin) {
  ScheduleTable table;
  std::istringstream lines(text);
  std::string line;
  int64_t cells = 0;
  while (std::getline(lines, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    const size_t row = table.size() + 1;
    const std::string where =
        origin + ": row " + std::to_string(row) + " (rank " + std::to_string(row - 1) + ")";
    const std::vector<std::string> fields = split_csv_line(line, where);
    cells += static_cast<int64_t>(fields.size());
    if (cells > kMaxScheduleCells) {
      throw ConfigError(where + ": the schedule CSV holds more than " +
                        std::to_string(kMaxScheduleCells) +
                        " cells, more than any schedule titan can run");
    }
    std::vector<Slot> rank;
    for (size_t col = 0; col < fields.size(); ++col) {
      try {
        rank.push_back(parse_action(fields[col]));
      } catch (const std::invalid_argument& e) {
        throw ConfigError(where + ", column " + std::to_string(col + 1) + ": '" + fields[col] +
                          "' is not a schedule action: " + e.what() +
                          ". HINT: cells are [stage][F|B|I|W|SEND_F|RECV_F|SEND_B|RECV_B]"
                          "[microbatch], e.g. 2F0, or empty for an idle step");
      }
    }
    table.push_back(std::move(rank));
  }
  if (table.empty()) throw ConfigError(origin + ": the schedule CSV has no rows (one per rank)");
  return table;
}

ScheduleTable load_schedule_csv(const std::string& path) {
  const std::string kind = non_regular_file_kind(path);
  if (!kind.empty()) {
    throw ConfigError("the pipeline schedule CSV '" + path + "' is " + kind +
                      ", not a regular file");
  }
  return parse_schedule_csv(read_regular_file(path, "pipeline schedule CSV"), path);
}

// ---- Validation ---------------------------------------------------------------------------------

TableExtent table_extent(const ScheduleTable& table) {
  TableExtent e;
  for (const auto& rank : table) {
    for (const Slot& slot : rank) {
      if (!slot) continue;
      const std::vector<Action> parts =
          slot->sub_actions.empty() ? std::vector<Action>{*slot} : slot->sub_actions;
      for (const Action& a : parts) {
        e.n_stages = std::max(e.n_stages, a.stage + 1);
        e.n_microbatches = std::max(e.n_microbatches, a.microbatch + 1);
      }
    }
  }
  return e;
}

std::vector<int64_t> validate_schedule_table(const ScheduleTable& table, int64_t pp,
                                             int64_t n_stages, int64_t n_microbatches) {
  if (static_cast<int64_t>(table.size()) != pp) {
    throw ConfigError("the pipeline schedule has " + std::to_string(table.size()) +
                      " ranks (rows), pipeline_parallel_degree is " + std::to_string(pp));
  }
  // Every stage runs a forward of every microbatch: a table of fewer forwards cannot be one
  // (and the bookkeeping below is sized by the counts, which must not come from a stray number).
  int64_t forwards = 0;
  for (const auto& rank : table) {
    for (const Slot& slot : rank) {
      if (!slot) continue;
      if (slot->kind == ActionKind::kForward) ++forwards;
      for (const Action& a : slot->sub_actions) forwards += a.kind == ActionKind::kForward;
    }
  }
  if (n_stages < 1 || n_microbatches < 1 || n_stages > forwards || n_microbatches > forwards) {
    throw ConfigError("the pipeline schedule has " + std::to_string(forwards) +
                      " forward actions, fewer than its " + std::to_string(n_stages) +
                      " stages or " + std::to_string(n_microbatches) +
                      " microbatches need (one forward of every microbatch on every stage)");
  }
  std::vector<int64_t> owner(n_stages, -1);
  // done[kind][stage] = microbatches seen so far
  std::map<ActionKind, std::vector<std::set<int64_t>>> done;
  for (ActionKind k : {ActionKind::kForward, ActionKind::kFullBackward, ActionKind::kBackwardInput,
                       ActionKind::kBackwardWeight}) {
    done[k].resize(n_stages);
  }
  for (int64_t r = 0; r < pp; ++r) {
    for (size_t step = 0; step < table[r].size(); ++step) {
      if (!table[r][step]) continue;
      const std::string at = "rank " + std::to_string(r) + ", step " + std::to_string(step) + ": ";
      const auto fail = [&](const std::string& what) {
        throw ConfigError(at + what + "\n" + format_schedule_table(table, step));
      };
      const Action& outer = *table[r][step];
      const std::vector<Action> actions = outer.kind == ActionKind::kOverlapForwardBackward
                                              ? outer.sub_actions
                                              : std::vector<Action>{outer};
      for (const Action& a : actions) {
        if (a.stage < 0 || a.stage >= n_stages) {
          fail(a.str() + " names stage " + std::to_string(a.stage) + " of " +
               std::to_string(n_stages) + " stages");
        }
        if (owner[a.stage] == -1) owner[a.stage] = r;
        if (owner[a.stage] != r) {
          fail("stage " + std::to_string(a.stage) + " is on rank " +
               std::to_string(owner[a.stage]) + " and rank " + std::to_string(r));
        }
        if (!is_compute(a.kind)) continue;
        if (a.microbatch >= n_microbatches) {
          fail(a.str() + " names microbatch " + std::to_string(a.microbatch) + " of " +
               std::to_string(n_microbatches));
        }
        auto& seen = done[a.kind][a.stage];
        if (seen.count(a.microbatch)) fail(a.str() + " appears twice");
        const bool backward =
            a.kind == ActionKind::kFullBackward || a.kind == ActionKind::kBackwardInput;
        if (backward && done[ActionKind::kForward][a.stage].count(a.microbatch) == 0) {
          fail(a.str() + " runs before its forward " + std::to_string(a.stage) + "F" +
               std::to_string(a.microbatch));
        }
        if (a.kind == ActionKind::kBackwardWeight &&
            done[ActionKind::kBackwardInput][a.stage].count(a.microbatch) == 0) {
          fail(a.str() + " runs before its backward input " + std::to_string(a.stage) + "I" +
               std::to_string(a.microbatch));
        }
        seen.insert(a.microbatch);
      }
    }
  }
  for (int64_t s = 0; s < n_stages; ++s) {
    const size_t f = done[ActionKind::kForward][s].size();
    const size_t b = done[ActionKind::kFullBackward][s].size();
    const size_t i = done[ActionKind::kBackwardInput][s].size();
    const size_t w = done[ActionKind::kBackwardWeight][s].size();
    const std::string counts = "stage " + std::to_string(s) + " has F=" + std::to_string(f) +
                               " B=" + std::to_string(b) + " I=" + std::to_string(i) +
                               " W=" + std::to_string(w);
    if (owner[s] == -1) throw ConfigError("stage " + std::to_string(s) + " never runs");
    if (static_cast<int64_t>(f) != n_microbatches || i != w ||
        static_cast<int64_t>(b + i) != n_microbatches) {
      throw ConfigError(counts + "; every microbatch (" + std::to_string(n_microbatches) +
                        ") needs one F and one backward (B, or I and W)");
    }
  }
  return owner;
}

// ---- Send / recv lowering -----------------------------------------------------------------------

namespace {

using Key = std::tuple<int64_t, ActionKind, int64_t>;  // (stage, kind, microbatch)
Key key_of(const Action& a) { return {a.stage, a.kind, a.microbatch}; }

}  // namespace

ScheduleTable add_send_recv(const ScheduleTable& compute, const std::vector<int64_t>& stage_rank) {
  const int64_t n_stages = static_cast<int64_t>(stage_rank.size());
  const auto rank_of = [&](int64_t stage) {
    TITAN_CHECK(stage >= 0 && stage < n_stages, "add_send_recv: stage ", stage, " of ", n_stages);
    return stage_rank[stage];
  };
  // The peer stage an action's output goes to, when that is on another rank.
  const auto needs_comm = [&](const Action& a) {
    if (a.kind == ActionKind::kForward) {
      return a.stage != n_stages - 1 && rank_of(a.stage + 1) != rank_of(a.stage);
    }
    if (a.kind == ActionKind::kFullBackward || a.kind == ActionKind::kBackwardInput) {
      return a.stage != 0 && rank_of(a.stage - 1) != rank_of(a.stage);
    }
    return false;
  };
  const size_t n_ranks = compute.size();
  std::vector<std::vector<Action>> todo(n_ranks);
  for (size_t r = 0; r < n_ranks; ++r) {
    for (const Slot& slot : compute[r]) {
      if (!slot) continue;
      if (is_comm(slot->kind)) {
        throw ConfigError("add_send_recv: the table already holds " + slot->str() + " on rank " +
                          std::to_string(r));
      }
      todo[r].push_back(*slot);
    }
  }
  std::vector<std::set<Key>> seen(n_ranks);
  // A rank does not place its own receives: the sender does, so a compute waits until its input's
  // receive (or, on the same rank, its producer) is already in the rank's list.
  const auto ready = [&](const Action& a, size_t r) {
    const std::set<Key>& prev = seen[r];
    if (a.kind == ActionKind::kForward && a.stage != 0) {
      return prev.count({a.stage, ActionKind::kRecvForward, a.microbatch}) > 0 ||
             prev.count({a.stage - 1, ActionKind::kForward, a.microbatch}) > 0;
    }
    const bool backward =
        a.kind == ActionKind::kFullBackward || a.kind == ActionKind::kBackwardInput;
    if (backward && a.stage != n_stages - 1) {
      return prev.count({a.stage, ActionKind::kRecvBackward, a.microbatch}) > 0 ||
             prev.count({a.stage + 1, ActionKind::kBackwardInput, a.microbatch}) > 0 ||
             prev.count({a.stage + 1, ActionKind::kFullBackward, a.microbatch}) > 0;
    }
    return true;
  };
  ScheduleTable out(n_ranks);
  std::vector<size_t> next(n_ranks, 0);
  while (true) {
    bool remaining = false;
    bool progress = false;
    for (size_t r = 0; r < n_ranks; ++r) {
      if (next[r] >= todo[r].size()) continue;
      remaining = true;
      const Action& action = todo[r][next[r]];
      const std::vector<Action> parts = action.kind == ActionKind::kOverlapForwardBackward
                                            ? action.sub_actions
                                            : std::vector<Action>{action};
      if (!std::all_of(parts.begin(), parts.end(), [&](const Action& a) { return ready(a, r); })) {
        continue;
      }
      out[r].emplace_back(action);
      for (const Action& a : parts) {
        seen[r].insert(key_of(a));
        if (!needs_comm(a)) continue;
        const bool fwd = a.kind == ActionKind::kForward;
        const Action send{
            a.stage, fwd ? ActionKind::kSendForward : ActionKind::kSendBackward, a.microbatch, {}};
        const Action recv{fwd ? a.stage + 1 : a.stage - 1,
                          fwd ? ActionKind::kRecvForward : ActionKind::kRecvBackward,
                          a.microbatch,
                          {}};
        out[r].emplace_back(send);
        seen[r].insert(key_of(send));
        const size_t peer = static_cast<size_t>(rank_of(recv.stage));
        out[peer].emplace_back(recv);
        seen[peer].insert(key_of(recv));
      }
      ++next[r];
      progress = true;
    }
    if (!remaining) break;
    if (!progress) {
      std::string stuck;
      for (size_t r = 0; r < n_ranks; ++r) {
        if (next[r] < todo[r].size()) {
          stuck += "\n  rank " + std::to_string(r) + " waits at " + todo[r][next[r]].str();
        }
      }
      throw ConfigError("cannot place sends and receives: no rank's next action has its input" +
                        stuck + "\n" + format_schedule_table(compute));
    }
  }
  return out;
}

// ---- Simulation ---------------------------------------------------------------------------------

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
  std::vector<Key> pending;                       // posted receives whose arrival is unknown

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
      throw ConfigError("the pipeline schedule is too large to simulate: stages up to " +
                        std::to_string(stage_bound - 1) + " and microbatches up to " +
                        std::to_string(microbatch_bound - 1));
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
  int64_t index(const Key& key) const {
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
    pending.push_back(key_of(a));
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
    throw ConfigError("stage " + std::to_string(a.stage) + " appears on rank " +
                      std::to_string(it->second) + " and rank " + std::to_string(rank) +
                      " of the pipeline schedule");
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
          "the pipeline schedule deadlocks: every unfinished rank waits for an "
          "input that no rank can produce" +
          stuck + "\n" + format_schedule_table(table));
    }
  }
  result.makespan = *std::max_element(clock.begin(), clock.end());
  for (int64_t r = 0; r < n_ranks; ++r) result.idle.push_back(result.makespan - result.busy[r]);
  return result;
}

}  // namespace titan::pp
