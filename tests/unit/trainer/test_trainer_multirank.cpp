// The Trainer itself on several ranks (threads over one HashStore, as the launcher's processes
// over a TCPStore): every layout (FSDP, HSDP, DDP, TP, FSDP x TP) reproduces the one-process loss
// curve and grad norms of the same seed and global batch, with activation checkpointing at its
// default (selective, every 2nd block).
#include "../test_util.h"

#include "titan/distributed/init.h"
#include "titan/trainer/trainer.h"

#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <filesystem>
#include <thread>

namespace titan {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kGlobalBatch = 8;
constexpr int64_t kSteps = 3;

JobConfig config_for(const std::string& dump, int64_t dp_size) {
  JobConfig c = test::tiny_training_config(dump);
  c.training.steps = kSteps;
  c.training.local_batch_size = kGlobalBatch / dp_size;
  c.training.global_batch_size = kGlobalBatch;
  c.lr_scheduler.warmup_steps = 1;
  c.debug.seed = 7;
  return c;
}

// train() on `world` ranks, threads sharing one store; results by rank.
std::vector<TrainResult> train_on_ranks(JobConfig config, int64_t world) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<TrainResult> results(world);
  std::vector<std::string> errors(world);
  std::vector<std::thread> threads;
  for (int64_t r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      DistributedContext ctx;
      ctx.env.source = "test threads";
      ctx.env.rank = r;
      ctx.env.local_rank = r;
      ctx.env.world_size = world;
      ctx.env.local_world_size = world;
      ctx.store = store;
      try {
        Trainer trainer(config, &ctx);
        results[r] = trainer.train();
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int64_t r = 0; r < world; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  return results;
}

struct Layout {
  const char* name;
  int64_t dp_replicate, dp_shard, tp;
};

TEST(TrainerMultiRank, EveryLayoutReproducesOneProcess) {
  const fs::path root = test::fresh_test_dir("titan_trainer_multirank");
  const TrainResult reference = Trainer(config_for((root / "one").string(), 1)).train();
  ASSERT_EQ(reference.losses.size(), static_cast<size_t>(kSteps));
  const std::vector<Layout> layouts = {{"FSDP 4", 1, 4, 1},
                                       {"HSDP 2x2", 2, 2, 1},
                                       {"DDP 2", 2, 1, 1},
                                       {"TP 2", 1, 1, 2},
                                       {"FSDP 2 x TP 2", 1, 2, 2}};
  for (const Layout& layout : layouts) {
    SCOPED_TRACE(layout.name);
    const int64_t world = layout.dp_replicate * layout.dp_shard * layout.tp;
    JobConfig c = config_for((root / layout.name).string(), layout.dp_replicate * layout.dp_shard);
    c.parallelism.data_parallel_replicate_degree = layout.dp_replicate;
    c.parallelism.data_parallel_shard_degree = layout.dp_shard;
    c.parallelism.tensor_parallel_degree = layout.tp;
    const std::vector<TrainResult> results = train_on_ranks(c, world);
    for (int64_t r = 0; r < world; ++r) {
      ASSERT_EQ(results[r].losses.size(), reference.losses.size()) << "rank " << r;
      for (size_t s = 0; s < reference.losses.size(); ++s) {
        // Sums in another order: float32 rounding, far below a real divergence.
        EXPECT_NEAR(results[r].losses[s], reference.losses[s], 2e-5 * reference.losses[s])
            << "rank " << r << " step " << s + 1;
        EXPECT_NEAR(results[r].grad_norms[s], reference.grad_norms[s],
                    1e-4 * reference.grad_norms[s])
            << "rank " << r << " step " << s + 1;
      }
    }
  }
  fs::remove_all(root);
}

}  // namespace
}  // namespace titan
