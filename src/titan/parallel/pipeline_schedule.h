// Pipeline schedules as data, with PyTorch's semantics (torch.distributed.pipelining.schedules):
// a schedule is a table of actions per pp rank — forward (F), full backward (B), backward for
// inputs (I) and for weights (W) of the zero-bubble schedules, sends and receives — generated for
// GPipe, 1F1B, Interleaved1F1B, LoopedBFS, InterleavedZeroBubble, ZBVZeroBubble and DualPipeV,
// or loaded from a CSV in PyTorch's text format ("2F0" = stage 2, forward, microbatch 0; one row
// per rank; empty cells are idle steps). One runtime runs any table; this file holds the pure,
// communication-free half: names, stage placement, the generators, each schedule's requirements
// on the microbatch count (errors show the arithmetic), the send/recv lowering pass, the table
// printer of PyTorch's _format_pipeline_order, and the
// point-to-point messages each rank posts, with the check that every pair of ranks posts them in
// one order (NCCL matches by order). The simulator that runs a table to find deadlocks and
// its bubble is planning: plan/schedule_simulator.h.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace titan::pp {

// PyTorch's _ComputationType, spelled as in its CSV: F, B, I, W, SEND_F, RECV_F, SEND_B, RECV_B;
// UNSHARD, RESHARD and REDUCE_GRAD (FSDP bookkeeping in PyTorch's dumped tables, no microbatch)
// and OVERLAP_F_B (DualPipeV's forward of one stage overlapped with the backward of another).
enum class ActionKind {
  kForward,
  kFullBackward,
  kBackwardInput,
  kBackwardWeight,
  kSendForward,
  kRecvForward,
  kSendBackward,
  kRecvBackward,
  kUnshard,
  kReshard,
  kReduceGrad,
  kOverlapForwardBackward,
};

// The CSV spelling of a kind ("F", "SEND_F", "OVERLAP_F_B", ...).
const char* action_kind_name(ActionKind kind);
bool is_compute(ActionKind kind);  // F, B, I, W, OVERLAP_F_B
bool is_comm(ActionKind kind);     // SEND_* / RECV_*

struct Action {
  int64_t stage = 0;  // -1 for OVERLAP_F_B, whose stages are in sub_actions
  ActionKind kind = ActionKind::kForward;
  int64_t microbatch = -1;          // -1: none (UNSHARD, RESHARD, REDUCE_GRAD, OVERLAP_F_B)
  std::vector<Action> sub_actions;  // OVERLAP_F_B only: (forward, backward)

  // PyTorch's text: "2F0", "1SEND_B3", "0UNSHARD", "(0F1;3B0)OVERLAP_F_B".
  std::string str() const;
  bool operator==(const Action& other) const = default;
};

// A cell of a table: an action, or nullopt for an idle step.
using Slot = std::optional<Action>;
// table[rank][step]; ranks may have different lengths.
using ScheduleTable = std::vector<std::vector<Slot>>;

// Parses PyTorch's action text ("2F0"); an empty or all-blank string is an idle step. Throws
// std::invalid_argument with the reason on anything else.
Slot parse_action(const std::string& text);

enum class ScheduleKind {
  kGPipe,
  k1F1B,
  kInterleaved1F1B,
  kLoopedBFS,
  kInterleavedZeroBubble,
  kZBVZeroBubble,
  kDualPipeV,
};

// The schedule named `name`, case-insensitively as PyTorch's get_schedule_class. Throws
// ConfigError naming `key` and the nearest valid name otherwise.
ScheduleKind parse_schedule_kind(const std::string& name,
                                 const std::string& key = "parallelism.pipeline_parallel_schedule");
const char* schedule_name(ScheduleKind kind);  // "GPipe", "1F1B", ...
std::vector<std::string> schedule_names();     // every valid name, PyTorch's spelling
// GPipe and 1F1B run one stage per rank (PyTorch's PipelineScheduleSingle); the others any number
// (ZBVZeroBubble and DualPipeV exactly two).
bool is_single_stage(ScheduleKind kind);

// Which rank holds which stage. Loop: stage s on rank s % pp (rank r holds r, r + pp, ...).
// V (ZBVZeroBubble, DualPipeV): stages zig-zag down and back up, so with two stages per rank rank
// r holds r and 2 * pp - 1 - r, and the first and last stages share rank 0.
enum class StagePlacement { kLoop, kV };
StagePlacement placement_of(ScheduleKind kind);
const char* placement_name(StagePlacement placement);  // "loop" / "v"
// stage -> rank for pp * stages_per_rank stages.
std::vector<int64_t> stage_to_rank(int64_t pp, int64_t stages_per_rank, StagePlacement placement);
// The stages rank `rank` holds, ascending.
std::vector<int64_t> rank_stages(int64_t rank, int64_t pp, int64_t stages_per_rank,
                                 StagePlacement placement);

// The largest schedules built or read: (stage, microbatch) pairs per table, and stage or
// microbatch numbers in a table (a large real run, pp 64 x 8 stages per rank x 512 microbatches,
// has 262,144 pairs). Beyond them a table takes minutes and gigabytes to build, check and print.
constexpr int64_t kMaxSchedulePairs = int64_t{1} << 20;
constexpr int64_t kMaxScheduleCells = int64_t{1} << 23;  // cells of a schedule CSV

struct ScheduleShape {
  int64_t pp = 1;               // pipeline ranks
  int64_t stages_per_rank = 1;  // virtual stages per rank
  int64_t n_microbatches = 1;
  int64_t n_stages() const { return pp * stages_per_rank; }
};

// Throws ConfigError, with the arithmetic, when `kind` cannot run `shape`: GPipe / 1F1B need one
// stage per rank, 1F1B at least as many microbatches as stages, Interleaved1F1B and
// InterleavedZeroBubble a microbatch count that is a multiple of its rounds
// (max(1, n_microbatches / pp)), ZBVZeroBubble and DualPipeV two stages per rank, DualPipeV at
// least as many microbatches as stages; and every shape at most kMaxSchedulePairs stages x
// microbatches.
void check_schedule_requirements(ScheduleKind kind, const ScheduleShape& shape);

// The compute-only table of `kind` (F, B, I, W, OVERLAP_F_B and the idle steps PyTorch's
// generators insert to align ranks), equal to PyTorch's pipeline_order for the same arguments,
// except 1F1B's last rank, which PyTorch labels from microbatch 1 (see the .cpp); ours is the
// order Schedule1F1B executes. Checks the requirements first.
ScheduleTable generate_schedule(ScheduleKind kind, const ScheduleShape& shape);

// PyTorch's _add_send_recv: lowers a compute-only table (idle steps dropped) to one with SEND_F /
// RECV_F / SEND_B / RECV_B where neighbouring stages sit on different ranks; each send follows its
// compute, the matching receive is placed on the peer when the sender is scheduled. `stage_rank`
// maps stage -> rank. Throws ConfigError when the table cannot be lowered (a cycle).
ScheduleTable add_send_recv(const ScheduleTable& compute, const std::vector<int64_t>& stage_rank);

// PyTorch's _format_pipeline_order: steps as rows, ranks as columns, "Step 07:" labels, columns
// padded to their widest cell; `error_step` appends " <-- ERROR HERE" to that row.
std::string format_schedule_table(const ScheduleTable& table,
                                  std::optional<int64_t> error_step = std::nullopt);

// PyTorch's _dump_csv text (Python's csv.writer): one row per rank, cells "2F0" or empty for idle
// steps, "\r\n" line ends.
std::string dump_schedule_csv(const ScheduleTable& table);
// Reads such a text (quoted cells, "\n" or "\r\n"); `origin` names the file in errors. Throws
// ConfigError naming row (rank + 1) and column of a bad cell.
ScheduleTable parse_schedule_csv(const std::string& text, const std::string& origin);
// parse_schedule_csv of a file; ConfigError when it cannot be read.
ScheduleTable load_schedule_csv(const std::string& path);

// The stages and microbatches a table names: the largest stage and microbatch number + 1 (0
// when it names none), over every action, overlapped pairs included.
struct TableExtent {
  int64_t n_stages = 0;
  int64_t n_microbatches = 0;
};
TableExtent table_extent(const ScheduleTable& table);

// PyTorch's _validate_schedule, stricter: `pp` ranks; each stage on one rank only; per stage
// every microbatch forwarded once, backward once (B, or I and W), F before its B / I, I before its
// W. Returns stage -> rank. Throws ConfigError naming rank and step.
std::vector<int64_t> validate_schedule_table(const ScheduleTable& table, int64_t pp,
                                             int64_t n_stages, int64_t n_microbatches);

// A point-to-point message a rank posts while it runs its row of a table: what PipelineRuntime
// does for a compute-only table (F(s, m) uses stage s - 1's activation from its rank, then sends
// its own to stage s + 1's rank; B / I(s, m) use the gradient of s's output from stage s + 1's
// rank, then send the gradient of s's input to stage s - 1's rank; nothing between stages of one
// rank), or the explicit SEND_* / RECV_* of a table that holds them.
struct Transfer {
  bool send = false;      // else a receive
  int64_t peer = 0;       // the rank on the other side
  bool gradient = false;  // else an activation
  int64_t boundary = 0;   // between stages boundary and boundary + 1
  int64_t microbatch = 0;
  int64_t step = 0;  // the column of the action that posts it
  Action action;     // that action
  // "the activation of stage 0 for stage 1, microbatch 2" / "the gradient of stage 1's input for
  // stage 0, microbatch 2"
  std::string message() const;
};

// Rank `rank`'s transfers in the order it posts them. `stage_rank`: stage -> rank. Sends follow
// their compute. Receives of a compute-only table are posted as the runtime posts them: in each
// peer's send order, an action that needs a message first receiving whatever that peer sent
// before it (kept until its own action runs); an explicit table's are its RECV actions, in order.
std::vector<Transfer> rank_transfers(const ScheduleTable& table, int64_t rank,
                                     const std::vector<int64_t>& stage_rank);

// NCCL matches a pair of ranks' sends and receives in the order they are posted, not by tag, so
// a table in which rank a sends to rank b in another order than b receives from a would hand
// each receive another message's data (or hang when the sizes differ). Throws ConfigError naming
// the two ranks, the first pair of messages that disagree, their actions and steps, and the
// table, unless every ordered pair of ranks posts the same messages in the same order (as
// rank_transfers lists them). Compute-only tables pass whenever each message used is one its
// peer sends (the runtime receives in the sender's order); an explicit table whose receives are
// written in another order than the sends, or a message without its counterpart, is refused.
void check_transfer_order(const ScheduleTable& table, const std::vector<int64_t>& stage_rank);

}  // namespace titan::pp
