// The TorchTitan keys the trainer reads: training.dtype = "bfloat16" (full bf16 training),
// debug.deterministic_warn_only, checkpoint.load_only and metrics.save_for_all_ranks, each on a
// tiny model over a small text dataset (byte tokenizer), a few steps.
#include "titan/checkpoint/checkpoint_files.h"
#include "titan/trainer/trainer.h"

#include "../test_util.h"

#include <ATen/Context.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

namespace titan {
namespace torchtitan_keys_test {

namespace fs = std::filesystem;

// A folder with one document of repeated English text.
std::string text_dataset() {
  const fs::path dir = fs::temp_directory_path() / "titan_torchtitan_keys_data";
  fs::create_directories(dir);
  std::string text;
  for (int i = 0; i < 300; ++i) text += "the quick brown fox jumps over the lazy dog. ";
  std::ofstream(dir / "doc.txt") << text;
  return dir.string();
}

JobConfig tiny_config(const std::string& tag) {
  JobConfig c = test::tiny_training_config(test::fresh_test_dir("titan_tt_keys_" + tag).string());
  c.model.hf_assets_path = "";  // byte tokenizer
  c.training.dataset = "text";
  c.training.dataset_path = text_dataset();
  c.training.local_batch_size = 4;
  c.training.steps = 4;
  c.lr_scheduler.warmup_steps = 1;
  c.debug.seed = 5;
  return c;
}

TEST(TorchTitanKeys, Bfloat16TrainsWithBf16ParametersGradientsAndStates) {
  JobConfig bf16 = tiny_config("bf16");
  bf16.training.dtype = "bfloat16";
  Trainer trainer(bf16);
  for (const auto& [name, p] : trainer.trained_params()) {
    EXPECT_EQ(p.scalar_type(), at::kBFloat16) << name;
  }
  const TrainResult result = trainer.train();
  for (const auto& [name, p] : trainer.trained_params()) {
    ASSERT_TRUE(p.grad().defined()) << name;
    EXPECT_EQ(p.grad().scalar_type(), at::kBFloat16) << name;
  }
  for (const auto& [name, state] : trainer.optimizer().state_tensors()) {
    EXPECT_EQ(state.scalar_type(), at::kBFloat16) << name;
  }
  // Same seed and data as a float32 run: the first loss agrees to bf16 precision, and training
  // makes progress.
  const TrainResult fp32 = Trainer(tiny_config("fp32")).train();
  ASSERT_EQ(result.losses.size(), 4u);
  EXPECT_NEAR(result.losses[0], fp32.losses[0], 0.05);
  for (double loss : result.losses) EXPECT_TRUE(std::isfinite(loss));
  EXPECT_LT(result.losses.back(), result.losses.front());
}

TEST(TorchTitanKeys, DeterministicWarnOnly) {
  JobConfig c = tiny_config("warn_only");
  c.debug.deterministic = true;
  c.debug.deterministic_warn_only = true;
  { Trainer trainer(c); }
  EXPECT_TRUE(at::globalContext().deterministicAlgorithms());
  EXPECT_TRUE(at::globalContext().deterministicAlgorithmsWarnOnly());
  c.debug.deterministic_warn_only = false;
  c.job.dump_folder += "_strict";
  { Trainer trainer(c); }
  EXPECT_FALSE(at::globalContext().deterministicAlgorithmsWarnOnly());
  at::globalContext().setDeterministicAlgorithms(false, false);
}

TEST(TorchTitanKeys, LoadOnlyResumesButNeverSaves) {
  JobConfig first = tiny_config("load_only");
  first.training.steps = 2;
  first.checkpoint.enable = true;
  first.checkpoint.interval = 1;
  first.checkpoint.last_save_model_only = false;
  Trainer(first).train();
  const std::string folder = (fs::path(first.job.dump_folder) / "checkpoint").string();
  ASSERT_EQ(ckpt::list_step_dirs(folder).size(), 2u);

  JobConfig again = first;
  again.training.steps = 4;
  again.checkpoint.load_only = true;
  const TrainResult result = Trainer(again).train();
  EXPECT_EQ(result.start_step, 3);  // resumed from step 2
  EXPECT_EQ(result.steps, 4);
  EXPECT_EQ(ckpt::list_step_dirs(folder).size(), 2u);  // steps 3 and 4 saved nothing
}

TEST(TorchTitanKeys, SaveForAllRanksNamesTheFileByRank) {
  JobConfig c = tiny_config("all_ranks");
  c.training.steps = 1;
  c.metrics.save_for_all_ranks = true;
  Trainer(c).train();
  EXPECT_TRUE(fs::exists(fs::path(c.job.dump_folder) / "metrics_rank_0.jsonl"));
  EXPECT_FALSE(fs::exists(fs::path(c.job.dump_folder) / "metrics.jsonl"));
}

}  // namespace torchtitan_keys_test
}  // namespace titan
