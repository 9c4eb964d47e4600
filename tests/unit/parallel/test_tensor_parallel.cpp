// Tensor + sequence parallelism on 2 ranks, and composed with FSDP (2 x 2), in threads, against
// the unsharded model: same loss (with and without loss parallel), gradients of every box, global
// gradient norm; and the clear errors for splits that do not divide.
#include "parallel_test_util.h"

#include "titan/parallel/data_parallel.h"
#include "titan/parallel/tensor_parallel.h"

#include <gtest/gtest.h>

namespace titan {
namespace test_tensor_parallel {

using test::kBatchPerRank;
using test::make_model;
using test::reference;
using test::Reference;
using test::rows_of;
using test::run_ranks;
using test::run_ranks_collect;

constexpr int64_t kVocab = 62;  // divisible by 2

void expect_close(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  EXPECT_TRUE(at::allclose(got, want, 1e-4, 1e-6))
      << what << ": max diff " << (got - want).abs().max().item<double>();
}

// TP over 2 ranks, each on the whole batch (tp ranks share their data).
void check_tp2(bool loss_parallel) {
  const Reference ref = reference(1, false, 1, kVocab);
  std::vector<std::shared_ptr<llama3::Transformer>> models;
  for (int r = 0; r < 2; ++r) models.push_back(make_model(false, at::kFloat, kVocab));
  run_ranks(2, [&](int rank, std::shared_ptr<dist::Group> world) {
    auto& model = *models[rank];
    TensorParallel tp(model, world, loss_parallel);
    at::Tensor logits = model.forward(ref.inputs);
    EXPECT_EQ(logits.size(1), ref.inputs.size(1));
    EXPECT_EQ(logits.size(2), loss_parallel ? kVocab / 2 : kVocab);
    at::Tensor loss = tp.cross_entropy(logits, ref.labels);
    EXPECT_NEAR(loss.item<double>(), ref.loss, 1e-5 * ref.loss);
    loss.backward();
    std::vector<std::pair<std::string, at::Tensor>> grads;
    std::vector<at::Tensor> tensors;
    std::vector<double> weights;
    for (const auto& item : model.named_parameters()) {
      grads.emplace_back(item.key(), item.value().grad());
      tensors.push_back(item.value().grad());
      weights.push_back(tp.replicated(item.key()) ? 0.5 : 1.0);
    }
    tp.reduce_replicated_grads(grads);
    for (const auto& [name, g] : grads) {
      const ParamPlacement& p = tp.placements().at(name);
      EXPECT_EQ(at::IntArrayRef(p.box.global_shape), ref.grads.at(name).sizes()) << name;
      expect_close(g, p.box.narrow(ref.grads.at(name), g.sizes()),
                   name + " on rank " + std::to_string(rank));
    }
    EXPECT_NEAR(clip_grad_norm(tensors, 0.0, {world.get()}, weights), ref.grad_norm,
                1e-5 * ref.grad_norm);
  });
}

TEST(TensorParallel, TwoRanksWithLossParallelMatchOneProcess) { check_tp2(true); }

TEST(TensorParallel, TwoRanksGatheredLossMatchesOneProcess) { check_tp2(false); }

// The plan shards every matrix and replicates only the norms.
TEST(TensorParallel, PlanShardsMatricesAndReplicatesNorms) {
  std::vector<std::shared_ptr<llama3::Transformer>> models;
  for (int r = 0; r < 2; ++r) models.push_back(make_model(false, at::kFloat, kVocab));
  run_ranks(2, [&](int rank, std::shared_ptr<dist::Group> world) {
    TensorParallel tp(*models[rank], world, true);
    for (const auto& [name, p] : tp.placements()) {
      const bool norm = name.find("norm") != std::string::npos;
      EXPECT_EQ(p.replicated, norm) << name;
    }
    const auto& wo = tp.placements().at("layers.0.attention.wo.weight");
    EXPECT_EQ(wo.box.offsets, (std::vector<int64_t>{0, rank * 12}));  // row-wise: columns split
    const auto& wq = tp.placements().at("layers.0.attention.wq.weight");
    EXPECT_EQ(wq.box.offsets, (std::vector<int64_t>{rank * 12, 0}));  // column-wise: rows split
  });
}

// 2D: FSDP over dp_shard 2 of TP 2 shards (mesh [dp_shard, tp], tp ranks adjacent).
TEST(TensorParallel, ComposesWithFsdpTwoByTwo) {
  const Reference ref = reference(2, false, 1, kVocab);
  std::vector<std::shared_ptr<llama3::Transformer>> models;
  for (int r = 0; r < 4; ++r) models.push_back(make_model(false, at::kFloat, kVocab));
  run_ranks(4, [&](int rank, std::shared_ptr<dist::Group> world) {
    const int dp = rank / 2, tp_rank = rank % 2;
    std::shared_ptr<dist::Group> tp_group, dp_group;
    for (int d = 0; d < 2; ++d) {
      auto g = world->new_subgroup("tp", {2 * d, 2 * d + 1});
      if (d == dp) tp_group = g;
    }
    for (int t = 0; t < 2; ++t) {
      auto g = world->new_subgroup("dp_shard", {t, t + 2});
      if (t == tp_rank) dp_group = g;
    }
    auto& model = *models[rank];
    TensorParallel tp(model, tp_group, true);
    DataParallelOptions o;
    o.shard_group = dp_group;
    o.placements = tp.placements();
    DataParallel fsdp(model, o);
    at::Tensor loss = tp.cross_entropy(model.forward(rows_of(ref.inputs, dp, 2, 0)),
                                       rows_of(ref.labels, dp, 2, 0));
    loss.backward();
    fsdp.finish_backward();
    std::vector<std::pair<std::string, at::Tensor>> grads;
    std::vector<at::Tensor> tensors;
    std::vector<double> weights;
    for (const auto& p : fsdp.params()) {
      grads.emplace_back(p.name, p.local.grad());
      tensors.push_back(p.local.grad());
      weights.push_back(tp.replicated(p.name) ? 0.5 : 1.0);
    }
    tp.reduce_replicated_grads(grads);
    at::Tensor mean = at::full({1}, loss.item<double>(), at::kDouble);
    dp_group->all_reduce(mean, dist::ReduceOp::kAvg).wait();
    EXPECT_NEAR(mean.item<double>(), ref.loss, 1e-5 * ref.loss);
    for (const auto& p : fsdp.params()) {
      EXPECT_EQ(at::IntArrayRef(p.box.global_shape), ref.grads.at(p.name).sizes()) << p.name;
      if (p.local.numel() == 0) continue;
      expect_close(p.local.grad(), p.box.narrow(ref.grads.at(p.name), p.local.sizes()),
                   p.name + " on rank " + std::to_string(rank));
    }
    EXPECT_NEAR(clip_grad_norm(tensors, 0.0, {dp_group.get(), tp_group.get()}, weights),
                ref.grad_norm, 1e-5 * ref.grad_norm);
  });
}

TEST(TensorParallel, SplitsThatDoNotDivideAreConfigErrors) {
  // 4 ranks: n_kv_heads 2 cannot be split 4 ways.
  std::vector<std::shared_ptr<llama3::Transformer>> models;
  for (int r = 0; r < 4; ++r) models.push_back(make_model(false, at::kFloat, 64));
  auto errors = run_ranks_collect(4, [&](int rank, std::shared_ptr<dist::Group> world) {
    TensorParallel tp(*models[rank], world, true);
  });
  for (const auto& e : errors) {
    EXPECT_NE(e.find("n_kv_heads 2; both must be divisible by tensor_parallel_degree 4"),
              std::string::npos)
        << e;
  }
  // Vocabulary 61 cannot be split 2 ways; tied embeddings are refused.
  std::vector<std::shared_ptr<llama3::Transformer>> odd{make_model(false), make_model(false)};
  errors = run_ranks_collect(2, [&](int rank, std::shared_ptr<dist::Group> world) {
    TensorParallel tp(*odd[rank], world, true);
  });
  EXPECT_NE(errors[0].find("tok_embeddings.weight has 61 vocabulary rows, not divisible by "
                           "tensor_parallel_degree 2"),
            std::string::npos)
      << errors[0];
  std::vector<std::shared_ptr<llama3::Transformer>> tied{make_model(true, at::kFloat, kVocab),
                                                         make_model(true, at::kFloat, kVocab)};
  errors = run_ranks_collect(2, [&](int rank, std::shared_ptr<dist::Group> world) {
    TensorParallel tp(*tied[rank], world, true);
  });
  EXPECT_NE(errors[1].find("does not support tied embeddings"), std::string::npos) << errors[1];
}

}  // namespace test_tensor_parallel
}  // namespace titan
