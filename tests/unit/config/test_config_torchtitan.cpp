// TorchTitan compatibility of the config: its [activation_checkpoint] section and rules.
#include "titan/config/config_manager.h"

#include "config_test_util.h"

#include <functional>

namespace titan {
namespace {

using config_test::config_error;
using config_test::contains;

std::string ac_error(const std::function<void(ActivationCheckpointSection&)>& edit) {
  JobConfig config;
  edit(config.activation_checkpoint);
  return config_error([&] { validate_job_config(config); });
}

TEST(ConfigActivationCheckpoint, DefaultsAreTorchTitans) {
  JobConfig config = parse_job_config({});
  const ActivationCheckpointSection& ac = config.activation_checkpoint;
  EXPECT_EQ(ac.mode, "selective");
  EXPECT_EQ(ac.selective_ac_option, "2");
  EXPECT_EQ(ac.per_op_sac_force_recompute_mm_shapes_by_fqns,
            (std::vector<std::string>{"moe.router.gate"}));
  EXPECT_FALSE(ac.early_stop);
  EXPECT_DOUBLE_EQ(ac.memory_budget, 0.5);
  EXPECT_FALSE(ac.visualize_memory_budget_pareto);
  EXPECT_TRUE(ac.preserve_rng_state);
  EXPECT_EQ(ac.determinism_check, "default");
  EXPECT_FALSE(ac.debug);
}

TEST(ConfigActivationCheckpoint, AcceptsEveryModeAndOption) {
  for (const char* mode : {"selective", "full", "none"}) {
    JobConfig config = parse_job_config({"--activation_checkpoint.mode", mode});
    EXPECT_EQ(config.activation_checkpoint.mode, mode);
  }
  for (const char* option : {"op", "1", "4"}) {
    JobConfig config = parse_job_config({"--activation_checkpoint.selective_ac_option", option});
    EXPECT_EQ(config.activation_checkpoint.selective_ac_option, option);
  }
  JobConfig config = parse_job_config({"--activation_checkpoint.determinism_check", "none"});
  EXPECT_EQ(config.activation_checkpoint.determinism_check, "none");
}

TEST(ConfigActivationCheckpoint, RefusesBadValuesNamingTheKey) {
  std::string message = ac_error([](auto& ac) { ac.mode = "partial"; });
  EXPECT_TRUE(contains(message, "activation_checkpoint.mode must be one of selective, full, none"));
  EXPECT_TRUE(contains(message, "got 'partial'"));

  message = ac_error([](auto& ac) { ac.mode = "memory_budget"; });
  EXPECT_TRUE(
      contains(message, "activation_checkpoint.mode = \"memory_budget\" is not supported yet"));
  EXPECT_TRUE(contains(message, "HINT: use mode = \"selective\""));

  message = ac_error([](auto& ac) { ac.selective_ac_option = "every"; });
  EXPECT_TRUE(
      contains(message, "selective_ac_option must be \"op\" or an integer >= 1, got 'every'"));
  message = ac_error([](auto& ac) { ac.selective_ac_option = "-2"; });
  EXPECT_TRUE(contains(message, "got '-2'"));
  message = ac_error([](auto& ac) { ac.selective_ac_option = std::string(1, '0'); });
  EXPECT_TRUE(
      contains(message, "selective_ac_option must be an integer >= 1 (every Nth block), got 0"));

  message = ac_error([](auto& ac) { ac.determinism_check = "strict"; });
  EXPECT_TRUE(
      contains(message, "activation_checkpoint.determinism_check must be one of default, none"));
}

}  // namespace
}  // namespace titan
