// comm.train_timeout_seconds replaces comm.init_timeout_seconds after the first step on every
// group a job makes: the parallel dimensions' groups and the groups made from them at any depth
// (the pipeline's pp_up / pp_down, context parallelism's ring directions, expert parallelism's),
// so that a stopped rank ends the job after the training timeout whatever group it stalls.
#include "../test_util.h"
#include "trainer_ranks.h"

#include "titan/distributed/comm.h"
#include "titan/trainer/trainer.h"

#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <algorithm>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

namespace titan {
namespace train_timeout_test {

namespace fs = std::filesystem;

constexpr int64_t kTrainSeconds = 7;
constexpr int64_t kInitSeconds = 300;

struct Layout {
  std::string name;
  std::string model = "llama3", flavor = "tiny";
  int64_t dp_replicate = 1, dp_shard = 1, tp = 1, pp = 1, cp = 1, ep = 1;
  std::vector<std::string> expected_groups;  // among the group names some rank must see
  int64_t world() const { return dp_replicate * dp_shard * tp * pp * cp; }
};

JobConfig config_for(const fs::path& root, const Layout& layout) {
  JobConfig c = test::tiny_training_config((root / layout.name).string());
  c.model.name = layout.model;
  c.model.flavor = layout.flavor;
  c.training.steps = 2;
  c.training.local_batch_size = 8 / (layout.dp_replicate * layout.dp_shard);
  c.training.global_batch_size = 8;
  c.validation.enable = false;
  c.comm.init_timeout_seconds = kInitSeconds;
  c.comm.train_timeout_seconds = kTrainSeconds;
  c.parallelism.data_parallel_replicate_degree = layout.dp_replicate;
  c.parallelism.data_parallel_shard_degree = layout.dp_shard;
  c.parallelism.tensor_parallel_degree = layout.tp;
  c.parallelism.pipeline_parallel_degree = layout.pp;
  c.parallelism.pipeline_parallel_schedule = "1F1B";
  c.parallelism.context_parallel_degree = layout.cp;
  c.parallelism.expert_parallel_degree = layout.ep;
  return c;
}

TEST(TrainTimeout, ReachesEveryGroupAtAnyDepth) {
  const fs::path root = test::fresh_test_dir("titan_train_timeout");
  std::vector<Layout> layouts(3);
  layouts[0].name = "pp2_tp2";
  layouts[0].pp = 2;
  layouts[0].tp = 2;
  layouts[0].expected_groups = {"world", "pp", "tp", "pp_up", "pp_down"};
  layouts[1].name = "ddp2_cp2";
  layouts[1].dp_replicate = 2;
  layouts[1].cp = 2;
  layouts[1].expected_groups = {"world", "dp_replicate", "cp", "cp_up", "cp_down"};
  layouts[2].name = "fsdp4_ep2";
  layouts[2].model = "qwen3";
  layouts[2].flavor = "tiny_moe";
  layouts[2].dp_shard = 4;
  layouts[2].ep = 2;
  layouts[2].expected_groups = {"world", "ep", "dp_shard_mod_ep"};
  for (const Layout& layout : layouts) {
    SCOPED_TRACE(layout.name);
    std::mutex mutex;
    std::map<std::string, std::set<int64_t>> seconds_by_group;  // every rank's view
    test::on_ranks(config_for(root, layout), layout.world(), [&](int64_t, Trainer& trainer) {
      dist::Group* world = trainer.world_group();
      ASSERT_NE(world, nullptr);
      // Before the first step every group waits as long as start-up may take.
      for (const auto& group : world->subgroups()) {
        EXPECT_EQ(group->timeout().count(), kInitSeconds * 1000) << group->describe();
      }
      trainer.train();
      std::lock_guard<std::mutex> lock(mutex);
      seconds_by_group["world"].insert(world->timeout().count() / 1000);
      for (const auto& group : world->subgroups()) {
        seconds_by_group[group->name()].insert(group->timeout().count() / 1000);
      }
    });
    // Dimensions of the same ranks share one group, named "dp_replicate=dp" and so on.
    std::string names;
    std::set<std::string> dims;
    for (const auto& [name, seconds] : seconds_by_group) {
      names += " " + name;
      EXPECT_EQ(seconds, std::set<int64_t>{kTrainSeconds}) << "group " << name;
      for (size_t start = 0; start <= name.size();) {
        const size_t end = std::min(name.find('=', start), name.size());
        dims.insert(name.substr(start, end - start));
        start = end + 1;
      }
    }
    for (const std::string& expected : layout.expected_groups) {
      EXPECT_TRUE(dims.count(expected)) << expected << " not among" << names;
    }
  }
}

// The switch on a group reaches sub-groups made from its sub-groups, and groups made after it
// start with the new timeout.
TEST(TrainTimeout, SetTimeoutReachesNestedAndLaterSubgroups) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  dist::GroupOptions options;
  options.gloo_hostname = "127.0.0.1";
  options.timeout = std::chrono::seconds(kInitSeconds);
  auto world = dist::Group::create(store, 0, 1, options);
  auto child = world->new_subgroup("child", {0});
  auto grandchild = child->new_subgroup("grandchild", {0});
  {
    auto dropped = child->new_subgroup("dropped", {0});  // dead before the switch: skipped
  }
  world->set_timeout(std::chrono::seconds(kTrainSeconds));
  EXPECT_EQ(child->timeout(), std::chrono::seconds(kTrainSeconds));
  EXPECT_EQ(grandchild->timeout(), std::chrono::seconds(kTrainSeconds));
  auto later = grandchild->new_subgroup("later", {0});
  EXPECT_EQ(later->timeout(), std::chrono::seconds(kTrainSeconds));
  std::vector<std::string> names;
  for (const auto& group : world->subgroups()) names.push_back(group->name());
  EXPECT_EQ(names, (std::vector<std::string>{"child", "grandchild", "later"}));
}

}  // namespace train_timeout_test
}  // namespace titan
