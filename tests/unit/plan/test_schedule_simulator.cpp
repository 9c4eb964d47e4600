// The schedule simulator (plan/schedule_simulator.h): GPipe / 1F1B bubbles equal
// (p-1)/(m+p-1) and the zero-bubble schedules beat 1F1B; a table that cannot run to the end is
// reported with each blocked rank's action and what it waits for; action costs and the
// communication latency set the makespan.
#include "../test_util.h"
#include "titan/parallel/pipeline_schedule.h"
#include "titan/plan/schedule_simulator.h"

#include <gtest/gtest.h>

#include <string>

namespace titan::pp {
namespace test_schedule_simulator {

using test::contains;
using test::message_of;

TEST(ScheduleSimulator, GPipeAnd1F1BBubbleIsTheClosedForm) {
  for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::k1F1B}) {
    for (int64_t p : {1, 2, 4, 8}) {
      for (int64_t m : {8, 16, 32}) {
        const SimulationResult sim = simulate_schedule(generate_schedule(kind, {p, 1, m}));
        const double expected = static_cast<double>(p - 1) / static_cast<double>(m + p - 1);
        EXPECT_NEAR(sim.bubble_fraction(), expected, 1e-12)
            << schedule_name(kind) << " p " << p << " m " << m;
        EXPECT_DOUBLE_EQ(sim.makespan, 3.0 * static_cast<double>(m + p - 1));
        for (double busy : sim.busy) EXPECT_DOUBLE_EQ(busy, 3.0 * static_cast<double>(m));
      }
    }
  }
}

TEST(ScheduleSimulator, ZeroBubbleSchedulesBeat1F1B) {
  for (int64_t p : {2, 4}) {
    for (int64_t m : {8, 16}) {
      const double one_f_one_b =
          simulate_schedule(generate_schedule(ScheduleKind::k1F1B, {p, 1, m})).bubble_fraction();
      const double interleaved =
          simulate_schedule(generate_schedule(ScheduleKind::kInterleaved1F1B, {p, 2, m}))
              .bubble_fraction();
      const double zb =
          simulate_schedule(generate_schedule(ScheduleKind::kInterleavedZeroBubble, {p, 2, m}))
              .bubble_fraction();
      const double zbv =
          simulate_schedule(generate_schedule(ScheduleKind::kZBVZeroBubble, {p, 2, m}))
              .bubble_fraction();
      EXPECT_LT(interleaved, one_f_one_b) << "p " << p << " m " << m;
      EXPECT_LT(zb, one_f_one_b) << "p " << p << " m " << m;
      EXPECT_LT(zbv, one_f_one_b) << "p " << p << " m " << m;
      EXPECT_LT(zbv, interleaved) << "p " << p << " m " << m;
    }
  }
}

// Hand-derived from PyTorch's Schedule1F1B._get_pipeline_order (rank 0: p-1-r warm-up forwards,
// 2(p-1-r) idle steps, F/B pairs, then an idle step before each remaining B). PyTorch numbers
// rank 1's steady forwards 1F1 .. 1F4 (its counter is bumped before use when there is no
// warm-up); Schedule1F1B._step_microbatches runs 1F0 .. 1F3, which is what we list.

TEST(ScheduleSimulator, SimulatorReportsDeadlocks) {
  // Rank 1 wants microbatch 1 first, which rank 0 forwards only after 0B0, which needs 1B0.
  const ScheduleTable table = parse_schedule_csv("0F0,0B0,0F1,0B1\n1F1,1F0,1B0,1B1\n", "test");
  const std::string m = message_of([&] { simulate_schedule(table); });
  EXPECT_TRUE(contains(m, "deadlocks")) << m;
  EXPECT_TRUE(contains(m, "rank 0: 0B0 (action 1 of its table) waits for 1B/I0")) << m;
  EXPECT_TRUE(contains(m, "rank 1: 1F1 (action 0 of its table) waits for 0F1")) << m;
  // A compute fed from another rank needs its receive posted first.
  const ScheduleTable no_recv = parse_schedule_csv("0F0,0SEND_F0,0B0\n1F0,1B0,\n", "test");
  const std::string m2 = message_of([&] { simulate_schedule(no_recv); });
  EXPECT_TRUE(contains(m2, "1RECV_F0 (not posted on this rank before it)")) << m2;
}

TEST(ScheduleSimulator, SimulatorCostsAndCommLatency) {
  ActionCosts costs;
  costs.comm = 0.5;
  // GPipe pp 2 m 1: F(0) [0,1], F(1) [1.5,2.5], B(1) [2.5,4.5], B(0) [5,7].
  const SimulationResult sim =
      simulate_schedule(generate_schedule(ScheduleKind::kGPipe, {2, 1, 1}), costs);
  EXPECT_DOUBLE_EQ(sim.makespan, 7.0);
  EXPECT_EQ(sim.busy, (std::vector<double>{3.0, 3.0}));
  EXPECT_EQ(sim.idle, (std::vector<double>{4.0, 4.0}));
  EXPECT_EQ(sim.n_actions, 4);
}

}  // namespace test_schedule_simulator
}  // namespace titan::pp
