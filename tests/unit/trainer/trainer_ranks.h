// Trainers on several ranks in one process: threads over one HashStore, as the launcher's
// processes over a TCPStore. Each thread builds its own Trainer from the same config.
#pragma once

#include "titan/distributed/init.h"
#include "titan/trainer/trainer.h"

#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace titan::test {

// `body(rank, trainer)` on `world` ranks; returns each rank's exception message ("" if none).
inline std::vector<std::string> errors_on_ranks(
    const JobConfig& config, int64_t world,
    const std::function<void(int64_t rank, Trainer&)>& body) {
  auto store = c10::make_intrusive<c10d::HashStore>();
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
        body(r, trainer);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

// `body(rank, trainer)` on `world` ranks; a rank's exception fails the test with its message.
inline void on_ranks(const JobConfig& config, int64_t world,
                     const std::function<void(int64_t rank, Trainer&)>& body) {
  const std::vector<std::string> errors = errors_on_ranks(config, world, body);
  for (int64_t r = 0; r < world; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

// train() on `world` ranks; results by rank.
inline std::vector<TrainResult> train_on_ranks(const JobConfig& config, int64_t world) {
  std::vector<TrainResult> results(world);
  on_ranks(config, world, [&](int64_t r, Trainer& trainer) { results[r] = trainer.train(); });
  return results;
}

}  // namespace titan::test
