// LoRA under every layout (FSDP, HSDP, DDP, FSDP x TP; activation checkpointing on and off): the
// loss and the adapters' gradients of one process, frozen parameters with no gradient, the grad
// norm over the adapters only, and whole parameters gathered back. Ranks are threads over a
// HashStore.
#include "parallel_test_util.h"

#include "titan/models/lora.h"
#include "titan/parallel/parallelize.h"
#include "titan/parallel/parallelized_model.h"

#include <gtest/gtest.h>

namespace titan {
namespace test_lora_parallel {

using test::kBatchPerRank;
using test::rows_of;

constexpr int64_t kVocab = 62;

LoraSpec spec() {
  LoraSpec s;
  s.rank = 4;
  s.alpha = 8;
  s.target_modules = {kAllLinear};
  return s;
}

nlohmann::json description() {
  const llama3::Llama3Args a = test::tiny_args(false, kVocab);
  return {{"name", "llama3"},
          {"flavor", "custom"},
          {"args",
           {{"dim", a.dim},
            {"n_layers", a.n_layers},
            {"n_heads", a.n_heads},
            {"n_kv_heads", a.n_kv_heads},
            {"vocab_size", a.vocab_size},
            {"multiple_of", a.multiple_of},
            {"max_seq_len", a.max_seq_len}}}};
}

// The tiny model with adapters on every linear layer of its blocks, B non-zero (it starts at
// zero, which would leave A's gradients zero).
std::shared_ptr<llama3::Transformer> lora_model() {
  auto m = test::make_model(false, at::kFloat, kVocab);
  apply_lora(*m, spec(), description());
  m->init_weights(1234);
  at::NoGradGuard no_grad;
  for (auto& item : m->named_parameters()) {
    if (item.key().find("lora_b") != std::string::npos) {
      init_whole(item.value(), ParamInit::normal(0, 0.05), 5, item.key());
    }
  }
  return m;
}

using test::degrees;

void check_layouts(const std::string& ac_mode) {
  const std::vector<std::pair<const char*, ParallelDegrees>> layouts = {
      {"FSDP 4", degrees(1, 4, 1)},
      {"HSDP 2x2", degrees(2, 2, 1)},
      {"DDP 4", degrees(4, 1, 1)},
      {"FSDP 2 x TP 2", degrees(1, 2, 2)}};
  for (const auto& [name, layout] : layouts) {
    SCOPED_TRACE(std::string(name) + ", activation checkpointing " + ac_mode);
    const ParallelDims mesh(layout, 4);
    // One process on the global batch.
    at::manual_seed(99);
    const int64_t rows = mesh.dp_size() * kBatchPerRank;
    const at::Tensor inputs = at::randint(0, kVocab, {rows, test::kSeq}, at::kLong);
    const at::Tensor labels = at::randint(0, kVocab, {rows, test::kSeq}, at::kLong);
    auto ref_model = lora_model();
    at::Tensor ref_loss = lm_cross_entropy_loss(ref_model->forward(inputs), labels);
    ref_loss.backward();
    std::map<std::string, at::Tensor> ref_grads;
    std::vector<at::Tensor> adapters;
    for (const auto& item : ref_model->named_parameters()) {
      if (!is_lora_param(item.key())) {
        EXPECT_FALSE(item.value().grad().defined()) << item.key();
        continue;
      }
      ref_grads[item.key()] = item.value().grad().clone();
      adapters.push_back(item.value());
    }
    const double ref_norm = clip_grad_norm(grads_of(adapters), 0.0);
    std::vector<std::shared_ptr<llama3::Transformer>> models;
    for (int r = 0; r < 4; ++r) models.push_back(lora_model());
    const auto named = lora_model()->named_parameters();
    test::run_ranks(4, [&](int rank, std::shared_ptr<dist::Group> world) {
      ParallelDims dims(layout, 4);
      dims.build_groups(world);
      ParallelizeOptions o;
      o.activation_checkpoint.mode = ac_mode;
      o.seq_lens = {{"training.seq_len", test::kSeq}};
      auto pm = parallelize_decoder(models[rank], dims, rank, o);
      const int64_t dp = dims.dp_rank(rank);
      pm->zero_grad();
      at::Tensor loss = pm->loss(pm->model().forward(rows_of(inputs, dp, dims.dp_size(), 0)),
                                 rows_of(labels, dp, dims.dp_size(), 0));
      loss.backward();
      pm->finish_backward();
      EXPECT_NEAR(pm->batch_mean(loss).item<double>(), ref_loss.item<double>(), 1e-5);
      for (const TrainedParam& p : pm->params()) {
        EXPECT_EQ(p.frozen, !is_lora_param(p.name)) << p.name;
        if (p.frozen) {
          EXPECT_FALSE(p.local.grad().defined()) << p.name << " on rank " << rank;
          continue;
        }
        if (p.local.numel() == 0 || p.tp_replicated) continue;
        const at::Tensor want = p.box.narrow(ref_grads.at(p.name), p.local.sizes());
        ASSERT_TRUE(p.local.grad().defined()) << p.name;
        const double scale = want.abs().max().item<double>() + 1e-6;
        EXPECT_LT((p.local.grad() - want).abs().max().item<double>(), 2e-5 * scale)
            << p.name << " on rank " << rank;
      }
      EXPECT_NEAR(pm->clip_grad_norm(0.0), ref_norm, 1e-5 * ref_norm);
      for (const auto& [pname, t] : pm->gather_full_parameters()) {
        EXPECT_TRUE(at::allclose(t, named[pname])) << pname << " gathered";
      }
    });
  }
}

TEST(LoraParallel, EveryLayoutMatchesOneProcess) { check_layouts("none"); }

TEST(LoraParallel, EveryLayoutMatchesOneProcessWithFullActivationCheckpointing) {
  check_layouts("full");
}

}  // namespace test_lora_parallel
}  // namespace titan
