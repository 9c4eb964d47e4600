// Block-causal attention (model.attn_mask_type = "block_causal") through the Trainer, on a corpus
// of short documents so that every 32-token window packs several of them: the mask changes the
// losses; per-op selective activation checkpointing (which keeps the masked attention's output)
// and context parallelism (ring attention with the documents of the whole sequence, cp 2 and 4,
// both rotate methods, with and without head-tail balancing, with FSDP) and pipeline parallelism
// (1F1B, and zero-bubble with CP) reproduce the one-process block-causal run of the same seed and
// global batch: losses within 1e-5 relative at every step, grad norms within 1e-4, the validation
// loss. TorchTitan's "ptrr" load balancer and
// unknown mask names are refused.
#include "../test_util.h"
#include "trainer_ranks.h"

#include "titan/common/check.h"
#include "titan/trainer/trainer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

namespace titan {
namespace test_trainer_block_causal {

namespace fs = std::filesystem;

constexpr int64_t kGlobalBatch = 4;
constexpr int64_t kSteps = 3;

// 300 documents of 3 to 20 lowercase letters, one JSON object per line.
fs::path write_short_documents(const fs::path& dir) {
  fs::create_directories(dir);
  const fs::path path = dir / "short.jsonl";
  std::ofstream out(path);
  std::mt19937 rng(11);
  for (int d = 0; d < 300; ++d) {
    const int len = 3 + static_cast<int>(rng() % 18);
    std::string text;
    for (int i = 0; i < len; ++i) text += static_cast<char>('a' + rng() % 26);
    out << "{\"text\": \"" << text << "\"}\n";
  }
  return path;
}

struct Layout {
  int64_t cp = 1, dp_shard = 1, pp = 1;
  std::string rotate = "allgather", balancer = "headtail", schedule = "1F1B";
  std::string name() const {
    std::string n = "cp " + std::to_string(cp) + " (" + rotate + ", " + balancer + ")";
    if (dp_shard > 1) n += " x dp_shard " + std::to_string(dp_shard);
    if (pp > 1) n += " x " + schedule + " pp " + std::to_string(pp);
    return n;
  }
};

JobConfig config_for(const fs::path& dump, const fs::path& corpus, const std::string& mask,
                     const Layout& layout) {
  JobConfig c = test::tiny_training_config(dump.string());
  c.model.attn_mask_type = mask;
  c.training.dataset = "jsonl";
  c.training.dataset_path = corpus.string();
  c.training.steps = kSteps;
  c.training.local_batch_size = kGlobalBatch / layout.dp_shard;
  c.training.global_batch_size = kGlobalBatch;
  c.lr_scheduler.warmup_steps = 1;
  c.debug.seed = 5;
  c.validation.enable = true;
  c.validation.dataset = "jsonl";
  c.validation.dataset_path = corpus.string();
  c.validation.freq = kSteps;
  c.validation.steps = 1;
  c.validation.local_batch_size = 2 / layout.dp_shard;
  c.validation.seq_len = 32;
  c.parallelism.data_parallel_shard_degree = layout.dp_shard;
  c.parallelism.context_parallel_degree = layout.cp;
  c.parallelism.context_parallel_rotate_method = layout.rotate;
  c.parallelism.context_parallel_load_balancer = layout.balancer;
  c.parallelism.pipeline_parallel_degree = layout.pp;
  c.parallelism.pipeline_parallel_schedule = layout.schedule;
  return c;
}

TrainResult on_layout(const JobConfig& config, int64_t world) {
  if (world == 1) return Trainer(config).train();
  return test::train_on_ranks(config, world)[0];
}

void expect_same_run(const TrainResult& got, const TrainResult& want, const std::string& what) {
  SCOPED_TRACE(what);
  ASSERT_EQ(got.losses.size(), want.losses.size());
  double worst = 0;
  for (size_t s = 0; s < want.losses.size(); ++s) {
    const double rel = std::abs(got.losses[s] - want.losses[s]) / want.losses[s];
    worst = std::max(worst, rel);
    EXPECT_LT(rel, 1e-5) << "step " << s + 1 << ": " << got.losses[s] << " vs " << want.losses[s];
    EXPECT_NEAR(got.grad_norms[s], want.grad_norms[s], 1e-4 * want.grad_norms[s])
        << "step " << s + 1;
  }
  ASSERT_EQ(got.validation_losses.size(), 1u);
  ASSERT_EQ(want.validation_losses.size(), 1u);
  EXPECT_NEAR(got.validation_losses[0], want.validation_losses[0],
              1e-5 * want.validation_losses[0]);
  std::printf("block-causal %s vs one process: worst loss %.2e relative\n", what.c_str(), worst);
}

TEST(TrainerBlockCausal, MasksDocumentsAndEveryLayoutReproducesOneProcess) {
  const fs::path root = test::fresh_test_dir("titan_trainer_block_causal");
  const fs::path corpus = write_short_documents(root / "data");
  const TrainResult block = on_layout(config_for(root / "one", corpus, "block_causal", {}), 1);
  const TrainResult causal = on_layout(config_for(root / "causal", corpus, "causal", {}), 1);
  // The first step's loss is the initial model's: only the mask differs.
  ASSERT_EQ(causal.losses.size(), block.losses.size());
  EXPECT_GT(std::abs(block.losses[0] - causal.losses[0]) / causal.losses[0], 1e-4)
      << "block-causal " << block.losses[0] << " vs causal " << causal.losses[0];

  // Per-op selective checkpointing keeps the masked attention and replays its backward.
  JobConfig sac = config_for(root / "sac", corpus, "block_causal", {});
  sac.activation_checkpoint.mode = "selective";
  sac.activation_checkpoint.selective_ac_option = "op";
  expect_same_run(on_layout(sac, 1), block, "selective op AC");
  JobConfig full = config_for(root / "full", corpus, "block_causal", {});
  full.activation_checkpoint.mode = "full";
  expect_same_run(on_layout(full, 1), block, "full AC");

  const auto cp = [](int64_t degree, const char* rotate, const char* balancer) {
    Layout l;
    l.cp = degree;
    l.rotate = rotate;
    l.balancer = balancer;
    return l;
  };
  Layout fsdp = cp(2, "alltoall", "headtail");
  fsdp.dp_shard = 2;
  // Pipeline: each microbatch's documents follow it through the schedule (1F1B, and the
  // zero-bubble split with CP).
  Layout pp = cp(1, "allgather", "headtail");
  pp.pp = 2;
  Layout pp_cp = cp(2, "alltoall", "headtail");
  pp_cp.pp = 2;
  pp_cp.schedule = "ZBVZeroBubble";
  for (const Layout& layout : {cp(2, "allgather", "headtail"), cp(2, "alltoall", "none"),
                               cp(4, "alltoall", "headtail"), fsdp, pp, pp_cp}) {
    const JobConfig c = config_for(root / layout.name(), corpus, "block_causal", layout);
    expect_same_run(on_layout(c, layout.cp * layout.dp_shard * layout.pp), block, layout.name());
  }
  fs::remove_all(root);
}

TEST(TrainerBlockCausal, RefusesPtrrAndUnknownMasks) {
  const fs::path root = test::fresh_test_dir("titan_trainer_block_causal_errors");
  const fs::path corpus = write_short_documents(root / "data");
  // TorchTitan's "ptrr" balancer reorders flex attention's block masks; we refuse it by name.
  Layout ptrr;
  ptrr.cp = 2;
  ptrr.balancer = "ptrr";
  JobConfig c = config_for(root / "ptrr", corpus, "block_causal", ptrr);
  c.validation.enable = false;
  for (const std::string& error : test::errors_on_ranks(c, 2, [](int64_t, Trainer&) {})) {
    EXPECT_TRUE(test::contains(error, "context_parallel_load_balancer = \"ptrr\" is not supported"))
        << error;
  }
  try {
    Trainer trainer(config_for(root / "typo", corpus, "block-causal", {}));
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_TRUE(test::contains(e.what(), "model.attn_mask_type")) << e.what();
    EXPECT_TRUE(test::contains(e.what(), "block_causal")) << e.what();
  }
  fs::remove_all(root);
}

}  // namespace test_trainer_block_causal
}  // namespace titan
