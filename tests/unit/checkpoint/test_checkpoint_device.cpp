// Checkpoints of GPU training, tested on the CPU: the RNG layout (CPU generators stand in for each
// rank's CUDA generator) saved and restored, checkpoints saved on CPU resumed on a "GPU" and the
// reverse, another world size, exclude_from_loading = ["rng"]; and the staging of asynchronous
// saves: one reused set of buffers for async_with_pinned_mem, fresh copies for async, and a save
// that waits for the previous write before it reuses the buffers. The CUDA cases run only where a
// GPU is present.
#include "titan/checkpoint/checkpoint_files.h"
#include "titan/checkpoint/checkpoint_manager.h"
#include "titan/checkpoint/rng_state.h"
#include "titan/checkpoint/staging.h"
#include "titan/common/check.h"
#include "titan/common/device.h"

#include "../distributed/multirank.h"
#include "../test_util.h"

#include <ATen/CPUGeneratorImpl.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <map>

namespace titan::ckpt {
namespace test_checkpoint_device {

namespace fs = std::filesystem;

at::Tensor state_of(at::Generator g) {
  std::lock_guard<std::mutex> lock(g.mutex());
  return g.get_state();
}

// Draws from `g` (moves it on).
at::Tensor draw(at::Generator g) { return at::randn({8}, g); }

// Generators of a rank with a CPU generator standing in for its device's, in states that differ
// with `seed`.
RankGenerators stand_in(int64_t seed, bool device) {
  RankGenerators g{at::make_generator<at::CPUGeneratorImpl>(7 + seed), std::nullopt, "cuda"};
  if (device) g.device = at::make_generator<at::CPUGeneratorImpl>(100 + seed);
  draw(g.cpu);  // a state other than the seed's
  if (g.device) draw(*g.device);
  return g;
}

// Ranks 0..world-1 save their generators into one checkpoint at `dir` (one process writes what
// the ranks would hand over); returns the entry's JSON (rank 0's).
nlohmann::json save_ranks(const std::string& dir, std::vector<RankGenerators>& ranks) {
  std::vector<SavedTensor> tensors;
  nlohmann::json state = nlohmann::json::object();
  const int64_t world = static_cast<int64_t>(ranks.size());
  for (int64_t r = 0; r < world; ++r) {
    nlohmann::json mine = nlohmann::json::object();
    save_rng_states(ranks[r], r, world, tensors, mine);
    if (r == 0) state = mine;
  }
  write_checkpoint(dir, tensors, {{"entries", {{"rng", state}}}});
  return state;
}

bool same_state(const at::Generator& a, const at::Tensor& saved) {
  return at::equal(state_of(a), saved);
}

TEST(RngLayout, EveryRankSavesItsDeviceGeneratorAndRestoresIt) {
  const std::string dir = test::fresh_test_dir("titan_rng") / "ckpt";
  std::vector<RankGenerators> saving = {stand_in(0, true), stand_in(1, true)};
  const at::Tensor cpu = state_of(saving[0].cpu);
  const std::vector<at::Tensor> device = {state_of(*saving[0].device), state_of(*saving[1].device)};
  const nlohmann::json state = save_ranks(dir, saving);
  EXPECT_EQ(state, (nlohmann::json{{"world_size", 2}, {"device", "cuda"}}));
  const CheckpointReader reader(dir);
  EXPECT_EQ(reader.names(), (std::vector<std::string>{"rng.cpu", "rng.cuda.0", "rng.cuda.1"}));
  for (int64_t r = 0; r < 2; ++r) {
    // The draws after restoring are those the saving rank would have made next.
    const at::Tensor next_cpu = draw(saving[0].cpu);
    const at::Tensor next_device = draw(*saving[r].device);
    RankGenerators resumed = stand_in(r + 5, true);  // other seeds, other states
    const RngRestore done = load_rng_states(reader, state, r, /*world_size=*/2, resumed);
    EXPECT_TRUE(done.cpu && done.device) << "rank " << r;
    EXPECT_EQ(done.device_states_ignored, 1);
    EXPECT_TRUE(same_state(resumed.cpu, cpu)) << "rank " << r;
    EXPECT_TRUE(same_state(*resumed.device, device[r])) << "rank " << r;
    EXPECT_TRUE(at::equal(draw(resumed.cpu), next_cpu));
    EXPECT_TRUE(at::equal(draw(*resumed.device), next_device));
    saving[0].cpu.set_state(cpu);
  }
}

TEST(RngLayout, CpuSavedCheckpointKeepsTheSeededDeviceGenerator) {
  const std::string dir = test::fresh_test_dir("titan_rng") / "ckpt";
  std::vector<RankGenerators> saving = {stand_in(0, /*device=*/false)};
  const at::Tensor cpu = state_of(saving[0].cpu);
  const nlohmann::json state = save_ranks(dir, saving);
  EXPECT_EQ(state["device"], "cpu");
  const CheckpointReader reader(dir);
  EXPECT_EQ(reader.names(), (std::vector<std::string>{"rng.cpu"}));
  RankGenerators gpu = stand_in(0, /*device=*/true);
  const at::Tensor seeded = state_of(*gpu.device);
  const RngRestore done = load_rng_states(reader, state, /*rank=*/0, /*world_size=*/1, gpu);
  EXPECT_TRUE(done.cpu);
  EXPECT_FALSE(done.device);
  EXPECT_TRUE(same_state(gpu.cpu, cpu));
  EXPECT_TRUE(same_state(*gpu.device, seeded));  // as start-up seeding left it
}

TEST(RngLayout, GpuSavedCheckpointLoadsOnTheCpu) {
  const std::string dir = test::fresh_test_dir("titan_rng") / "ckpt";
  std::vector<RankGenerators> saving = {stand_in(0, true), stand_in(1, true)};
  const at::Tensor cpu = state_of(saving[0].cpu);
  const nlohmann::json state = save_ranks(dir, saving);
  const CheckpointReader reader(dir);
  for (int64_t r = 0; r < 2; ++r) {
    RankGenerators on_cpu = stand_in(r, /*device=*/false);
    const RngRestore done = load_rng_states(reader, state, r, /*world_size=*/2, on_cpu);
    EXPECT_TRUE(done.cpu);
    EXPECT_FALSE(done.device);
    EXPECT_EQ(done.device_states_ignored, 2);
    EXPECT_TRUE(same_state(on_cpu.cpu, cpu));
  }
}

TEST(RngLayout, AnotherWorldSizeRestoresTheRanksThatSaved) {
  const std::string dir = test::fresh_test_dir("titan_rng") / "ckpt";
  std::vector<RankGenerators> saving = {stand_in(0, true), stand_in(1, true)};
  const at::Tensor device1 = state_of(*saving[1].device);
  const nlohmann::json state = save_ranks(dir, saving);
  const CheckpointReader reader(dir);
  // Three ranks: rank 1 restores rank 1's state, rank 2 (none saved) keeps its seeding.
  RankGenerators r1 = stand_in(11, true), r2 = stand_in(12, true);
  const at::Tensor seeded2 = state_of(*r2.device);
  EXPECT_TRUE(load_rng_states(reader, state, 1, /*world_size=*/3, r1).device);
  EXPECT_TRUE(same_state(*r1.device, device1));
  const RngRestore done2 = load_rng_states(reader, state, 2, /*world_size=*/3, r2);
  EXPECT_TRUE(done2.cpu);
  EXPECT_FALSE(done2.device);
  EXPECT_TRUE(same_state(*r2.device, seeded2));
  // One rank: rank 0's state; rank 1's is unused.
  RankGenerators alone = stand_in(20, true);
  const RngRestore done = load_rng_states(reader, state, 0, /*world_size=*/1, alone);
  EXPECT_TRUE(done.device);
  EXPECT_EQ(done.device_states_ignored, 1);
}

TEST(RngLayout, AStateThatDoesNotFitItsGeneratorIsADataError) {
  const std::string dir = test::fresh_test_dir("titan_rng") / "ckpt";
  RankGenerators g = stand_in(0, true);
  write_checkpoint(
      dir, {{"rng.cpu", state_of(g.cpu), {}}, {"rng.cuda.0", at::zeros({16}, at::kByte), {}}},
      {{"entries", {{"rng", {{"world_size", 1}, {"device", "cuda"}}}}}});
  const CheckpointReader reader(dir);
  const std::string message =
      test::message_of([&] { load_rng_states(reader, reader.state()["entries"]["rng"], 0, 1, g); });
  EXPECT_TRUE(test::contains(message, "'rng.cuda.0' (16 bytes) is no state of this generator"))
      << message;
}

CheckpointSection section(const std::string& async_mode = "disabled") {
  CheckpointSection c;
  c.enable = true;
  c.interval = 1;
  c.keep_latest_k = 0;
  c.async_mode = async_mode;
  return c;
}

// A model entry holding `w`, plus train_state.
std::vector<StateEntry> model_entries(at::Tensor& w, int64_t& step) {
  StateEntry model;
  model.name = "model";
  model.is_model = true;
  model.save = [&w](std::vector<SavedTensor>& tensors, nlohmann::json&) {
    tensors.push_back({"w", w, {}});
  };
  model.load = [&w](const CheckpointReader& reader, const nlohmann::json&) {
    reader.read_box_into("w", ShardBox::whole(w.sizes()), w);
  };
  StateEntry train;
  train.name = "train_state";
  train.save = [&step](std::vector<SavedTensor>&, nlohmann::json& state) { state["step"] = step; };
  train.load = [&step](const CheckpointReader&, const nlohmann::json& state) {
    step = state.at("step").get<int64_t>();
  };
  return {model, train};
}

TEST(RngLayout, ExcludeFromLoadingRngKeepsTheGenerators) {
  const std::string dump = test::fresh_test_dir("titan_rng");
  at::Tensor w = at::ones({3});
  int64_t step = 1;
  RankGenerators gens = stand_in(0, true);
  const at::Tensor saved_cpu = state_of(gens.cpu);
  const at::Tensor saved_device = state_of(*gens.device);
  auto entries = [&] {
    std::vector<StateEntry> e = model_entries(w, step);
    e.push_back(rng_entry(gens, /*rank=*/0, /*world_size=*/1));
    return e;
  };
  CheckpointManager(section(), dump, entries(), {}).save(1, /*model_only=*/false);
  draw(gens.cpu);
  draw(*gens.device);
  const at::Tensor moved_cpu = state_of(gens.cpu);
  const at::Tensor moved_device = state_of(*gens.device);
  CheckpointSection excluding = section();
  excluding.exclude_from_loading = {"rng"};
  EXPECT_TRUE(CheckpointManager(excluding, dump, entries(), {}).load().loaded);
  EXPECT_TRUE(same_state(gens.cpu, moved_cpu));
  EXPECT_TRUE(same_state(*gens.device, moved_device));
  EXPECT_TRUE(CheckpointManager(section(), dump, entries(), {}).load().loaded);
  EXPECT_TRUE(same_state(gens.cpu, saved_cpu));
  EXPECT_TRUE(same_state(*gens.device, saved_device));
}

TEST(RngLayout, RanksOfAGroupEachSaveAndRestoreTheirOwn) {
  const std::string dump = test::fresh_test_dir("titan_rng");
  std::vector<at::Tensor> saved_device(2);
  at::Tensor saved_cpu;
  // Rank r's state entries over its generators (rank 0 hands over w).
  auto entries = [](int rank, RankGenerators& gens, at::Tensor& w, int64_t& step) {
    std::vector<StateEntry> e = model_entries(w, step);
    if (rank != 0) {
      e[0].save = [](std::vector<SavedTensor>&, nlohmann::json&) {};
    }
    e.push_back(rng_entry(gens, rank, /*world_size=*/2));
    return e;
  };
  test::run_ranks(2, [&](int rank, std::shared_ptr<dist::Group> group) {
    RankGenerators gens = stand_in(rank, true);
    at::Tensor w = at::ones({3});
    int64_t step = 1;
    if (rank == 0) saved_cpu = state_of(gens.cpu);
    saved_device[rank] = state_of(*gens.device);
    CheckpointManager(section(), dump, entries(rank, gens, w, step), {}, group).save(1, false);
  });
  const CheckpointReader reader(step_dir(dump + "/checkpoint", 1));
  EXPECT_EQ(reader.names(), (std::vector<std::string>{"rng.cpu", "rng.cuda.0", "rng.cuda.1", "w"}));
  test::run_ranks(2, [&](int rank, std::shared_ptr<dist::Group> group) {
    RankGenerators gens = stand_in(rank + 3, true);
    at::Tensor w = at::zeros({3});
    int64_t step = 0;
    EXPECT_EQ(
        CheckpointManager(section(), dump, entries(rank, gens, w, step), {}, group).load().step, 1);
    EXPECT_TRUE(same_state(gens.cpu, saved_cpu)) << "rank " << rank;
    EXPECT_TRUE(same_state(*gens.device, saved_device[rank])) << "rank " << rank;
  });
}

// ---- staging of asynchronous saves -------------------------------------------------------------

std::vector<SavedTensor> tensors_of(const at::Tensor& a, const at::Tensor& b) {
  // `b` is rank-local box [2, 4) of a (6,) tensor.
  return {{"a", a, {}}, {"b", b, ShardBox{{6}, {2}}}};
}

TEST(Staging, PinnedModeReusesOneSetOfBuffers) {
  Stager stager(/*reuse=*/true);
  at::Tensor a = at::arange(12, at::kFloat).view({4, 3});
  at::Tensor b = at::arange(2, at::kLong);
  std::vector<SavedTensor> first = tensors_of(a, b);
  stager.stage(first);
  EXPECT_EQ(stager.allocations(), 2);
  EXPECT_EQ(stager.bytes(), 12 * 4 + 2 * 8);
  ASSERT_EQ(stager.buffers().size(), 2u);
  EXPECT_EQ(staging_key(first[1]), "b@2");
  const void* a_buffer = first[0].local.data_ptr();
  const void* b_buffer = first[1].local.data_ptr();
  EXPECT_NE(a_buffer, a.data_ptr());  // a copy, not the live tensor
  EXPECT_TRUE(at::equal(first[0].local, a));
  EXPECT_TRUE(at::equal(first[1].local, b));

  // The next save: the same buffers hold the new values.
  a.mul_(-1);
  b.add_(10);
  std::vector<SavedTensor> second = tensors_of(a, b);
  stager.stage(second);
  EXPECT_EQ(stager.allocations(), 2);
  EXPECT_EQ(second[0].local.data_ptr(), a_buffer);
  EXPECT_EQ(second[1].local.data_ptr(), b_buffer);
  EXPECT_TRUE(at::equal(second[0].local, a));
  EXPECT_TRUE(at::equal(second[1].local, b));

  // A changed shape or dtype re-allocates that buffer only.
  std::vector<SavedTensor> reshaped = tensors_of(a, at::arange(3, at::kLong));
  stager.stage(reshaped);
  EXPECT_EQ(stager.allocations(), 3);
  EXPECT_EQ(reshaped[0].local.data_ptr(), a_buffer);
  EXPECT_NE(reshaped[1].local.data_ptr(), b_buffer);
  std::vector<SavedTensor> recast = tensors_of(a.to(at::kBFloat16), at::arange(3, at::kLong));
  stager.stage(recast);
  EXPECT_EQ(stager.allocations(), 4);
  EXPECT_EQ(recast[0].local.scalar_type(), at::kBFloat16);

  // Buffers of tensors a save no longer hands over are let go: one set at most.
  std::vector<SavedTensor> only_a = {{"a", a, {}}};
  stager.stage(only_a);
  EXPECT_EQ(stager.buffers().size(), 1u);
  EXPECT_EQ(stager.bytes(), 12 * 4);
}

TEST(Staging, AsyncModeCopiesFreshEachTime) {
  Stager stager(/*reuse=*/false);
  at::Tensor a = at::arange(12, at::kFloat);
  std::vector<SavedTensor> first = {{"a", a, {}}};
  stager.stage(first);
  std::vector<SavedTensor> second = {{"a", a, {}}};
  stager.stage(second);
  EXPECT_NE(first[0].local.data_ptr(), a.data_ptr());
  EXPECT_NE(first[0].local.data_ptr(), second[0].local.data_ptr());
  EXPECT_TRUE(stager.buffers().empty());
  a.zero_();  // the copies do not follow the live tensor
  EXPECT_TRUE(at::equal(first[0].local, at::arange(12, at::kFloat)));
}

TEST(Staging, ManagerReusesBuffersAndWaitsForThePreviousWrite) {
  const std::string dump = test::fresh_test_dir("titan_staging");
  // 16 MiB, so that the write of step 1 is still running when step 2 starts.
  at::Tensor w = at::full({4 << 20}, 1.0f);
  int64_t step = 1;
  CheckpointManager manager(section("async_with_pinned_mem"), dump, model_entries(w, step), {});
  ASSERT_NE(manager.stager(), nullptr);
  EXPECT_TRUE(manager.stager()->reuses());
  manager.save(1, /*model_only=*/false);
  const void* buffer = manager.stager()->buffers().at("w").data_ptr();
  w.fill_(2.0f);  // training goes on while step 1 is written
  step = 2;
  manager.save(2, /*model_only=*/false);
  // save(2) finished and committed step 1 before it staged into the same buffer.
  EXPECT_TRUE(is_checkpoint_dir(step_dir(dump + "/checkpoint", 1)));
  EXPECT_EQ(manager.stager()->buffers().at("w").data_ptr(), buffer);
  EXPECT_EQ(manager.stager()->allocations(), 1);
  w.fill_(3.0f);
  manager.wait();
  EXPECT_TRUE(at::equal(CheckpointReader(step_dir(dump + "/checkpoint", 1)).read("w"),
                        at::full({4 << 20}, 1.0f)));
  EXPECT_TRUE(at::equal(CheckpointReader(step_dir(dump + "/checkpoint", 2)).read("w"),
                        at::full({4 << 20}, 2.0f)));
  EXPECT_FALSE(
      CheckpointManager(section("async"), dump, model_entries(w, step), {}).stager()->reuses());
  EXPECT_EQ(CheckpointManager(section(), dump, model_entries(w, step), {}).stager(), nullptr);
}

// ---- on a GPU ----------------------------------------------------------------------------------

TEST(StagingCuda, PinnedBuffersFromDeviceTensors) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const at::Device cuda(at::kCUDA, 0);
  Stager stager(/*reuse=*/true);
  at::Tensor a = at::arange(1 << 20, at::TensorOptions().dtype(at::kFloat).device(cuda));
  std::vector<SavedTensor> first = {{"a", a, {}}};
  stager.stage(first);
  EXPECT_TRUE(first[0].local.is_cpu());
  EXPECT_TRUE(first[0].local.is_pinned());
  EXPECT_TRUE(at::equal(first[0].local, a.cpu()));
  a.mul_(2);
  std::vector<SavedTensor> second = {{"a", a, {}}};
  stager.stage(second);
  EXPECT_EQ(second[0].local.data_ptr(), first[0].local.data_ptr());
  EXPECT_TRUE(at::equal(second[0].local, a.cpu()));
}

TEST(RngLayoutCuda, CudaGeneratorRoundTripAndCrossDeviceLoad) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const at::Device cuda(at::kCUDA, 0);
  const std::string dump = test::fresh_test_dir("titan_rng_cuda");
  // A CUDA parameter saved and loaded into a CPU one and back.
  at::Tensor w = at::arange(6, at::TensorOptions().dtype(at::kFloat).device(cuda));
  int64_t step = 1;
  RankGenerators gens = rank_generators(cuda);
  ASSERT_TRUE(gens.device.has_value());
  EXPECT_EQ(gens.device_kind, "cuda");
  auto entries = [&](at::Tensor& t) {
    std::vector<StateEntry> e = model_entries(t, step);
    e.push_back(rng_entry(gens, 0, 1));
    return e;
  };
  const at::Tensor saved = state_of(*gens.device);
  CheckpointManager(section("async_with_pinned_mem"), dump, entries(w), {}).save(1, false);
  const at::Tensor next = at::randn({8}, at::TensorOptions().device(cuda));  // moves it on
  // The CUDA parameter's values into a CPU tensor; the CUDA generator back to the saved state.
  at::Tensor on_cpu = at::zeros({6});
  EXPECT_TRUE(CheckpointManager(section(), dump, entries(on_cpu), {}).load().loaded);
  EXPECT_TRUE(at::equal(on_cpu, w.cpu()));
  EXPECT_TRUE(same_state(*gens.device, saved));
  EXPECT_TRUE(at::equal(at::randn({8}, at::TensorOptions().device(cuda)), next));
  // And into a CUDA tensor.
  at::Tensor back = at::zeros({6}, at::TensorOptions().device(cuda));
  EXPECT_TRUE(CheckpointManager(section(), dump, entries(back), {}).load().loaded);
  EXPECT_TRUE(at::equal(back, w));
}

}  // namespace test_checkpoint_device
}  // namespace titan::ckpt
