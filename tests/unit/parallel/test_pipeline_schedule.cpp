// Pipeline schedules as data: for every schedule and several (pp, stages per rank, microbatches)
// each stage's forward and backward of each microbatch runs exactly once on the rank that owns
// the stage, and the table runs to the end under its data dependencies; small tables match
// PyTorch's order cell by cell; CSV text round-trips and reads PyTorch's dumps; the send/recv
// pass; the requirement errors show their arithmetic. (The simulator's own tests are
// tests/unit/plan/test_schedule_simulator.cpp.)
#include "../test_util.h"
#include "titan/common/check.h"
#include "titan/parallel/pipeline_schedule.h"
#include "titan/plan/schedule_simulator.h"

#include <gtest/gtest.h>

#include <map>
#include <set>

namespace titan::pp {
namespace test_pipeline_schedule {

using test::contains;
using test::message_of;

// A table written as PyTorch prints it: one string per cell, "" for idle.
ScheduleTable table_of(const std::vector<std::vector<std::string>>& cells) {
  ScheduleTable table;
  for (const auto& rank : cells) {
    std::vector<Slot> row;
    for (const std::string& cell : rank) row.push_back(parse_action(cell));
    table.push_back(row);
  }
  return table;
}

std::vector<std::vector<std::string>> cells_of(const ScheduleTable& table) {
  std::vector<std::vector<std::string>> cells;
  for (const auto& rank : table) {
    std::vector<std::string> row;
    for (const Slot& slot : rank) row.push_back(slot ? slot->str() : "");
    cells.push_back(row);
  }
  return cells;
}

// Every F / backward of every (stage, microbatch) once, on the stage's rank by the placement.
void expect_complete(ScheduleKind kind, const ScheduleShape& shape, const ScheduleTable& table) {
  const std::string what = std::string(schedule_name(kind)) + " pp " + std::to_string(shape.pp) +
                           " v " + std::to_string(shape.stages_per_rank) + " m " +
                           std::to_string(shape.n_microbatches);
  const std::vector<int64_t> owner =
      validate_schedule_table(table, shape.pp, shape.n_stages(), shape.n_microbatches);
  EXPECT_EQ(owner, stage_to_rank(shape.pp, shape.stages_per_rank, placement_of(kind))) << what;
  std::map<std::tuple<int64_t, ActionKind, int64_t>, int> count;
  for (const auto& rank : table) {
    for (const Slot& slot : rank) {
      if (!slot) continue;
      const std::vector<Action> parts =
          slot->sub_actions.empty() ? std::vector<Action>{*slot} : slot->sub_actions;
      for (const Action& a : parts) ++count[{a.stage, a.kind, a.microbatch}];
    }
  }
  for (int64_t s = 0; s < shape.n_stages(); ++s) {
    for (int64_t mb = 0; mb < shape.n_microbatches; ++mb) {
      EXPECT_EQ((count[{s, ActionKind::kForward, mb}]), 1)
          << what << " stage " << s << " mb " << mb;
      const int full = count[{s, ActionKind::kFullBackward, mb}];
      const int input = count[{s, ActionKind::kBackwardInput, mb}];
      const int weight = count[{s, ActionKind::kBackwardWeight, mb}];
      EXPECT_TRUE((full == 1 && input == 0 && weight == 0) ||
                  (full == 0 && input == 1 && weight == 1))
          << what << " stage " << s << " mb " << mb << ": B " << full << " I " << input << " W "
          << weight;
    }
  }
}

struct Case {
  ScheduleKind kind;
  int64_t pp, per_rank, m;
};

std::vector<Case> all_cases() {
  std::vector<Case> cases;
  for (int64_t p : {1, 2, 3, 4, 8}) {
    for (int64_t m : {1, 2, 3, 4, 5, 8, 12, 16}) {
      for (ScheduleKind kind :
           {ScheduleKind::kGPipe, ScheduleKind::k1F1B, ScheduleKind::kInterleaved1F1B,
            ScheduleKind::kLoopedBFS, ScheduleKind::kInterleavedZeroBubble,
            ScheduleKind::kZBVZeroBubble, ScheduleKind::kDualPipeV}) {
        std::vector<int64_t> per_rank = {1};
        if (!is_single_stage(kind)) per_rank = {2};
        if (kind == ScheduleKind::kInterleaved1F1B || kind == ScheduleKind::kLoopedBFS ||
            kind == ScheduleKind::kInterleavedZeroBubble) {
          per_rank = {1, 2, 3};
        }
        for (int64_t v : per_rank) cases.push_back({kind, p, v, m});
      }
    }
  }
  return cases;
}

TEST(PipelineSchedule, EverySchedulesRunsEachStageMicrobatchOnceWithoutDeadlock) {
  int64_t generated = 0;
  for (const Case& c : all_cases()) {
    const ScheduleShape shape{c.pp, c.per_rank, c.m};
    if (!message_of([&] { check_schedule_requirements(c.kind, shape); }).empty()) continue;
    const ScheduleTable table = generate_schedule(c.kind, shape);
    expect_complete(c.kind, shape, table);
    const SimulationResult sim = simulate_schedule(table);
    ASSERT_EQ(static_cast<int64_t>(sim.busy.size()), c.pp);
    EXPECT_GT(sim.makespan, 0);
    // Lowered with sends and receives it still runs, in the same time when transfers are free.
    const ScheduleTable comms =
        add_send_recv(table, stage_to_rank(c.pp, c.per_rank, placement_of(c.kind)));
    const SimulationResult sim_comms = simulate_schedule(comms);
    EXPECT_DOUBLE_EQ(sim_comms.makespan, sim.makespan) << schedule_name(c.kind) << " pp " << c.pp;
    ++generated;
  }
  EXPECT_GT(generated, 200);
}

// NCCL pairs messages by order: every generated table as the runtime runs it, and its PyTorch
// lowering with explicit sends and receives, posts each pair of ranks' messages in one order;
// and the check sees them all (each boundary between stages on different ranks carries 2
// messages per microbatch). Some schedules (zero bubble, DualPipeV) use messages in another
// order than they are sent: their receives are posted ahead (counted).
// Whether `a` is the action that uses the received message `t` (else it posted `t` ahead of its
// use, receiving in the sender's order).
bool uses(const Action& a, const Transfer& t) {
  const std::vector<Action> parts = a.sub_actions.empty() ? std::vector<Action>{a} : a.sub_actions;
  for (const Action& p : parts) {
    const bool kind =
        t.gradient ? p.kind == ActionKind::kFullBackward || p.kind == ActionKind::kBackwardInput
                   : p.kind == ActionKind::kForward;
    const int64_t stage = t.gradient ? t.boundary : t.boundary + 1;
    if (kind && p.stage == stage && p.microbatch == t.microbatch) return true;
  }
  return false;
}

TEST(PipelineSchedule, EveryScheduleOrdersEachPairsMessagesAlike) {
  int64_t checked = 0, ahead = 0;
  for (const Case& c : all_cases()) {
    const ScheduleShape shape{c.pp, c.per_rank, c.m};
    if (!message_of([&] { check_schedule_requirements(c.kind, shape); }).empty()) continue;
    const std::string what = std::string(schedule_name(c.kind)) + " pp " + std::to_string(c.pp) +
                             " v " + std::to_string(c.per_rank) + " m " + std::to_string(c.m);
    const std::vector<int64_t> stage_rank = stage_to_rank(c.pp, c.per_rank, placement_of(c.kind));
    const ScheduleTable table = generate_schedule(c.kind, shape);
    EXPECT_EQ(message_of([&] { check_transfer_order(table, stage_rank); }), "") << what;
    EXPECT_EQ(
        message_of([&] { check_transfer_order(add_send_recv(table, stage_rank), stage_rank); }), "")
        << what;
    int64_t crossings = 0;
    for (size_t s = 0; s + 1 < stage_rank.size(); ++s)
      crossings += stage_rank[s] != stage_rank[s + 1];
    int64_t sends = 0, recvs = 0;
    for (int64_t r = 0; r < c.pp; ++r) {
      for (const Transfer& t : rank_transfers(table, r, stage_rank)) (t.send ? sends : recvs) += 1;
    }
    EXPECT_EQ(sends, 2 * crossings * c.m) << what;
    EXPECT_EQ(recvs, sends) << what;
    for (int64_t r = 0; r < c.pp; ++r) {
      for (const Transfer& t : rank_transfers(table, r, stage_rank)) {
        if (!t.send && !uses(t.action, t)) ++ahead;
      }
    }
    ++checked;
  }
  EXPECT_GT(checked, 200);
  EXPECT_GT(ahead, 0);  // the runtime's in-order receiving is exercised
}

// NCCL pairs a rank's k-th send to a peer with the peer's k-th receive from it. A table whose
// receiving rank uses two same-shaped activations in another order than they are sent (rank 1
// runs 1F1 before 1F0) runs anyway: the runtime receives in the sender's order, microbatch 0's
// activation first (posted by 1F1, kept for 1F0). A table with explicit sends and receives in
// different orders is refused, naming both actions, the ranks and the steps; so is a send
// without its receive.
TEST(PipelineSchedule, SwappedMessagesAreReceivedInOrderOrRefused) {
  const ScheduleTable swapped =
      table_of({{"0F0", "0F1", "0B0", "0B1"}, {"", "1F1", "1F0", "1B0", "1B1"}});
  EXPECT_EQ(validate_schedule_table(swapped, 2, 2, 2), (std::vector<int64_t>{0, 1}));
  simulate_schedule(swapped);  // no deadlock
  EXPECT_EQ(message_of([&] { check_transfer_order(swapped, {0, 1}); }), "");
  const std::vector<Transfer> rank1 = rank_transfers(swapped, 1, {0, 1});
  ASSERT_GE(rank1.size(), 3u);
  for (int i = 0; i < 2; ++i) {
    EXPECT_FALSE(rank1[i].send);
    EXPECT_EQ(rank1[i].microbatch, i);  // sender's order
    EXPECT_EQ(rank1[i].action.str(), "1F1");
    EXPECT_EQ(rank1[i].step, 1);
  }
  EXPECT_TRUE(rank1[2].send);  // 1F1 has no send (last stage); 1B0's gradient to rank 0
  EXPECT_EQ(rank1[2].action.str(), "1B0");

  const ScheduleTable comms =
      table_of({{"0F0", "0SEND_F0", "0F1", "0SEND_F1"}, {"1RECV_F1", "1RECV_F0", "1F0", "1F1"}});
  std::string m = message_of([&] { check_transfer_order(comms, {0, 1}); });
  EXPECT_TRUE(contains(m,
                       "rank 0 and rank 1 post their point-to-point messages in different "
                       "orders: rank 0's 1st send to rank 1 is the activation of stage 0 for "
                       "stage 1, microbatch 0 (0SEND_F0 at step 1), but rank 1's 1st receive "
                       "from rank 0 is for the activation of stage 0 for stage 1, microbatch 1 "
                       "(1RECV_F1 at step 0)"))
      << m;
  EXPECT_TRUE(contains(m, "HINT")) << m;
  // Gradients the other way.
  const ScheduleTable grads = table_of({{"0RECV_B1", "0RECV_B0"}, {"1SEND_B0", "1SEND_B1"}});
  m = message_of([&] { check_transfer_order(grads, {0, 1}); });
  EXPECT_TRUE(contains(m,
                       "rank 1's 1st send to rank 0 is the gradient of stage 1's input for "
                       "stage 0, microbatch 0 (1SEND_B0 at step 0)"))
      << m;
  m = message_of([&] {
    check_transfer_order(table_of({{"0F0", "0SEND_F0", "0SEND_F0"}, {"1RECV_F0", "1F0"}}), {0, 1});
  });
  EXPECT_TRUE(contains(m, "rank 0 sends 2 messages to rank 1, which receives 1 from it; the 2nd"))
      << m;
}

TEST(PipelineSchedule, OneFOneBMatchesPyTorchPp2M4) {
  const std::vector<std::vector<std::string>> expected = {
      {"0F0", "", "", "0F1", "0B0", "0F2", "0B1", "0F3", "0B2", "", "0B3"},
      {"", "1F0", "1B0", "1F1", "1B1", "1F2", "1B2", "1F3", "1B3"},
  };
  EXPECT_EQ(cells_of(generate_schedule(ScheduleKind::k1F1B, {2, 1, 4})), expected);
}

// ScheduleGPipe._get_pipeline_order: r idle, all F, 3(p-1-r) idle, all B in microbatch order.
TEST(PipelineSchedule, GPipeMatchesPyTorchPp2M2) {
  const std::vector<std::vector<std::string>> expected = {
      {"0F0", "0F1", "", "", "", "0B0", "0B1"},
      {"", "1F0", "1F1", "1B0", "1B1"},
  };
  EXPECT_EQ(cells_of(generate_schedule(ScheduleKind::kGPipe, {2, 1, 2})), expected);
}

// ScheduleInterleaved1F1B via _get_1f1b_rank_ops, pp 2, 2 stages per rank, 2 microbatches:
// rounds = 1, 2 per round; rank 0 warm-up min(1*2 + 2*1, 4) = 4 forwards and
// (2*2 + 2*1) - 4 = 2 idle steps, then cooldown (idle, B) pairs; rank 1 warm-up 2, one idle step,
// two F/B pairs on stage 3, cooldown on stage 1.
TEST(PipelineSchedule, Interleaved1F1BMatchesPyTorchPp2V2M2) {
  const std::vector<std::vector<std::string>> expected = {
      {"0F0", "0F1", "2F0", "2F1", "", "", "", "2B0", "", "2B1", "", "0B0", "", "0B1"},
      {"", "1F0", "1F1", "", "3F0", "3B0", "3F1", "3B1", "", "1B0", "", "1B1"},
  };
  EXPECT_EQ(cells_of(generate_schedule(ScheduleKind::kInterleaved1F1B, {2, 2, 2})), expected);
}

// ScheduleZBVZeroBubble._calculate_single_rank_operations, pp 2, 4 microbatches: rank 0 holds
// stages 0 and 3, rank 1 stages 1 and 2 (V); warm-up 2(p-r)-1 chunk-0 forwards, r (F1, F0) pairs,
// p-r (F1, I1, W1) triples, the steady (F0, I0, W0, F1, I1, W1) rounds, then the cool-down.
TEST(PipelineSchedule, ZBVMatchesPyTorchPp2M4) {
  const std::vector<std::vector<std::string>> expected = {
      {"0F0", "0F1", "0F2", "3F0", "3I0", "3W0", "3F1", "3I1", "3W1", "0F3", "0I0", "0W0",
       "3F2", "3I2", "3W2", "0I1", "0W1", "3F3", "3I3", "3W3", "0I2", "0W2", "0I3", "0W3"},
      {"",    "1F0", "2F0", "1F1", "2F1", "2I0", "2W0", "1F2", "1I0", "1W0", "2F2", "2I1", "2W1",
       "1F3", "1I1", "1W1", "2F3", "2I2", "2W2", "1I2", "2I3", "1I3", "1W2", "2W3", "1W3"},
  };
  EXPECT_EQ(cells_of(generate_schedule(ScheduleKind::kZBVZeroBubble, {2, 2, 4})), expected);
}

TEST(PipelineSchedule, DualPipeVOverlapsForwardAndBackward) {
  const ScheduleTable table = generate_schedule(ScheduleKind::kDualPipeV, {2, 2, 4});
  // Rank 1 (stages 1 and 2): no leading idle step; step 1 F0F1 pairs; main step starts with the
  // non-overlapped 1F, 2B on the last rank, then (2F;1B)OVERLAP_F_B.
  const std::vector<std::string> rank1 = cells_of(table)[1];
  const std::vector<std::string> head(rank1.begin(), rank1.begin() + 7);
  EXPECT_EQ(head, (std::vector<std::string>{"1F0", "2F0", "1F1", "2F1", "1F2", "2B0",
                                            "(2F2;1B0)OVERLAP_F_B"}));
  const Action parsed = *parse_action("(2F2;1B0)OVERLAP_F_B");
  EXPECT_EQ(parsed, *table[1][6]);
}

TEST(PipelineSchedule, PlacementLoopAndV) {
  EXPECT_EQ(stage_to_rank(4, 2, StagePlacement::kLoop),
            (std::vector<int64_t>{0, 1, 2, 3, 0, 1, 2, 3}));
  EXPECT_EQ(stage_to_rank(4, 2, StagePlacement::kV),
            (std::vector<int64_t>{0, 1, 2, 3, 3, 2, 1, 0}));
  EXPECT_EQ(stage_to_rank(2, 3, StagePlacement::kV), (std::vector<int64_t>{0, 1, 1, 0, 0, 1}));
  EXPECT_EQ(rank_stages(1, 4, 2, StagePlacement::kV), (std::vector<int64_t>{1, 6}));
  EXPECT_EQ(rank_stages(1, 4, 2, StagePlacement::kLoop), (std::vector<int64_t>{1, 5}));
  EXPECT_EQ(placement_of(ScheduleKind::kZBVZeroBubble), StagePlacement::kV);
  EXPECT_EQ(placement_of(ScheduleKind::kInterleavedZeroBubble), StagePlacement::kLoop);
}

TEST(PipelineSchedule, NamesAreCaseInsensitiveAndUnknownOnesSuggest) {
  EXPECT_EQ(parse_schedule_kind("1f1b"), ScheduleKind::k1F1B);
  EXPECT_EQ(parse_schedule_kind("gpipe"), ScheduleKind::kGPipe);
  EXPECT_EQ(parse_schedule_kind("INTERLEAVEDZEROBUBBLE"), ScheduleKind::kInterleavedZeroBubble);
  EXPECT_EQ(parse_schedule_kind("dualpipev"), ScheduleKind::kDualPipeV);
  for (const std::string& name : schedule_names()) {
    EXPECT_EQ(schedule_name(parse_schedule_kind(name)), name);
  }
  const std::string message = message_of([] { parse_schedule_kind("Interleaved1FB"); });
  EXPECT_TRUE(contains(message, "parallelism.pipeline_parallel_schedule")) << message;
  EXPECT_TRUE(contains(message, "did you mean 'Interleaved1F1B'")) << message;
  EXPECT_TRUE(
      contains(message_of([] { parse_schedule_kind("zbv"); }), "did you mean 'ZBVZeroBubble'"));
}

TEST(PipelineSchedule, RequirementsShowTheArithmetic) {
  const auto message = [](ScheduleKind kind, ScheduleShape shape) {
    return message_of([&] { check_schedule_requirements(kind, shape); });
  };
  std::string m = message(ScheduleKind::k1F1B, {4, 1, 3});
  EXPECT_TRUE(contains(m, "3 microbatches < 4 stages")) << m;
  m = message(ScheduleKind::kInterleaved1F1B, {4, 2, 10});
  EXPECT_EQ(m, "");  // rounds = 2 divides 10
  m = message(ScheduleKind::kInterleaved1F1B, {4, 2, 9});
  EXPECT_TRUE(contains(m, "max(1, 9 microbatches / 4 ranks) = 2, and 9 % 2 = 1")) << m;
  m = message(ScheduleKind::kInterleavedZeroBubble, {4, 2, 3});
  EXPECT_EQ(m, "");  // one round of 3
  m = message(ScheduleKind::kZBVZeroBubble, {2, 3, 8});
  EXPECT_TRUE(contains(m, "exactly 2 stages per rank")) << m;
  m = message(ScheduleKind::kDualPipeV, {2, 2, 3});
  EXPECT_TRUE(contains(m, "3 microbatches < 2 ranks * 2 stages per rank = 4 stages")) << m;
  m = message(ScheduleKind::kGPipe, {2, 2, 4});
  EXPECT_TRUE(contains(m, "one stage per rank")) << m;
  EXPECT_THROW(generate_schedule(ScheduleKind::k1F1B, {4, 1, 2}), ConfigError);
}

TEST(PipelineSchedule, FormatsLikePyTorch) {
  const std::string text =
      format_schedule_table(generate_schedule(ScheduleKind::kGPipe, {2, 1, 2}));
  // Column r is as wide as step label r and rank r's widest cell (the "Rank r" header does not
  // count, as in PyTorch); pads are kept at the ends of rows.
  const std::string expected =
      "        Rank 0 Rank 1\n"
      "Step 0: 0F0          \n"
      "Step 1: 0F1    1F0   \n"
      "Step 2:        1F1   \n"
      "Step 3:        1B0   \n"
      "Step 4:        1B1   \n"
      "Step 5: 0B0          \n"
      "Step 6: 0B1          \n";
  EXPECT_EQ(text, expected);
  const std::string marked =
      format_schedule_table(generate_schedule(ScheduleKind::kGPipe, {2, 1, 2}), 3);
  EXPECT_TRUE(contains(marked, "Step 3:        1B0    <-- ERROR HERE\n")) << marked;
}

TEST(PipelineSchedule, CsvRoundTripsAndReadsPyTorchDumps) {
  for (ScheduleKind kind :
       {ScheduleKind::k1F1B, ScheduleKind::kInterleavedZeroBubble, ScheduleKind::kDualPipeV}) {
    const int64_t v = is_single_stage(kind) ? 1 : 2;
    const ScheduleTable table = generate_schedule(kind, {3, v, 6});
    const std::string csv = dump_schedule_csv(table);
    EXPECT_EQ(parse_schedule_csv(csv, "t.csv"), table) << schedule_name(kind);
    EXPECT_EQ(dump_schedule_csv(parse_schedule_csv(csv, "t.csv")), csv);
    const ScheduleTable comms = add_send_recv(table, stage_to_rank(3, v, placement_of(kind)));
    EXPECT_EQ(parse_schedule_csv(dump_schedule_csv(comms), "c.csv"), comms);
  }
  EXPECT_EQ(dump_schedule_csv(generate_schedule(ScheduleKind::kGPipe, {2, 1, 1})),
            "0F0,,,,0B0\r\n,1F0,1B0\r\n");
  // What PyTorch's _PipelineScheduleRuntime._dump_csv writes (compute_comms: FSDP bookkeeping
  // without microbatch, overlapped actions), and Python's "" for a row of one empty cell.
  const std::string dumped =
      "0UNSHARD,0F0,0SEND_F0,(0F1;0B0)OVERLAP_F_B,0RESHARD,0REDUCE_GRAD\r\n"
      "\"\"\r\n"
      "1RECV_F0, 1F0 ,\"1B0\"\n";
  const ScheduleTable read = parse_schedule_csv(dumped, "dump.csv");
  ASSERT_EQ(read.size(), 3u);
  EXPECT_EQ(cells_of(read)[0],
            (std::vector<std::string>{"0UNSHARD", "0F0", "0SEND_F0", "(0F1;0B0)OVERLAP_F_B",
                                      "0RESHARD", "0REDUCE_GRAD"}));
  EXPECT_EQ(read[1], std::vector<Slot>{std::nullopt});
  EXPECT_EQ(cells_of(read)[2], (std::vector<std::string>{"1RECV_F0", "1F0", "1B0"}));
  EXPECT_EQ(dump_schedule_csv({{std::nullopt}}), "\"\"\r\n");
}

TEST(PipelineSchedule, MalformedCsvNamesRowAndColumn) {
  std::string m = message_of([] { parse_schedule_csv("0F0,1B0\r\n1F0,1X0\r\n", "s.csv"); });
  EXPECT_TRUE(contains(m, "s.csv: row 2 (rank 1), column 2: '1X0'")) << m;
  EXPECT_TRUE(contains(m, "'X' is not an action type")) << m;
  m = message_of([] { parse_schedule_csv("0F0,F1\n", "s.csv"); });
  EXPECT_TRUE(contains(m, "row 1 (rank 0), column 2: 'F1'")) << m;
  m = message_of([] { parse_schedule_csv("0F\n", "s.csv"); });
  EXPECT_TRUE(contains(m, "F needs a microbatch number")) << m;
  m = message_of([] { parse_schedule_csv("0F0,\"1B0\n", "s.csv"); });
  EXPECT_TRUE(contains(m, "not closed")) << m;
  m = message_of([] { parse_schedule_csv("", "s.csv"); });
  EXPECT_TRUE(contains(m, "no rows")) << m;
  m = message_of([] { load_schedule_csv("/nonexistent/schedule.csv"); });
  EXPECT_TRUE(contains(m, "/nonexistent/schedule.csv")) << m;
}

TEST(PipelineSchedule, ValidationNamesRankAndStep) {
  std::string m = message_of([] {
    validate_schedule_table(table_of({{"0F0", "0B1"}, {"1F0", "1B0"}}), 2, 2, 1);
  });
  EXPECT_TRUE(contains(m, "rank 0, step 1: 0B1 names microbatch 1 of 1")) << m;
  m = message_of([] {
    validate_schedule_table(table_of({{"0B0", "0F0"}, {"1F0", "1B0"}}), 2, 2, 1);
  });
  EXPECT_TRUE(contains(m, "rank 0, step 0: 0B0 runs before its forward 0F0")) << m;
  m = message_of([] {
    validate_schedule_table(table_of({{"0F0", "1F0"}, {"1B0", "0B0"}}), 2, 2, 1);
  });
  EXPECT_TRUE(contains(m, "stage 1 is on rank 0 and rank 1")) << m;
  m = message_of([] {
    validate_schedule_table(table_of({{"0F0", "0I0"}, {"1F0", "1B0"}}), 2, 2, 1);
  });
  EXPECT_TRUE(contains(m, "stage 0 has F=1 B=0 I=1 W=0")) << m;
  m = message_of([] { validate_schedule_table(table_of({{"0F0", "0B0"}}), 2, 2, 1); });
  EXPECT_TRUE(contains(m, "1 ranks (rows), pipeline_parallel_degree is 2")) << m;
}

TEST(PipelineSchedule, SendRecvPassPlacesTransfersAfterTheirCompute) {
  const ScheduleTable comms =
      add_send_recv(generate_schedule(ScheduleKind::k1F1B, {2, 1, 2}), {0, 1});
  // Hand-run of PyTorch's _add_send_recv on the idle-free lists rank 0 = [0F0 0F1 0B0 0B1],
  // rank 1 = [1F0 1B0 1F1 1B1], one action per rank per round, rank 0 first: round 2 puts
  // 1RECV_F1 (from 0F1) on rank 1 before rank 1 places 1B0.
  const std::vector<std::vector<std::string>> expected = {
      {"0F0", "0SEND_F0", "0F1", "0SEND_F1", "0RECV_B0", "0B0", "0RECV_B1", "0B1"},
      {"1RECV_F0", "1F0", "1RECV_F1", "1B0", "1SEND_B0", "1F1", "1B1", "1SEND_B1"},
  };
  EXPECT_EQ(cells_of(comms), expected);
  // V placement: stages 1 and 2 share rank 1, so nothing is sent between them.
  const ScheduleTable v = add_send_recv(generate_schedule(ScheduleKind::kZBVZeroBubble, {2, 2, 4}),
                                        stage_to_rank(2, 2, StagePlacement::kV));
  for (const Slot& slot : v[1]) {
    ASSERT_TRUE(slot);
    EXPECT_FALSE(slot->kind == ActionKind::kSendForward && slot->stage == 1) << slot->str();
  }
}

}  // namespace test_pipeline_schedule
}  // namespace titan::pp
