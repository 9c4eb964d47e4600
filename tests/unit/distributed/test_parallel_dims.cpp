// ParallelDims: degree validation without process groups (many layouts, errors with the
// arithmetic), mesh coordinates and group membership, and the named groups on 2, 3 and 4 ranks.
#include "titan/distributed/parallel_dims.h"

#include "multirank.h"
#include "titan/common/check.h"

#include <ATen/ATen.h>

#include <algorithm>

namespace titan {
namespace test_parallel_dims {

ParallelDegrees degrees(int64_t dp_replicate, int64_t dp_shard, int64_t cp = 1, int64_t tp = 1,
                        int64_t pp = 1, int64_t ep = 1) {
  ParallelDegrees d;
  d.dp_replicate = dp_replicate;
  d.dp_shard = dp_shard;
  d.cp = cp;
  d.tp = tp;
  d.pp = pp;
  d.ep = ep;
  return d;
}

std::string config_error(const ParallelDegrees& d, int64_t world_size) {
  try {
    resolve_parallel_degrees(d, world_size);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(ParallelDegrees, ValidLayoutsResolve) {
  struct Case {
    ParallelDegrees in;
    int64_t world;
    int64_t dp_shard;
  };
  const Case cases[] = {
      {degrees(1, -1), 1, 1},
      {degrees(1, -1), 8, 8},
      {degrees(2, -1), 8, 4},
      {degrees(2, 4), 8, 4},
      {degrees(8, -1), 8, 1},
      {degrees(1, -1, 1, 2), 8, 4},
      {degrees(2, -1, 2, 2, 2), 32, 2},
      {degrees(1, -1, 1, 1, 4), 4, 1},
      {degrees(1, 3), 3, 3},
      {degrees(3, -1), 6, 2},
      {degrees(1, -1, 2, 2, 1, 4), 8, 2},  // ep 4: multiple of cp*tp=4, divides 2*2*2=8
      {degrees(1, -1, 1, 1, 1, 2), 4, 4},
  };
  for (const Case& c : cases) {
    ParallelDegrees r = resolve_parallel_degrees(c.in, c.world);
    EXPECT_EQ(r.dp_shard, c.dp_shard) << c.in.product_text() << " world " << c.world;
    EXPECT_EQ(r.dp_replicate * r.dp_shard * r.cp * r.tp * r.pp, c.world);
  }
}

TEST(ParallelDegrees, ErrorsShowTheArithmetic) {
  EXPECT_NE(config_error(degrees(2, 2, 1, 2), 4)
                .find("dp_replicate(2) * dp_shard(2) * cp(1) * tp(2) * pp(1) = 8 != world_size 4"),
            std::string::npos);
  EXPECT_NE(config_error(degrees(1, 2), 4).find("= 2 != world_size 4"), std::string::npos);
  EXPECT_NE(config_error(degrees(1, 2), 4).find("data_parallel_shard_degree = -1"),
            std::string::npos);
  EXPECT_NE(config_error(degrees(4, -1), 6)
                .find("dp_replicate(4) * cp(1) * tp(1) * pp(1) = 4 does not divide world_size 6"),
            std::string::npos);
  EXPECT_NE(config_error(degrees(1, -1, 1, 3), 8).find("= 3 does not divide world_size 8"),
            std::string::npos);
  EXPECT_NE(
      config_error(degrees(0, -1), 4)
          .find("parallelism.data_parallel_replicate_degree (dp_replicate) must be >= 1, got 0"),
      std::string::npos);
  EXPECT_NE(config_error(degrees(1, -2), 4).find("data_parallel_shard_degree (dp_shard)"),
            std::string::npos);
  EXPECT_NE(config_error(degrees(1, 0), 4).find("must be >= 1, got 0"), std::string::npos);
  EXPECT_NE(config_error(degrees(1, -1, 0), 4).find("context_parallel_degree"), std::string::npos);
  EXPECT_NE(config_error(degrees(1, -1, 1, -1), 4).find("tensor_parallel_degree"),
            std::string::npos);
  EXPECT_NE(config_error(degrees(1, -1, 1, 1, 0), 4).find("pipeline_parallel_degree"),
            std::string::npos);
  EXPECT_NE(config_error(degrees(1, -1, 1, 1, 1, 0), 4).find("expert_parallel_degree"),
            std::string::npos);
  EXPECT_NE(config_error(degrees(1, -1), 0).find("world_size must be >= 1"), std::string::npos);
  // ep must be a multiple of cp * tp and divide dp_shard * cp * tp.
  EXPECT_NE(config_error(degrees(1, -1, 1, 2, 1, 3), 8)
                .find("ep(3) must be a multiple of cp(1) * tp(2) = 2"),
            std::string::npos);
  EXPECT_NE(
      config_error(degrees(1, -1, 1, 1, 1, 8), 4).find("divide dp_shard(4) * cp(1) * tp(1) = 4"),
      std::string::npos);
}

TEST(ParallelDegrees, UnimplementedParallelismsAreRefusedByName) {
  auto refusal = [](const ParallelDegrees& d, int64_t world) {
    try {
      ParallelDims dims(d, world);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(refusal(degrees(1, -1, 1, 2), 4), "");        // tensor parallelism is implemented
  EXPECT_EQ(refusal(degrees(1, -1, 2), 4), "");           // context parallelism is implemented
  EXPECT_EQ(refusal(degrees(1, -1, 1, 1, 2), 4), "");     // pipeline parallelism is implemented
  EXPECT_EQ(refusal(degrees(1, -1, 1, 1, 1, 2), 4), "");  // expert parallelism is implemented
  // Experts split over tp (expert_tensor_parallel_degree = tp) too; etp is 1 or tp.
  ParallelDegrees etp = degrees(1, -1, 1, 2, 1, 2);
  etp.etp = 2;
  EXPECT_EQ(refusal(etp, 4), "");
  etp.etp = 3;
  const std::string ep = refusal(etp, 4);
  EXPECT_NE(ep.find("parallelism.expert_tensor_parallel_degree (etp) must be 1 or "
                    "tensor_parallel_degree (2), got 3"),
            std::string::npos)
      << ep;
  // With etp = tp, ep borrows from dp_shard x cp only: ep 4 does not divide dp_shard 2 x cp 1.
  etp = degrees(1, -1, 1, 2, 1, 4);
  etp.etp = 2;
  EXPECT_NE(refusal(etp, 4).find("with expert_tensor_parallel_degree = tp, ep(4) must be a "
                                 "multiple of cp(1) and divide dp_shard(2) * cp(1) = 2"),
            std::string::npos);
  // Arithmetic errors come first.
  EXPECT_NE(refusal(degrees(1, 2, 1, 2), 8).find("!= world_size 8"), std::string::npos);
  EXPECT_EQ(refusal(degrees(2, -1), 4), "");
  ParallelismSection section;
  section.data_parallel_replicate_degree = 2;
  ParallelDims from_config = ParallelDims::from_config(section, 6);
  EXPECT_EQ(from_config.dp_shard(), 3);
}

TEST(ParallelDims, FlagsAndSizes) {
  ParallelDims fsdp(degrees(1, -1), 4);
  EXPECT_TRUE(fsdp.dp_enabled());
  EXPECT_TRUE(fsdp.fsdp_enabled());
  EXPECT_FALSE(fsdp.dp_replicate_enabled());
  EXPECT_FALSE(fsdp.hsdp_enabled());
  EXPECT_FALSE(fsdp.ddp_enabled());
  EXPECT_EQ(fsdp.dp_size(), 4);

  ParallelDims hsdp(degrees(2, 2), 4);
  EXPECT_TRUE(hsdp.hsdp_enabled());
  EXPECT_FALSE(hsdp.ddp_enabled());

  ParallelDims ddp(degrees(2, -1), 2);
  EXPECT_TRUE(ddp.ddp_enabled());
  EXPECT_FALSE(ddp.fsdp_enabled());
  EXPECT_EQ(ddp.dp_shard(), 1);

  ParallelDims single(degrees(1, -1), 1);
  EXPECT_FALSE(single.dp_enabled());
  EXPECT_EQ(single.describe(), "world 1 = pp(1) x dp_replicate(1) x dp_shard(1) x cp(1) x tp(1)");
  EXPECT_EQ(single.non_data_parallel_size(), 1);
}

TEST(ParallelDims, MeshCoordinatesAndGroupMembership) {
  // pp 2 x dp_replicate 2 x dp_shard 2 x cp 1 x tp 2 = 16: planned only (tp, pp refused to run).
  ParallelDims dims = ParallelDims::planned(degrees(2, 2, 1, 2, 2), 16);
  EXPECT_EQ(dims.mesh_shape(), (std::vector<int64_t>{2, 2, 2, 1, 2}));
  for (int64_t r = 0; r < 16; ++r) EXPECT_EQ(dims.rank_at(dims.coordinate(r)), r);
  MeshCoord c = dims.coordinate(13);  // 13 = ((1*2 + 1)*2 + 0)*2 + 1
  EXPECT_EQ(c.pp, 1);
  EXPECT_EQ(c.dp_replicate, 1);
  EXPECT_EQ(c.dp_shard, 0);
  EXPECT_EQ(c.cp, 0);
  EXPECT_EQ(c.tp, 1);
  EXPECT_EQ(dims.group_ranks("tp", 13), (std::vector<int>{12, 13}));
  EXPECT_EQ(dims.group_ranks("dp_shard", 13), (std::vector<int>{13, 15}));
  EXPECT_EQ(dims.group_ranks("dp_replicate", 13), (std::vector<int>{9, 13}));
  EXPECT_EQ(dims.group_ranks("pp", 13), (std::vector<int>{5, 13}));
  EXPECT_EQ(dims.group_ranks("cp", 13), (std::vector<int>{13}));
  EXPECT_EQ(dims.group_ranks("dp", 13), (std::vector<int>{9, 11, 13, 15}));
  EXPECT_EQ(dims.group_ranks("dp_shard_cp", 13), (std::vector<int>{13, 15}));
  EXPECT_EQ(dims.group_ranks("dp_cp", 13), (std::vector<int>{9, 11, 13, 15}));
  EXPECT_EQ(dims.dp_rank(13), 2);  // dp_replicate 1 * dp_shard 2 + dp_shard 0
  EXPECT_EQ(dims.dp_rank(15), 3);
  // The dp rank is the position in the "dp" group.
  for (int64_t r = 0; r < 16; ++r) {
    auto dp = dims.group_ranks("dp", r);
    EXPECT_EQ(dp[dims.dp_rank(r)], r);
  }
  EXPECT_THROW(dims.group_ranks("sp", 0), c10::Error);
  EXPECT_THROW(dims.coordinate(16), c10::Error);

  // cp sits between dp_shard and tp: dp_shard_cp flattens dp_shard (outer) x cp (inner).
  ParallelDims cp = ParallelDims::planned(degrees(1, 2, 2, 2), 8);
  EXPECT_EQ(cp.group_ranks("cp", 0), (std::vector<int>{0, 2}));
  EXPECT_EQ(cp.group_ranks("dp_shard", 0), (std::vector<int>{0, 4}));
  EXPECT_EQ(cp.group_ranks("dp_shard_cp", 1), (std::vector<int>{1, 3, 5, 7}));
}

// Expert parallelism splits dp_shard into dp_shard_mod_ep (outer) x dp_shard_in_ep (inner); the
// ep group is dp_shard_in_ep x cp x tp, the experts' FSDP group dp_shard_mod_ep.
TEST(ParallelDims, ExpertGroupsSplitDpShard) {
  // dp_shard 4 x tp 2, ep 4: dp_shard_in_ep 2, dp_shard_mod_ep 2. Rank = dp_shard * 2 + tp.
  ParallelDims dims = ParallelDims::planned(degrees(1, 4, 1, 2, 1, 4), 8);
  EXPECT_EQ(dims.dp_shard_in_ep(), 2);
  EXPECT_EQ(dims.dp_shard_mod_ep(), 2);
  EXPECT_EQ(dims.group_ranks("ep", 0), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(dims.group_ranks("ep", 5), (std::vector<int>{4, 5, 6, 7}));
  EXPECT_EQ(dims.group_ranks("dp_shard_mod_ep", 0), (std::vector<int>{0, 4}));
  EXPECT_EQ(dims.group_ranks("dp_shard_mod_ep", 5), (std::vector<int>{1, 5}));
  // Every rank sits in one ep group and one dp_shard_mod_ep group, which cross in it alone.
  for (int r = 0; r < 8; ++r) {
    const auto ep = dims.group_ranks("ep", r);
    const auto mod = dims.group_ranks("dp_shard_mod_ep", r);
    int both = 0;
    for (int x : ep) both += std::count(mod.begin(), mod.end(), x);
    EXPECT_EQ(both, 1) << r;
  }
  EXPECT_NE(dims.describe().find("ep(4) = dp_shard_in_ep(2) x cp(1) x tp(2), FSDP of experts over "
                                 "dp_shard_mod_ep(2)"),
            std::string::npos)
      << dims.describe();
  // With cp and HSDP: dp_replicate 2 x dp_shard 2 x cp 2, ep 4 = dp_shard 2 x cp 2 (all of it).
  ParallelDims hsdp = ParallelDims::planned(degrees(2, 2, 2, 1, 1, 4), 8);
  EXPECT_EQ(hsdp.group_ranks("ep", 6), (std::vector<int>{4, 5, 6, 7}));
  EXPECT_EQ(hsdp.group_ranks("dp_shard_mod_ep", 6), (std::vector<int>{6}));
  // etp = tp: ep = dp_shard_in_ep x cp, each tp rank exchanging with its own tp coordinate.
  ParallelDegrees split = degrees(1, 4, 1, 2, 1, 2);
  split.etp = 2;
  ParallelDims etp = ParallelDims::planned(split, 8);
  EXPECT_EQ(etp.dp_shard_in_ep(), 2);
  EXPECT_EQ(etp.dp_shard_mod_ep(), 2);
  EXPECT_EQ(etp.group_ranks("ep", 0), (std::vector<int>{0, 2}));
  EXPECT_EQ(etp.group_ranks("ep", 5), (std::vector<int>{5, 7}));
  EXPECT_EQ(etp.group_ranks("dp_shard_mod_ep", 0), (std::vector<int>{0, 4}));
  // No ep groups without expert parallelism.
  EXPECT_THROW(ParallelDims::planned(degrees(1, 4), 4).group_ranks("ep", 0), c10::Error);
}

TEST(ParallelDims, NamedGroupsOnFourRanks) {
  // HSDP: dp_replicate 2 x dp_shard 2. Ranks {0,1} and {2,3} shard; {0,2} and {1,3} replicate.
  test::run_ranks(4, [&](int rank, std::shared_ptr<dist::Group> world) {
    ParallelDims dims(degrees(2, 2), 4);
    EXPECT_THROW(dims.group("dp_shard"), c10::Error);  // not built yet
    dims.build_groups(world);
    dist::Group& shard = dims.group("dp_shard");
    dist::Group& replicate = dims.group("dp_replicate");
    EXPECT_EQ(shard.size(), 2);
    EXPECT_EQ(shard.rank(), rank % 2);
    EXPECT_EQ(replicate.rank(), rank / 2);
    EXPECT_EQ(dims.group_ptr("dp"), world);                                // spans every rank
    EXPECT_EQ(dims.group_ptr("dp_shard_cp"), dims.group_ptr("dp_shard"));  // cp = 1
    EXPECT_EQ(dims.group("tp").size(), 1);
    EXPECT_THROW(dims.group("bogus"), c10::Error);

    at::Tensor t = at::full({4}, rank + 1.0);
    shard.all_reduce(t).wait();
    EXPECT_TRUE(at::equal(t, at::full({4}, rank < 2 ? 3.0 : 7.0))) << "dp_shard of rank " << rank;
    at::Tensor u = at::full({4}, rank + 1.0);
    replicate.all_reduce(u).wait();
    EXPECT_TRUE(at::equal(u, at::full({4}, rank % 2 == 0 ? 4.0 : 6.0)))
        << "dp_replicate of rank " << rank;
    at::Tensor v = at::full({2}, rank + 1.0);
    dims.group("dp").all_reduce(v, dist::ReduceOp::kAvg).wait();
    EXPECT_TRUE(at::equal(v, at::full({2}, 2.5)));
    // An HSDP gradient step in miniature: reduce-scatter in the shard group, then all-reduce
    // the shard across replicas = the mean over all four ranks, sharded.
    at::Tensor grad = at::arange(8, at::kFloat) * (rank + 1);
    at::Tensor piece = at::empty({4}, at::kFloat);
    shard.reduce_scatter_tensor(piece, grad, dist::ReduceOp::kAvg).wait();
    replicate.all_reduce(piece, dist::ReduceOp::kAvg).wait();
    at::Tensor expected = (at::arange(8, at::kFloat) * 2.5).narrow(0, 4 * (rank % 2), 4);
    EXPECT_TRUE(at::allclose(piece, expected));
  });
}

TEST(ParallelDims, NamedGroupsOnTwoAndThreeRanks) {
  test::run_ranks(3, [&](int rank, std::shared_ptr<dist::Group> world) {
    ParallelDims dims(degrees(1, -1), 3);  // FSDP over all three
    dims.build_groups(world);
    EXPECT_EQ(dims.group_ptr("dp_shard"), world);
    EXPECT_EQ(dims.group("dp_replicate").size(), 1);
    EXPECT_EQ(dims.dp_rank(rank), rank);
  });
  test::run_ranks(2, [&](int rank, std::shared_ptr<dist::Group> world) {
    ParallelDims dims(degrees(2, -1), 2);  // DDP
    dims.build_groups(world);
    EXPECT_TRUE(dims.ddp_enabled());
    EXPECT_EQ(dims.group_ptr("dp_replicate"), world);
    EXPECT_EQ(dims.group("dp_shard").size(), 1);
    at::Tensor t = at::full({3}, rank + 1.0);
    dims.group("dp_shard").all_reduce(t).wait();  // a group of one: unchanged
    EXPECT_TRUE(at::equal(t, at::full({3}, rank + 1.0)));
  });
}

// Context parallelism's ring hops get a communicator per direction: cp_up and cp_down hold the cp
// ranks, in cp order, but are groups of their own (never the cp group or the world, even where
// those have the same ranks); without cp they are not built.
TEST(ParallelDims, CpDirectionGroupsAreCommunicatorsOfTheirOwn) {
  test::run_ranks(4, [&](int rank, std::shared_ptr<dist::Group> world) {
    ParallelDims dims(degrees(1, 2, /*cp=*/2), 4);  // dp_shard 2 x cp 2: cp pairs {0,1}, {2,3}
    dims.build_groups(world);
    for (const char* name : {"cp_up", "cp_down"}) {
      const auto group = dims.group_ptr(name);
      EXPECT_NE(group, dims.group_ptr("cp")) << name;
      EXPECT_EQ(group->ranks(), dims.group("cp").ranks()) << name;
      EXPECT_EQ(group->rank(), rank % 2) << name;
    }
    EXPECT_NE(dims.group_ptr("cp_up"), dims.group_ptr("cp_down"));
    // They work: rank 0 of each pair sends up, rank 1 answers down.
    at::Tensor t = at::full({3}, rank + 1.0);
    if (rank % 2 == 0) {
      dims.group("cp_up").send(t, 1).wait();
      dims.group("cp_down").recv(t, 1).wait();
      EXPECT_TRUE(at::equal(t, at::full({3}, rank + 2.0)));
    } else {
      at::Tensor got = at::empty({3});
      dims.group("cp_up").recv(got, 0).wait();
      EXPECT_TRUE(at::equal(got, at::full({3}, static_cast<double>(rank))));
      dims.group("cp_down").send(t, 0).wait();
    }
  });
  test::run_ranks(2, [&](int, std::shared_ptr<dist::Group> world) {
    ParallelDims cp_only(degrees(1, 1, /*cp=*/2), 2);
    cp_only.build_groups(world);
    EXPECT_EQ(cp_only.group_ptr("cp"), world);  // spans every rank
    EXPECT_NE(cp_only.group_ptr("cp_up"), world);
    EXPECT_EQ(cp_only.group("cp_up").size(), 2);
  });
  test::run_ranks(2, [&](int, std::shared_ptr<dist::Group> world) {
    ParallelDims no_cp(degrees(1, 2), 2);
    no_cp.build_groups(world);
    EXPECT_THROW(no_cp.group("cp_up"), c10::Error);
  });
}

}  // namespace test_parallel_dims
}  // namespace titan
