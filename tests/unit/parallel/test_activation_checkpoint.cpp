// Activation checkpointing against the same model without it: loss and every gradient, bitwise
// for full and every-Nth AC and for per-op AC (whose replayed ops use autograd's own backward
// formulas), in float32 and bf16 compute; composed with FSDP (2 ranks), TP (2 ranks) and both
// (2 x 2) against the same layout without AC. Also: which blocks each mode checkpoints
// (TorchTitan's every-Nth counter), that checkpointed blocks really run again in backward, that
// the random state is replayed, that a block that changes shape when recomputed is named, the
// config errors, and the memory kept by forward (CpuMemoryProbe: bytes of live CPU tensors
// after forward + loss, before backward) per mode.
#include "parallel_test_util.h"

#include "../op_counter.h"
#include "../sdp_switches.h"
#include "../test_util.h"
#include "titan/common/device.h"
#include "titan/common/memory_probe.h"
#include "titan/components/loss.h"
#include "titan/models/common/linear.h"
#include "titan/parallel/activation_checkpoint.h"
#include "titan/parallel/data_parallel.h"
#include "titan/parallel/tensor_parallel.h"

#include <gtest/gtest.h>

#include <iostream>
#include <map>

namespace titan {
namespace test_activation_checkpoint {

using test::message_of;
using test::run_ranks;

constexpr int64_t kVocab = 62;  // divisible by 2 for TP

ActivationCheckpointSection ac_config(const std::string& mode, const std::string& option = "2") {
  ActivationCheckpointSection c;
  c.mode = mode;
  c.selective_ac_option = option;
  return c;
}

std::shared_ptr<llama3::Transformer> model_with(int64_t layers, at::ScalarType dtype = at::kFloat,
                                                int64_t dim = 24) {
  llama3::Llama3Args args = test::tiny_args(/*tied=*/false, kVocab);
  args.n_layers = layers;
  args.dim = dim;
  args.max_seq_len = 64;
  auto m = std::make_shared<llama3::Transformer>(args, dtype);
  m->init_weights(/*seed=*/1234);
  return m;
}

struct Batch {
  at::Tensor inputs, labels;
};
Batch batch(int64_t rows = 2, int64_t seq = test::kSeq) {
  at::manual_seed(99);
  return {at::randint(0, kVocab, {rows, seq}, at::kLong),
          at::randint(0, kVocab, {rows, seq}, at::kLong)};
}

struct Step {
  double loss = 0;
  std::vector<std::pair<std::string, at::Tensor>> grads;  // (name, gradient)
};

Step train_step(Model& model, const Batch& b, const ForwardInputs& inputs = {}) {
  at::Tensor loss = lm_cross_entropy_loss(model.forward(b.inputs, inputs), b.labels);
  loss.backward();
  Step s{loss.item<double>(), {}};
  for (const auto& item : model.named_parameters()) {
    s.grads.emplace_back(item.key(), item.value().grad().clone());
  }
  return s;
}

// Same loss and gradients: bitwise when tol == 0, else allclose(rtol = tol, atol = tol / 100).
void expect_same_step(const Step& got, const Step& want, double tol, const std::string& what) {
  if (tol == 0) {
    EXPECT_EQ(got.loss, want.loss) << what;
  } else {
    EXPECT_NEAR(got.loss, want.loss, tol * std::abs(want.loss)) << what;
  }
  ASSERT_EQ(got.grads.size(), want.grads.size()) << what;
  for (size_t i = 0; i < want.grads.size(); ++i) {
    const at::Tensor& g = got.grads[i].second;
    const at::Tensor& w = want.grads[i].second;
    ASSERT_TRUE(g.defined() && w.defined()) << what << ": " << want.grads[i].first;
    const bool same = tol == 0 ? at::equal(g, w) : at::allclose(g, w, tol, tol / 100);
    EXPECT_TRUE(same) << what << ": " << want.grads[i].first << " max diff "
                      << (g.to(at::kDouble) - w.to(at::kDouble)).abs().max().item<double>();
  }
}

// Counts each unit's runs; installed inside AC, so it sees the recomputations too.
class RunCounter : public UnitRunner {
 public:
  at::Tensor run(int64_t index, const at::Tensor& input, const UnitFn& next) override {
    ++runs[index];
    return next(input);
  }
  std::map<int64_t, int64_t> runs;
};

// A step with `config`: the same loss and gradients as without AC, and each block runs twice
// (forward + recomputation) exactly when checkpointed.
void check_mode(const ActivationCheckpointSection& config, int64_t layers,
                const std::vector<int64_t>& checkpointed_blocks, at::ScalarType dtype, double tol) {
  const Batch b = batch();
  auto plain = model_with(layers, dtype);
  const Step want = train_step(*plain, b);
  auto model = model_with(layers, dtype);
  RunCounter counter;
  model->add_unit_runner(&counter);
  auto ac = apply_activation_checkpointing(*model, config);
  ASSERT_NE(ac, nullptr);
  const std::string what = config.mode + " " + config.selective_ac_option;
  expect_same_step(train_step(*model, b), want, tol, what);
  for (int64_t block = 0; block < layers; ++block) {
    const bool chosen = std::count(checkpointed_blocks.begin(), checkpointed_blocks.end(), block);
    EXPECT_EQ(ac->checkpointed(block + 1), chosen) << what << ", block " << block;
    EXPECT_EQ(counter.runs[block + 1], chosen ? 2 : 1) << what << ", block " << block;
  }
  EXPECT_EQ(counter.runs[0], 1);           // embeddings: never checkpointed
  EXPECT_EQ(counter.runs[layers + 1], 1);  // norm + output
  EXPECT_EQ(ac->recomputations(), static_cast<int64_t>(checkpointed_blocks.size()));
  model->remove_unit_runner(&counter);
}

// The policy the memory estimate counts is the one the runner applies.
TEST(ActivationCheckpointing, PolicyOfEveryMode) {
  EXPECT_EQ(ac_policy(ac_config("none")).every, 0);
  EXPECT_FALSE(ac_policy(ac_config("none")).per_op);
  EXPECT_EQ(ac_policy(ac_config("full")).every, 1);
  EXPECT_EQ(ac_policy(ac_config("selective", "3")).every, 3);
  EXPECT_TRUE(ac_policy(ac_config("selective", "op")).per_op);
  EXPECT_EQ(ac_policy(ac_config("selective", "op")).every, 0);
  EXPECT_THROW(ac_policy(ac_config("selective", "0")), ConfigError);
  EXPECT_THROW(ac_policy(ac_config("memory_budget")), ConfigError);
}

TEST(ActivationCheckpointing, FullModeGivesBitwiseTheSameGradients) {
  check_mode(ac_config("full"), 4, {0, 1, 2, 3}, at::kFloat, /*tol=*/0);
}

// TorchTitan's counter over blocks, incremented before the test: N = 2 -> blocks 1, 3.
TEST(ActivationCheckpointing, SelectiveEveryNthBlock) {
  check_mode(ac_config("selective", "2"), 4, {1, 3}, at::kFloat, /*tol=*/0);
  check_mode(ac_config("selective", "3"), 4, {2}, at::kFloat, /*tol=*/0);
  check_mode(ac_config("selective", "1"), 3, {0, 1, 2}, at::kFloat, /*tol=*/0);
  check_mode(ac_config("selective", "5"), 4, {}, at::kFloat, /*tol=*/0);
}

TEST(ActivationCheckpointing, SelectiveOpGivesBitwiseTheSameGradients) {
  check_mode(ac_config("selective", "op"), 3, {0, 1, 2}, at::kFloat, /*tol=*/0);
}

// bf16 matmuls (fp32 master weights, bf16 residual stream): the same ops in the same order, so
// bitwise too.
TEST(ActivationCheckpointing, Bf16ComputeMatchesWithoutCheckpointing) {
  check_mode(ac_config("full"), 2, {0, 1}, at::kBFloat16, /*tol=*/0);
  check_mode(ac_config("selective", "op"), 2, {0, 1}, at::kBFloat16, /*tol=*/0);
}

// No autograd (validation): blocks run once, plainly.
TEST(ActivationCheckpointing, NoGradForwardRunsBlocksOnce) {
  auto model = model_with(2);
  RunCounter counter;
  model->add_unit_runner(&counter);
  auto ac = apply_activation_checkpointing(*model, ac_config("full"));
  at::NoGradGuard no_grad;
  const at::Tensor got = model->forward(batch().inputs);
  EXPECT_EQ(counter.runs[1], 1);
  EXPECT_EQ(ac->recomputations(), 0);
  model->remove_unit_runner(&counter);
  ac.reset();
  EXPECT_TRUE(at::equal(got, model->forward(batch().inputs)));
}

// ---- A model whose blocks draw random numbers or change shape when run again ----------------

// Units "layers.i": h + dropout(tanh(h W_i^T)), h (bs, dim).
class NoisyModel : public Model {
 public:
  NoisyModel(int64_t layers, int64_t dim, double dropout) : dropout_(dropout) {
    auto list = register_module("layers", std::make_shared<torch::nn::Module>());
    for (int64_t i = 0; i < layers; ++i) {
      layers_.push_back(
          list->register_module(std::to_string(i), std::make_shared<Linear>(dim, dim)));
    }
    runs_.assign(layers, 0);
  }
  using Model::forward;
  at::Tensor run_forward(const at::Tensor& x, const ForwardInputs&) override {
    at::Tensor h = x;
    for (size_t i = 0; i < layers_.size(); ++i) {
      h = run_unit(static_cast<int64_t>(i), h, [this, i](const at::Tensor& in) {
        const at::Tensor out = in + at::dropout(at::tanh(layers_[i]->forward(in)), dropout_, true);
        // A unit that computes something else when run again (a shape, here).
        return shrink_on_rerun && ++runs_[i] > 1 ? out.narrow(1, 0, out.size(1) - 1) : out;
      });
    }
    return h;
  }
  ParamInit param_init(const std::string&) const override { return ParamInit::normal(0.0, 0.3); }
  ModelStats stats(int64_t, int64_t) const override { return {}; }
  std::vector<ModelUnit> units() const override {
    std::vector<ModelUnit> out;
    for (size_t i = 0; i < layers_.size(); ++i) {
      const std::string name = "layers." + std::to_string(i);
      out.push_back({name, {name + ".weight"}, false, static_cast<int64_t>(i)});
    }
    return out;
  }
  bool shrink_on_rerun = false;

 private:
  double dropout_;
  std::vector<std::shared_ptr<Linear>> layers_;
  std::vector<int64_t> runs_;
};

struct NoisyStep {
  Step step;
  double next_draw = 0;  // the first random number after the step
};

NoisyStep noisy_step(const ActivationCheckpointSection* config) {
  auto shared = std::make_shared<NoisyModel>(3, 16, /*dropout=*/0.5);
  NoisyModel& model = *shared;
  at::manual_seed(5);
  model.init_weights(5);
  const at::Tensor x = at::randn({4, 16});
  std::unique_ptr<ActivationCheckpointing> ac;
  if (config != nullptr) ac = apply_activation_checkpointing(model, *config);
  at::manual_seed(7);
  NoisyStep s;
  at::Tensor loss = model.forward(x).square().mean();
  loss.backward();
  s.step.loss = loss.item<double>();
  for (const auto& item : model.named_parameters()) {
    s.step.grads.emplace_back(item.key(), item.value().grad().clone());
  }
  s.next_draw = at::rand({1}).item<double>();
  return s;
}

TEST(ActivationCheckpointing, PreserveRngStateReplaysTheForwardsDraws) {
  const NoisyStep want = noisy_step(nullptr);
  ActivationCheckpointSection config = ac_config("full");
  const NoisyStep got = noisy_step(&config);
  expect_same_step(got.step, want.step, /*tol=*/0, "preserve_rng_state");
  EXPECT_EQ(got.next_draw, want.next_draw);  // the draws after the step are untouched
  // Without it the recomputation draws other dropout masks: other gradients.
  config.preserve_rng_state = false;
  const NoisyStep unpreserved = noisy_step(&config);
  EXPECT_EQ(unpreserved.step.loss, want.step.loss);
  EXPECT_FALSE(at::equal(unpreserved.step.grads[0].second, want.step.grads[0].second));
}

// Full AC on two dropout-free NoisyModel blocks, forward done: the loss to run backward from.
struct NoisyForward {
  std::shared_ptr<NoisyModel> model = std::make_shared<NoisyModel>(2, 8, /*dropout=*/0.0);
  std::unique_ptr<ActivationCheckpointing> ac;
  at::Tensor loss;
};
std::unique_ptr<NoisyForward> noisy_forward(bool shrink_on_rerun, bool debug) {
  auto f = std::make_unique<NoisyForward>();
  f->model->init_weights(/*seed=*/0);
  f->model->shrink_on_rerun = shrink_on_rerun;
  ActivationCheckpointSection config = ac_config("full");
  config.debug = debug;
  f->ac = apply_activation_checkpointing(*f->model, config);
  f->loss = f->model->forward(at::randn({3, 8})).sum();
  return f;
}

TEST(ActivationCheckpointing, DeterminismCheckNamesTheBlock) {
  auto f = noisy_forward(/*shrink_on_rerun=*/true, /*debug=*/false);
  const std::string error = message_of([&] { f->loss.backward(); });
  EXPECT_NE(error.find("recomputing layers.1 for backward gave an output [3, 7] Float on cpu, but "
                       "its forward gave [3, 8] Float on cpu"),
            std::string::npos)
      << error;
  EXPECT_NE(error.find("determinism_check = \"none\""), std::string::npos) << error;
}

TEST(ActivationCheckpointing, DebugLogsEachRecomputation) {
  auto f = noisy_forward(/*shrink_on_rerun=*/false, /*debug=*/true);
  testing::internal::CaptureStdout();
  f->loss.backward();
  const std::string out = testing::internal::GetCapturedStdout();
  EXPECT_NE(out.find("recomputed layers.1 (0 kept op results reused), largest |recomputed - "
                     "forward| output difference 0.0"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("recomputed layers.0"), std::string::npos) << out;
}

TEST(ActivationCheckpointing, ConfigErrorsAndFactory) {
  auto model = model_with(2);
  EXPECT_EQ(apply_activation_checkpointing(*model, ac_config("none")), nullptr);
  auto error = [&](const ActivationCheckpointSection& c) {
    return message_of([&] { ActivationCheckpointing ac(*model, c); });
  };
  EXPECT_NE(error(ac_config("memory_budget")).find("\"memory_budget\" is not supported"),
            std::string::npos);
  EXPECT_NE(error(ac_config("partial")).find("must be none, full or selective, got 'partial'"),
            std::string::npos);
  EXPECT_NE(error(ac_config("selective", "0")).find("\"op\" or an integer >= 1, got '0'"),
            std::string::npos);
  EXPECT_NE(error(ac_config("selective", "ops")).find("got 'ops'"), std::string::npos);
  ActivationCheckpointSection norm = ac_config("selective", "op");
  norm.per_op_sac_force_recompute_mm_shapes_by_fqns = {"attention_norm"};
  EXPECT_NE(error(norm).find("'attention_norm' matches layers.0.attention_norm, which is not a "
                             "Linear layer"),
            std::string::npos)
      << error(norm);
  EXPECT_TRUE(model->unit_runners().empty());  // a failed construction installs nothing
  auto ac = apply_activation_checkpointing(*model, ac_config("selective", "2"));
  EXPECT_EQ(ac->describe(),
            "activation checkpointing: selective, one block in 2, 1 of 2 blocks (layers.1)");
  ac.reset();
  DataParallel dp(*model, DataParallelOptions{});
  EXPECT_NE(error(ac_config("full")).find("must be applied before FSDP / DDP"), std::string::npos);
}

// ---- Memory ----------------------------------------------------------------------------------

// Bytes of CPU tensors that forward + loss leave alive for backward.
int64_t bytes_kept_by_forward(const ActivationCheckpointSection* config, const Batch& b,
                              int64_t layers, int64_t dim) {
  auto model = model_with(layers, at::kFloat, dim);
  std::unique_ptr<ActivationCheckpointing> ac;
  if (config != nullptr) ac = apply_activation_checkpointing(*model, *config);
  CpuMemoryProbe::install();
  const int64_t before = CpuMemoryProbe::live_bytes();
  at::Tensor loss = lm_cross_entropy_loss(model->forward(b.inputs), b.labels);
  const int64_t kept = CpuMemoryProbe::live_bytes() - before;
  loss.backward();
  return kept;
}

TEST(ActivationCheckpointing, ForwardKeepsLessMemory) {
  const int64_t layers = 4, dim = 64, rows = 4, seq = 32;
  const Batch b = batch(rows, seq);
  ActivationCheckpointSection full = ac_config("full"), every2 = ac_config("selective", "2"),
                              op = ac_config("selective", "op");
  ActivationCheckpointSection op_w1 = op;  // w1 and w3 share a shape: both recomputed
  op_w1.per_op_sac_force_recompute_mm_shapes_by_fqns = {"feed_forward.w1"};
  const int64_t none = bytes_kept_by_forward(nullptr, b, layers, dim);
  const int64_t kept_full = bytes_kept_by_forward(&full, b, layers, dim);
  const int64_t kept_every2 = bytes_kept_by_forward(&every2, b, layers, dim);
  const int64_t kept_op = bytes_kept_by_forward(&op, b, layers, dim);
  const int64_t kept_op_w1 = bytes_kept_by_forward(&op_w1, b, layers, dim);
  const char* format =
      "bytes kept by forward: none %lld, op %lld, op (w1 forced) %lld, every "
      "2nd %lld, full %lld\n";
  std::printf(format, static_cast<long long>(none), static_cast<long long>(kept_op),
              static_cast<long long>(kept_op_w1), static_cast<long long>(kept_every2),
              static_cast<long long>(kept_full));
  EXPECT_LT(kept_full, kept_every2);
  EXPECT_LT(kept_every2, none);
  EXPECT_LT(kept_full, kept_op);
  EXPECT_LT(kept_op, none);
  // "op" keeps, per block, beyond what full AC keeps: the outputs of matmuls 1, 3, 5, 7 (wq, wv,
  // w1, w2; wk, wo, w3 are recomputed) and attention's output and log-sum-exp, all float32.
  const int64_t tokens = rows * seq, heads = 4, kv_dim = dim / heads * 2;
  const int64_t hidden =
      model_with(1, at::kFloat, dim)->layers[0]->feed_forward->w1->weight.size(0);
  const int64_t per_block =
      tokens * (dim + kv_dim + hidden + dim) * 4 + tokens * dim * 4 + rows * heads * seq * 4;
  EXPECT_EQ(kept_op - kept_full, layers * per_block);
  // Forcing w1/w3 recomputation drops one (tokens, hidden) output per block: w1's is no longer
  // kept and not counted, so w2 becomes the 5th matmul (kept either way).
  EXPECT_EQ(kept_op - kept_op_w1, layers * tokens * hidden * 4);
  // Every second block: the two non-checkpointed blocks keep what they kept without AC.
  EXPECT_EQ(none - kept_every2, (none - kept_full) / 2);
}

// ---- Composed with FSDP and TP -----------------------------------------------------------------

// A step's gradients on FSDP shards or TP boxes as the rank holds them.
std::vector<at::Tensor> local_grads(Model& model, const DataParallel* fsdp) {
  std::vector<at::Tensor> out;
  if (fsdp != nullptr) {
    for (const auto& p : fsdp->params()) out.push_back(p.local.grad().clone());
  } else {
    for (const auto& item : model.named_parameters()) out.push_back(item.value().grad().clone());
  }
  return out;
}

void expect_same_grads(const std::vector<at::Tensor>& got, const std::vector<at::Tensor>& want,
                       const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_TRUE(at::equal(got[i], want[i])) << what << ", parameter " << i << ": max diff "
                                            << (got[i] - want[i]).abs().max().item<double>();
  }
}

// Layout of `world` ranks: FSDP over `shard` ranks x TP over `tp` ranks (tp ranks adjacent).
// Each rank runs the layout without AC, then with `config`, on the same data; the losses and
// this rank's gradients must agree bitwise.
void check_composed(int shard, int tp, const ActivationCheckpointSection& config) {
  const int world_size = shard * tp;
  const Batch b = batch(2 * shard);
  std::vector<std::shared_ptr<llama3::Transformer>> plain, checkpointed;
  for (int r = 0; r < world_size; ++r) {
    plain.push_back(model_with(2));
    checkpointed.push_back(model_with(2));
  }
  run_ranks(world_size, [&](int rank, std::shared_ptr<dist::Group> world) {
    const int dp = rank / tp, tp_rank = rank % tp;
    std::shared_ptr<dist::Group> tp_group, dp_group;
    for (int d = 0; d < shard && tp > 1; ++d) {
      std::vector<int> ranks;
      for (int t = 0; t < tp; ++t) ranks.push_back(d * tp + t);
      auto g = world->new_subgroup("tp", ranks);
      if (d == dp) tp_group = g;
    }
    for (int t = 0; t < tp && shard > 1; ++t) {
      std::vector<int> ranks;
      for (int d = 0; d < shard; ++d) ranks.push_back(d * tp + t);
      auto g = world->new_subgroup("dp_shard", ranks);
      if (t == tp_rank) dp_group = g;
    }
    const at::Tensor inputs = b.inputs.narrow(0, 2 * dp, 2);
    const at::Tensor labels = b.labels.narrow(0, 2 * dp, 2);
    auto step = [&](Model& model, bool with_ac) {
      std::unique_ptr<TensorParallel> tensor_parallel;
      if (tp_group) tensor_parallel = std::make_unique<TensorParallel>(model, tp_group, true);
      std::unique_ptr<ActivationCheckpointing> ac;
      if (with_ac) ac = apply_activation_checkpointing(model, config);  // TP, AC, FSDP
      std::unique_ptr<DataParallel> fsdp;
      if (dp_group) {
        DataParallelOptions o;
        o.shard_group = dp_group;
        if (tensor_parallel) o.placements = tensor_parallel->placements();
        fsdp = std::make_unique<DataParallel>(model, o);
      }
      const at::Tensor logits = model.forward(inputs);
      at::Tensor loss = tensor_parallel ? tensor_parallel->cross_entropy(logits, labels)
                                        : lm_cross_entropy_loss(logits, labels);
      loss.backward();
      if (fsdp) fsdp->finish_backward();
      if (ac) {
        EXPECT_EQ(ac->recomputations(), 2);
      }
      return std::make_pair(loss.item<double>(), local_grads(model, fsdp.get()));
    };
    const auto want = step(*plain[rank], false);
    const auto got = step(*checkpointed[rank], true);
    const std::string what =
        config.mode + " " + config.selective_ac_option + " on rank " + std::to_string(rank);
    EXPECT_EQ(got.first, want.first) << what;
    expect_same_grads(got.second, want.second, what);
  });
}

// Per-op AC keeps the attention kernel's results, so the kernel's forward (ATen op `op`) runs
// once per block, in the forward and not in the recomputation, where full AC runs it twice per
// block (the counter sees recomputations). With `documents` the blocks are block-causal.
// Gradients equal those without AC (within `tol`; 0: bitwise).
void check_attention_kept(const at::Device& device, at::ScalarType dtype, int64_t n_kv_heads,
                          bool documents, const std::string& op, double tol) {
  constexpr int64_t kLayers = 2;
  llama3::Llama3Args args = test::tiny_args(/*tied=*/false, kVocab);
  args.n_layers = kLayers;
  args.dim = 32;  // head_dim 8: what the CUDA flash kernels take unpadded
  args.n_kv_heads = n_kv_heads;
  args.max_seq_len = 64;
  Batch b = batch();
  b.inputs = b.inputs.to(device);
  b.labels = b.labels.to(device);
  const at::Tensor docs =
      at::tensor({0, 0, 0, 1, 1, 1, 1, 2, /**/ 0, 0, 0, 0, 0, 1, 1, 1}, at::kLong)
          .view({2, test::kSeq})
          .to(device);
  const std::string what = device.str() + " " + c10::toString(dtype) + " kv heads " +
                           std::to_string(n_kv_heads) + (documents ? " block-causal" : "") + " (" +
                           op + ")";
  const auto run = [&](const std::string& mode, int64_t& calls) {
    auto model = std::make_shared<llama3::Transformer>(args, dtype);
    model->init_weights(/*seed=*/1234);
    model->to(device);
    std::unique_ptr<ActivationCheckpointing> ac;
    if (mode != "none") {
      ac = apply_activation_checkpointing(
          *model, mode == "op" ? ac_config("selective", "op") : ac_config("full"));
    }
    ForwardInputs inputs;
    if (documents) inputs.document_ids = docs;
    test::OpCounter counter(op);
    Step step = train_step(*model, b, inputs);
    calls = counter.count();
    return step;
  };
  int64_t plain_calls = 0, op_calls = 0, full_calls = 0;
  const Step plain = run("none", plain_calls);
  const Step kept = run("op", op_calls);
  run("full", full_calls);
  EXPECT_EQ(plain_calls, kLayers) << what;
  EXPECT_EQ(op_calls, kLayers) << what << ": per-op AC ran the attention kernel again";
  EXPECT_EQ(full_calls, 2 * kLayers) << what;
  expect_same_step(kept, plain, tol, what);
}

TEST(ActivationCheckpointing, OpModeKeepsTheAttentionKernel) {
  const char* cpu_flash = "aten::_scaled_dot_product_flash_attention_for_cpu";
  check_attention_kept(at::kCPU, at::kFloat, 2, /*documents=*/false, cpu_flash, /*tol=*/0);
  check_attention_kept(at::kCPU, at::kFloat, 2, /*documents=*/true, cpu_flash, /*tol=*/0);
}

// The backend SDPA picks, under the current switches, for check_attention_kept's causal
// attention (4 query heads of 8 dims, `kv_heads` key/value heads) in `dtype` on `device`.
at::SDPBackend sdpa_choice(const at::Device& device, at::ScalarType dtype, int64_t kv_heads) {
  const auto options = at::TensorOptions().dtype(dtype).device(device);
  const at::Tensor q = at::empty({2, 4, test::kSeq, 8}, options);
  const at::Tensor k = at::empty({2, kv_heads, test::kSeq, 8}, options);
  return static_cast<at::SDPBackend>(at::_fused_sdp_choice(q, k, k, std::nullopt, 0.0,
                                                           /*is_causal=*/true, std::nullopt,
                                                           /*enable_gqa=*/kv_heads != 4));
}

// On a GPU, each kernel SDPA may run, pinned by its switches: CUDA flash (bf16, GQA); cuDNN
// (bf16, MHA and GQA) where this libtorch runs it for the shapes; memory-efficient (float32, MHA:
// SDPA runs GQA in float32 with the math backend, which is recomputed); SDPA's own choice with
// every switch on (cuDNN on sm90 since libtorch 2.9); and the variable-length flash kernel of
// block-causal attention (bf16), which titan calls whatever SDPA prefers.
TEST(ActivationCheckpointingCuda, OpModeKeepsTheGpuAttentionKernels) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const at::Device cuda(at::kCUDA, 0);
  using B = at::SDPBackend;
  {
    test::SdpSwitches flash({B::flash_attention, B::math});
    ASSERT_EQ(sdpa_choice(cuda, at::kBFloat16, 2), B::flash_attention);
    check_attention_kept(cuda, at::kBFloat16, 2, false, test::sdpa_kernel_op(B::flash_attention),
                         /*tol=*/2e-2);
  }
  for (const int64_t kv_heads : {4, 2}) {
    test::SdpSwitches cudnn({B::cudnn_attention, B::math});
    if (sdpa_choice(cuda, at::kBFloat16, kv_heads) != B::cudnn_attention) {
      std::cout << "[ NOTE     ] SDPA does not run cuDNN attention here for kv heads " << kv_heads
                << ": not checked\n";
      continue;
    }
    check_attention_kept(cuda, at::kBFloat16, kv_heads, false,
                         test::sdpa_kernel_op(B::cudnn_attention), /*tol=*/2e-2);
  }
  ASSERT_EQ(sdpa_choice(cuda, at::kFloat, 4), B::efficient_attention);
  check_attention_kept(cuda, at::kFloat, 4, false, test::sdpa_kernel_op(B::efficient_attention),
                       /*tol=*/1e-4);
  const B chosen = sdpa_choice(cuda, at::kBFloat16, 2);
  std::cout << "[ NOTE     ] SDPA's own choice for bf16 GQA: backend " << static_cast<int>(chosen)
            << "\n";
  ASSERT_NE(test::sdpa_kernel_op(chosen), "") << "SDPA chose the math backend for bf16 GQA";
  check_attention_kept(cuda, at::kBFloat16, 2, false, test::sdpa_kernel_op(chosen), 2e-2);
  check_attention_kept(cuda, at::kBFloat16, 2, true, "aten::_flash_attention_forward",
                       /*tol=*/2e-2);
}

TEST(ActivationCheckpointing, InsideFsdpMatchesFsdpWithoutIt) {
  check_composed(/*shard=*/2, /*tp=*/1, ac_config("full"));
  check_composed(/*shard=*/2, /*tp=*/1, ac_config("selective", "op"));
}

TEST(ActivationCheckpointing, WithTensorParallelMatchesTpWithoutIt) {
  check_composed(/*shard=*/1, /*tp=*/2, ac_config("full"));
  check_composed(/*shard=*/1, /*tp=*/2, ac_config("selective", "op"));  // reduce-scatters kept
}

TEST(ActivationCheckpointing, TwoDimensionalFsdpTimesTp) {
  check_composed(/*shard=*/2, /*tp=*/2, ac_config("selective", "op"));
}

}  // namespace test_activation_checkpoint
}  // namespace titan
