// Schedule tables as text and as a process: PyTorch's table printer and CSV format, validation of
// a loaded table, and the send/recv lowering pass (the simulator is plan/schedule_simulator).
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
  if (quoted) throw ConfigError(message(where, ": a quoted cell is not closed"));
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
      throw ConfigError(message(where, ": the schedule CSV holds more than ", kMaxScheduleCells,
                                " cells, more than any schedule titan can run"));
    }
    std::vector<Slot> rank;
    for (size_t col = 0; col < fields.size(); ++col) {
      try {
        rank.push_back(parse_action(fields[col]));
      } catch (const std::invalid_argument& e) {
        throw ConfigError(message(where, ", column ", col + 1, ": '", fields[col],
                                  "' is not a schedule action: ", e.what(),
                                  ". HINT: cells are [stage][F|B|I|W|SEND_F|RECV_F|SEND_B|RECV_B]"
                                  "[microbatch], e.g. 2F0, or empty for an idle step"));
      }
    }
    table.push_back(std::move(rank));
  }
  if (table.empty())
    throw ConfigError(message(origin, ": the schedule CSV has no rows (one per rank)"));
  return table;
}

ScheduleTable load_schedule_csv(const std::string& path) {
  const std::string kind = non_regular_file_kind(path);
  if (!kind.empty()) {
    throw ConfigError(
        message("the pipeline schedule CSV '", path, "' is ", kind, ", not a regular file"));
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
    throw ConfigError(message("the pipeline schedule has ", table.size(),
                              " ranks (rows), pipeline_parallel_degree is ", pp));
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
    throw ConfigError(
        message("the pipeline schedule has ", forwards, " forward actions, fewer than its ",
                n_stages, " stages or ", n_microbatches,
                " microbatches need (one forward of every microbatch on every stage)"));
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
        throw ConfigError(message(at, what, "\n", format_schedule_table(table, step)));
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
    if (owner[s] == -1) throw ConfigError(message("stage ", s, " never runs"));
    if (static_cast<int64_t>(f) != n_microbatches || i != w ||
        static_cast<int64_t>(b + i) != n_microbatches) {
      throw ConfigError(message(counts, "; every microbatch (", n_microbatches,
                                ") needs one F and one backward (B, or I and W)"));
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
        throw ConfigError(
            message("add_send_recv: the table already holds ", slot->str(), " on rank ", r));
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
      throw ConfigError(
          message("cannot place sends and receives: no rank's next action has its input", stuck,
                  "\n", format_schedule_table(compute)));
    }
  }
  return out;
}

}  // namespace titan::pp
