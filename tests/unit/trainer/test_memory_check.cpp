// check_training_memory: absurd sizes are refused before anything is allocated, naming the key
// and showing the estimate; the shipped configs' sizes and multi-rank sharding are not.
#include "titan/trainer/memory_check.h"

#include "titan/common/check.h"
#include "titan/config/config_manager.h"

#include <gtest/gtest.h>

#include <filesystem>

namespace titan {
namespace memory_check_test {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

std::string refusal(const JobConfig& config, const LaunchEnv& env, double memory) {
  try {
    check_training_memory(config, env, memory);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

// configs/llama3/<name> of this checkout (tests may run from any directory).
std::string shipped_config(const std::string& name) {
  return (std::filesystem::path(__FILE__).parent_path().parent_path().parent_path().parent_path() /
          "configs" / "llama3" / name)
      .string();
}

JobConfig debug_config(std::vector<std::string> overrides = {}) {
  overrides.insert(overrides.begin(), {"--job.config_file", shipped_config("debug_model.toml")});
  return parse_job_config(overrides);
}

TEST(MemoryCheck, DebugConfigFitsASmallMachine) {
  EXPECT_EQ(refusal(debug_config(), LaunchEnv{}, 2 * kGiB), "");
}

TEST(MemoryCheck, HugeSequenceOrBatchIsRefusedNamingTheKey) {
  std::string msg =
      refusal(debug_config({"--training.seq_len", "1000000000"}), LaunchEnv{}, 64 * kGiB);
  EXPECT_NE(msg.find("training.local_batch_size 8 x training.seq_len 1000000000 needs about"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("HINT: lower training.local_batch_size or training.seq_len"),
            std::string::npos)
      << msg;
  msg = refusal(debug_config({"--training.local_batch_size", "100000000"}), LaunchEnv{}, 64 * kGiB);
  EXPECT_NE(msg.find("training.local_batch_size 100000000 x training.seq_len 256"),
            std::string::npos)
      << msg;
  msg = refusal(debug_config({"--validation.seq_len", "100000000"}), LaunchEnv{}, 64 * kGiB);
  EXPECT_NE(msg.find("HINT: lower validation.local_batch_size or validation.seq_len"),
            std::string::npos)
      << msg;
  // Unknown memory never refuses.
  EXPECT_EQ(refusal(debug_config({"--training.seq_len", "1000000000"}), LaunchEnv{}, 0), "");
}

TEST(MemoryCheck, ALargeModelNamesTheFlavorAndShardingHelps) {
  JobConfig c = parse_job_config({"--job.config_file", shipped_config("llama3_8b.toml"),
                                  "--training.local_batch_size", "1", "--training.seq_len", "8",
                                  "--validation.enable=false"});
  // 8B parameters: 16 bytes each of weights, gradients and AdamW state on one rank.
  const std::string msg = refusal(c, LaunchEnv{}, 32 * kGiB);
  EXPECT_NE(msg.find("use a smaller model.flavor than '8B'"), std::string::npos) << msg;
  LaunchEnv many;
  many.world_size = 64;
  many.local_world_size = 1;
  EXPECT_EQ(refusal(c, many, 32 * kGiB), "");
}

}  // namespace memory_check_test
}  // namespace titan
