// FSDP / HSDP / DDP (DataParallel) on 1-4 ranks in threads, against one unsharded model on the
// whole batch: same losses, gradients, norms and optimizer updates, for every reshard policy,
// with and without prefetch, tied and untied embeddings, shard sizes that need padding. On a GPU
// (skipped without one) ranks also share cuda:0 over Gloo groups that stage the CUDA tensors (the
// shared-device test mode), so the forward's gathers run on the gather stream.
#include "parallel_test_util.h"

#include "titan/common/device.h"
#include "titan/components/loss.h"
#include "titan/components/optimizer.h"
#include "titan/models/common/init.h"
#include "titan/models/common/linear.h"
#include "titan/models/llama3/model.h"
#include "titan/parallel/data_parallel.h"

#include <gtest/gtest.h>

#include <map>
#include <mutex>

namespace titan {
namespace test_data_parallel {

using test::kBatchPerRank;
using test::kSeq;
using test::make_model;
using test::reference;
using test::Reference;
using test::rows_of;
using test::run_ranks;

// The gradients of the shards `dp` keeps (what its optimizer reads).
std::vector<at::Tensor> shard_grads(const DataParallel& dp) {
  std::vector<at::Tensor> out;
  for (const ShardedParam& p : dp.params()) out.push_back(p.local.grad());
  return out;
}

struct Layout {
  int replicate = 1;
  int shard = 1;
};

// Sets up the shard / replicate groups of `world` for `layout` (ranks ordered replicate-major).
DataParallelOptions options_for(const Layout& layout, const std::shared_ptr<dist::Group>& world) {
  DataParallelOptions o;
  const int rank = world->rank();
  const int rep = rank / layout.shard, sh = rank % layout.shard;
  std::vector<std::shared_ptr<dist::Group>> shard_groups, replicate_groups;
  for (int r = 0; r < layout.replicate; ++r) {
    std::vector<int> ranks;
    for (int s = 0; s < layout.shard; ++s) ranks.push_back(r * layout.shard + s);
    auto g = layout.shard > 1 ? world->new_subgroup("dp_shard", ranks) : nullptr;
    if (r == rep) o.shard_group = g;
  }
  for (int s = 0; s < layout.shard; ++s) {
    std::vector<int> ranks;
    for (int r = 0; r < layout.replicate; ++r) ranks.push_back(r * layout.shard + s);
    auto g = layout.replicate > 1 ? world->new_subgroup("dp_replicate", ranks) : nullptr;
    if (s == sh) o.replicate_group = g;
  }
  return o;
}

// One forward/backward (micro_batches of them) on every rank, checked against the reference.
void check_gradients(const Layout& layout, bool tied, const std::string& reshard, int64_t prefetch,
                     int64_t micro_batches = 1) {
  const int world_size = layout.replicate * layout.shard;
  const Reference ref = reference(world_size, tied, micro_batches);
  std::vector<std::shared_ptr<llama3::Transformer>> models;
  for (int r = 0; r < world_size; ++r) models.push_back(make_model(tied));
  run_ranks(world_size, [&](int rank, std::shared_ptr<dist::Group> world) {
    DataParallelOptions o = options_for(layout, world);
    o.reshard_after_forward = reshard;
    o.prefetch = prefetch;
    DataParallel dp(*models[rank], o);
    double loss_sum = 0;
    for (int64_t m = 0; m < micro_batches; ++m) {
      at::Tensor loss =
          lm_cross_entropy_loss(models[rank]->forward(rows_of(ref.inputs, rank, world_size, m)),
                                rows_of(ref.labels, rank, world_size, m));
      (loss / static_cast<double>(micro_batches)).backward();
      dp.finish_backward();
      loss_sum += loss.item<double>() / static_cast<double>(micro_batches);
    }
    at::Tensor mean = at::full({1}, loss_sum, at::kDouble);
    world->all_reduce(mean, dist::ReduceOp::kAvg).wait();
    EXPECT_NEAR(mean.item<double>(), ref.loss, 1e-5 * ref.loss) << "rank " << rank;
    for (const ShardedParam& p : dp.params()) {
      const at::Tensor want = ref.grads.at(p.name);
      ASSERT_EQ(at::IntArrayRef(p.box.global_shape), want.sizes()) << p.name;
      if (p.local.numel() == 0) continue;
      ASSERT_TRUE(p.local.grad().defined()) << p.name << " on rank " << rank;
      const at::Tensor rows = want.narrow(0, p.row_offset, p.local.size(0));
      EXPECT_TRUE(at::allclose(p.local.grad(), rows, 1e-4, 1e-6))
          << p.name << " on rank " << rank << ": max diff "
          << (p.local.grad() - rows).abs().max().item<double>();
    }
    EXPECT_NEAR(clip_grad_norm(shard_grads(dp), 0.0, {dp.norm_group()}), ref.grad_norm,
                1e-5 * ref.grad_norm);
  });
}

TEST(DataParallel, FsdpTwoRanksMatchesOneProcess) {
  check_gradients({1, 2}, /*tied=*/false, "default", /*prefetch=*/true);
}

TEST(DataParallel, FsdpThreeRanksPaddedShards) {
  check_gradients({1, 3}, /*tied=*/false, "default", /*prefetch=*/true);
}

TEST(DataParallel, ReshardPoliciesAndNoPrefetch) {
  check_gradients({1, 2}, false, "always", /*prefetch=*/true);
  check_gradients({1, 2}, false, "never", /*prefetch=*/true);
  check_gradients({1, 3}, false, "always", /*prefetch=*/false);
}

// parallelism.fsdp_prefetch_units > 1: several gathers in flight ahead, the same gradients.
TEST(DataParallel, PrefetchSeveralUnitsAhead) {
  check_gradients({1, 2}, false, "default", /*prefetch=*/3);
  check_gradients({1, 3}, false, "always", /*prefetch=*/2);
  check_gradients({1, 2}, /*tied=*/true, "always", /*prefetch=*/2);
}

TEST(DataParallel, TiedEmbeddingsUnitRunsTwice) {
  check_gradients({1, 2}, /*tied=*/true, "always", /*prefetch=*/true);
  check_gradients({2, 1}, /*tied=*/true, "default", /*prefetch=*/true);
}

TEST(DataParallel, HsdpTwoByTwo) { check_gradients({2, 2}, false, "default", true); }

TEST(DataParallel, DdpTwoReplicas) { check_gradients({2, 1}, false, "default", true); }

TEST(DataParallel, GradientAccumulationAddsMicroBatches) {
  check_gradients({1, 2}, false, "default", true, /*micro_batches=*/3);
}

// The test model with its parameters and buffers on `device`.
std::shared_ptr<llama3::Transformer> make_model_on(bool tied, const at::Device& device) {
  if (device.is_cpu()) return make_model(tied);
  ParamDeviceGuard guard(device);
  auto model = make_model(tied);
  for (auto& buffer : model->buffers()) buffer.set_data(buffer.to(device));
  return model;
}

// A forward without autograd (validation) on `ranks` ranks gives the reference logits and frees
// every unit. On a CUDA `device` all ranks compute on it, over Gloo groups staging the tensors.
void check_no_grad_forward(int ranks, const std::string& reshard, int64_t prefetch,
                           const at::Device& device = at::kCPU) {
  const at::Tensor tokens = at::randint(0, 61, {2, kSeq}, at::kLong);
  auto ref_model = make_model(false);
  at::Tensor want;
  {
    at::NoGradGuard no_grad;
    want = ref_model->forward(tokens);
  }
  std::vector<std::shared_ptr<llama3::Transformer>> models;
  for (int r = 0; r < ranks; ++r) models.push_back(make_model_on(false, device));
  dist::GroupOptions group_options = test::loopback_options();
  group_options.stage_cuda_tensors = device.is_cuda();
  // A GPU's float32 kernels sum in other orders than the CPU's.
  const double rtol = device.is_cuda() ? 1e-4 : 1e-5, atol = device.is_cuda() ? 1e-5 : 1e-6;
  run_ranks(
      ranks,
      [&](int rank, std::shared_ptr<dist::Group> world) {
        DataParallelOptions o;
        o.shard_group = world;
        o.reshard_after_forward = reshard;
        o.prefetch = prefetch;
        DataParallel dp(*models[rank], o);
        at::NoGradGuard no_grad;
        for (int i = 0; i < 2; ++i) {  // twice: the first must have left the units consistent
          const at::Tensor got = models[rank]->forward(tokens.to(device)).cpu();
          EXPECT_TRUE(at::allclose(got, want, rtol, atol))
              << (got - want).abs().max().item<double>();
        }
      },
      group_options);
}

TEST(DataParallel, NoGradForwardMatches) {
  check_no_grad_forward(2, "default", true);
  check_no_grad_forward(2, "default", /*prefetch=*/3);  // gathers ahead that validation ends
}

// Ranks sharing one GPU over Gloo (the shared-device test mode): the unit gathers run on the
// gather stream, unit i + 1's while unit i computes, and compute waits for them by event. Only
// forwards here: autograd runs a process's CUDA backward on one worker thread per device, so
// threads-as-ranks would queue one rank's backward behind another's blocked collective;
// gpu_check.sh's shared_parallel stage trains FSDP, TP and PP with one process per rank.
TEST(SharedDevice, FsdpForwardOnOneGpuMatchesOneProcess) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device visible; runs in gpu_check.sh";
  const at::Device cuda(at::kCUDA, 0);
  check_no_grad_forward(2, "default", /*prefetch=*/true, cuda);
  check_no_grad_forward(3, "always", /*prefetch=*/true, cuda);
  check_no_grad_forward(2, "never", /*prefetch=*/false, cuda);
  check_no_grad_forward(2, "always", /*prefetch=*/2, cuda);
}

// Every Linear of `model` computes in float8 (tensorwise, emulated; the tiny dims need not be
// multiples of 16 when emulated).
void to_float8_linears(llama3::Transformer& model) {
  Float8LinearOptions f8;
  f8.recipe = Float8Recipe::kTensorwise;
  f8.emulate = true;
  for (const auto& item : model.named_modules()) {
    if (auto* linear = dynamic_cast<Linear*>(item.value().get())) linear->float8 = f8;
  }
}

// Float8 all-gather (torchao's FSDP float8 all-gather): float8 layers' weights travel as float8
// bytes, scaled by the maximum over every shard. After the gather each layer holds exactly the
// cast of its whole weight (data bytes and scale), and two training steps (SGD in between, so
// the scales are taken again) give bitwise the losses and gradients of FSDP without it (float32
// params: the layers cast the same weight with the same scale either way), with the scales
// precomputed or per unit, for every reshard policy (the backward re-gathers revive what
// autograd saved). 3 ranks: rows of 24 and 61 are padded.
TEST(DataParallel, Float8AllGatherGathersTheWholeWeightCast) {
  constexpr int kRanks = 3;
  const Reference data = reference(kRanks, false);
  auto whole = make_model(false);
  to_float8_linears(*whole);
  const auto float8_layers = float8_linears(*whole);
  ASSERT_EQ(float8_layers.size(), 15u);  // 7 per block, output
  const double one_process_loss =
      lm_cross_entropy_loss(whole->forward(data.inputs), data.labels).item<double>();
  struct Result {
    std::vector<double> losses;
    std::vector<at::Tensor> grads;  // step by step, parameter by parameter
  };
  for (const char* reshard : {"never", "always", "default"}) {
    SCOPED_TRACE(reshard);
    std::vector<std::vector<Result>> by_mode(3, std::vector<Result>(kRanks));
    for (int mode = 0; mode < 3; ++mode) {  // off, gather, gather with precomputed scales
      std::vector<std::shared_ptr<llama3::Transformer>> models;
      for (int r = 0; r < kRanks; ++r) {
        models.push_back(make_model(false));
        to_float8_linears(*models.back());
      }
      run_ranks(kRanks, [&](int rank, std::shared_ptr<dist::Group> world) {
        DataParallelOptions o = options_for({1, kRanks}, world);
        o.reshard_after_forward = reshard;
        o.float8_all_gather = mode >= 1;
        o.float8_precompute_scales = mode == 2;
        DataParallel dp(*models[rank], o);
        EXPECT_EQ(dp.describe().find("float8 all-gather of 15 weights") != std::string::npos,
                  mode >= 1)
            << dp.describe();
        Result& result = by_mode[mode][rank];
        for (int step = 0; step < 2; ++step) {
          at::Tensor loss =
              lm_cross_entropy_loss(models[rank]->forward(rows_of(data.inputs, rank, kRanks, 0)),
                                    rows_of(data.labels, rank, kRanks, 0));
          if (mode >= 1 && step == 0 && std::string(reshard) == "never") {
            // Every unit still gathered: each layer holds the whole weight's float8 cast.
            for (const auto& [name, layer] : float8_linears(*models[rank])) {
              ASSERT_TRUE(layer->float8_weight.has_value()) << name;
              const at::Tensor w = whole->named_parameters()[name];
              const Float8Tensor want =
                  to_float8(w, at::kFloat8_e4m3fn, std::nullopt, /*power_of_2=*/false);
              EXPECT_TRUE(
                  at::equal(layer->float8_weight->data.view(at::kByte), want.data.view(at::kByte)))
                  << name;
              EXPECT_TRUE(at::equal(layer->float8_weight->scale, want.scale)) << name;
              // The unsharded weight holds the dequantized values.
              EXPECT_TRUE(at::equal(layer->weight, from_float8(want, at::kFloat))) << name;
            }
          }
          loss.backward();
          dp.finish_backward();
          result.losses.push_back(loss.item<double>());
          at::NoGradGuard no_grad;
          for (const ShardedParam& p : dp.params()) {
            if (p.local.numel() == 0) continue;
            result.grads.push_back(p.local.grad().clone());
            p.local.sub_(p.local.grad(), 0.05);
          }
          dp.zero_grad();
        }
      });
    }
    for (int r = 0; r < kRanks; ++r) {
      const Result& off = by_mode[0][r];
      for (int mode = 1; mode < 3; ++mode) {
        const Result& on = by_mode[mode][r];
        ASSERT_EQ(on.losses.size(), off.losses.size());
        for (size_t s = 0; s < off.losses.size(); ++s) {
          EXPECT_EQ(on.losses[s], off.losses[s]) << "mode " << mode << " rank " << r;
        }
        ASSERT_EQ(on.grads.size(), off.grads.size());
        for (size_t i = 0; i < off.grads.size(); ++i) {
          EXPECT_TRUE(at::equal(on.grads[i], off.grads[i])) << "mode " << mode << " rank " << r;
        }
      }
    }
    // The first step's mean loss over the ranks is the one-process float8 loss up to the
    // activations' scales, which each rank takes over its own 2 rows (measured 1.7e-3 relative;
    // a layer fed another weight or a wrong scale is off by far more).
    double mean = 0;
    for (int r = 0; r < kRanks; ++r) mean += by_mode[1][r].losses[0] / kRanks;
    EXPECT_NEAR(mean, one_process_loss, 1e-2 * one_process_loss);
  }
}

// Optimizer steps on the shards == steps on the whole model.
TEST(DataParallel, AdamWStepsOnShardsMatchWholeModel) {
  OptimizerSection opt;
  opt.lr = 1e-2;
  opt.weight_decay = 0.1;
  const Reference data = reference(3, false);
  auto ref_model = make_model(false);
  std::vector<NamedParam> ref_params;
  std::vector<at::Tensor> ref_tensors;
  for (const auto& item : ref_model->named_parameters()) {
    ref_params.push_back({item.key(), item.value()});
    ref_tensors.push_back(item.value());
  }
  Optimizer ref_opt(ref_params, opt);
  for (int step = 0; step < 3; ++step) {
    ref_opt.zero_grad();
    lm_cross_entropy_loss(ref_model->forward(data.inputs), data.labels).backward();
    clip_grad_norm(grads_of(ref_tensors), 0.05);
    ref_opt.step(opt.lr);
  }
  std::vector<std::shared_ptr<llama3::Transformer>> models;
  for (int r = 0; r < 3; ++r) models.push_back(make_model(false));
  std::mutex mu;
  run_ranks(3, [&](int rank, std::shared_ptr<dist::Group> world) {
    DataParallelOptions o;
    o.shard_group = world;
    DataParallel dp(*models[rank], o);
    std::vector<NamedParam> shards;
    for (const auto& p : dp.params()) shards.push_back({p.name, p.local});
    Optimizer optimizer(shards, opt);
    for (int step = 0; step < 3; ++step) {
      dp.zero_grad();
      lm_cross_entropy_loss(models[rank]->forward(rows_of(data.inputs, rank, 3, 0)),
                            rows_of(data.labels, rank, 3, 0))
          .backward();
      dp.finish_backward();
      clip_grad_norm(shard_grads(dp), 0.05, {dp.norm_group()});
      optimizer.step(opt.lr);
    }
    const auto full = dp.gather_full_parameters();
    const auto want = ref_model->named_parameters();
    // Adam divides by sqrt(v): where a gradient is ~0, summation-order noise in it moves the
    // update by a small fraction of lr; the bound is 1% of one step (lr = 1e-2).
    for (const auto& [name, t] : full) {
      EXPECT_TRUE(at::allclose(t, want[name], 1e-4, 1e-4))
          << name << ": " << (t - want[name]).abs().max().item<double>();
    }
  });
}

TEST(DataParallel, GatherAndLoadFullParameters) {
  auto original = make_model(false);
  std::map<std::string, at::Tensor> want;
  for (const auto& item : original->named_parameters()) want[item.key()] = item.value().clone();
  std::vector<std::shared_ptr<llama3::Transformer>> models;
  for (int r = 0; r < 4; ++r) models.push_back(make_model(false));
  run_ranks(4, [&](int rank, std::shared_ptr<dist::Group> world) {
    DataParallelOptions o;
    o.shard_group = world;
    DataParallel dp(*models[rank], o);
    for (const auto& [name, t] : dp.gather_full_parameters()) {
      EXPECT_TRUE(at::equal(t, want.at(name))) << name;
    }
    dp.load_full_parameters([&](const std::string& name) { return want.at(name) * 2; });
    for (const auto& [name, t] : dp.gather_full_parameters()) {
      EXPECT_TRUE(at::equal(t, want.at(name) * 2)) << name;
    }
  });
}

// Per-rank parameter bytes are the model's / shard size, up to padding of < 1 row per parameter.
TEST(DataParallel, MemoryAccountingIsOneOverShardSize) {
  auto original = make_model(false);
  int64_t total = 0, max_row_bytes = 0, n_params = 0;
  for (const auto& item : original->named_parameters()) {
    total += item.value().numel() * 4;
    max_row_bytes =
        std::max<int64_t>(max_row_bytes, item.value().numel() / item.value().size(0) * 4);
    ++n_params;
  }
  for (int n : {2, 3, 4}) {
    std::vector<std::shared_ptr<llama3::Transformer>> models;
    for (int r = 0; r < n; ++r) models.push_back(make_model(false));
    run_ranks(n, [&](int rank, std::shared_ptr<dist::Group> world) {
      DataParallelOptions o;
      o.shard_group = world;
      DataParallel dp(*models[rank], o);
      const DataParallelMemory m = dp.memory();
      EXPECT_EQ(m.total_param_bytes, total);
      EXPECT_GE(m.shard_param_bytes * n, total);
      EXPECT_LE(m.shard_param_bytes * n, total + n * n_params * max_row_bytes);
      // The model itself keeps nothing: its parameters were released.
      for (const auto& item : models[rank]->named_parameters()) EXPECT_EQ(item.value().numel(), 0);
      int64_t local = 0;
      for (const auto& p : dp.params()) local += p.local.numel() * 4;
      EXPECT_LE(local, m.shard_param_bytes);
    });
  }
}

// bf16 all-gather (mixed_precision_param) tracks the unsharded bf16 model closely.
TEST(DataParallel, Bf16ParamsCloseToReference) {
  const Reference data = reference(2, false);
  auto ref_model = make_model(false, at::kBFloat16);
  const double want =
      lm_cross_entropy_loss(ref_model->forward(data.inputs), data.labels).item<double>();
  std::vector<std::shared_ptr<llama3::Transformer>> models{make_model(false, at::kBFloat16),
                                                           make_model(false, at::kBFloat16)};
  run_ranks(2, [&](int rank, std::shared_ptr<dist::Group> world) {
    DataParallelOptions o;
    o.shard_group = world;
    o.param_dtype = at::kBFloat16;
    DataParallel dp(*models[rank], o);
    at::Tensor loss = lm_cross_entropy_loss(models[rank]->forward(rows_of(data.inputs, rank, 2, 0)),
                                            rows_of(data.labels, rank, 2, 0));
    loss.backward();
    dp.finish_backward();
    at::Tensor mean = at::full({1}, loss.item<double>(), at::kDouble);
    world->all_reduce(mean, dist::ReduceOp::kAvg).wait();
    EXPECT_NEAR(mean.item<double>(), want, 2e-2 * want);
    for (const auto& p : dp.params()) {
      if (p.local.numel() > 0) {
        EXPECT_EQ(p.local.grad().scalar_type(), at::kFloat) << p.name;
      }
    }
  });
}

TEST(DataParallel, ParameterSlotsCoverEveryParameter) {
  auto model = make_model(true);
  const auto slots = parameter_slots(*model);
  EXPECT_EQ(slots.size(), model->named_parameters().size());
  int64_t in_units = 0;
  for (const auto& u : model->units()) in_units += static_cast<int64_t>(u.params.size());
  EXPECT_EQ(in_units, static_cast<int64_t>(slots.size()));
}

}  // namespace test_data_parallel
}  // namespace titan
