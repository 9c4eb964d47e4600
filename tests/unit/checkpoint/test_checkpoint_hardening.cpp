// Checkpoints that must not lose work or load silently wrong state: model-only exports never
// push out the last full checkpoint nor get overwritten, a folder of exports is no silent fresh
// start, the index protects itself, file names stay inside the step folder, deletions never leave
// a complete-looking half, temporaries of live processes survive, one run per dump folder, and
// safetensors data sections are tiled exactly.
#include "titan/checkpoint/checkpoint_files.h"
#include "titan/checkpoint/checkpoint_manager.h"
#include "titan/checkpoint/safetensors.h"
#include "titan/common/check.h"
#include "titan/common/folder_lock.h"
#include "titan/components/data/dataset.h"
#include "titan/trainer/trainer.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <limits>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

namespace titan {
namespace test_checkpoint_hardening {

namespace fs = std::filesystem;
using ckpt::CheckpointManager;
using ckpt::CheckpointReader;
using ckpt::SavedTensor;
using ckpt::StateEntry;

std::string fresh_dir(const std::string& tag) {
  const fs::path dir = fs::temp_directory_path() / ("titan_ckpt_hard_" + tag);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

template <typename F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

// The message of the ConfigError `f` throws ("" if none; another exception fails the test).
template <typename F>
std::string config_error_of(F&& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

// Entries of a minimal trainer: a model tensor and the step.
struct State {
  at::Tensor w = at::zeros({4, 3});
  int64_t step = 0;

  std::vector<StateEntry> entries() {
    StateEntry model;
    model.name = "model";
    model.is_model = true;
    model.save = [this](std::vector<SavedTensor>& tensors, nlohmann::json&) {
      tensors.push_back({"w", w, {}});
    };
    model.load = [this](const CheckpointReader& r, const nlohmann::json&) { w = r.read("w"); };
    StateEntry train_state;
    train_state.name = "train_state";
    train_state.save = [this](std::vector<SavedTensor>&, nlohmann::json& s) { s["step"] = step; };
    train_state.load = [this](const CheckpointReader&, const nlohmann::json& s) {
      step = s.at("step").get<int64_t>();
    };
    return {model, train_state};
  }
};

CheckpointSection section() {
  CheckpointSection c;
  c.enable = true;
  c.interval = 1;
  c.keep_latest_k = 0;
  c.export_dtype = "float32";
  return c;
}

// Saves steps `from`..`to` as a run with `last` as its last step would.
void train_and_save(const std::string& dump, const CheckpointSection& config, int64_t from,
                    int64_t to, int64_t last) {
  State s;
  CheckpointManager manager(config, dump, s.entries(), {});
  for (int64_t step = from; step <= to; ++step) {
    s.step = step;
    s.w.fill_(static_cast<double>(step));
    manager.maybe_save(step, last);
  }
}

std::vector<int64_t> steps_of(const std::string& folder) {
  std::vector<int64_t> out;
  for (const auto& [step, dir] : ckpt::list_step_dirs(folder)) out.push_back(step);
  return out;
}

std::vector<std::string> names_in(const std::string& folder) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(folder)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

bool any_name_starts_with(const std::string& folder, const std::string& prefix) {
  for (const auto& n : names_in(folder)) {
    if (n.rfind(prefix, 0) == 0) return true;
  }
  return false;
}

// ---- item 1: model-only exports -----------------------------------------------------------------

TEST(CheckpointHardening, KeepLatestKNeverDeletesTheNewestFullCheckpoint) {
  const std::string dump = fresh_dir("keep_full");
  const std::string folder = dump + "/checkpoint";
  CheckpointSection config = section();
  config.keep_latest_k = 1;
  config.last_save_model_only = true;
  train_and_save(dump, config, 1, 3, /*last=*/3);
  // step-3 is the model-only export; step-2, the newest full one, survives keep_latest_k 1.
  EXPECT_EQ(steps_of(folder), (std::vector<int64_t>{2, 3}));

  // Raising the step count resumes from step-2 (not from scratch) and, when it saves step 3
  // again, moves the first run's export aside instead of overwriting it.
  State s;
  CheckpointManager manager(config, dump, s.entries(), {});
  const ckpt::LoadResult r = manager.load();
  EXPECT_TRUE(r.loaded);
  EXPECT_EQ(r.step, 2);
  EXPECT_EQ(s.step, 2);
  EXPECT_TRUE(at::equal(s.w, at::full({4, 3}, 2.0)));
  s.step = 3;
  manager.maybe_save(3, /*last_step=*/5);
  EXPECT_TRUE(any_name_starts_with(folder, "step-3.model-only-"));
  EXPECT_FALSE(CheckpointReader(folder + "/step-3").state()["model_only"].get<bool>());
  // keep_latest_k 1 and step-3 is now the newest full checkpoint: step-2 goes.
  EXPECT_EQ(steps_of(folder), (std::vector<int64_t>{3}));
}

TEST(CheckpointHardening, OnlyModelOnlyCheckpointsRefuseToStartOver) {
  const std::string dump = fresh_dir("only_exports");
  CheckpointSection config = section();
  config.interval = 500;  // the defaults' shape: only the final save happens
  config.last_save_model_only = true;
  train_and_save(dump, config, 1, 3, /*last=*/3);
  EXPECT_EQ(steps_of(dump + "/checkpoint"), (std::vector<int64_t>{3}));
  State s;
  CheckpointManager manager(config, dump, s.entries(), {});
  std::string err = config_error_of([&] { manager.load(); });
  EXPECT_NE(err.find("only model-only checkpoints (step-3"), std::string::npos) << err;
  EXPECT_NE(err.find("--checkpoint.initial_load_path"), std::string::npos) << err;

  // Asking for the model-only step explicitly is refused the same way, never a fresh start.
  config.load_step = 3;
  CheckpointManager explicit_step(config, dump, s.entries(), {});
  err = config_error_of([&] { explicit_step.load(); });
  EXPECT_NE(err.find("is a model-only checkpoint"), std::string::npos) << err;

  // The weights are usable the way the hint says: as an initial load in another folder.
  CheckpointSection fresh = section();
  fresh.initial_load_path = dump + "/checkpoint/step-3";
  State t;
  CheckpointManager other(fresh, fresh_dir("only_exports_next"), t.entries(), {});
  const ckpt::LoadResult r = other.load();
  EXPECT_TRUE(r.loaded && r.model_only);
  EXPECT_EQ(r.step, 0);
  EXPECT_TRUE(at::equal(t.w, at::full({4, 3}, 3.0)));
}

TEST(CheckpointHardening, TrainerResumesAfterTheFinalExportWithKeepLatestOne) {
  if (!fs::exists(default_dataset_path("sotu"))) GTEST_SKIP() << "sotu corpus missing";
  JobConfig c;
  c.job.dump_folder = fresh_dir("trainer_k1");
  c.model.flavor = "tiny";
  c.training.device = "cpu";
  c.training.seq_len = 16;
  c.training.local_batch_size = 2;
  c.training.steps = 3;
  c.training.mixed_precision_param = "float32";
  c.training.num_threads = 1;
  c.metrics.log_freq = 100;
  c.metrics.peak_flops = 1e12;
  c.debug.seed = 5;
  c.checkpoint.enable = true;
  c.checkpoint.interval = 1;
  c.checkpoint.keep_latest_k = 1;
  Trainer(c).train();
  c.training.steps = 5;
  Trainer more(c);
  EXPECT_EQ(more.train_state().step, 2);
  const TrainResult r = more.train();
  EXPECT_EQ(r.start_step, 3);
  EXPECT_TRUE(any_name_starts_with(c.job.dump_folder + "/checkpoint", "step-3.model-only-"));
}

// ---- item 2: the index protects itself
// ------------------------------------------------------------

// Rewrites `dir`'s index.json as version 1 (no checksum) after `edit`.
void edit_as_version_1(const std::string& dir, const std::function<void(nlohmann::json&)>& edit) {
  nlohmann::json index = nlohmann::json::parse(read_text(dir + "/index.json"));
  index.erase("checksum");
  index["version"] = 1;
  edit(index);
  write_text(dir + "/index.json", index.dump(1));
}

TEST(CheckpointHardening, IndexChecksumCatchesOneChangedDigit) {
  const std::string dump = fresh_dir("index_crc");
  const std::string folder = dump + "/checkpoint";
  train_and_save(dump, section(), 1, 3, /*last=*/9);
  const std::string step3 = folder + "/step-3";
  std::string text = read_text(step3 + "/index.json");
  // train_state's step 3 -> 1: one changed byte.
  const size_t at = text.find("\"step\": 3", text.find("\"train_state\""));
  ASSERT_NE(at, std::string::npos) << text;
  text[at + 8] = '1';
  write_text(step3 + "/index.json", text);
  const std::string err = message_of([&] { CheckpointReader r(step3, /*verify=*/false); });
  EXPECT_NE(err.find("index is corrupted"), std::string::npos) << err;

  // Resuming falls back to step-2 and, saving step 3 again, keeps the corrupt one aside.
  State s;
  CheckpointManager manager(section(), dump, s.entries(), {});
  EXPECT_EQ(manager.load().step, 2);
  s.step = 3;
  manager.save(3, /*model_only=*/false);
  EXPECT_TRUE(any_name_starts_with(folder, "step-3.unloadable-"));
  EXPECT_EQ(CheckpointReader(step3).state()["step"], 3);
}

TEST(CheckpointHardening, SwappedTensorNamesAreCaught) {
  const std::string dir = fresh_dir("swap") + "/step-1";
  ckpt::write_checkpoint(dir, {{"a", at::zeros({2}), {}}, {"b", at::ones({2}), {}}}, {{"step", 1}});
  std::string text = read_text(dir + "/index.json");
  const size_t a = text.find("\"key\": \"a\"");
  const size_t b = text.find("\"key\": \"b\"");
  ASSERT_NE(a, std::string::npos);
  ASSERT_NE(b, std::string::npos);
  text[a + 8] = 'b';
  text[b + 8] = 'a';
  write_text(dir + "/index.json", text);
  EXPECT_NE(message_of([&] { CheckpointReader r(dir); }).find("index is corrupted"),
            std::string::npos);
}

TEST(CheckpointHardening, FolderNameStateStepAndTrainStateMustAgree) {
  const std::string dump = fresh_dir("steps_agree");
  train_and_save(dump, section(), 3, 3, /*last=*/9);
  const std::string dir = dump + "/checkpoint/step-3";
  // Unprotected (version 1) indexes get the cross-checks too.
  edit_as_version_1(dir,
                    [](nlohmann::json& i) { i["state"]["entries"]["train_state"]["step"] = 1; });
  std::string err = message_of([&] { CheckpointReader r(dir); });
  EXPECT_NE(err.find("train_state records step 1 but the checkpoint is of step 3"),
            std::string::npos)
      << err;
  edit_as_version_1(dir, [](nlohmann::json& i) {
    i["state"]["step"] = 1;
    i["state"]["entries"]["train_state"]["step"] = 1;
  });
  err = message_of([&] { CheckpointReader r(dir); });
  EXPECT_NE(err.find("named step-3 but its state records step 1"), std::string::npos) << err;
  // A consistent version-1 index still loads.
  edit_as_version_1(dir, [](nlohmann::json& i) {
    i["state"]["step"] = 3;
    i["state"]["entries"]["train_state"]["step"] = 3;
  });
  EXPECT_EQ(message_of([&] { CheckpointReader r(dir); }), "");
}

// ---- item 4: file names stay inside the step folder
// -----------------------------------------------

TEST(CheckpointHardening, FileNamesThatLeaveTheFolderAreRefused) {
  const std::string dump = fresh_dir("escape");
  train_and_save(dump, section(), 1, 2, /*last=*/9);
  const std::string dir = dump + "/checkpoint/step-2";
  for (const std::string bad : {"../step-1/shard-00000.safetensors", "../../../etc/passwd",
                                "/etc/passwd", "..", "sub/shard.safetensors"}) {
    edit_as_version_1(dir, [&](nlohmann::json& i) {
      nlohmann::json files;
      files[bad] = i["files"]["shard-00000.safetensors"];
      i["files"] = files;
      for (auto& [name, t] : i["tensors"].items()) {
        for (auto& shard : t["shards"]) shard["file"] = bad;
      }
    });
    const std::string err = message_of([&] { CheckpointReader r(dir, /*verify=*/false); });
    EXPECT_NE(err.find("is not a plain file name"), std::string::npos) << bad << ": " << err;
  }
}

// ---- item 8: a FIFO where a checkpoint file belongs is refused, not opened (which would block)
// ----

TEST(CheckpointHardening, FifosAreRefusedWithoutBlocking) {
  const std::string dump = fresh_dir("fifo");
  train_and_save(dump, section(), 1, 1, /*last=*/9);
  const std::string dir = dump + "/checkpoint/step-1";
  const std::string shard = dir + "/shard-00000.safetensors";
  fs::remove(shard);
  ASSERT_EQ(::mkfifo(shard.c_str(), 0600), 0);
  std::string err = message_of([&] { ckpt::SafetensorsReader r(shard); });
  EXPECT_NE(err.find("is a FIFO (named pipe)"), std::string::npos) << err;
  fs::remove(dir + "/index.json");
  ASSERT_EQ(::mkfifo((dir + "/index.json").c_str(), 0600), 0);
  err = message_of([&] { CheckpointReader r(dir); });
  EXPECT_NE(err.find("is a FIFO (named pipe)"), std::string::npos) << err;
}

// ---- items 3 and 6: deletions, temporaries, the folder lock
// ---------------------------------------

TEST(CheckpointHardening, PurgeRenamesBeforeDeletingAndStartupCleansUp) {
  const std::string dump = fresh_dir("purge");
  const std::string folder = dump + "/checkpoint";
  CheckpointSection config = section();
  config.keep_latest_k = 2;
  train_and_save(dump, config, 1, 4, /*last=*/9);
  EXPECT_EQ(steps_of(folder), (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(names_in(folder), (std::vector<std::string>{"step-3", "step-4"}));

  // What a kill leaves: a purge that renamed but did not finish, a save of a dead process, a
  // save of a live one (the parent of this test), a step folder whose index is gone.
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ::waitpid(child, nullptr, 0);  // `child` is now a pid nobody uses
  fs::create_directories(folder + "/step-1.deleting-" + std::to_string(child) + "/x");
  fs::create_directories(folder + "/step-5.tmp-" + std::to_string(child));
  const std::string live = folder + "/step-6.tmp-" + std::to_string(::getppid());
  fs::create_directories(live);
  fs::create_directories(folder + "/step-7");
  write_text(folder + "/step-7/shard-00000.safetensors", "x");

  State s;
  CheckpointManager manager(config, dump, s.entries(), {});
  EXPECT_EQ(manager.load().step, 4);
  EXPECT_EQ(names_in(folder),
            (std::vector<std::string>{"step-3", "step-4",
                                      "step-6.tmp-" + std::to_string(::getppid()), "step-7"}));
  // Saving step 7 moves the incomplete folder aside rather than deleting it.
  s.step = 7;
  manager.save(7, /*model_only=*/false);
  EXPECT_TRUE(any_name_starts_with(folder, "step-7.incomplete-"));
  EXPECT_EQ(steps_of(folder), (std::vector<int64_t>{4, 7}));
  fs::remove_all(live);
}

TEST(CheckpointHardening, AStepFolderNotWrittenByThisRunIsNotOverwritten) {
  const std::string dump = fresh_dir("no_overwrite");
  State s;
  CheckpointManager manager(section(), dump, s.entries(), {});
  EXPECT_FALSE(manager.load().loaded);
  // Another writer creates step-2 after this run started.
  train_and_save(dump, section(), 2, 2, /*last=*/9);
  s.step = 2;
  const std::string err = message_of([&] { manager.save(2, /*model_only=*/false); });
  EXPECT_NE(err.find("was not written by this run"), std::string::npos) << err;
}

TEST(CheckpointHardening, LoadStepWithNewerCheckpointsIsRefused) {
  const std::string dump = fresh_dir("load_step_newer");
  train_and_save(dump, section(), 1, 3, /*last=*/9);
  CheckpointSection config = section();
  config.load_step = 1;
  State s;
  CheckpointManager manager(config, dump, s.entries(), {});
  const std::string err = config_error_of([&] { manager.load(); });
  EXPECT_NE(err.find("newer checkpoints (step-2, step-3)"), std::string::npos) << err;
}

TEST(CheckpointHardening, DumpFolderLockNamesTheHolder) {
  const std::string folder = fresh_dir("lock") + "/dump";
  // Another process holds the folder (a forked child that locks it and waits).
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  if (child == 0) {
    auto lock = FolderLock::acquire(folder, "job.dump_folder");
    (void)!::write(ready[1], "x", 1);
    ::pause();
    ::_exit(0);
  }
  char c;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  const std::string err = config_error_of([&] { FolderLock::acquire(folder, "job.dump_folder"); });
  EXPECT_NE(err.find("in use by another run (pid " + std::to_string(child) + " on host"),
            std::string::npos)
      << err;
  // kill -9 releases it.
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  auto lock = FolderLock::acquire(folder, "job.dump_folder");
  EXPECT_NE(read_text(folder + "/.titan.lock").find(process_description()), std::string::npos);
  // The same process may hold it twice (trainers built one after the other).
  auto again = FolderLock::acquire(folder, "job.dump_folder");
  EXPECT_EQ(again->path(), lock->path());
  ::close(ready[0]);
  ::close(ready[1]);
}

// ---- safetensors data sections
// ----------------------------------------------------------------------

std::string safetensors_bytes(const std::string& header, size_t data_bytes) {
  std::string len(8, '\0');
  for (int i = 0; i < 8; ++i) len[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  return len + header + std::string(data_bytes, '\0');
}

TEST(CheckpointHardening, SafetensorsOffsetsMustTileTheDataSection) {
  const std::string dir = fresh_dir("st_tiles");
  struct Case {
    std::string header;
    size_t data;
    std::string error;
  };
  const std::vector<Case> cases = {
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
       12, "overlapping data_offsets"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[12,16]}})",
       16, "a gap in the data section"},
      {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8, "a gap in the data section"},
      {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 8, "trailing bytes"},
      {R"({"a":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,0]}})", 0,
       "overflows"},
  };
  for (const Case& c : cases) {
    write_text(dir + "/x.safetensors", safetensors_bytes(c.header, c.data));
    const std::string err = message_of([&] { ckpt::SafetensorsReader r(dir + "/x.safetensors"); });
    EXPECT_NE(err.find(c.error), std::string::npos) << c.header << ": " << err;
  }
  // Out of header order but tiling exactly is valid (the order of JSON keys means nothing).
  write_text(
      dir + "/ok.safetensors",
      safetensors_bytes(
          R"({"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"z":{"dtype":"F32","shape":[0],"data_offsets":[12,12]}})",
          12));
  EXPECT_EQ(message_of([&] { ckpt::SafetensorsReader r(dir + "/ok.safetensors"); }), "");
}

// An index with a valid checksum that lists a tensor as two shards over the same rows (the
// element count matches, rows 2-3 come from nowhere) is refused at open: the shards must tile the
// tensor, not merely add up to it. The honest index (rows 0-1 and 2-3) reads back exactly.
TEST(CheckpointHardening, ShardBoxesMustTileTheTensor) {
  const at::Tensor top = at::arange(6, at::kFloat).reshape({2, 3});
  const at::Tensor bottom = top + 100;
  // The index of `a` and `b` saved whole, made into one tensor "w" [4, 3] of two shards, with
  // b's box starting at row `b_row`, and sealed again with its checksum.
  auto forged = [&](const std::string& tag, int64_t b_row) {
    const std::string dir = fresh_dir(tag) + "/step-1";
    ckpt::write_checkpoint(dir, {{"a", top, {}}, {"b", bottom, {}}}, {{"step", 1}});
    nlohmann::json index = nlohmann::json::parse(read_text(dir + "/index.json"));
    nlohmann::json a = index["tensors"]["a"]["shards"][0];
    nlohmann::json b = index["tensors"]["b"]["shards"][0];
    b["offsets"] = {b_row, 0};
    index["tensors"] = {{"w", {{"dtype", "F32"}, {"shape", {4, 3}}, {"shards", {a, b}}}}};
    index.erase("checksum");
    const std::string canonical = index.dump();
    index["checksum"] = ckpt::crc32c(canonical.data(), canonical.size());
    write_text(dir + "/index.json", index.dump(1));
    return dir;
  };
  const std::string honest = forged("tile_ok", 2);
  EXPECT_TRUE(at::equal(CheckpointReader(honest).read("w"), at::cat({top, bottom})));
  const std::string overlap = forged("tile_overlap", 0);
  const std::string err = message_of([&] { CheckpointReader r(overlap); });
  EXPECT_NE(err.find("index.json: tensor 'w' [4, 3]: shard 0 (file '"), std::string::npos) << err;
  EXPECT_NE(err.find("key 'a') [0, 0] + [2, 3] overlaps shard 1 ("), std::string::npos) << err;
  // A box past the end, with offsets that would overflow when added to the length.
  const std::string past = forged("tile_past", std::numeric_limits<int64_t>::max());
  const std::string err2 = message_of([&] { CheckpointReader r(past); });
  EXPECT_NE(err2.find("is not inside the tensor [4, 3]"), std::string::npos) << err2;
}

}  // namespace test_checkpoint_hardening
}  // namespace titan
