// parse_job_config(): defaults, TOML loading, command-line forms, and the precedence
// command line > TOML > defaults.
#include "titan/config/config_manager.h"

#include "config_test_util.h"

namespace titan {
namespace test_config_parse {

using config_test::TempDir;

TEST(ConfigParse, NoArgumentsGiveTheDefaults) {
  JobConfig config = parse_job_config({});
  JobConfig defaults;
  EXPECT_EQ(config.job.dump_folder, "./outputs");
  EXPECT_EQ(config.training.steps, defaults.training.steps);
  EXPECT_EQ(config.training.global_batch_size, -1);
  EXPECT_DOUBLE_EQ(config.optimizer.lr, defaults.optimizer.lr);
  EXPECT_DOUBLE_EQ(config.lr_scheduler.decay_ratio, -1.0);
  EXPECT_EQ(config.parallelism.data_parallel_shard_degree, -1);
  EXPECT_FALSE(config.job.print_config);
  EXPECT_EQ(render_config_toml(config), render_config_toml(defaults));
}

TEST(ConfigParse, DefaultsPassValidation) { EXPECT_NO_THROW(validate_job_config(JobConfig{})); }

TEST(ConfigParse, LoadsTomlFile) {
  TempDir dir;
  std::string file = dir.write("job.toml", R"(
[job]
description = "llama3 debug"

[model]
flavor = "tiny"

[optimizer]
lr = 3e-4
weight_decay = 0   # an integer is fine for a float key

[training]
steps = 20
local_batch_size = 4
global_batch_size = 8.0  # a whole float is fine for an integer key

[validation]
enable = true
)");
  JobConfig config = parse_job_config({"--job.config_file", file});
  EXPECT_EQ(config.job.config_file, file);
  EXPECT_EQ(config.job.description, "llama3 debug");
  EXPECT_EQ(config.model.flavor, "tiny");
  EXPECT_DOUBLE_EQ(config.optimizer.lr, 3e-4);
  EXPECT_DOUBLE_EQ(config.optimizer.weight_decay, 0.0);
  EXPECT_EQ(config.training.steps, 20);
  EXPECT_EQ(config.training.local_batch_size, 4);
  EXPECT_EQ(config.training.global_batch_size, 8);
  EXPECT_TRUE(config.validation.enable);
  // Keys the file does not set keep their defaults.
  EXPECT_EQ(config.training.seq_len, JobConfig{}.training.seq_len);
}

TEST(ConfigParse, DottedTomlKeys) {
  TempDir dir;
  std::string file = dir.write("job.toml", "training.steps = 7\nmetrics.log_freq = 2\n");
  JobConfig config = parse_job_config({"--job.config_file=" + file});
  EXPECT_EQ(config.training.steps, 7);
  EXPECT_EQ(config.metrics.log_freq, 2);
}

TEST(ConfigParse, PrecedenceCommandLineOverTomlOverDefaults) {
  TempDir dir;
  std::string file = dir.write("job.toml", "[training]\nsteps = 20\nseq_len = 64\n");
  // The override comes before --job.config_file and still wins.
  JobConfig config = parse_job_config({"--training.steps", "30", "--job.config_file", file});
  EXPECT_EQ(config.training.steps, 30);    // command line
  EXPECT_EQ(config.training.seq_len, 64);  // TOML
  EXPECT_EQ(config.training.local_batch_size, JobConfig{}.training.local_batch_size);  // default
}

TEST(ConfigParse, BothCommandLineForms) {
  JobConfig config = parse_job_config({"--training.steps", "5", "--training.seq_len=128",
                                       "--optimizer.lr=0.001", "--model.flavor", "tiny",
                                       "--debug.seed=-1", "--training.global_batch_size", "-1"});
  EXPECT_EQ(config.training.steps, 5);
  EXPECT_EQ(config.training.seq_len, 128);
  EXPECT_DOUBLE_EQ(config.optimizer.lr, 0.001);
  EXPECT_EQ(config.model.flavor, "tiny");
  EXPECT_EQ(config.debug.seed, -1);
  EXPECT_EQ(config.training.global_batch_size, -1);
}

TEST(ConfigParse, ValuesMayContainEqualsAndBeEmpty) {
  JobConfig config = parse_job_config(
      {"--job.description=a=b", "--model.hf_assets_path=", "--validation.dataset_path", ""});
  EXPECT_EQ(config.job.description, "a=b");
  EXPECT_EQ(config.model.hf_assets_path, "");
  EXPECT_EQ(config.validation.dataset_path, "");
}

TEST(ConfigParse, RepeatedKeyLastWins) {
  JobConfig config = parse_job_config({"--training.steps", "5", "--training.steps=6"});
  EXPECT_EQ(config.training.steps, 6);
}

TEST(ConfigParse, BoolSwitches) {
  EXPECT_TRUE(parse_job_config({"--job.print_config"}).job.print_config);
  EXPECT_TRUE(parse_job_config({"--job.print_config=true"}).job.print_config);
  EXPECT_TRUE(parse_job_config({"--job.print_config", "1"}).job.print_config);
  EXPECT_FALSE(parse_job_config({"--job.print_config=false"}).job.print_config);
  EXPECT_FALSE(parse_job_config({"--job.print_config", "false"}).job.print_config);
  EXPECT_FALSE(parse_job_config({"--job.print_config", "0"}).job.print_config);
  EXPECT_FALSE(parse_job_config({"--job.print_config=False"}).job.print_config);

  // A switch followed by another override is a bare true.
  JobConfig config = parse_job_config({"--validation.enable", "--training.steps", "3"});
  EXPECT_TRUE(config.validation.enable);
  EXPECT_EQ(config.training.steps, 3);
}

TEST(ConfigParse, BoolSwitchFollowedByNonBoolTokenLeavesItAsNextArgument) {
  // "5" is not a boolean spelling, so --job.print_config is a bare switch and "5" is then an
  // unexpected positional argument.
  std::string message = config_test::config_error([] {
    parse_job_config({"--job.print_config", "5"});
  });
  EXPECT_TRUE(config_test::contains(message, "unexpected command-line argument '5'"));
}

TEST(ConfigParse, CommandLineTurnsOffTomlBool) {
  TempDir dir;
  std::string file = dir.write("job.toml", "[validation]\nenable = true\n");
  JobConfig config = parse_job_config({"--job.config_file", file, "--validation.enable=false"});
  EXPECT_FALSE(config.validation.enable);
}

TEST(ConfigParse, EmptyConfigFileValueLoadsNothing) {
  JobConfig config = parse_job_config({"--job.config_file="});
  EXPECT_EQ(config.job.config_file, "");
}

// Every TOML file shipped under configs/ loads and validates (the repo root is found from this
// source file's path).
TEST(ConfigParse, ShippedConfigsLoad) {
  std::filesystem::path configs =
      std::filesystem::path(__FILE__).parent_path().parent_path().parent_path().parent_path() /
      "configs";
  if (!std::filesystem::is_directory(configs)) {
    GTEST_SKIP() << "no configs/ folder at " << configs;
  }
  int loaded = 0;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(configs)) {
    if (entry.path().extension() != ".toml") {
      continue;
    }
    SCOPED_TRACE(entry.path().string());
    JobConfig config;
    EXPECT_NO_THROW(config = parse_job_config({"--job.config_file", entry.path().string()}));
    EXPECT_EQ(config.job.config_file, entry.path().string());
    ++loaded;
  }
  EXPECT_GT(loaded, 0);
}

TEST(ConfigParse, ParseRunsValidation) {
  EXPECT_THROW(parse_job_config({"--training.steps", "0"}), ConfigError);
}

}  // namespace test_config_parse
}  // namespace titan
