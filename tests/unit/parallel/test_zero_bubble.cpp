// The zero-bubble split of a backward (deferred_grad.h) on a later pipeline stage of a tiny Llama
// (layers, norm, output: its input is a hidden state), against the plain backward of the same
// model: two microbatches run forward, then I(0), I(1), W(0), W(1) as a zero-bubble schedule
// interleaves them. After the I steps the input gradients equal the plain backward's and no
// Linear weight has a gradient (nor, under FSDP, has any unit been reduced); after the W steps
// every gradient equals the plain backward's (float32, 1e-6). Without FSDP and with FSDP over
// 2 ranks, each plain, with full AC, per-op selective AC, and float8 (emulated, tensorwise).
#include "parallel_test_util.h"

#include "titan/components/loss.h"
#include "titan/models/common/deferred_grad.h"
#include "titan/models/common/linear.h"
#include "titan/parallel/activation_checkpoint.h"
#include "titan/parallel/data_parallel.h"

#include <gtest/gtest.h>

namespace titan {
namespace test_zero_bubble {

constexpr int64_t kMicrobatches = 2;

struct Setup {
  int ranks = 1;            // FSDP over this many ranks (1: none)
  std::string ac = "none";  // none, full, op
  bool float8 = false;
  std::string name() const {
    return "fsdp " + std::to_string(ranks) + ", ac " + ac + (float8 ? ", float8" : "");
  }
};

// The model's stage after the embedding.
std::shared_ptr<llama3::Transformer> stage_model(bool float8) {
  auto m = test::make_model(/*tied=*/false);
  m->keep_only({"layers.0", "layers.1", "norm", "output"});
  if (float8) {
    Float8LinearOptions o;
    o.emulate = true;
    for (const auto& module : m->modules()) {
      if (auto* linear = dynamic_cast<Linear*>(module.get())) linear->float8 = o;
    }
  }
  return m;
}

int64_t linears_in(Model& model) {
  int64_t n = 0;
  for (const auto& module : model.modules()) n += dynamic_cast<Linear*>(module.get()) != nullptr;
  return n;
}

// Gradients of this rank's parameters (FSDP: its shards; undefined where none).
std::vector<at::Tensor> grads_of(Model& model, const DataParallel* fsdp) {
  std::vector<at::Tensor> out;
  if (fsdp != nullptr) {
    for (const auto& p : fsdp->params()) out.push_back(p.local.grad());
  } else {
    for (const auto& item : model.named_parameters()) out.push_back(item.value().grad());
  }
  return out;
}

struct Run {
  std::vector<at::Tensor> input_grads;  // per microbatch
  std::vector<at::Tensor> grads;        // after the step
};

void check(const Setup& s) {
  SCOPED_TRACE(s.name());
  at::manual_seed(5);
  const int64_t rows = test::kBatchPerRank;
  const at::Tensor hidden = at::randn({s.ranks * kMicrobatches * rows, test::kSeq, 24});
  const at::Tensor labels = at::randint(0, 61, {s.ranks * kMicrobatches * rows, test::kSeq});
  std::vector<std::shared_ptr<llama3::Transformer>> plain, split;
  for (int r = 0; r < s.ranks; ++r) {
    plain.push_back(stage_model(s.float8));
    split.push_back(stage_model(s.float8));
  }
  test::run_ranks(s.ranks, [&](int rank, std::shared_ptr<dist::Group> world) {
    const auto step = [&](Model& model, bool deferred) {
      ActivationCheckpointSection ac_config;
      ac_config.mode = s.ac == "op" ? "selective" : s.ac;
      ac_config.selective_ac_option = "op";
      std::unique_ptr<ActivationCheckpointing> ac =
          apply_activation_checkpointing(model, ac_config);
      std::unique_ptr<DataParallel> fsdp;
      if (s.ranks > 1) {
        DataParallelOptions o;
        o.shard_group = world;
        fsdp = std::make_unique<DataParallel>(model, o);
      }
      auto deferral = std::make_shared<WeightGradDeferral>();
      if (deferred) {
        for (const auto& module : model.modules()) {
          if (auto* linear = dynamic_cast<Linear*>(module.get())) linear->deferral = deferral;
        }
        if (fsdp) fsdp->defer_weight_grads(deferral);
      }
      Run run;
      std::vector<at::Tensor> inputs, losses;
      for (int64_t m = 0; m < kMicrobatches; ++m) {
        const int64_t first = (m * s.ranks + rank) * rows;
        inputs.push_back(hidden.narrow(0, first, rows).clone().requires_grad_(true));
        const at::Tensor loss =
            lm_cross_entropy_loss(model.forward(inputs[m]), labels.narrow(0, first, rows));
        losses.push_back(loss / static_cast<double>(kMicrobatches));
      }
      if (!deferred) {
        for (int64_t m = 0; m < kMicrobatches; ++m) losses[m].backward();
      } else {
        std::vector<DeferredGrads> pending(kMicrobatches);
        for (int64_t m = 0; m < kMicrobatches; ++m) {
          WeightGradDeferral::Scope collect(*deferral, &pending[m]);
          losses[m].backward();
          EXPECT_EQ(pending[m].pending(), linears_in(model)) << "microbatch " << m;
        }
        if (fsdp) fsdp->finish_backward();
        const std::vector<at::Tensor> before_w = grads_of(model, fsdp.get());
        const auto names = model.named_parameters();
        for (size_t i = 0; i < before_w.size(); ++i) {
          const bool linear = names[i].key().find("norm") == std::string::npos;
          // FSDP: every unit holds a Linear, so none is reduced before W.
          EXPECT_EQ(before_w[i].defined(), !linear && !fsdp) << names[i].key() << " before W";
        }
        for (int64_t m = 0; m < kMicrobatches; ++m) pending[m].run();
      }
      for (const at::Tensor& in : inputs) run.input_grads.push_back(in.grad());
      if (fsdp) fsdp->finish_backward();
      for (const at::Tensor& g : grads_of(model, fsdp.get())) run.grads.push_back(g.clone());
      return run;
    };
    const Run want = step(*plain[rank], /*deferred=*/false);
    const Run got = step(*split[rank], /*deferred=*/true);
    for (int64_t m = 0; m < kMicrobatches; ++m) {
      EXPECT_TRUE(at::allclose(got.input_grads[m], want.input_grads[m], 1e-6, 1e-7))
          << "input gradient of microbatch " << m;
    }
    ASSERT_EQ(got.grads.size(), want.grads.size());
    for (size_t i = 0; i < want.grads.size(); ++i) {
      EXPECT_TRUE(at::allclose(got.grads[i], want.grads[i], 1e-6, 1e-7))
          << "parameter " << i << " on rank " << rank << ": max diff "
          << (got.grads[i] - want.grads[i]).abs().max().item<double>();
    }
  });
}

TEST(ZeroBubble, WeightGradientsWaitForW) {
  for (int ranks : {1, 2}) {
    for (const char* ac : {"none", "full", "op"}) check({ranks, ac, /*float8=*/false});
    check({ranks, "none", /*float8=*/true});
  }
  check({2, "op", /*float8=*/true});
}

}  // namespace test_zero_bubble
}  // namespace titan
