// Distributed Muon's exchange (parallel/muon_exchange.h) on 4 ranks over Gloo: matrices cut as
// FSDP (uneven rows, an empty shard), FSDP x TP (2 x 2 boxes), replicated, and a stack of experts
// split by EP and FSDP; every rank's piece of the result equals its piece of the one-process
// Newton–Schulz of the whole matrix. And the refusals: other matrices on another rank, pieces that
// do not tile a matrix.
#include "../distributed/multirank.h"

#include "titan/components/muon.h"
#include "titan/components/optimizer.h"
#include "titan/parallel/muon_exchange.h"

#include <gtest/gtest.h>

#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

namespace titan {
namespace muon_exchange_test {

using test::run_ranks;
using test::run_ranks_collect;

struct Layout {
  std::string name;
  std::vector<int64_t> shape;
  // Per rank: offsets and sizes of its piece.
  std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> pieces;
};

std::vector<Layout> layouts() {
  std::vector<Layout> out;
  // FSDP over 4 ranks, rows in chunks of 3: 3, 3, 3, 1.
  out.push_back({"layers.0.attention.wq.weight",
                 {10, 6},
                 {{{0, 0}, {3, 6}}, {{3, 0}, {3, 6}}, {{6, 0}, {3, 6}}, {{9, 0}, {1, 6}}}});
  // FSDP 2 x TP 2 (column-wise): 2 x 2 boxes.
  out.push_back({"layers.0.attention.wo.weight",
                 {8, 12},
                 {{{0, 0}, {4, 6}}, {{0, 6}, {4, 6}}, {{4, 0}, {4, 6}}, {{4, 6}, {4, 6}}}});
  // Whole on ranks 0 and 1 (replicated), nothing on 2 and 3.
  out.push_back({"layers.0.moe.shared_gate.weight",
                 {5, 7},
                 {{{0, 0}, {5, 7}}, {{0, 0}, {5, 7}}, {{5, 0}, {0, 7}}, {{5, 0}, {0, 7}}}});
  // Experts: EP 2 over the stack (3 each), FSDP 2 over their rows.
  out.push_back({"layers.1.moe.experts.w1.weight",
                 {6, 4, 5},
                 {{{0, 0, 0}, {3, 2, 5}},
                  {{0, 2, 0}, {3, 2, 5}},
                  {{3, 0, 0}, {3, 2, 5}},
                  {{3, 2, 0}, {3, 2, 5}}}});
  // Fewer rows than ranks: rank 3's shard is empty.
  out.push_back({"layers.1.feed_forward.w2.weight",
                 {3, 9},
                 {{{0, 0}, {1, 9}}, {{1, 0}, {1, 9}}, {{2, 0}, {1, 9}}, {{3, 0}, {0, 9}}}});
  return out;
}

at::Tensor piece_of(const at::Tensor& whole, const std::vector<int64_t>& offsets,
                    const std::vector<int64_t>& sizes) {
  at::Tensor t = whole;
  for (size_t d = 0; d < sizes.size(); ++d) t = t.narrow(d, offsets[d], sizes[d]);
  return t;
}

TEST(MuonExchange, PiecesEqualTheWholeMatrixNewtonSchulz) {
  const std::vector<Layout> all = layouts();
  at::manual_seed(11);
  std::vector<at::Tensor> whole, expected;
  for (const Layout& l : all) {
    whole.push_back(at::randn(l.shape).to(at::kBFloat16));
    expected.push_back(newton_schulz(whole.back(), NewtonSchulz{}));
  }
  std::mutex mu;
  std::map<std::string, std::vector<int>> owners;
  run_ranks(4, [&](int rank, std::shared_ptr<dist::Group> world) {
    std::vector<MuonMatrix> matrices;
    std::vector<at::Tensor> updates;
    for (size_t i = 0; i < all.size(); ++i) {
      const auto& [offsets, sizes] = all[i].pieces[rank];
      matrices.push_back({all[i].name, ShardBox{all[i].shape, offsets}, sizes});
      updates.push_back(piece_of(whole[i], offsets, sizes).clone());
    }
    MuonExchange exchange(matrices, world);
    std::vector<int> calls(all.size(), 0);
    exchange.run(updates, NewtonSchulz{}, [&](size_t i, const at::Tensor& o) {
      ++calls[i];
      const auto& [offsets, sizes] = all[i].pieces[rank];
      const at::Tensor want = piece_of(expected[i], offsets, sizes);
      ASSERT_EQ(o.sizes(), want.sizes()) << all[i].name << " rank " << rank;
      EXPECT_EQ(o.scalar_type(), at::kBFloat16);
      if (all[i].shape.size() == 2) {
        EXPECT_TRUE(at::equal(o, want)) << all[i].name << " rank " << rank;
      } else {
        // Expert ranges run as smaller batches than the whole stack: batched GEMM roundings.
        EXPECT_LT((o.to(at::kFloat) - want.to(at::kFloat)).abs().max().item<double>(), 2e-2)
            << all[i].name << " rank " << rank;
      }
    });
    EXPECT_EQ(calls, std::vector<int>(all.size(), 1)) << "rank " << rank;
    if (rank == 0) {
      const std::lock_guard<std::mutex> lock(mu);
      const auto o = exchange.owners();
      for (size_t i = 0; i < all.size(); ++i) owners[all[i].name] = o[i];
    }
  });
  // Each bucket (layers.0, layers.1) spreads its units over the ranks: layers.0's three
  // matrices on three ranks; layers.1's expert stack in 4 ranges and its one matrix on all four.
  std::set<int> layer0 = {owners["layers.0.attention.wq.weight"][0],
                          owners["layers.0.attention.wo.weight"][0],
                          owners["layers.0.moe.shared_gate.weight"][0]};
  EXPECT_EQ(layer0.size(), 3u);
  std::vector<int> layer1 = owners["layers.1.moe.experts.w1.weight"];
  EXPECT_EQ(layer1.size(), 4u);
  layer1.push_back(owners["layers.1.feed_forward.w2.weight"][0]);
  EXPECT_EQ(std::set<int>(layer1.begin(), layer1.end()).size(), 4u);
}

TEST(MuonExchange, OptimizerStepEqualsOneProcess) {
  // A Muon optimizer over FSDP-style row shards with the exchange moves each shard as the
  // one-process optimizer moves its rows, over three steps.
  at::manual_seed(12);
  const at::Tensor w0 = at::randn({10, 6});
  std::vector<at::Tensor> grads;
  for (int t = 0; t < 3; ++t) grads.push_back(at::randn({10, 6}));
  OptimizerSection cfg;
  cfg.name = "Muon";
  cfg.lr = 0.02;
  NamedParam whole{"layers.0.attention.wq.weight", w0.clone().set_requires_grad(true)};
  whole.matrix = true;
  Optimizer one({whole}, cfg);
  for (const at::Tensor& g : grads) {
    whole.param.mutable_grad() = g.clone();
    one.step(cfg.lr);
  }
  run_ranks(2, [&](int rank, std::shared_ptr<dist::Group> world) {
    const int64_t first = rank * 5;
    NamedParam p{whole.name, w0.narrow(0, first, 5).clone().set_requires_grad(true)};
    p.matrix = true;
    p.box = ShardBox{{10, 6}, {first, 0}};
    Optimizer opt({p}, cfg);
    opt.set_muon_orthogonalizer(std::make_unique<MuonExchange>(opt.muon_matrices(), world));
    for (const at::Tensor& g : grads) {
      p.param.mutable_grad() = g.narrow(0, first, 5).clone();
      opt.step(cfg.lr);
    }
    EXPECT_TRUE(at::equal(p.param, whole.param.narrow(0, first, 5))) << "rank " << rank;
  });
}

TEST(MuonExchange, RefusesOtherMatricesAndPiecesThatDoNotTile) {
  auto errors = run_ranks_collect(2, [&](int rank, std::shared_ptr<dist::Group> world) {
    std::vector<MuonMatrix> m = {
        {rank == 0 ? "layers.0.attention.wq.weight" : "layers.0.attention.wk.weight",
         ShardBox{{4, 4}, {rank * 2, 0}},
         {2, 4}}};
    MuonExchange exchange(m, world);
  });
  for (const std::string& e : errors) {
    EXPECT_NE(e.find("has other matrices than rank"), std::string::npos) << e;
  }
  errors = run_ranks_collect(2, [&](int rank, std::shared_ptr<dist::Group> world) {
    // Rows 0..2 and 1..3 of 4: overlapping pieces.
    std::vector<MuonMatrix> m = {
        {"layers.0.attention.wq.weight", ShardBox{{4, 4}, {rank, 0}}, {3, 4}}};
    MuonExchange exchange(m, world);
  });
  for (const std::string& e : errors) {
    EXPECT_NE(e.find("hold 24 values, not the matrix's 16"), std::string::npos) << e;
  }
}

}  // namespace muon_exchange_test
}  // namespace titan
