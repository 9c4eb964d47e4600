// Fault-tolerant replica groups: the lighthouse's quorum rules, and replicas (one thread each,
// one rank per group) that average over a real lighthouse on loopback, lose a member, and take
// a restarted member back with the state of a peer.
#include "titan/distributed/ft/lighthouse.h"
#include "titan/distributed/ft/manager.h"
#include "titan/distributed/ft/quorum.h"
#include "titan/distributed/ft/semi_sync.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <future>
#include <thread>

namespace titan::ft {
namespace {

using std::chrono::milliseconds;

ReplicaView asking(int64_t id, int64_t step, Clock::time_point at, int64_t incarnation = 1) {
  ReplicaView v;
  v.self = {id, incarnation, step, false};
  v.alive = true;
  v.asking = true;
  v.asked_at = at;
  return v;
}

ReplicaView silent(int64_t id, int64_t incarnation = 1) {
  ReplicaView v;
  v.self = {id, incarnation, 0, false};
  v.alive = true;
  return v;
}

TEST(QuorumRules, WaitsForMinReplicas) {
  const QuorumRules rules(2, milliseconds(100));
  const Clock::time_point t0 = Clock::now();
  std::string why;
  EXPECT_FALSE(rules.decide({asking(0, 0, t0)}, nullptr, t0 + milliseconds(500), &why));
  EXPECT_EQ(why, "1 of min_replicas 2 live replicas asking");
  ReplicaView dead = asking(1, 0, t0);
  dead.alive = false;
  EXPECT_FALSE(rules.decide({asking(0, 0, t0), dead}, nullptr, t0 + milliseconds(500)));
  const std::optional<Quorum> q = rules.decide({asking(1, 3, t0), asking(0, 3, t0)}, nullptr, t0);
  ASSERT_TRUE(q);
  EXPECT_EQ(q->quorum_id, 1);
  ASSERT_EQ(q->participants.size(), 2u);
  EXPECT_EQ(q->participants[0].replica_id, 0);  // sorted by id
  EXPECT_EQ(q->max_step(), 3);
}

TEST(QuorumRules, NewcomersWaitedForUpToTheJoinTimeout) {
  const QuorumRules rules(1, milliseconds(100));
  const Clock::time_point t0 = Clock::now();
  std::string why;
  EXPECT_FALSE(rules.decide({asking(0, 0, t0), silent(1)}, nullptr, t0 + milliseconds(50), &why));
  EXPECT_EQ(why, "waiting up to the join timeout for replica 1");
  const std::optional<Quorum> q =
      rules.decide({asking(0, 0, t0), silent(1)}, nullptr, t0 + milliseconds(100));
  ASSERT_TRUE(q);
  EXPECT_EQ(q->participants.size(), 1u);
}

TEST(QuorumRules, LiveMembersOfTheLastQuorumAreWaitedFor) {
  const QuorumRules rules(1, milliseconds(100));
  const Clock::time_point t0 = Clock::now();
  Quorum previous;
  previous.quorum_id = 4;
  previous.participants = {{0, 1, 5, false}, {1, 1, 5, false}};
  std::string why;
  // However long: going on without a live member could split the replicas.
  EXPECT_FALSE(
      rules.decide({asking(0, 5, t0), silent(1)}, &previous, t0 + std::chrono::hours(1), &why));
  EXPECT_EQ(why, "waiting for replica 1 of the last quorum");
  // Once it stops beating it is not waited for; the members changed, so does the id.
  ReplicaView gone = silent(1);
  gone.alive = false;
  std::optional<Quorum> q = rules.decide({asking(0, 5, t0), gone}, &previous, t0);
  ASSERT_TRUE(q);
  EXPECT_EQ(q->quorum_id, 5);
  // Same members: same id, unless a member's group broke.
  q = rules.decide({asking(0, 5, t0), asking(1, 5, t0)}, &previous, t0);
  ASSERT_TRUE(q);
  EXPECT_EQ(q->quorum_id, 4);
  ReplicaView broken = asking(1, 5, t0);
  broken.new_group = true;
  q = rules.decide({asking(0, 5, t0), broken}, &previous, t0);
  ASSERT_TRUE(q);
  EXPECT_EQ(q->quorum_id, 5);
  // A restart of replica 1 is a new member (another incarnation).
  q = rules.decide({asking(0, 5, t0), asking(1, 0, t0, /*incarnation=*/2)}, &previous, t0);
  ASSERT_TRUE(q);
  EXPECT_EQ(q->quorum_id, 5);
}

TEST(Quorum, SourceAndRecovery) {
  Quorum q;
  q.participants = {{0, 1, 7, false}, {1, 2, 0, true}, {2, 1, 7, false}};
  EXPECT_EQ(q.source_index(), 0);
  EXPECT_FALSE(q.recovers(0));
  EXPECT_TRUE(q.recovers(1));   // behind
  EXPECT_FALSE(q.recovers(2));  // at the max step, not new
  // The start of a job: everyone new at step 0; the lowest id gives its state to the others.
  q.participants = {{0, 1, 0, true}, {1, 1, 0, true}};
  EXPECT_EQ(q.source_index(), 0);
  EXPECT_FALSE(q.recovers(0));
  EXPECT_TRUE(q.recovers(1));
  // A member whose recovery broke off (-1) takes the state again.
  q.participants = {{0, 1, 3, false}, {1, 1, -1, false}};
  EXPECT_TRUE(q.recovers(1));
  // A new member resumed from a later checkpoint than a live one gives, not takes.
  q.participants = {{0, 1, 3, false}, {1, 2, 9, true}};
  EXPECT_EQ(q.source_index(), 1);
  EXPECT_TRUE(q.recovers(0));
  EXPECT_FALSE(q.recovers(1));
}

TEST(Quorum, JsonRoundTripAndMalformedInput) {
  Quorum q;
  q.quorum_id = 12;
  q.participants = {{0, 123456789012LL, 7, false}, {3, 5, -1, true}};
  const Quorum back = Quorum::from_json(q.to_json());
  EXPECT_EQ(back.quorum_id, 12);
  ASSERT_EQ(back.participants.size(), 2u);
  EXPECT_EQ(back.participants[0].incarnation, 123456789012LL);
  EXPECT_EQ(back.participants[1].step, -1);
  EXPECT_TRUE(back.participants[1].fresh);
  EXPECT_EQ(back.describe(), "replicas 0 (step 7), 3 (step -1, new)");
  for (const char* bad : {"", "{", "[]", R"({"quorum_id": 1})",
                          R"({"quorum_id": 1, "participants": [{"replica_id": 0}]})"}) {
    EXPECT_THROW(Quorum::from_json(bad), std::runtime_error) << bad;
  }
}

ManagerOptions replica(int64_t id, int port) {
  ManagerOptions o;
  o.replica_id = id;
  o.lighthouse = "127.0.0.1:" + std::to_string(port);
  o.timeout = milliseconds(3000);
  o.quorum_timeout = milliseconds(20000);
  o.gloo_hostname = "127.0.0.1";
  o.fingerprint = "test";
  o.beat_interval = milliseconds(20);
  return o;
}

std::unique_ptr<Lighthouse> quiet_lighthouse(int64_t min_replicas) {
  LighthouseOptions o;
  o.port = 0;
  o.min_replicas = min_replicas;
  o.join_timeout = milliseconds(200);
  o.heartbeat_timeout = milliseconds(1000);
  o.log = [](const std::string&) {};
  return Lighthouse::start(o);
}

TEST(FaultTolerance, ReplicasAverageLoseAMemberAndTakeItBackWithThePeersState) {
  const std::unique_ptr<Lighthouse> lighthouse = quiet_lighthouse(1);
  const int port = lighthouse->port();
  // Two replica groups of one rank each, both new at step 0: replica 1 takes replica 0's state.
  auto a = std::make_unique<Manager>(replica(0, port), nullptr);
  auto b = std::make_unique<Manager>(replica(1, port), nullptr);
  at::Tensor state_a = at::arange(6, at::kFloat), state_b = at::zeros({6});
  auto both = [&](const std::function<bool(Manager&, int)>& body) {
    auto fa = std::async(std::launch::async, [&] { return body(*a, 0); });
    auto fb = std::async(std::launch::async, [&] { return body(*b, 1); });
    return std::make_pair(fa.get(), fb.get());
  };
  // Replica 0 may get a quorum of its own first (the lighthouse read its request before replica
  // 1's registration): it asks again, as it would at its next step, until they are together.
  const auto join = [&](int64_t step_a, int64_t step_b) {
    return both([&](Manager& m, int i) {
      if (i == 1) return m.start_step(step_b);
      for (int tries = 0; tries < 50; ++tries) {
        if (!m.start_step(step_a)) return false;
        if (m.participants() == 2) return true;
      }
      return false;
    });
  };
  auto started = join(0, 0);
  ASSERT_TRUE(started.first && started.second) << a->error() << b->error();
  EXPECT_EQ(a->participants(), 2);
  EXPECT_TRUE(a->is_source());
  EXPECT_TRUE(b->recovering());
  // Replica 0 gives its state (and a text), replica 1 takes it.
  const auto move_state = [&](const std::string& text) {
    const auto moved = both([&](Manager& m, int i) {
      std::string blob = i == 0 ? text : "";
      const bool ok = m.transfer_state({i == 0 ? state_a : state_b}, blob);
      if (i == 1) {
        EXPECT_EQ(blob, text);
      }
      return ok;
    });
    ASSERT_TRUE(moved.first && moved.second) << a->error() << b->error();
    EXPECT_TRUE(at::equal(state_a, state_b));
  };
  move_state("step 0");
  // A step: both average their gradients (the mean of 1 and 3).
  started = both([](Manager& m, int) { return m.start_step(1); });
  ASSERT_TRUE(started.first && started.second);
  EXPECT_FALSE(a->recovering() || b->recovering());
  at::Tensor grad_a = at::full({3}, 1.0), grad_b = at::full({3}, 3.0);
  auto averaged = both([&](Manager& m, int i) { return m.average({i == 0 ? grad_a : grad_b}); });
  ASSERT_TRUE(averaged.first && averaged.second);
  EXPECT_TRUE(at::allclose(grad_a, at::full({3}, 2.0)));
  EXPECT_TRUE(at::allclose(grad_b, at::full({3}, 2.0)));
  const int64_t two = a->quorum().quorum_id;

  // Replica 1 ends: replica 0 goes on alone in a new quorum, at once (it said it left).
  b.reset();
  ASSERT_TRUE(a->start_step(2));
  EXPECT_EQ(a->participants(), 1);
  EXPECT_GT(a->quorum().quorum_id, two);
  grad_a.fill_(5.0);
  ASSERT_TRUE(a->average({grad_a}));
  EXPECT_TRUE(at::allclose(grad_a, at::full({3}, 5.0)));  // alone: its own gradient
  state_a.add_(1.0);                                      // its step 3

  // Replica 1 restarts (another incarnation, state lost): it joins when replica 0 asks next and
  // takes replica 0's state at step 3.
  b = std::make_unique<Manager>(replica(1, port), nullptr);
  state_b.zero_();
  started = join(3, 0);
  ASSERT_TRUE(started.first && started.second) << a->error() << b->error();
  EXPECT_EQ(b->participants(), 2);
  EXPECT_EQ(b->quorum().max_step(), 3);
  EXPECT_TRUE(b->recovering());
  move_state("step 3");
}

TEST(FaultTolerance, AReplicaThatHangsFailsTheAverageAtTheTimeoutAndIsLeftBehind) {
  const std::unique_ptr<Lighthouse> lighthouse = quiet_lighthouse(1);
  const int port = lighthouse->port();
  auto a = std::make_unique<Manager>(replica(0, port), nullptr);
  auto b = std::make_unique<Manager>(replica(1, port), nullptr);
  auto fb = std::async(std::launch::async, [&] { return b->start_step(0); });
  for (int tries = 0; tries < 50 && a->participants() < 2; ++tries) {  // see the test above
    ASSERT_TRUE(a->start_step(0));
  }
  ASSERT_TRUE(fb.get());
  ASSERT_EQ(a->participants(), 2);
  // Replica 1 never joins the average (a hang): replica 0's op fails at the group timeout.
  const auto t0 = Clock::now();
  EXPECT_FALSE(a->average({at::ones({4})}));
  const double waited = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_GE(waited, 2.5);
  EXPECT_LT(waited, 10.0);
  EXPECT_NE(a->error().find("averaging over quorum"), std::string::npos) << a->error();
  EXPECT_FALSE(a->agree(false));
  // Replica 1 is still beating, so the lighthouse waits for it as a member of the last quorum;
  // once it is gone (here it says so; a stopped process stops beating: tests/e2e), replica 0 goes
  // on alone with a new group.
  auto next = std::async(std::launch::async, [&] { return a->start_step(0); });
  EXPECT_EQ(next.wait_for(milliseconds(500)), std::future_status::timeout);
  b.reset();
  ASSERT_TRUE(next.get());
  EXPECT_EQ(a->participants(), 1);
}

}  // namespace
}  // namespace titan::ft

namespace titan::ft {
namespace {

TEST(OuterStep, DiLoCoIsNesterovSgdOnThePseudoGradient) {
  // Two syncs by hand: torch.optim.SGD(lr=0.5, momentum=0.9, nesterov=True) on g = p0 - p.
  at::Tensor p = at::tensor({1.0, 2.0}, at::kDouble);
  OuterStep outer(SemiSync::kDiLoCo, {p}, /*lr=*/0.5, /*momentum=*/0.9);
  p.sub_(at::tensor({0.2, -0.4}, at::kDouble));  // inner steps
  std::vector<at::Tensor> g = outer.to_average();
  EXPECT_TRUE(at::allclose(g[0], at::tensor({0.2, -0.4}, at::kDouble)));
  g[0].copy_(at::tensor({0.1, -0.2}, at::kDouble));  // the replicas' mean
  outer.apply(g);
  // buf = g; p = p0 - lr * (g + 0.9 * buf) = p0 - 0.5 * 1.9 * g
  EXPECT_TRUE(at::allclose(p, at::tensor({1.0 - 0.095, 2.0 + 0.19}, at::kDouble)));
  EXPECT_TRUE(at::allclose(outer.momentum_buffers()[0], at::tensor({0.1, -0.2}, at::kDouble)));
  const at::Tensor p1 = p.clone();
  p.sub_(at::tensor({0.3, 0.3}, at::kDouble));
  g = outer.to_average();
  outer.apply(g);
  // buf = 0.9 * buf + g; p = p1 - 0.5 * (g + 0.9 * buf)
  const at::Tensor buf = at::tensor({0.09 + 0.3, -0.18 + 0.3}, at::kDouble);
  EXPECT_TRUE(at::allclose(outer.momentum_buffers()[0], buf));
  EXPECT_TRUE(at::allclose(p, p1 - 0.5 * (at::full({2}, 0.3, at::kDouble) + 0.9 * buf)));
  // No inner progress: no pseudo-gradient.
  EXPECT_TRUE(at::allclose(outer.to_average()[0], at::zeros({2}, at::kDouble)));
}

TEST(OuterStep, LocalSgdAveragesTheParametersThemselves) {
  at::Tensor p = at::ones({3});
  OuterStep outer(SemiSync::kLocalSgd, {p}, 0.7, 0.9);
  EXPECT_TRUE(outer.momentum_buffers().empty());
  std::vector<at::Tensor> x = outer.to_average();
  EXPECT_TRUE(x[0].is_same(p));  // averaged in place
  x[0].fill_(2.0);
  outer.apply(x);
  EXPECT_TRUE(at::allclose(p, at::full({3}, 2.0)));
  EXPECT_EQ(semi_sync_from_name(""), SemiSync::kNone);
  EXPECT_EQ(semi_sync_from_name("diloco"), SemiSync::kDiLoCo);
  EXPECT_THROW(semi_sync_from_name("sync"), std::invalid_argument);
}

}  // namespace
}  // namespace titan::ft
