// The point-to-point messages of a schedule table, rank by rank in the order they are posted, and
// the check that every pair of ranks agrees on that order (NCCL pairs a sender's k-th send to a
// peer with the peer's k-th receive from it, whatever the tags say).
#include "titan/common/check.h"
#include "titan/parallel/pipeline_schedule.h"

#include <algorithm>
#include <map>
#include <utility>

namespace titan::pp {

std::string Transfer::message() const {
  const std::string mb = ", microbatch " + std::to_string(microbatch);
  if (gradient) {
    return "the gradient of stage " + std::to_string(boundary + 1) + "'s input for stage " +
           std::to_string(boundary) + mb;
  }
  return "the activation of stage " + std::to_string(boundary) + " for stage " +
         std::to_string(boundary + 1) + mb;
}

namespace {

// The transfers one action posts, in the runtime's order (PipelineRuntime::forward / backward:
// the receive before the compute, the send after it).
void append_transfers(const Action& a, int64_t step, const std::vector<int64_t>& stage_rank,
                      bool explicit_comms, std::vector<Transfer>& out) {
  const int64_t n_stages = static_cast<int64_t>(stage_rank.size());
  // A table from a CSV may send past the last stage or before the first: its error, not a crash.
  const auto rank_of = [&](int64_t stage) {
    if (stage < 0 || stage >= n_stages) {
      throw ConfigError(message("pipeline schedule: ", a.str(), " at step ", step,
                                " reaches stage ", stage, ", but the stages are 0 to ",
                                n_stages - 1));
    }
    return stage_rank[stage];
  };
  const auto add = [&](bool send, int64_t peer_stage, bool gradient, int64_t boundary) {
    Transfer t;
    t.send = send;
    t.peer = rank_of(peer_stage);
    t.gradient = gradient;
    t.boundary = boundary;
    t.microbatch = a.microbatch;
    t.step = step;
    t.action = a;
    out.push_back(std::move(t));
  };
  const int64_t s = a.stage;
  if (explicit_comms) {
    switch (a.kind) {
      case ActionKind::kSendForward: add(true, s + 1, false, s); break;
      case ActionKind::kRecvForward: add(false, s - 1, false, s - 1); break;
      case ActionKind::kSendBackward: add(true, s - 1, true, s - 1); break;
      case ActionKind::kRecvBackward: add(false, s + 1, true, s); break;
      default: break;
    }
    return;
  }
  const auto crosses = [&](int64_t other) {
    return other >= 0 && other < n_stages && rank_of(other) != rank_of(s);
  };
  switch (a.kind) {
    case ActionKind::kForward:
      if (crosses(s - 1)) add(false, s - 1, false, s - 1);
      if (crosses(s + 1)) add(true, s + 1, false, s);
      break;
    case ActionKind::kFullBackward:
    case ActionKind::kBackwardInput:
      if (crosses(s + 1)) add(false, s + 1, true, s);
      if (crosses(s - 1)) add(true, s - 1, true, s - 1);
      break;
    case ActionKind::kOverlapForwardBackward:
      for (const Action& sub : a.sub_actions) {
        append_transfers(sub, step, stage_rank, explicit_comms, out);
      }
      break;
    default: break;
  }
}

bool has_comms(const ScheduleTable& table) {
  for (const auto& row : table) {
    for (const Slot& slot : row) {
      if (slot && is_comm(slot->kind)) return true;
    }
  }
  return false;
}

std::string ordinal(size_t i) {
  const size_t n = i + 1;
  const char* suffix = (n % 100 >= 11 && n % 100 <= 13) ? "th"
                       : n % 10 == 1                    ? "st"
                       : n % 10 == 2                    ? "nd"
                       : n % 10 == 3                    ? "rd"
                                                        : "th";
  return std::to_string(n) + suffix;
}

std::string posted_by(const Transfer& t) {
  return t.action.str() + " at step " + std::to_string(t.step);
}

}  // namespace

namespace {

// A rank's transfers in the order its actions need them: sends after their compute, receives
// before the compute that uses them (or as written, for explicit SEND / RECV actions).
std::vector<Transfer> transfers_in_use_order(const ScheduleTable& table, int64_t rank,
                                             const std::vector<int64_t>& stage_rank,
                                             bool explicit_comms) {
  std::vector<Transfer> out;
  const auto& row = table[rank];
  for (size_t step = 0; step < row.size(); ++step) {
    if (row[step]) {
      append_transfers(*row[step], static_cast<int64_t>(step), stage_rank, explicit_comms, out);
    }
  }
  return out;
}

bool same_message(const Transfer& a, const Transfer& b) {
  return a.gradient == b.gradient && a.boundary == b.boundary && a.microbatch == b.microbatch;
}

}  // namespace

std::vector<Transfer> rank_transfers(const ScheduleTable& table, int64_t rank,
                                     const std::vector<int64_t>& stage_rank) {
  const int64_t n_ranks = static_cast<int64_t>(table.size());
  TITAN_CHECK(rank >= 0 && rank < n_ranks, "pipeline schedule: rank ", rank, " of ", n_ranks);
  const bool explicit_comms = has_comms(table);
  std::vector<Transfer> uses = transfers_in_use_order(table, rank, stage_rank, explicit_comms);
  if (explicit_comms) return uses;
  // The runtime receives from each peer in the peer's send order: a receive first takes what the
  // peer sent before the message it needs (kept until used).
  std::map<int64_t, std::vector<Transfer>> incoming;  // peer -> its sends to `rank`, in order
  std::map<int64_t, size_t> next;                     // peer -> sends received so far
  for (int64_t peer = 0; peer < n_ranks; ++peer) {
    if (peer == rank) continue;
    for (Transfer& t : transfers_in_use_order(table, peer, stage_rank, false)) {
      if (t.send && t.peer == rank) incoming[peer].push_back(std::move(t));
    }
  }
  std::vector<Transfer> out;
  std::vector<Transfer> early;  // received before the action that uses it
  for (Transfer& use : uses) {
    if (use.send) {
      out.push_back(std::move(use));
      continue;
    }
    const auto kept = std::find_if(early.begin(), early.end(),
                                   [&](const Transfer& t) { return same_message(t, use); });
    if (kept != early.end()) {
      early.erase(kept);
      continue;
    }
    const std::vector<Transfer>& sent = incoming[use.peer];
    size_t& i = next[use.peer];
    const auto found = std::find_if(sent.begin() + static_cast<std::ptrdiff_t>(i), sent.end(),
                                    [&](const Transfer& t) { return same_message(t, use); });
    if (found == sent.end()) {  // nothing the peer sends: left for check_transfer_order to name
      out.push_back(std::move(use));
      continue;
    }
    for (; sent.begin() + static_cast<std::ptrdiff_t>(i) != found; ++i) {
      Transfer ahead = sent[i];  // posted by `use`'s action, ahead of its own message
      ahead.send = false;
      ahead.peer = use.peer;
      ahead.step = use.step;
      ahead.action = use.action;
      early.push_back(ahead);
      out.push_back(std::move(ahead));
    }
    ++i;
    out.push_back(std::move(use));
  }
  return out;
}

void check_transfer_order(const ScheduleTable& table, const std::vector<int64_t>& stage_rank) {
  const int64_t n_ranks = static_cast<int64_t>(table.size());
  // (sender, receiver) -> the sender's sends to the receiver / the receiver's receives from it.
  std::map<std::pair<int64_t, int64_t>, std::vector<Transfer>> sends, recvs;
  for (int64_t r = 0; r < n_ranks; ++r) {
    for (Transfer& t : rank_transfers(table, r, stage_rank)) {
      if (t.send) {
        sends[{r, t.peer}].push_back(std::move(t));
      } else {
        recvs[{t.peer, r}].push_back(std::move(t));
      }
    }
  }
  const std::string why =
      ". NCCL pairs a rank's sends to a peer with the peer's receives from it in the order both "
      "post them, not by tag, so these would get each other's data (or hang). HINT: order the "
      "receiving rank's actions as the sender sends, or the sender's as the receiver receives\n";
  std::map<std::pair<int64_t, int64_t>, bool> pairs;
  for (const auto& [key, list] : sends) pairs[key] = true;
  for (const auto& [key, list] : recvs) pairs[key] = true;
  for (const auto& [key, unused] : pairs) {
    const auto [src, dst] = key;
    const std::vector<Transfer>& s = sends[key];
    const std::vector<Transfer>& r = recvs[key];
    const std::string ranks = "rank " + std::to_string(src) + " and rank " + std::to_string(dst);
    for (size_t i = 0; i < std::min(s.size(), r.size()); ++i) {
      if (same_message(s[i], r[i])) continue;
      throw ConfigError(message("pipeline schedule: ", ranks,
                                " post their point-to-point messages in different orders: rank ",
                                src, "'s ", ordinal(i), " send to rank ", dst, " is ",
                                s[i].message(), " (", posted_by(s[i]), "), but rank ", dst, "'s ",
                                ordinal(i), " receive from rank ", src, " is for ", r[i].message(),
                                " (", posted_by(r[i]), ")", why, format_schedule_table(table)));
    }
    if (s.size() != r.size()) {
      const bool more_sends = s.size() > r.size();
      const Transfer& extra = more_sends ? s[r.size()] : r[s.size()];
      throw ConfigError(message(
          "pipeline schedule: rank ", src, " sends ", s.size(), " messages to rank ", dst,
          ", which receives ", r.size(), " from it; the ", ordinal(std::min(s.size(), r.size())),
          ", ", extra.message(), " (", posted_by(extra), "), has no ",
          (more_sends ? "receive" : "send"), "\n", format_schedule_table(table)));
    }
  }
}

}  // namespace titan::pp
