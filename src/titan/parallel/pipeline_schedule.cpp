// Actions, schedule names, stage placement, requirements and the table generators of the seven
// schedules. Each generator reproduces the per-rank order of PyTorch's
// _calculate_single_rank_operations / _get_pipeline_order (torch/distributed/pipelining/
// schedules.py), idle steps included, so that a table printed here reads like PyTorch's.
#include "titan/parallel/pipeline_schedule.h"

#include "titan/common/check.h"
#include "titan/common/names.h"

#include <algorithm>
#include <cctype>
#include <deque>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>
#include <utility>

namespace titan::pp {
namespace {

struct KindName {
  ActionKind kind;
  const char* name;
};
// Longest first among names sharing a prefix is not needed: parsing matches the whole suffix.
constexpr KindName kKindNames[] = {
    {ActionKind::kForward, "F"},
    {ActionKind::kFullBackward, "B"},
    {ActionKind::kBackwardInput, "I"},
    {ActionKind::kBackwardWeight, "W"},
    {ActionKind::kSendForward, "SEND_F"},
    {ActionKind::kRecvForward, "RECV_F"},
    {ActionKind::kSendBackward, "SEND_B"},
    {ActionKind::kRecvBackward, "RECV_B"},
    {ActionKind::kUnshard, "UNSHARD"},
    {ActionKind::kReshard, "RESHARD"},
    {ActionKind::kReduceGrad, "REDUCE_GRAD"},
    {ActionKind::kOverlapForwardBackward, "OVERLAP_F_B"},
};

std::string trim(const std::string& text) {
  size_t begin = 0;
  size_t end = text.size();
  while (begin < end && std::isspace(static_cast<unsigned char>(text[begin]))) ++begin;
  while (end > begin && std::isspace(static_cast<unsigned char>(text[end - 1]))) --end;
  return text.substr(begin, end - begin);
}

std::string lower(std::string text) {
  for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

// A plain action "<stage><KIND><microbatch?>", e.g. "12SEND_B3".
Action parse_plain_action(const std::string& text) {
  size_t i = 0;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) ++i;
  if (i == 0) throw std::invalid_argument("it does not start with a stage number");
  size_t j = text.size();
  while (j > i && std::isdigit(static_cast<unsigned char>(text[j - 1]))) --j;
  const std::string kind = text.substr(i, j - i);
  Action action;
  try {
    action.stage = std::stoll(text.substr(0, i));
    action.microbatch = j < text.size() ? std::stoll(text.substr(j)) : -1;
  } catch (const std::exception&) {
    action.stage = kMaxSchedulePairs;  // out of range below
  }
  if (action.stage >= kMaxSchedulePairs || action.microbatch >= kMaxSchedulePairs) {
    throw std::invalid_argument("its stage or microbatch number is above " +
                                std::to_string(kMaxSchedulePairs - 1));
  }
  bool known = false;
  for (const KindName& k : kKindNames) {
    if (kind == k.name && k.kind != ActionKind::kOverlapForwardBackward) {
      action.kind = k.kind;
      known = true;
    }
  }
  if (!known) throw std::invalid_argument("'" + kind + "' is not an action type");
  const bool needs_microbatch = is_compute(action.kind) || is_comm(action.kind);
  if (needs_microbatch && action.microbatch < 0) {
    throw std::invalid_argument(std::string(action_kind_name(action.kind)) +
                                " needs a microbatch number after it");
  }
  return action;
}

}  // namespace

const char* action_kind_name(ActionKind kind) {
  for (const KindName& k : kKindNames) {
    if (k.kind == kind) return k.name;
  }
  return "?";
}

bool is_compute(ActionKind kind) {
  return kind == ActionKind::kForward || kind == ActionKind::kFullBackward ||
         kind == ActionKind::kBackwardInput || kind == ActionKind::kBackwardWeight ||
         kind == ActionKind::kOverlapForwardBackward;
}

bool is_comm(ActionKind kind) {
  return kind == ActionKind::kSendForward || kind == ActionKind::kRecvForward ||
         kind == ActionKind::kSendBackward || kind == ActionKind::kRecvBackward;
}

std::string Action::str() const {
  if (kind == ActionKind::kOverlapForwardBackward) {
    std::string out = "(";
    for (size_t i = 0; i < sub_actions.size(); ++i) {
      out += (i > 0 ? ";" : "") + sub_actions[i].str();
    }
    return out + ")" + action_kind_name(kind);
  }
  std::string out = std::to_string(stage) + action_kind_name(kind);
  if (microbatch >= 0) out += std::to_string(microbatch);
  return out;
}

Slot parse_action(const std::string& raw) {
  const std::string text = trim(raw);
  if (text.empty()) return std::nullopt;
  if (text[0] != '(') return parse_plain_action(text);
  // "(0F1;3B0)OVERLAP_F_B": a forward and a backward run together.
  const size_t close = text.find(')');
  if (close == std::string::npos) throw std::invalid_argument("'(' without ')'");
  const std::string kind = text.substr(close + 1);
  if (kind != action_kind_name(ActionKind::kOverlapForwardBackward)) {
    throw std::invalid_argument("a parenthesised group must be followed by OVERLAP_F_B, not '" +
                                kind + "'");
  }
  Action action{/*stage=*/-1, ActionKind::kOverlapForwardBackward, /*microbatch=*/-1, {}};
  const std::string inner = text.substr(1, close - 1);
  size_t begin = 0;
  while (begin <= inner.size()) {
    size_t end = inner.find(';', begin);
    if (end == std::string::npos) end = inner.size();
    const std::string part = trim(inner.substr(begin, end - begin));
    if (!part.empty()) {
      Action sub = parse_plain_action(part);
      if (!is_compute(sub.kind)) {
        throw std::invalid_argument("OVERLAP_F_B holds compute actions only, not " + sub.str());
      }
      action.sub_actions.push_back(std::move(sub));
    }
    begin = end + 1;
  }
  if (action.sub_actions.empty()) throw std::invalid_argument("OVERLAP_F_B with no actions");
  return action;
}

// ---- Schedule names and placement -------------------------------------------------------------

namespace {

constexpr std::pair<ScheduleKind, const char*> kScheduleNames[] = {
    {ScheduleKind::k1F1B, "1F1B"},
    {ScheduleKind::kInterleaved1F1B, "Interleaved1F1B"},
    {ScheduleKind::kGPipe, "GPipe"},
    {ScheduleKind::kLoopedBFS, "LoopedBFS"},
    {ScheduleKind::kInterleavedZeroBubble, "InterleavedZeroBubble"},
    {ScheduleKind::kZBVZeroBubble, "ZBVZeroBubble"},
    {ScheduleKind::kDualPipeV, "DualPipeV"},
};

}  // namespace

ScheduleKind parse_schedule_kind(const std::string& name, const std::string& key) {
  for (const auto& [kind, spelled] : kScheduleNames) {
    if (lower(name) == lower(spelled)) return kind;
  }
  // The name it shortens or nearly spells, else the nearest by edit distance (on lower case),
  // reported in PyTorch's spelling: "zbv" -> ZBVZeroBubble, "1F1F" -> 1F1B.
  std::vector<std::string> lowered;
  for (const auto& [kind, spelled] : kScheduleNames) lowered.push_back(lower(spelled));
  std::string nearest = likely_name(lower(name), lowered);
  if (nearest.empty()) nearest = nearest_name(lower(name), lowered);
  std::string suggestion;
  for (const auto& [kind, spelled] : kScheduleNames) {
    if (lower(spelled) == nearest) suggestion = spelled;
  }
  std::string valid;
  for (const std::string& n : schedule_names()) valid += (valid.empty() ? "" : ", ") + n;
  throw ConfigError(message(key, " = \"", name, "\" is not a pipeline schedule",
                            did_you_mean(suggestion), " (valid, in any case: ", valid, ")"));
}

const char* schedule_name(ScheduleKind kind) {
  for (const auto& [k, spelled] : kScheduleNames) {
    if (k == kind) return spelled;
  }
  return "?";
}

std::vector<std::string> schedule_names() {
  std::vector<std::string> names;
  for (const auto& [kind, spelled] : kScheduleNames) names.emplace_back(spelled);
  return names;
}

bool is_single_stage(ScheduleKind kind) {
  return kind == ScheduleKind::kGPipe || kind == ScheduleKind::k1F1B;
}

StagePlacement placement_of(ScheduleKind kind) {
  const bool v = kind == ScheduleKind::kZBVZeroBubble || kind == ScheduleKind::kDualPipeV;
  return v ? StagePlacement::kV : StagePlacement::kLoop;
}

const char* placement_name(StagePlacement placement) {
  return placement == StagePlacement::kV ? "v" : "loop";
}

std::vector<int64_t> stage_to_rank(int64_t pp, int64_t stages_per_rank, StagePlacement placement) {
  TITAN_CHECK(pp >= 1 && stages_per_rank >= 1, "stage_to_rank: pp ", pp, " and stages_per_rank ",
              stages_per_rank, " must be >= 1");
  const int64_t n_stages = pp * stages_per_rank;
  std::vector<int64_t> ranks(n_stages);
  for (int64_t s = 0; s < n_stages; ++s) {
    const int64_t round = s / pp;   // which pass over the ranks
    const int64_t offset = s % pp;  // position within the pass
    // V: even passes go down the ranks, odd passes come back up.
    const bool up = placement == StagePlacement::kV && round % 2 == 1;
    ranks[s] = up ? pp - 1 - offset : offset;
  }
  return ranks;
}

std::vector<int64_t> rank_stages(int64_t rank, int64_t pp, int64_t stages_per_rank,
                                 StagePlacement placement) {
  const std::vector<int64_t> ranks = stage_to_rank(pp, stages_per_rank, placement);
  std::vector<int64_t> stages;
  for (int64_t s = 0; s < static_cast<int64_t>(ranks.size()); ++s) {
    if (ranks[s] == rank) stages.push_back(s);
  }
  return stages;
}

// ---- Requirements -------------------------------------------------------------------------------

void check_schedule_requirements(ScheduleKind kind, const ScheduleShape& shape) {
  const std::string name = schedule_name(kind);
  const int64_t p = shape.pp;
  const int64_t v = shape.stages_per_rank;
  const int64_t m = shape.n_microbatches;
  if (p < 1 || v < 1 || m < 1) {
    throw ConfigError(message(name, ": pp (", p, "), stages per rank (", v, ") and microbatches (",
                              m, ") must all be >= 1"));
  }
  // Bounded before any product is formed (each factor first, then the pairs).
  const double pairs = static_cast<double>(p) * static_cast<double>(v) * static_cast<double>(m);
  if (pairs > static_cast<double>(kMaxSchedulePairs)) {
    std::ostringstream os;
    os << name << ": pp " << p << " x " << v << " stages per rank x " << m
       << " microbatches = " << pairs << " (stage, microbatch) pairs, above the "
       << kMaxSchedulePairs
       << " a schedule may hold (a table that size takes minutes and gigabytes to build and "
          "check). HINT: fewer microbatches (a larger parallelism.pipeline_parallel_microbatch_size)"
          " or fewer stages per rank";
    throw ConfigError(os.str());
  }
  const std::string stages = std::to_string(p) + " ranks * " + std::to_string(v) +
                             " stages per rank = " + std::to_string(p * v) + " stages";
  if (is_single_stage(kind) && v != 1) {
    throw ConfigError(message(name, " runs one stage per rank, got ", v,
                              " stages per rank. HINT: use Interleaved1F1B, LoopedBFS or "
                              "InterleavedZeroBubble for several"));
  }
  if (placement_of(kind) == StagePlacement::kV && v != 2) {
    throw ConfigError(message(name, " runs exactly 2 stages per rank (V placement), got ", v));
  }
  if (kind == ScheduleKind::k1F1B && m < p) {
    throw ConfigError(message("1F1B needs at least as many microbatches as stages: ", m,
                              " microbatches < ", p,
                              " stages. HINT: raise training.local_batch_size or lower "
                              "parallelism.pipeline_parallel_microbatch_size"));
  }
  if (kind == ScheduleKind::kDualPipeV && m < p * v) {
    throw ConfigError(message("DualPipeV needs at least as many microbatches as stages: ", m,
                              " microbatches < ", stages));
  }
  if (kind == ScheduleKind::kInterleaved1F1B || kind == ScheduleKind::kInterleavedZeroBubble) {
    const int64_t rounds = std::max<int64_t>(1, m / p);
    if (m % rounds != 0) {
      throw ConfigError(message(
          name, " needs the microbatches to be a multiple of its rounds: rounds = ", "max(1, ", m,
          " microbatches / ", p, " ranks) = ", rounds, ", and ", m, " % ", rounds, " = ",
          m % rounds, ". HINT: use a multiple of ", p, " microbatches"));
    }
  }
}

// ---- Generators ---------------------------------------------------------------------------------

namespace {

Action make(int64_t stage, ActionKind kind, int64_t microbatch) {
  return Action{stage, kind, microbatch, {}};
}

void idle(std::vector<Slot>& ops, int64_t n) {
  for (int64_t i = 0; i < n; ++i) ops.emplace_back(std::nullopt);
}

// GPipe: all forwards, then all backwards (microbatch order), aligned by idle steps.
std::vector<Slot> gpipe_rank(int64_t rank, int64_t p, int64_t m) {
  std::vector<Slot> ops;
  idle(ops, rank);
  for (int64_t mb = 0; mb < m; ++mb) ops.emplace_back(make(rank, ActionKind::kForward, mb));
  idle(ops, 3 * (p - 1 - rank));
  for (int64_t mb = 0; mb < m; ++mb) ops.emplace_back(make(rank, ActionKind::kFullBackward, mb));
  return ops;
}

// 1F1B: p - rank forwards, then alternate backward / forward, then the remaining backwards — the
// order Schedule1F1B._step_microbatches runs. Idle steps as in PyTorch's _get_pipeline_order,
// whose last rank however starts its steady forwards at microbatch 1 (its counter is bumped
// before use when there is no warm-up forward); we number them from 0 as the runtime does.
std::vector<Slot> one_f_one_b_rank(int64_t rank, int64_t p, int64_t m) {
  std::vector<Slot> ops;
  idle(ops, rank);
  const int64_t warmup = p - 1 - rank;
  int64_t fwd = 0;
  for (; fwd < warmup; ++fwd) ops.emplace_back(make(rank, ActionKind::kForward, fwd));
  idle(ops, 2 * (p - 1 - rank));
  int64_t bwd = 0;
  for (; fwd < m; ++fwd, ++bwd) {
    ops.emplace_back(make(rank, ActionKind::kForward, fwd));
    ops.emplace_back(make(rank, ActionKind::kFullBackward, bwd));
  }
  for (; bwd < m; ++bwd) {
    idle(ops, 1);
    ops.emplace_back(make(rank, ActionKind::kFullBackward, bwd));
  }
  return ops;
}

// LoopedBFS: every microbatch through each local stage in turn (breadth first), then backwards
// through the local stages in reverse, microbatches in reverse.
std::vector<Slot> looped_bfs_rank(int64_t rank, const ScheduleShape& shape) {
  const int64_t p = shape.pp;
  std::vector<Slot> ops;
  idle(ops, rank);
  std::vector<int64_t> stages;
  for (int64_t s = rank; s < shape.n_stages(); s += p) stages.push_back(s);
  for (int64_t s : stages) {
    for (int64_t mb = 0; mb < shape.n_microbatches; ++mb) {
      ops.emplace_back(make(s, ActionKind::kForward, mb));
    }
  }
  idle(ops, 2 * (p - 1 - rank));
  for (auto s = stages.rbegin(); s != stages.rend(); ++s) {
    for (int64_t mb = shape.n_microbatches - 1; mb >= 0; --mb) {
      ops.emplace_back(make(*s, ActionKind::kFullBackward, mb));
    }
  }
  return ops;
}

// The warm-up forwards of the interleaved schedules: the last rank runs (stages_per_rank - 1)
// rounds, each rank before it `factor` more; capped at all of its forwards.
int64_t interleaved_warmup(int64_t rank, const ScheduleShape& shape, int64_t per_round,
                           int64_t factor) {
  const int64_t last = (shape.stages_per_rank - 1) * per_round;
  const int64_t warmup = last + factor * (shape.pp - 1 - rank);
  return std::min(warmup, shape.n_microbatches * shape.stages_per_rank);
}

// Interleaved 1F1B and its zero-bubble variant (PyTorch's _get_1f1b_rank_ops): warm-up forwards,
// then forward + backward pairs, then the remaining backwards; local stages change every
// `per_round` microbatches (forwards ascending, backwards descending). Zero bubble splits each
// backward into I and W, delaying the W of the first `rank` steady steps.
std::vector<Slot> interleaved_rank(int64_t rank, const ScheduleShape& shape, bool zero_bubble) {
  const int64_t p = shape.pp;
  const int64_t v = shape.stages_per_rank;
  const int64_t m = shape.n_microbatches;
  const int64_t rounds = std::max<int64_t>(1, m / p);
  const int64_t per_round = m / rounds;
  const int64_t warmup = interleaved_warmup(rank, shape, per_round, zero_bubble ? 1 : 2);
  const int64_t fwd_bwd = v * m - warmup;
  const int64_t cooldown = warmup;
  const int64_t total = warmup + fwd_bwd + cooldown;
  const int64_t steady_without_w = zero_bubble ? rank : 0;

  const auto forward_stage = [&](int64_t op) { return ((op / per_round) % v) * p + rank; };
  const auto backward_stage = [&](int64_t op) {
    return (v - 1 - ((op - warmup) / per_round) % v) * p + rank;
  };
  const ActionKind backward = zero_bubble ? ActionKind::kBackwardInput : ActionKind::kFullBackward;
  std::map<int64_t, int64_t> next_fwd, next_bwd, next_w;  // stage -> next microbatch

  std::vector<Slot> ops;
  idle(ops, rank);
  const int64_t post_warmup =
      zero_bubble ? p - rank - 1 : v * p + 2 * (p - 1 - rank) - warmup - rank;
  std::vector<int64_t> backward_ops;
  size_t weights_done = 0;
  const auto add_weight = [&]() {
    const int64_t s = backward_stage(backward_ops[weights_done++]);
    ops.emplace_back(make(s, ActionKind::kBackwardWeight, next_w[s]++));
  };
  const auto add_forward = [&](int64_t op) {
    const int64_t s = forward_stage(op);
    ops.emplace_back(make(s, ActionKind::kForward, next_fwd[s]++));
  };
  const auto add_backward = [&](int64_t op) {
    const int64_t s = backward_stage(op);
    ops.emplace_back(make(s, backward, next_bwd[s]++));
    backward_ops.push_back(op);
    if (zero_bubble && op - warmup >= steady_without_w) add_weight();
  };
  for (int64_t op = 0; op < total; ++op) {
    if (op < warmup) {
      add_forward(op);
      if (op == warmup - 1) idle(ops, post_warmup);
    } else if (op < warmup + fwd_bwd) {
      add_forward(op);
      add_backward(op);
    } else {
      if (!zero_bubble) idle(ops, 1);
      add_backward(op);
    }
  }
  while (zero_bubble && weights_done < backward_ops.size()) add_weight();
  return ops;
}

// PyTorch's ScheduleInterleavedZeroBubble._add_bubbles_to_actions: steps all ranks in lockstep and
// delays a forward (only forwards: the check for backwards looks for B, which zero bubble never
// emits) until the previous stage's forward ran in an earlier step.
ScheduleTable add_forward_bubbles(const ScheduleTable& actions) {
  const size_t n_ranks = actions.size();
  ScheduleTable result(n_ranks);
  std::vector<size_t> next(n_ranks, 0);
  std::set<std::pair<int64_t, int64_t>> forwarded;  // (stage, microbatch) seen in earlier steps
  while (true) {
    bool finished = true;
    bool advanced = false;
    std::vector<std::pair<int64_t, int64_t>> this_step;
    for (size_t r = 0; r < n_ranks; ++r) {
      if (next[r] >= actions[r].size()) continue;
      finished = false;
      const Slot& slot = actions[r][next[r]];
      const bool wait = slot && slot->kind == ActionKind::kForward && slot->stage != 0 &&
                        forwarded.count({slot->stage - 1, slot->microbatch}) == 0;
      if (wait) {
        result[r].emplace_back(std::nullopt);
        continue;
      }
      result[r].push_back(slot);
      if (slot && slot->kind == ActionKind::kForward) {
        this_step.emplace_back(slot->stage, slot->microbatch);
      }
      ++next[r];
      advanced = true;
    }
    forwarded.insert(this_step.begin(), this_step.end());
    if (finished) break;
    TITAN_CHECK(advanced, "InterleavedZeroBubble: a forward waits for one that never runs");
  }
  return result;
}

// ZBVZeroBubble (PyTorch's ScheduleZBVZeroBubble): rank r holds chunk 0 = stage r and chunk 1 =
// stage 2p - 1 - r. Generated for max(2p - 1, m) microbatches, then actions on microbatches >= m
// become idle steps.
std::vector<Slot> zbv_rank(int64_t rank, const ScheduleShape& shape) {
  const int64_t p = shape.pp;
  const int64_t m = shape.n_microbatches;
  const int64_t n_micro = std::max(2 * p - 1, m);
  const int64_t chunk0 = rank;
  const int64_t chunk1 = shape.n_stages() - 1 - rank;
  int64_t f0 = 0, f1 = 0, b0 = 0, b1 = 0;
  std::vector<Slot> ops;
  idle(ops, rank);
  const auto add = [&](int64_t stage, ActionKind kind, int64_t mb) {
    ops.emplace_back(make(stage, kind, mb));
  };
  for (int64_t i = 0; i < 2 * (p - rank) - 1; ++i) add(chunk0, ActionKind::kForward, f0++);
  for (int64_t i = 0; i < rank; ++i) {
    add(chunk1, ActionKind::kForward, f1++);
    add(chunk0, ActionKind::kForward, f0++);
  }
  for (int64_t i = 0; i < p - rank; ++i) {
    add(chunk1, ActionKind::kForward, f1++);
    add(chunk1, ActionKind::kBackwardInput, b1);
    add(chunk1, ActionKind::kBackwardWeight, b1++);
  }
  while (f1 < f0 || f0 < n_micro) {
    if (f0 < n_micro) add(chunk0, ActionKind::kForward, f0++);
    add(chunk0, ActionKind::kBackwardInput, b0);
    add(chunk0, ActionKind::kBackwardWeight, b0++);
    add(chunk1, ActionKind::kForward, f1++);
    add(chunk1, ActionKind::kBackwardInput, b1);
    add(chunk1, ActionKind::kBackwardWeight, b1++);
  }
  int64_t w0 = b0, w1 = b1;
  for (int64_t i = 0; i < rank; ++i) {
    add(chunk0, ActionKind::kBackwardInput, b0++);
    add(chunk1, ActionKind::kBackwardInput, b1++);
  }
  for (int64_t i = 0; i < p - rank; ++i) {
    add(chunk0, ActionKind::kBackwardInput, b0++);
    add(chunk0, ActionKind::kBackwardWeight, w0++);
  }
  while (w1 < b1) add(chunk1, ActionKind::kBackwardWeight, w1++);
  while (w0 < b0) add(chunk0, ActionKind::kBackwardWeight, w0++);
  TITAN_CHECK(w0 == b0 && b0 == f0 && w1 == b1 && b1 == f1, "ZBVZeroBubble rank ", rank,
              ": unbalanced counts");
  for (Slot& slot : ops) {
    if (slot && slot->microbatch >= m) slot.reset();
  }
  return ops;
}

// DualPipeV (PyTorch's ScheduleDualPipeV, after DeepSeek's DualPipe): eight phases per rank; the
// main one pairs the forward of one local stage with the backward of the other in OVERLAP_F_B.
// Microbatch numbers come from per-(stage, kind) counters; a B advances both the I and W counters;
// W steps pop the oldest pending I.
std::vector<Slot> dualpipev_rank(int64_t rank, const ScheduleShape& shape) {
  const int64_t p = shape.pp;
  const int64_t m = shape.n_microbatches;
  const int64_t stage0 = rank;
  const int64_t stage1 = 2 * p - 1 - rank;
  std::map<std::pair<int64_t, ActionKind>, int64_t> counter;
  std::deque<std::pair<int64_t, int64_t>> pending_weights;  // (stage, microbatch) after an I
  std::vector<Slot> ops;

  const auto count_backward = [&](int64_t stage) {
    ++counter[{stage, ActionKind::kBackwardInput}];
    ++counter[{stage, ActionKind::kBackwardWeight}];
  };
  const auto add = [&](int64_t stage, ActionKind kind) {
    const ActionKind key = kind == ActionKind::kFullBackward ? ActionKind::kBackwardInput : kind;
    const int64_t mb = counter[{stage, key}];
    ops.emplace_back(make(stage, kind, mb));
    if (kind == ActionKind::kFullBackward) {
      count_backward(stage);
      return;
    }
    if (kind == ActionKind::kBackwardInput) pending_weights.emplace_back(stage, mb);
    counter[{stage, key}] = mb + 1;
  };
  const auto add_overlap = [&](int64_t forward_stage, int64_t backward_stage) {
    const int64_t f = counter[{forward_stage, ActionKind::kForward}];
    const int64_t b = counter[{backward_stage, ActionKind::kBackwardInput}];
    Action overlap{/*stage=*/-1, ActionKind::kOverlapForwardBackward, /*microbatch=*/-1, {}};
    overlap.sub_actions = {make(forward_stage, ActionKind::kForward, f),
                           make(backward_stage, ActionKind::kFullBackward, b)};
    ops.emplace_back(std::move(overlap));
    counter[{forward_stage, ActionKind::kForward}] = f + 1;
    count_backward(backward_stage);
  };
  const auto add_pending_weight = [&]() {
    if (pending_weights.empty()) return;
    const auto [stage, mb] = pending_weights.front();
    pending_weights.pop_front();
    ops.emplace_back(make(stage, ActionKind::kBackwardWeight, mb));
    ++counter[{stage, ActionKind::kBackwardWeight}];
  };

  for (int64_t i = 0; i < 2 * (p - rank - 1); ++i) add(stage0, ActionKind::kForward);
  for (int64_t i = 0; i < rank + 1; ++i) {
    add(stage0, ActionKind::kForward);
    add(stage1, ActionKind::kForward);
  }
  for (int64_t i = 0; i < p - rank - 1; ++i) {
    add(stage1, ActionKind::kBackwardInput);
    add_pending_weight();
    add(stage1, ActionKind::kForward);
  }
  for (int64_t i = 0; i < m - 2 * p + rank + 1; ++i) {
    if (i == 0 && rank == p - 1) {  // not overlapped, to shrink the bubble
      add(stage0, ActionKind::kForward);
      add(stage1, ActionKind::kFullBackward);
    } else {
      add_overlap(stage0, stage1);
    }
    add_overlap(stage1, stage0);
  }
  for (int64_t i = 0; i < p - rank - 1; ++i) {
    add(stage1, ActionKind::kFullBackward);
    add_overlap(stage1, stage0);
  }
  // The second half of these backwards is split into I (+ a later W) to fill the bubble.
  bool split = false;
  const int64_t n6 = rank + 1;
  for (int64_t i = 0; i < n6; ++i) {
    if (i == n6 / 2 && rank % 2 == 1) split = true;
    add(stage1, split ? ActionKind::kBackwardInput : ActionKind::kFullBackward);
    if (i == n6 / 2 && rank % 2 == 0) split = true;
    add(stage0, split ? ActionKind::kBackwardInput : ActionKind::kFullBackward);
  }
  for (int64_t i = 0; i < p - rank - 1; ++i) {
    add_pending_weight();
    add(stage0, split ? ActionKind::kBackwardInput : ActionKind::kFullBackward);
  }
  for (int64_t i = 0; i < rank + 1; ++i) add_pending_weight();
  return ops;
}

}  // namespace

ScheduleTable generate_schedule(ScheduleKind kind, const ScheduleShape& shape) {
  check_schedule_requirements(kind, shape);
  ScheduleTable table;
  for (int64_t r = 0; r < shape.pp; ++r) {
    switch (kind) {
      case ScheduleKind::kGPipe:
        table.push_back(gpipe_rank(r, shape.pp, shape.n_microbatches));
        break;
      case ScheduleKind::k1F1B:
        table.push_back(one_f_one_b_rank(r, shape.pp, shape.n_microbatches));
        break;
      case ScheduleKind::kLoopedBFS: table.push_back(looped_bfs_rank(r, shape)); break;
      case ScheduleKind::kInterleaved1F1B:
        table.push_back(interleaved_rank(r, shape, /*zero_bubble=*/false));
        break;
      case ScheduleKind::kInterleavedZeroBubble:
        table.push_back(interleaved_rank(r, shape, /*zero_bubble=*/true));
        break;
      case ScheduleKind::kZBVZeroBubble: table.push_back(zbv_rank(r, shape)); break;
      case ScheduleKind::kDualPipeV: table.push_back(dualpipev_rank(r, shape)); break;
    }
  }
  if (kind == ScheduleKind::kInterleavedZeroBubble) table = add_forward_bubbles(table);
  return table;
}

}  // namespace titan::pp
