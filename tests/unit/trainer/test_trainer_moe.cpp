// Mixture-of-experts training through the Trainer (Qwen3's tiny_moe: 2 MoE layers of 4 experts,
// top-2): the loss falls and the auxiliary-loss-free balancing moves the expert biases; FSDP,
// DDP, TP, FSDP x TP and PP reproduce the one-process run of the same seed and global batch
// (losses within 1e-5 relative, grad norms within 1e-4, and the expert biases, which depend on the
// token counts summed over every rank); a checkpoint carries the biases, resumed in another
// layout. Expert parallelism (ep 2, alone and with FSDP, HSDP, TP and PP) reproduces it too,
// and its checkpoints resume in other layouts.
#include "../test_util.h"
#include "trainer_ranks.h"

#include "titan/models/common/moe.h"
#include "titan/parallel/parallelized_model.h"
#include "titan/trainer/trainer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>

namespace titan {
namespace test_trainer_moe {

namespace fs = std::filesystem;

constexpr int64_t kGlobalBatch = 8;

struct Layout {
  int64_t dp_replicate = 1, dp_shard = 1, tp = 1, pp = 1, ep = 1, cp = 1, etp = 1;
  std::string model = "qwen3", flavor = "tiny_moe";
  int64_t world() const { return dp_replicate * dp_shard * tp * pp * cp; }
  std::string name() const {
    return model + " " + flavor + ": dp_replicate " + std::to_string(dp_replicate) +
           " x dp_shard " + std::to_string(dp_shard) + " x tp " + std::to_string(tp) + " x pp " +
           std::to_string(pp) + (cp > 1 ? " x cp " + std::to_string(cp) : "") +
           (ep > 1 ? " with ep " + std::to_string(ep) : "") +
           (etp > 1 ? ", etp " + std::to_string(etp) : "");
  }
};

JobConfig config_for(const fs::path& dump, const Layout& layout, int64_t steps) {
  JobConfig c = test::tiny_training_config(dump.string());
  c.model.name = layout.model;
  c.model.flavor = layout.flavor;
  c.training.steps = steps;
  c.training.local_batch_size = kGlobalBatch / (layout.dp_replicate * layout.dp_shard);
  c.training.global_batch_size = kGlobalBatch;
  c.lr_scheduler.warmup_steps = 1;
  c.optimizer.lr = 3e-3;
  c.debug.seed = 9;
  c.parallelism.data_parallel_replicate_degree = layout.dp_replicate;
  c.parallelism.data_parallel_shard_degree = layout.dp_shard;
  c.parallelism.tensor_parallel_degree = layout.tp;
  c.parallelism.pipeline_parallel_degree = layout.pp;
  c.parallelism.expert_parallel_degree = layout.ep;
  c.parallelism.context_parallel_degree = layout.cp;
  c.parallelism.expert_tensor_parallel_degree = layout.etp;
  c.parallelism.pipeline_parallel_schedule = "1F1B";
  return c;
}

// Full checkpoints every 2 steps.
JobConfig with_checkpoints(JobConfig c) {
  c.checkpoint.enable = true;
  c.checkpoint.interval = 2;
  c.checkpoint.last_save_model_only = false;
  return c;
}

struct Outcome {
  TrainResult result;
  std::map<std::string, at::Tensor> biases;  // rank 0's (its stage under PP)
};

Outcome run(const JobConfig& config, int64_t world) {
  Outcome out;
  test::on_ranks(config, world, [&](int64_t r, Trainer& t) {
    TrainResult result = t.train();
    if (r != 0) return;
    out.result = result;
    for (const auto& [name, b] : t.parallelized().state_buffers()) out.biases[name] = b.clone();
  });
  return out;
}

// Every layout's run against the one-process run `one` (4 steps).
void expect_reproduces(const fs::path& root, const Outcome& one,
                       const std::vector<Layout>& layouts) {
  for (const Layout& layout : layouts) {
    SCOPED_TRACE(layout.name());
    const Outcome got = run(config_for(root / layout.name(), layout, 4), layout.world());
    ASSERT_EQ(got.result.losses.size(), 4u);
    double worst = 0;
    for (size_t s = 0; s < 4; ++s) {
      const double rel =
          std::abs(got.result.losses[s] - one.result.losses[s]) / one.result.losses[s];
      worst = std::max(worst, rel);
      EXPECT_LT(rel, 1e-5) << "step " << s + 1;
      EXPECT_NEAR(got.result.grad_norms[s], one.result.grad_norms[s],
                  1e-4 * one.result.grad_norms[s]);
    }
    for (const auto& [name, b] : got.biases) {
      ASSERT_TRUE(one.biases.count(name)) << name;
      EXPECT_TRUE(at::allclose(b, one.biases.at(name), 0, 1e-9)) << name;
    }
    std::printf("MoE %s vs one process: worst loss %.2e relative\n", layout.name().c_str(), worst);
  }
}

TEST(TrainerMoE, LearnsBalancesAndEveryLayoutReproducesOneProcess) {
  const fs::path root = test::fresh_test_dir("titan_trainer_moe");
  const Outcome one = run(config_for(root / "one", {}, 4), 1);
  ASSERT_EQ(one.result.losses.size(), 4u);
  EXPECT_LT(one.result.losses.back(), one.result.losses.front());
  ASSERT_EQ(one.biases.size(), 2u);
  for (const auto& [name, b] : one.biases) {
    EXPECT_GT(b.abs().max().item<double>(), 0.0) << name << ": the bias never moved";
  }
  std::vector<Layout> layouts(5);
  layouts[0].dp_shard = 2;                     // FSDP
  layouts[1].dp_replicate = 2;                 // DDP
  layouts[2].tp = 2;                           // TP: MoE on sequence shards
  layouts[3].dp_shard = 2, layouts[3].tp = 2;  // FSDP x TP
  layouts[4].pp = 2;                           // PP: one MoE layer per stage
  expect_reproduces(root, one, layouts);
  fs::remove_all(root);
}

// Expert parallelism: tiny_moe's 4 experts split 2 + 2 over ep 2, tokens exchanged by all-to-all.
TEST(TrainerMoE, ExpertParallelReproducesOneProcess) {
  const fs::path root = test::fresh_test_dir("titan_trainer_moe_ep");
  const Outcome one = run(config_for(root / "one", {}, 4), 1);
  std::vector<Layout> layouts(6);
  layouts[0].dp_shard = 2;  // EP 2 (the experts' FSDP group has one rank)
  layouts[1].dp_shard = 4;  // EP 2 x FSDP 2: experts sharded over dp_shard_mod_ep 2
  layouts[2].dp_shard = 2, layouts[2].tp = 2;  // EP over the tp ranks, FSDP of experts over 2
  layouts[3].dp_replicate = 2, layouts[3].dp_shard = 2;  // EP 2 under HSDP
  layouts[4].pp = 2, layouts[4].dp_shard = 2;            // EP 2 in each pipeline stage
  layouts[5].cp = 2;  // EP over the cp ranks (each routes its share of the sequences)
  for (Layout& layout : layouts) layout.ep = 2;
  expect_reproduces(root, one, layouts);
  // The same seed routes the same way: a second EP run equals the first bitwise.
  const Outcome a = run(config_for(root / "again_a", layouts[0], 4), 2);
  const Outcome b = run(config_for(root / "again_b", layouts[0], 4), 2);
  EXPECT_EQ(a.result.losses, b.result.losses);
  for (const auto& [name, bias] : a.biases) EXPECT_TRUE(at::equal(bias, b.biases.at(name))) << name;
  fs::remove_all(root);
}

// expert_tensor_parallel_degree = tp: every tp rank routes the whole sequences and holds a slice of
// each expert's hidden features (the shared experts' too), alone and under EP; and DeepSeek-V3's
// tiny flavor (sigmoid routing in groups, a shared expert, a dense first layer) under EP,
// expert-split TP and CP.
TEST(TrainerMoE, ExpertsSplitOverTpAndDeepSeekReproduceOneProcess) {
  const fs::path root = test::fresh_test_dir("titan_trainer_moe_etp");
  for (const std::string model : {"qwen3", "deepseek_v3"}) {
    Layout base;
    base.model = model;
    base.flavor = model == "qwen3" ? "tiny_moe" : "tiny";
    const Outcome one = run(config_for(root / (model + " one"), base, 4), 1);
    std::vector<Layout> layouts(4, base);
    layouts[0].tp = 2, layouts[0].etp = 2;  // TP of experts
    layouts[1].dp_shard = 2, layouts[1].tp = 2, layouts[1].ep = 2, layouts[1].etp = 2;  // EP x TP
    layouts[2].dp_shard = 2, layouts[2].ep = 2;                                         // EP 2
    layouts[3].cp = 2, layouts[3].ep = 2;  // ring attention (MLA's too), EP over the cp ranks
    expect_reproduces(root, one, layouts);
  }
  fs::remove_all(root);
}

// ep 3 does not divide tiny_moe's 4 experts: every rank refuses with the arithmetic.
TEST(TrainerMoE, ExpertCountsMustDivideByEp) {
  const fs::path root = test::fresh_test_dir("titan_trainer_moe_ep3");
  Layout layout;
  layout.dp_shard = 3, layout.ep = 3;
  JobConfig c = config_for(root, layout, 1);
  c.training.local_batch_size = 2;
  c.training.global_batch_size = 6;
  const std::vector<std::string> errors =
      test::errors_on_ranks(c, 3, [](int64_t, Trainer& t) { t.train(); });
  for (const std::string& e : errors) {
    EXPECT_TRUE(test::contains(e,
                               "MoE layer layers.0.moe has 4 experts, not divisible by "
                               "expert_parallel_degree 3 (4 % 3 = 1)"))
        << e;
  }
  fs::remove_all(root);
}

// A checkpoint written under EP 2 x FSDP 2 resumes in one process and one process's under EP 2
// x TP 2; steps 3-4 match the uninterrupted run.
TEST(TrainerMoE, CheckpointsMoveBetweenExpertLayouts) {
  const fs::path root = test::fresh_test_dir("titan_trainer_moe_ep_ckpt");
  const Outcome reference = run(config_for(root / "reference", {}, 4), 1);
  Layout ep_fsdp;
  ep_fsdp.dp_shard = 4, ep_fsdp.ep = 2;
  Layout ep_tp;
  ep_tp.dp_shard = 2, ep_tp.tp = 2, ep_tp.ep = 2;
  struct Move {
    Layout from, to;
  };
  for (const Move& move : {Move{ep_fsdp, Layout{}}, Move{Layout{}, ep_tp}}) {
    SCOPED_TRACE(move.from.name() + " -> " + move.to.name());
    const fs::path dump = root / (move.from.name() + " to " + move.to.name());
    run(with_checkpoints(config_for(dump, move.from, 4)), move.from.world());
    fs::remove_all(dump / "checkpoint" / "step-4");
    const Outcome resumed = run(with_checkpoints(config_for(dump, move.to, 4)), move.to.world());
    ASSERT_EQ(resumed.result.losses.size(), 2u);
    for (size_t s = 0; s < 2; ++s) {
      EXPECT_NEAR(resumed.result.losses[s], reference.result.losses[s + 2],
                  1e-5 * reference.result.losses[s + 2]);
    }
    for (const auto& [name, b] : resumed.biases) {
      EXPECT_TRUE(at::allclose(b, reference.biases.at(name), 0, 1e-9)) << name;
    }
  }
  fs::remove_all(root);
}

// debug.moe_force_load_balance: round-robin routing, so every expert gets the same tokens and
// the biases never move; validation does not count tokens.
TEST(TrainerMoE, ForcedBalanceKeepsLoadsEven) {
  const fs::path root = test::fresh_test_dir("titan_trainer_moe_forced");
  JobConfig c = config_for(root, {}, 2);
  c.debug.moe_force_load_balance = true;
  c.validation.enable = true;
  c.validation.freq = 1;
  c.validation.steps = 1;
  c.validation.seq_len = 32;
  c.validation.local_batch_size = 2;
  Trainer trainer(c);
  trainer.train();
  for (const auto& [name, b] : trainer.parallelized().state_buffers()) {
    EXPECT_EQ(b.abs().max().item<double>(), 0.0) << name;
  }
  for (const auto& module : trainer.parallelized().model().modules()) {
    if (auto* moe = dynamic_cast<MoE*>(module.get())) {
      EXPECT_TRUE(moe->force_load_balance);
      EXPECT_EQ(moe->tokens_per_expert.sum().item<double>(), 0.0);  // validation counted nothing
    }
  }
  fs::remove_all(root);
}

TEST(TrainerMoE, CheckpointsCarryTheExpertBias) {
  const fs::path root = test::fresh_test_dir("titan_trainer_moe_ckpt");
  const Outcome reference = run(config_for(root / "reference", {}, 4), 1);
  // The biases after step 2, from a run stopped there (same schedule: steps = 4).
  JobConfig stop = config_for(root / "stopped", {}, 4);
  stop.training.steps = 2;
  const Outcome first = run(stop, 1);
  // A 4-step run that checkpoints at 2, its step 4 removed: resumption starts after step 2.
  run(with_checkpoints(config_for(root / "resumed", {}, 4)), 1);
  fs::remove_all(root / "resumed" / "checkpoint" / "step-4");
  Layout fsdp;
  fsdp.dp_shard = 2;
  // Resumed at step 2 under FSDP 2: the biases come back from the checkpoint.
  test::on_ranks(with_checkpoints(config_for(root / "resumed", fsdp, 4)), 2,
                 [&](int64_t r, Trainer& t) {
                   if (r == 0) {
                     for (const auto& [name, b] : t.parallelized().state_buffers()) {
                       EXPECT_TRUE(at::equal(b, first.biases.at(name))) << name;
                     }
                   }
                   const TrainResult result = t.train();
                   if (r != 0) return;
                   ASSERT_EQ(result.losses.size(), 2u);
                   for (size_t s = 0; s < 2; ++s) {
                     EXPECT_NEAR(result.losses[s], reference.result.losses[s + 2],
                                 1e-5 * reference.result.losses[s + 2]);
                   }
                   for (const auto& [name, b] : t.parallelized().state_buffers()) {
                     EXPECT_TRUE(at::allclose(b, reference.biases.at(name), 0, 1e-9)) << name;
                   }
                 });
  fs::remove_all(root);
}

}  // namespace test_trainer_moe
}  // namespace titan
