// Collective checkpoints: ranks (threads over Gloo, see multirank.h) each save their boxes of a
// tiny sharded model into one step directory; one process reads the whole tensors back bit for
// bit; a different number of ranks with a different layout loads them; retention, resuming,
// falling back past corruption together, rejected overlaps and holes, and asynchronous commits.
#include "titan/checkpoint/checkpoint_files.h"
#include "titan/checkpoint/checkpoint_manager.h"
#include "titan/common/check.h"

#include "../distributed/multirank.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <thread>

namespace titan::ckpt {
namespace test_checkpoint_distributed {

namespace fs = std::filesystem;
using test::run_ranks;
using test::run_ranks_collect;

std::string fresh_dump(const std::string& tag) {
  const fs::path dir = fs::temp_directory_path() / ("titan_ckpt_dist_" + tag);
  fs::remove_all(dir);
  return dir.string();
}

CheckpointSection section() {
  CheckpointSection c;
  c.enable = true;
  c.interval = 1;
  c.keep_latest_k = 0;
  return c;
}

std::string folder_of(const std::string& dump) { return dump + "/checkpoint"; }

std::vector<int64_t> steps_in(const std::string& dump) {
  std::vector<int64_t> out;
  for (const auto& [step, dir] : list_step_dirs(folder_of(dump))) out.push_back(step);
  return out;
}

// The global tensors at step `step` (distinct per step).
at::Tensor weight(int64_t step) { return at::arange(35, at::kFloat).view({7, 5}) * 0.25 + step; }
at::Tensor embed(int64_t step) {
  return (at::arange(24, at::kFloat).view({4, 6}) - step).to(at::kBFloat16);
}
at::Tensor bias(int64_t step) { return at::arange(5, at::kFloat) * -1.5 + step; }

// [begin, end) of `n` owned by `rank` of `size` when chunked as FSDP does: ceil(n / size) each,
// so trailing ranks may own nothing.
std::pair<int64_t, int64_t> chunk(int64_t n, int rank, int size) {
  const int64_t per = (n + size - 1) / size;
  const int64_t begin = std::min(n, rank * per);
  return {begin, std::min(n, begin + per)};
}

enum class Layout { kRows, kCols };

// One rank's part of a tiny model: a box of `w` (rows or columns), rows of the bf16 `e`, and the
// replicated `b`, which only rank 0 hands over. `train_step` is the non-tensor state.
struct RankState {
  int rank = 0, size = 1;
  Layout layout = Layout::kRows;
  at::Tensor w, e, b;
  int64_t train_step = 0;

  std::vector<int64_t> w_offsets() const {
    const auto [r0, r1] = chunk(7, rank, size);
    const auto [c0, c1] = chunk(5, rank, size);
    return layout == Layout::kRows ? std::vector<int64_t>{r0, 0} : std::vector<int64_t>{0, c0};
  }
  std::vector<int64_t> w_lengths() const {
    const auto [r0, r1] = chunk(7, rank, size);
    const auto [c0, c1] = chunk(5, rank, size);
    return layout == Layout::kRows ? std::vector<int64_t>{r1 - r0, 5}
                                   : std::vector<int64_t>{7, c1 - c0};
  }
  // This rank's parts of step `step`'s tensors.
  void set_step(int64_t step) {
    const auto o = w_offsets();
    const auto l = w_lengths();
    w = weight(step).narrow(0, o[0], l[0]).narrow(1, o[1], l[1]).clone();
    const auto [e0, e1] = chunk(4, rank, size);
    e = embed(step).narrow(0, e0, e1 - e0).clone();
    b = bias(step);
    train_step = step;
  }
  void expect_step(int64_t step) const {
    RankState want = *this;
    want.set_step(step);
    EXPECT_TRUE(at::equal(w, want.w)) << "rank " << rank << " w";
    EXPECT_TRUE(at::equal(e, want.e)) << "rank " << rank << " e";
    EXPECT_TRUE(at::equal(b, want.b)) << "rank " << rank << " b";
    EXPECT_EQ(train_step, step) << "rank " << rank;
  }
};

std::vector<StateEntry> entries(RankState& s) {
  StateEntry model;
  model.name = "model";
  model.is_model = true;
  model.save = [&s](std::vector<SavedTensor>& tensors, nlohmann::json& state) {
    tensors.push_back({"w", s.w, {{7, 5}, s.w_offsets()}});
    tensors.push_back({"e", s.e, {{4, 6}, {chunk(4, s.rank, s.size).first, 0}}});
    if (s.rank == 0) tensors.push_back({"b", s.b, {}});
    state["saved_by"] = s.rank;  // only rank 0's JSON is kept
  };
  model.load = [&s](const CheckpointReader& reader, const nlohmann::json&) {
    s.w = reader.read_slice("w", s.w_offsets(), s.w_lengths());
    const auto [e0, e1] = chunk(4, s.rank, s.size);
    s.e = reader.read_slice("e", {e0, 0}, {e1 - e0, 6});
    s.b = reader.read("b");
  };
  StateEntry train;
  train.name = "train_state";
  train.save = [&s](std::vector<SavedTensor>&, nlohmann::json& state) {
    state["step"] = s.train_step;
  };
  train.load = [&s](const CheckpointReader&, const nlohmann::json& state) {
    s.train_step = state.at("step").get<int64_t>();
  };
  return {model, train};
}

RankState rank_state(int rank, int size, Layout layout, int64_t step = 0) {
  RankState s;
  s.rank = rank;
  s.size = size;
  s.layout = layout;
  s.set_step(step);
  return s;
}

// Every rank saves `steps` (each with that step's values) in `layout`.
void save_steps(const std::string& dump, int size, Layout layout, const std::vector<int64_t>& steps,
                CheckpointSection config = section()) {
  run_ranks(size, [&](int rank, std::shared_ptr<dist::Group> group) {
    RankState s = rank_state(rank, size, layout);
    CheckpointManager manager(config, dump, entries(s), {{"model", "tiny"}}, group);
    for (int64_t step : steps) {
      s.set_step(step);
      manager.save(step, /*model_only=*/false);
    }
  });
}

// Flips the last byte: tensor data, which only the CRC32C check notices.
void flip_last_byte(const std::string& path) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  const auto offset = static_cast<std::streamoff>(fs::file_size(path) - 1);
  f.seekg(offset);
  char c = 0;
  f.read(&c, 1);
  f.seekp(offset);
  f.put(static_cast<char>(c ^ 0x5a));
}

bool has_temporaries(const std::string& dump) {
  for (const auto& entry : fs::directory_iterator(folder_of(dump))) {
    if (entry.path().filename().string().find(".tmp-") != std::string::npos) return true;
  }
  return false;
}

TEST(CheckpointDistributed, RanksWriteTheirBoxesAndOneProcessReadsThemWhole) {
  for (int size : {2, 3}) {
    SCOPED_TRACE("ranks " + std::to_string(size));
    const std::string dump = fresh_dump("whole_" + std::to_string(size));
    save_steps(dump, size, Layout::kRows, {3});
    const std::string dir = step_dir(folder_of(dump), 3);
    CheckpointReader reader(dir);
    EXPECT_EQ(reader.names(), (std::vector<std::string>{"b", "e", "w"}));
    EXPECT_TRUE(at::equal(reader.read("w"), weight(3)));
    EXPECT_TRUE(at::equal(reader.read("e"), embed(3)));  // bf16 bits, whole
    EXPECT_TRUE(at::equal(reader.read("b"), bias(3)));
    // Boxes that cross the ranks' row boundaries (rows 2..6 span every rank's part).
    EXPECT_TRUE(at::equal(reader.read_slice("w", {2, 1}, {5, 3}),
                          weight(3).narrow(0, 2, 5).narrow(1, 1, 3)));
    EXPECT_TRUE(at::equal(reader.read_slice("e", {1, 2}, {3, 4}),
                          embed(3).narrow(0, 1, 3).narrow(1, 2, 4)));
    EXPECT_EQ(reader.state()["entries"]["model"]["saved_by"], 0);
    EXPECT_EQ(reader.state()["entries"]["train_state"]["step"], 3);
    EXPECT_EQ(reader.state()["model"], "tiny");
    // Each rank's own shard files; the fragments are merged away; nothing temporary is left.
    for (int r = 0; r < size; ++r) {
      EXPECT_TRUE(fs::exists(dir + "/shard-r0000" + std::to_string(r) + "-00000.safetensors"));
      EXPECT_FALSE(fs::exists(dir + "/fragment-r0000" + std::to_string(r) + ".json"));
    }
    EXPECT_FALSE(has_temporaries(dump));
  }
}

TEST(CheckpointDistributed, OneRankGroupWritesASingleWriterCheckpoint) {
  const std::string dump = fresh_dump("one_rank");
  save_steps(dump, 1, Layout::kRows, {1});
  const std::string dir = step_dir(folder_of(dump), 1);
  EXPECT_TRUE(fs::exists(dir + "/shard-00000.safetensors"));
  EXPECT_TRUE(at::equal(CheckpointReader(dir).read("w"), weight(1)));
}

TEST(CheckpointDistributed, LoadsWithAnotherRankCountAndLayout) {
  struct Case {
    int save_ranks;
    Layout save_layout;
    int load_ranks;
    Layout load_layout;
  };
  for (const Case& c :
       {Case{3, Layout::kRows, 2, Layout::kCols}, Case{2, Layout::kCols, 3, Layout::kRows}}) {
    SCOPED_TRACE(std::to_string(c.save_ranks) + " -> " + std::to_string(c.load_ranks) + " ranks");
    const std::string dump = fresh_dump("layout_" + std::to_string(c.save_ranks));
    save_steps(dump, c.save_ranks, c.save_layout, {5});
    run_ranks(c.load_ranks, [&](int rank, std::shared_ptr<dist::Group> group) {
      RankState s = rank_state(rank, c.load_ranks, c.load_layout);
      CheckpointManager manager(section(), dump, entries(s), {}, group);
      const LoadResult r = manager.load();
      EXPECT_TRUE(r.loaded);
      EXPECT_EQ(r.step, 5);
      s.expect_step(5);
    });
  }
}

TEST(CheckpointDistributed, KeepLatestKAndEveryRankResumesFromTheNewest) {
  const std::string dump = fresh_dump("keep");
  CheckpointSection config = section();
  config.keep_latest_k = 2;
  run_ranks(2, [&](int rank, std::shared_ptr<dist::Group> group) {
    RankState s = rank_state(rank, 2, Layout::kRows);
    CheckpointManager manager(config, dump, entries(s), {}, group);
    for (int64_t step = 1; step <= 4; ++step) {
      s.set_step(step);
      EXPECT_TRUE(manager.maybe_save(step, /*last_step=*/10));
    }
    EXPECT_EQ(manager.final_model_only_step(), -1);
  });
  EXPECT_EQ(steps_in(dump), (std::vector<int64_t>{3, 4}));

  // A final model-only export does not resume training, but is reported as the final step.
  run_ranks(2, [&](int rank, std::shared_ptr<dist::Group> group) {
    RankState s = rank_state(rank, 2, Layout::kRows, /*step=*/9);
    CheckpointManager manager(section(), dump, entries(s), {}, group);
    manager.save(/*step=*/9, /*model_only=*/true);
    EXPECT_EQ(manager.final_model_only_step(), 9);
  });
  run_ranks(3, [&](int rank, std::shared_ptr<dist::Group> group) {
    RankState s = rank_state(rank, 3, Layout::kCols);
    CheckpointManager manager(config, dump, entries(s), {}, group);
    EXPECT_EQ(manager.final_model_only_step(), 9);
    const LoadResult r = manager.load();
    EXPECT_EQ(r.step, 4);
    EXPECT_EQ(r.dir, step_dir(folder_of(dump), 4));
    s.expect_step(4);
  });
}

TEST(CheckpointDistributed, AllRanksFallBackPastACorruptShardTogether) {
  const std::string dump = fresh_dump("corrupt");
  save_steps(dump, 2, Layout::kRows, {1, 2, 3});
  // Only rank 0 checks checksums, and this file holds rank 1's rows: rank 0 decides for all.
  flip_last_byte(step_dir(folder_of(dump), 3) + "/shard-r00001-00000.safetensors");
  run_ranks(3, [&](int rank, std::shared_ptr<dist::Group> group) {
    RankState s = rank_state(rank, 3, Layout::kRows);
    CheckpointManager manager(section(), dump, entries(s), {}, group);
    EXPECT_EQ(manager.load().step, 2);
    s.expect_step(2);
  });

  // A DataError on one rank only (its load of step 2 fails) moves every rank back to step 1.
  run_ranks(2, [&](int rank, std::shared_ptr<dist::Group> group) {
    RankState s = rank_state(rank, 2, Layout::kCols);
    std::vector<StateEntry> e = entries(s);
    auto load_model = e[0].load;
    e[0].load = [&, load_model](const CheckpointReader& reader, const nlohmann::json& state) {
      if (rank == 1 && reader.state()["step"] == 2) throw DataError("rank 1 cannot read step 2");
      load_model(reader, state);
    };
    CheckpointManager manager(section(), dump, std::move(e), {}, group);
    EXPECT_EQ(manager.load().step, 1);
    s.expect_step(1);
  });

  // With every checkpoint unusable, every rank refuses to start over.
  std::ofstream(step_dir(folder_of(dump), 2) + "/index.json", std::ios::trunc) << "{";
  std::ofstream(step_dir(folder_of(dump), 1) + "/index.json", std::ios::trunc) << "{";
  const auto errors = run_ranks_collect(2, [&](int rank, std::shared_ptr<dist::Group> group) {
    RankState s = rank_state(rank, 2, Layout::kRows);
    CheckpointManager manager(section(), dump, entries(s), {}, group);
    EXPECT_THROW(manager.load(), DataError);
  });
  EXPECT_EQ(errors, (std::vector<std::string>{"", ""}));
}

TEST(CheckpointDistributed, LoadStepAndMissingStepAgreeOnEveryRank) {
  const std::string dump = fresh_dump("load_step");
  save_steps(dump, 2, Layout::kRows, {1, 2});
  CheckpointSection config = section();
  config.load_step = 1;
  // Going back to step 1 would overwrite step 2 (and a restart would resume from it): refused
  // on every rank until step 2 is moved away.
  run_ranks(2, [&](int rank, std::shared_ptr<dist::Group> group) {
    RankState s = rank_state(rank, 2, Layout::kRows);
    CheckpointManager manager(config, dump, entries(s), {}, group);
    try {
      manager.load();
      ADD_FAILURE() << "load_step 1 with a newer step-2 loaded";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("newer checkpoints (step-2)"), std::string::npos)
          << e.what();
    }
  });
  fs::rename(step_dir(folder_of(dump), 2), folder_of(dump) + "/../step-2-moved");
  run_ranks(2, [&](int rank, std::shared_ptr<dist::Group> group) {
    RankState s = rank_state(rank, 2, Layout::kRows);
    CheckpointManager manager(config, dump, entries(s), {}, group);
    EXPECT_EQ(manager.load().step, 1);
    s.expect_step(1);
  });
  config.load_step = 7;
  run_ranks(2, [&](int rank, std::shared_ptr<dist::Group> group) {
    RankState s = rank_state(rank, 2, Layout::kRows);
    CheckpointManager manager(config, dump, entries(s), {}, group);
    EXPECT_THROW(manager.load(), ConfigError);
  });
}

// Every rank saves with `save` as its model entry's save callback; returns each rank's error.
std::vector<std::string> save_with(
    const std::string& dump, int size,
    const std::function<void(int, std::vector<SavedTensor>&)>& save) {
  return run_ranks_collect(size, [&](int rank, std::shared_ptr<dist::Group> group) {
    StateEntry model;
    model.name = "model";
    model.is_model = true;
    model.save = [&, rank](std::vector<SavedTensor>& tensors, nlohmann::json&) {
      save(rank, tensors);
    };
    model.load = [](const CheckpointReader&, const nlohmann::json&) {};
    CheckpointManager manager(section(), dump, {model}, {}, group);
    manager.save(/*step=*/1, /*model_only=*/false);
  });
}

TEST(CheckpointDistributed, OverlapsHolesAndFailedRanksLeaveNoCheckpoint) {
  const at::Tensor w = weight(0);
  {
    const std::string dump = fresh_dump("overlap");
    const auto errors = save_with(dump, 2, [&](int rank, std::vector<SavedTensor>& tensors) {
      const int64_t begin = rank == 0 ? 0 : 3;  // rows [0, 4) and [3, 7): row 3 twice
      tensors.push_back({"w", w.narrow(0, begin, 4), {{7, 5}, {begin, 0}}});
    });
    EXPECT_NE(errors[0].find("'w'"), std::string::npos) << errors[0];
    EXPECT_NE(errors[0].find("rank 0's box [0, 0] + [4, 5] overlaps rank 1's box [3, 0]"),
              std::string::npos)
        << errors[0];
    EXPECT_NE(errors[1].find("rank 0 failed to merge or commit"), std::string::npos) << errors[1];
    EXPECT_TRUE(steps_in(dump).empty());
    EXPECT_FALSE(has_temporaries(dump));
  }
  {
    const std::string dump = fresh_dump("replicated_twice");
    const auto errors = save_with(dump, 3, [&](int rank, std::vector<SavedTensor>& tensors) {
      if (rank != 1) tensors.push_back({"b", bias(0), {}});
    });
    EXPECT_NE(errors[0].find("'b' [5]: rank 0's box [0] + [5] overlaps rank 2's box"),
              std::string::npos)
        << errors[0];
    EXPECT_NE(errors[0].find("a replicated tensor by one rank only"), std::string::npos);
    EXPECT_TRUE(steps_in(dump).empty());
  }
  {
    const std::string dump = fresh_dump("hole");
    const auto errors = save_with(dump, 2, [&](int rank, std::vector<SavedTensor>& tensors) {
      if (rank == 0) tensors.push_back({"w", w.narrow(0, 0, 4), {{7, 5}, {0, 0}}});
    });
    EXPECT_NE(errors[0].find("cover 20 of its 35 elements"), std::string::npos) << errors[0];
    EXPECT_TRUE(steps_in(dump).empty());
  }
  {
    const std::string dump = fresh_dump("dtype");
    const auto errors = save_with(dump, 2, [&](int rank, std::vector<SavedTensor>& tensors) {
      at::Tensor part = w.narrow(0, rank * 4, rank == 0 ? 4 : 3);
      if (rank == 1) part = part.to(at::kDouble);
      tensors.push_back({"w", part, {{7, 5}, {rank * 4, 0}}});
    });
    EXPECT_NE(errors[0].find("rank 0 saves it as F32 [7,5], rank 1 as F64"), std::string::npos)
        << errors[0];
    EXPECT_TRUE(steps_in(dump).empty());
  }
  {
    // A rank whose own state fails: every rank throws, nothing is written.
    const std::string dump = fresh_dump("rank_fails");
    const auto errors = save_with(dump, 3, [&](int rank, std::vector<SavedTensor>&) {
      if (rank == 2) throw DataError("rank 2 cannot snapshot");
    });
    EXPECT_NE(errors[0].find("rank(s) 2 failed"), std::string::npos) << errors[0];
    EXPECT_EQ(errors[2], "rank 2 cannot snapshot");
    EXPECT_TRUE(steps_in(dump).empty());
    EXPECT_FALSE(has_temporaries(dump));
  }
}

TEST(CheckpointDistributed, AsyncSavesCommitOnTheCallingThread) {
  const std::string dump = fresh_dump("async");
  CheckpointSection config = section();
  config.async_mode = "async";
  config.interval = 2;
  std::vector<int> polls(2, 0);
  run_ranks(2, [&](int rank, std::shared_ptr<dist::Group> group) {
    RankState s = rank_state(rank, 2, Layout::kRows, /*step=*/2);
    {
      CheckpointManager manager(config, dump, entries(s), {}, group);
      // save() only starts the writing: nothing is visible before the commit in wait().
      manager.save(/*step=*/2, /*model_only=*/false);
      s.set_step(99);  // the snapshot was taken: changing the state now does not matter
      EXPECT_FALSE(is_checkpoint_dir(step_dir(folder_of(dump), 2)));
      manager.wait();
      EXPECT_TRUE(is_checkpoint_dir(step_dir(folder_of(dump), 2)));

      // maybe_save() commits once every rank has written (the same call on every rank).
      s.set_step(4);
      EXPECT_TRUE(manager.maybe_save(4, /*last_step=*/100));
      while (!is_checkpoint_dir(step_dir(folder_of(dump), 4)) && polls[rank] < 2000) {
        ++polls[rank];
        EXPECT_FALSE(manager.maybe_save(5, /*last_step=*/100));
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      EXPECT_TRUE(is_checkpoint_dir(step_dir(folder_of(dump), 4)));

      // The destructor commits the last one.
      s.set_step(6);
      EXPECT_TRUE(manager.maybe_save(6, /*last_step=*/100));
    }
    EXPECT_TRUE(is_checkpoint_dir(step_dir(folder_of(dump), 6)));
  });
  EXPECT_EQ(polls[0], polls[1]);  // both ranks saw the commit after the same call
  EXPECT_EQ(steps_in(dump), (std::vector<int64_t>{2, 4, 6}));
  for (int64_t step : {2, 4, 6}) {
    CheckpointReader reader(step_dir(folder_of(dump), step));
    EXPECT_TRUE(at::equal(reader.read("w"), weight(step))) << step;
    EXPECT_EQ(reader.state()["entries"]["train_state"]["step"], step);
  }
}

}  // namespace test_checkpoint_distributed
}  // namespace titan::ckpt
