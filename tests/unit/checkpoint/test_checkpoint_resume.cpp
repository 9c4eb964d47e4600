// Checkpointing through the trainer: resuming reproduces an uninterrupted run bit for bit,
// async saves equal sync saves, retention, exclusions, model-only exports, seed checkpoints and
// falling back past a corrupted checkpoint.
#include "titan/checkpoint/checkpoint_files.h"
#include "titan/checkpoint/checkpoint_manager.h"
#include "titan/checkpoint/safetensors.h"
#include "titan/common/check.h"
#include "titan/components/data/dataset.h"
#include "titan/trainer/trainer.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>

namespace titan {
namespace test_checkpoint_resume {

namespace fs = std::filesystem;

JobConfig tiny_config(const std::string& tag, int64_t steps) {
  JobConfig c;
  c.job.dump_folder = (fs::temp_directory_path() / ("titan_ckpt_resume_" + tag)).string();
  fs::remove_all(c.job.dump_folder);
  c.model.flavor = "tiny";
  c.training.device = "cpu";  // CPU checkpoints (rng.cpu only), also where a GPU is visible
  c.training.seq_len = 32;
  c.training.local_batch_size = 4;
  c.training.steps = steps;
  c.training.mixed_precision_param = "float32";
  c.training.num_threads = 1;
  c.lr_scheduler.warmup_steps = 2;
  c.metrics.log_freq = 100;
  c.metrics.peak_flops = 1e12;  // skip the probe
  c.metrics.disable_color_printing = true;
  c.debug.seed = 11;
  c.checkpoint.enable = true;
  c.checkpoint.interval = 3;
  c.checkpoint.last_save_model_only = false;
  return c;
}

std::string folder_of(const JobConfig& c) {
  return (fs::path(c.job.dump_folder) / c.checkpoint.folder).string();
}

std::vector<int64_t> steps_in(const JobConfig& c) {
  std::vector<int64_t> out;
  for (const auto& [step, dir] : ckpt::list_step_dirs(folder_of(c))) out.push_back(step);
  return out;
}

#define REQUIRE_CORPUS()                         \
  if (!fs::exists(default_dataset_path("sotu"))) \
  GTEST_SKIP() << "sotu corpus missing; run scripts/setup.sh"

TEST(CheckpointResume, ResumedRunMatchesUninterruptedBitwise) {
  REQUIRE_CORPUS();
  JobConfig straight = tiny_config("straight", 7);
  straight.checkpoint.enable = false;
  const TrainResult want = Trainer(straight).train();
  ASSERT_EQ(want.losses.size(), 7u);

  // The same run with checkpoints at 3, 6 and 7: saving does not perturb training.
  JobConfig c = tiny_config("resume", 7);
  const TrainResult saved = Trainer(c).train();
  EXPECT_EQ(steps_in(c), (std::vector<int64_t>{3, 6, 7}));
  EXPECT_EQ(saved.losses, want.losses);
  // Drop 6 and 7 so the rerun resumes mid-way from step 3 (with a partial token buffer).
  fs::remove_all(ckpt::step_dir(folder_of(c), 6));
  fs::remove_all(ckpt::step_dir(folder_of(c), 7));

  Trainer resumed(c);
  EXPECT_EQ(resumed.train_state().step, 3);
  const TrainResult got = resumed.train();
  EXPECT_EQ(got.start_step, 4);
  ASSERT_EQ(got.losses.size(), 4u);
  for (size_t i = 0; i < got.losses.size(); ++i) {
    EXPECT_EQ(got.losses[i], want.losses[3 + i]) << "step " << 4 + i;  // bitwise
    EXPECT_EQ(got.grad_norms[i], want.grad_norms[3 + i]) << "step " << 4 + i;
  }
  EXPECT_EQ(resumed.train_state().tokens_seen, 7 * 4 * 32);
}

TEST(CheckpointResume, AsyncSaveEqualsSyncSave) {
  REQUIRE_CORPUS();
  // A save every step: async_with_pinned_mem reuses its buffers for steps 2 and 3, and each
  // step's checkpoint must still hold that step's state.
  JobConfig sync = tiny_config("sync", 3);
  sync.checkpoint.interval = 1;
  Trainer(sync).train();
  for (const std::string mode : {"async", "async_with_pinned_mem"}) {
    JobConfig async = tiny_config(mode, 3);
    async.checkpoint.interval = 1;
    async.checkpoint.async_mode = mode;
    Trainer(async).train();
    for (int64_t step = 1; step <= 3; ++step) {
      ckpt::CheckpointReader a(ckpt::step_dir(folder_of(sync), step));
      ckpt::CheckpointReader b(ckpt::step_dir(folder_of(async), step));
      ASSERT_EQ(a.names(), b.names());
      for (const auto& name : a.names()) {
        EXPECT_TRUE(at::equal(a.read(name), b.read(name)))
            << mode << " step " << step << " " << name;
      }
      nlohmann::json sa = a.state(), sb = b.state();
      sa.erase("job_config");  // differs in dump_folder and async_mode only
      sb.erase("job_config");
      EXPECT_EQ(sa, sb) << mode << " step " << step;
    }
  }
  ckpt::CheckpointReader a(ckpt::step_dir(folder_of(sync), 3));
  nlohmann::json sa = a.state();
  // Every component is in the checkpoint.
  for (const char* entry :
       {"model", "optimizer", "lr_scheduler", "dataloader", "train_state", "rng"}) {
    EXPECT_TRUE(sa["entries"].contains(entry)) << entry;
  }
  EXPECT_TRUE(a.has("optimizer.layers.0.attention.wq.weight.exp_avg_sq"));
  EXPECT_TRUE(a.has("rng.cpu"));
  EXPECT_FALSE(a.has("rng.cuda.0"));  // trained on the CPU
  EXPECT_EQ(sa["entries"]["rng"], (nlohmann::json{{"world_size", 1}, {"device", "cpu"}}));
  EXPECT_EQ(sa["entries"]["train_state"]["step"], 3);
  EXPECT_EQ(sa["model"]["flavor"], "tiny");
}

TEST(CheckpointResume, KeepLatestKDeletesOldest) {
  REQUIRE_CORPUS();
  JobConfig c = tiny_config("keep", 5);
  c.checkpoint.interval = 1;
  c.checkpoint.keep_latest_k = 2;
  Trainer(c).train();
  EXPECT_EQ(steps_in(c), (std::vector<int64_t>{4, 5}));
  JobConfig all = tiny_config("keep_all", 3);
  all.checkpoint.interval = 1;
  all.checkpoint.keep_latest_k = 0;
  Trainer(all).train();
  EXPECT_EQ(steps_in(all), (std::vector<int64_t>{1, 2, 3}));
}

TEST(CheckpointResume, ExcludeFromLoadingKeepsFreshState) {
  REQUIRE_CORPUS();
  JobConfig c = tiny_config("exclude", 3);
  Trainer(c).train();
  c.training.steps = 5;
  c.checkpoint.exclude_from_loading = {"optimizer", "dataloader"};
  Trainer resumed(c);
  EXPECT_EQ(resumed.train_state().step, 3);        // loaded
  EXPECT_EQ(resumed.optimizer().step_count(), 0);  // excluded: fresh
  for (const auto& [name, t] : resumed.optimizer().state_tensors()) {
    EXPECT_EQ(t.abs().sum().item<double>(), 0.0) << name;
  }
  c.checkpoint.exclude_from_loading = {"bogus"};
  EXPECT_THROW(Trainer{c}, ConfigError);
}

TEST(CheckpointResume, ModelOnlyFinalExportAndCompletedRun) {
  REQUIRE_CORPUS();
  JobConfig c = tiny_config("model_only", 4);
  c.checkpoint.last_save_model_only = true;
  c.checkpoint.export_dtype = "bfloat16";
  Trainer trainer(c);
  trainer.train();
  ckpt::CheckpointReader final_ckpt(ckpt::step_dir(folder_of(c), 4));
  EXPECT_TRUE(final_ckpt.state()["model_only"].get<bool>());
  EXPECT_FALSE(final_ckpt.has("optimizer.norm.weight.exp_avg"));
  EXPECT_EQ(final_ckpt.meta("norm.weight").dtype, at::kBFloat16);
  at::Tensor w = trainer.model().named_parameters()["layers.1.feed_forward.w2.weight"];
  EXPECT_TRUE(at::equal(final_ckpt.read("layers.1.feed_forward.w2.weight"), w.to(at::kBFloat16)));

  // Running the finished job again trains nothing.
  const TrainResult again = Trainer(c).train();
  EXPECT_TRUE(again.losses.empty());
  // With more steps it resumes from the last full checkpoint (step 3), not the export.
  c.training.steps = 5;
  Trainer more(c);
  EXPECT_EQ(more.train_state().step, 3);
}

TEST(CheckpointResume, FallsBackPastACorruptedCheckpoint) {
  REQUIRE_CORPUS();
  JobConfig c = tiny_config("fallback", 6);
  Trainer(c).train();
  const std::string newest = ckpt::step_dir(folder_of(c), 6);
  const std::string shard = newest + "/shard-00000.safetensors";
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(fs::file_size(shard) / 2));
    f.put('\x7f');
  }
  c.training.steps = 8;
  Trainer resumed(c);
  EXPECT_EQ(resumed.train_state().step, 3);  // step 6 is corrupt

  // With every checkpoint corrupt, resuming refuses instead of silently starting over.
  const std::string older = ckpt::step_dir(folder_of(c), 3) + "/index.json";
  std::ofstream(older, std::ios::trunc) << "{";
  EXPECT_THROW(Trainer{c}, DataError);
}

// Rewrites the newest checkpoint's index with `edit` applied to its state and the checksum
// sealed again: what a forger (or a buggy tool) would leave, which the CRC alone cannot catch.
void edit_state(const std::string& dir, const std::function<void(nlohmann::json&)>& edit) {
  const std::string path = dir + "/index.json";
  std::ifstream in(path);
  nlohmann::json index = nlohmann::json::parse(in);
  in.close();
  edit(index["state"]["entries"]);
  index.erase("checksum");
  const std::string canonical = index.dump();
  index["checksum"] = ckpt::crc32c(canonical.data(), canonical.size());
  std::ofstream(path, std::ios::trunc) << index.dump(1);
}

// Every state field is range-checked at resume: a negative optimizer step count (NaN updates
// after it) or step, or a non-integer token count, makes the checkpoint unloadable, naming the
// field, and the run falls back to the one before.
TEST(CheckpointResume, StateFieldsAreRangeChecked) {
  REQUIRE_CORPUS();
  JobConfig c = tiny_config("fields", 6);
  Trainer(c).train();
  c.training.steps = 8;
  const std::vector<std::pair<std::string, std::function<void(nlohmann::json&)>>> edits = {
      {"optimizer.step_count -3 is outside [0, ",
       [](nlohmann::json& e) { e["optimizer"]["step_count"] = -3; }},
      {"train_state.tokens_seen must be an integer",
       [](nlohmann::json& e) { e["train_state"]["tokens_seen"] = "many"; }},
      {"lr_scheduler.warmup_steps -1 is outside",
       [](nlohmann::json& e) { e["lr_scheduler"]["warmup_steps"] = -1; }},
  };
  for (const auto& [expected, edit] : edits) {
    SCOPED_TRACE(expected);
    const std::string copy = c.job.dump_folder + "_edited";
    fs::remove_all(copy);
    fs::copy(c.job.dump_folder, copy, fs::copy_options::recursive);
    JobConfig e = c;
    e.job.dump_folder = copy;
    edit_state(ckpt::step_dir(folder_of(e), 6), edit);
    Trainer resumed(e);
    EXPECT_EQ(resumed.train_state().step, 3);  // step 6 refused, step 3 loaded
    EXPECT_EQ(resumed.optimizer().step_count(), 3);
    // Asked for step 6 alone, the refusal names the field.
    std::string message;
    try {
      JobConfig only6 = e;
      only6.checkpoint.load_step = 6;
      Trainer t(only6);
    } catch (const DataError& error) {
      message = error.what();
    }
    EXPECT_NE(message.find(expected), std::string::npos) << message;
  }
}

TEST(CheckpointResume, SeedCheckpointAndInitialLoad) {
  REQUIRE_CORPUS();
  JobConfig seed = tiny_config("seed", 2);
  seed.checkpoint.create_seed_checkpoint = true;
  Trainer seeder(seed);
  EXPECT_EQ(seeder.train().steps, 0);
  EXPECT_EQ(steps_in(seed), (std::vector<int64_t>{0}));

  // A different seed but the seed checkpoint's weights: the first loss equals the seeding run's.
  JobConfig from_seed = tiny_config("from_seed", 2);
  from_seed.checkpoint.initial_load_path = folder_of(seed);
  from_seed.debug.seed = 99;
  Trainer loaded(from_seed);
  EXPECT_EQ(loaded.train_state().step, 0);
  for (const auto& item : seeder.model().named_parameters()) {
    EXPECT_TRUE(at::equal(item.value(), loaded.model().named_parameters()[item.key()]))
        << item.key();
  }
  from_seed.checkpoint.initial_load_path = "/nonexistent/titan";
  EXPECT_THROW(Trainer{from_seed}, ConfigError);
}

TEST(CheckpointResume, LastSaveInHfAndInitialLoadInHf) {
  REQUIRE_CORPUS();
  JobConfig c = tiny_config("hf_out", 2);
  c.checkpoint.last_save_model_only = true;
  c.checkpoint.last_save_in_hf = true;
  Trainer trainer(c);
  trainer.train();
  const std::string hf_dir = folder_of(c) + "/step-2-hf";
  ASSERT_TRUE(fs::exists(hf_dir + "/config.json"));
  ASSERT_TRUE(fs::exists(hf_dir + "/model.safetensors"));
  EXPECT_EQ(steps_in(c), (std::vector<int64_t>{2}));  // the HF folder is not a step checkpoint

  JobConfig d = tiny_config("hf_in", 2);
  d.checkpoint.initial_load_path = hf_dir;
  d.checkpoint.initial_load_in_hf = true;
  d.debug.seed = 1234;
  Trainer loaded(d);
  for (const auto& item : trainer.model().named_parameters()) {
    EXPECT_TRUE(at::equal(item.value(), loaded.model().named_parameters()[item.key()]))
        << item.key();
  }
}

}  // namespace test_checkpoint_resume
}  // namespace titan
