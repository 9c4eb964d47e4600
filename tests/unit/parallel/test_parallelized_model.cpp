// The parallelized model as the trainer holds it: for every layout (one process, FSDP, HSDP, DDP,
// TP + FSDP) with activation checkpointing on and off, one object gives the single-process
// loss, every gradient (of this rank's boxes), the global grad norm, whole parameters gathered
// back, and loads whole parameters into its boxes; and each rank holds the parameters the memory
// estimate gives it. Ranks are threads over a HashStore.
#include "parallel_test_util.h"

#include "titan/config/job_config.h"
#include "titan/models/registry.h"
#include "titan/parallel/parallelize.h"
#include "titan/parallel/parallelized_model.h"
#include "titan/plan/memory_estimate.h"
#include "titan/plan/memory_options.h"

#include <gtest/gtest.h>

namespace titan {
namespace test_parallelized_model {

using test::kBatchPerRank;
using test::make_model;
using test::reference;
using test::rows_of;

void expect_close(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  const double scale = want.abs().max().item<double>() + 1e-6;
  EXPECT_LT((got - want).abs().max().item<double>(), 2e-5 * scale) << what;
}

struct Layout {
  const char* name;
  ParallelDegrees degrees;
};

using test::degrees;

ParallelizeOptions options(const std::string& ac_mode) {
  ParallelizeOptions o;
  o.activation_checkpoint.mode = ac_mode;
  o.activation_checkpoint.selective_ac_option = "1";
  o.seq_lens = {{"training.seq_len", test::kSeq}};
  return o;
}

// Every layout of 4 ranks against the unsharded model on the same global batch.
void check_layouts(const std::string& ac_mode) {
  const std::vector<Layout> layouts = {{"FSDP 4", degrees(1, 4, 1)},
                                       {"HSDP 2x2", degrees(2, 2, 1)},
                                       {"DDP 4", degrees(4, 1, 1)},
                                       {"FSDP 2 x TP 2", degrees(1, 2, 2)}};
  for (const Layout& layout : layouts) {
    SCOPED_TRACE(std::string(layout.name) + ", activation checkpointing " + ac_mode);
    // The unsharded model on the global batch (the data-parallel ranks' rows); models and
    // reference weights are built before the threads (init uses the global generator).
    const ParallelDims mesh(layout.degrees, 4);
    const test::Reference ref = reference(static_cast<int>(mesh.dp_size()), /*tied=*/false, 1,
                                          /*vocab=*/62);
    const auto named = make_model(false, at::kFloat, 62)->named_parameters();
    std::vector<std::shared_ptr<llama3::Transformer>> models;
    for (int r = 0; r < 4; ++r) models.push_back(make_model(false, at::kFloat, 62));
    test::run_ranks(4, [&](int rank, std::shared_ptr<dist::Group> world) {
      ParallelDims dims(layout.degrees, 4);
      dims.build_groups(world);
      auto pm = parallelize_decoder(models[rank], dims, rank, options(ac_mode));
      const int64_t dp = dims.dp_rank(rank);
      pm->zero_grad();
      at::Tensor loss = pm->loss(pm->model().forward(rows_of(ref.inputs, dp, dims.dp_size(), 0)),
                                 rows_of(ref.labels, dp, dims.dp_size(), 0));
      loss.backward();
      pm->finish_backward();
      EXPECT_NEAR(pm->batch_mean(loss).item<double>(), ref.loss, 1e-5 * ref.loss) << layout.name;
      // Gradients before clipping (the clip would rescale them).
      std::map<std::string, at::Tensor> grads;
      for (const TrainedParam& p : pm->params()) {
        EXPECT_EQ(at::IntArrayRef(p.box.global_shape), ref.grads.at(p.name).sizes()) << p.name;
        if (p.local.numel() > 0 && !p.tp_replicated) {
          expect_close(p.local.grad(), p.box.narrow(ref.grads.at(p.name), p.local.sizes()),
                       p.name + " on rank " + std::to_string(rank));
        }
      }
      EXPECT_NEAR(pm->clip_grad_norm(0.0), ref.grad_norm, 1e-5 * ref.grad_norm);
      // Whole parameters back, and loaded into the boxes.
      const auto full = pm->gather_full_parameters();
      for (const auto& [name, t] : full) expect_close(t, named[name], name + " gathered");
      pm->load_full_parameters([&](const std::string& name) { return named[name] * 2; });
      for (const auto& [name, t] : pm->gather_full_parameters()) {
        expect_close(t, named[name] * 2, name + " loaded");
      }
      // Exactly one rank writes each box of each parameter.
      int64_t writers = 0;
      for (const TrainedParam& p : pm->params()) writers += p.writer ? 1 : 0;
      at::Tensor count = at::full({1}, writers, at::kLong);
      world->all_reduce(count, dist::ReduceOp::kSum).wait();
      const int64_t boxes_per_param = layout.degrees.dp_shard * layout.degrees.tp;
      const int64_t n_params = static_cast<int64_t>(named.size());
      EXPECT_LE(count.item<int64_t>(), n_params * boxes_per_param);
      EXPECT_GE(count.item<int64_t>(), n_params);
    });
  }
}

TEST(ParallelizedModel, EveryLayoutMatchesOneProcess) { check_layouts("none"); }

TEST(ParallelizedModel, EveryLayoutMatchesOneProcessWithFullActivationCheckpointing) {
  check_layouts("full");
}

// One process: the object adds nothing (same losses and gradients as the bare model, bitwise),
// and describes activation checkpointing when it is on.
TEST(ParallelizedModel, OneProcessIsTheBareModel) {
  const test::Reference ref = reference(1, /*tied=*/true);
  ParallelDims dims(degrees(1, 1, 1), 1);
  auto pm = parallelize_decoder(make_model(true), dims, 0, options("full"));
  EXPECT_EQ(pm->describe().size(), 1u);  // activation checkpointing only
  EXPECT_FALSE(pm->communicates());
  at::Tensor loss = pm->loss(pm->model().forward(ref.inputs), ref.labels);
  loss.backward();
  pm->finish_backward();
  EXPECT_EQ(loss.item<double>(), ref.loss);
  for (const TrainedParam& p : pm->params()) {
    EXPECT_TRUE(p.writer);
    EXPECT_TRUE(at::equal(p.local.grad(), ref.grads.at(p.name))) << p.name;
  }
}

// parallel/ owns the parallelize functions by model name: parallelize_decoder unless a model
// registers its own, which then replaces it for that model only.
TEST(ParallelizedModel, ParallelizeFunctionsByModelName) {
  ParallelDims dims(degrees(1, 1, 1), 1);
  const ParallelizeOptions o = options("full");
  EXPECT_EQ(parallelize_fn("llama3")(make_model(true), dims, 0, o)->describe().size(), 1u);
  int calls = 0;
  register_parallelize("test_parallelize_model",
                       [&](std::shared_ptr<Model> model, const ParallelDims& d, int64_t rank,
                           const ParallelizeOptions& opts) {
                         ++calls;
                         ParallelizeOptions none = opts;
                         none.activation_checkpoint.mode = "none";
                         return parallelize_decoder(std::move(model), d, rank, none);
                       });
  EXPECT_TRUE(parallelize_fn("test_parallelize_model")(make_model(true), dims, 0, o)
                  ->describe()
                  .empty());  // its own options: no activation checkpointing
  EXPECT_EQ(calls, 1);
  parallelize_fn("llama3")(make_model(true), dims, 0, o);
  EXPECT_EQ(calls, 1);
}

// The parameters the memory estimate gives a rank (`titan inspect`, `titan plan` and the start-up
// check share it) are what each rank of the parallelized model holds, on average over the ranks:
// the tiny MoE (routed experts about half its parameters) over 4 ranks, with TP keeping the
// experts whole and replicated (etp 1) or splitting them (etp = tp), and EP with either.
TEST(ParallelizedModel, MemoryEstimateGivesEachRankTheParametersItHolds) {
  struct Case {
    const char* name;
    ParallelDegrees degrees;
  };
  const auto with = [](int64_t replicate, int64_t shard, int64_t tp, int64_t ep, int64_t etp) {
    ParallelDegrees d = degrees(replicate, shard, tp);
    d.ep = ep;
    d.etp = etp;
    return d;
  };
  const std::vector<Case> cases = {
      {"FSDP 4", with(1, 4, 1, 1, 1)},
      {"FSDP 2 x TP 2, whole experts", with(1, 2, 2, 1, 1)},
      {"FSDP 2 x TP 2, experts split over tp", with(1, 2, 2, 1, 2)},
      {"FSDP 2 x TP 2 x EP 2, whole experts", with(1, 2, 2, 2, 1)},
      {"FSDP 2 x TP 2 x EP 2, experts split over tp", with(1, 2, 2, 2, 2)},
      {"FSDP 4 x EP 2", with(1, 4, 1, 2, 1)},
      {"FSDP 4 x EP 4", with(1, 4, 1, 4, 1)},
      {"HSDP 2 x 2 x EP 2", with(2, 2, 1, 2, 1)},
  };
  const ModelSpec& spec = get_model_spec("qwen3");
  ModelBuildOptions build;
  build.max_seq_len = test::kSeq;
  build.seed = 7;
  std::map<std::string, double> held;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    JobConfig config;
    config.model.name = "qwen3";
    config.model.flavor = "tiny_moe";
    config.training.seq_len = test::kSeq;
    ParallelismSection& p = config.parallelism;
    p.data_parallel_replicate_degree = c.degrees.dp_replicate;
    p.data_parallel_shard_degree = c.degrees.dp_shard;
    p.tensor_parallel_degree = c.degrees.tp;
    p.expert_parallel_degree = c.degrees.ep;
    p.expert_tensor_parallel_degree = c.degrees.etp;
    const MemoryEstimate need =
        estimate_training_memory(spec, "tiny_moe", 1, test::kSeq, at::kFloat,
                                 training_memory_options(config, 4 / c.degrees.dp_replicate));
    ASSERT_EQ(need.parts[0].name, "weights (fp32)");
    const double predicted = need.parts[0].bytes / 4;

    std::vector<std::shared_ptr<Model>> models;
    for (int r = 0; r < 4; ++r) models.push_back(spec.build("tiny_moe", build));
    std::vector<double> mean(4, 0);
    test::run_ranks(4, [&](int rank, std::shared_ptr<dist::Group> world) {
      ParallelDims dims(c.degrees, 4);
      dims.build_groups(world);
      auto pm = parallelize_decoder(models[rank], dims, rank, options("none"));
      int64_t numel = 0;
      for (const TrainedParam& param : pm->params()) numel += param.local.numel();
      at::Tensor sum = at::full({1}, numel, at::kLong);
      world->all_reduce(sum, dist::ReduceOp::kSum).wait();
      mean[rank] = static_cast<double>(sum.item<int64_t>()) / 4;
    });
    EXPECT_NEAR(predicted, mean[0], 0.02 * mean[0]);
    held[c.name] = mean[0];
  }
  // Whole experts replicated over tp cost a tp rank about half the model more than split ones.
  EXPECT_GT(held["FSDP 2 x TP 2, whole experts"],
            1.3 * held["FSDP 2 x TP 2, experts split over tp"]);
}

}  // namespace test_parallelized_model
}  // namespace titan
