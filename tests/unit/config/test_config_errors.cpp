// Parse errors: unknown sections and keys (with suggestions), wrong value types from TOML and the
// command line, malformed command lines, and missing or broken TOML files.
#include "titan/config/config_manager.h"

#include "config_test_util.h"

namespace titan {
namespace test_config_errors {

using config_test::config_error;
using config_test::contains;
using config_test::TempDir;

std::string cli_error(const std::vector<std::string>& args) {
  return config_error([&] { parse_job_config(args); });
}

std::string toml_error(const std::string& toml) {
  TempDir dir;
  std::string file = dir.write("job.toml", toml);
  return config_error([&] { parse_job_config({"--job.config_file", file}); });
}

TEST(ConfigErrors, ThrowsConfigError) {
  EXPECT_THROW(parse_job_config({"--trainig.steps", "5"}), ConfigError);
  EXPECT_THROW(parse_job_config({"--training.stesp", "5"}), ConfigError);
  EXPECT_THROW(parse_job_config({"--training.steps", "ten"}), ConfigError);
  EXPECT_THROW(parse_job_config({"stray"}), ConfigError);
  EXPECT_THROW(parse_job_config({"--training.steps"}), ConfigError);
}

TEST(ConfigErrors, UnknownSectionOnCommandLine) {
  std::string message = cli_error({"--trainig.steps", "5"});
  EXPECT_TRUE(contains(message, "unknown config section 'trainig'; did you mean 'training'?"));
  EXPECT_TRUE(contains(message, "command line"));
  EXPECT_TRUE(contains(message, "--trainig.steps"));
}

TEST(ConfigErrors, UnknownKeyOnCommandLine) {
  std::string message = cli_error({"--training.stesp", "5"});
  EXPECT_TRUE(
      contains(message, "unknown config key 'training.stesp'; did you mean 'training.steps'?"));
  EXPECT_TRUE(contains(message, "command line"));
}

TEST(ConfigErrors, UnknownKeyThatLivesInAnotherSection) {
  std::string message = cli_error({"--training.lr=0.1"});
  EXPECT_TRUE(contains(message, "unknown config key 'training.lr'; did you mean 'optimizer.lr'?"));
  // A key found in several sections lists them all.
  message = cli_error({"--model.seq_len", "4"});
  EXPECT_TRUE(contains(message, "'training.seq_len' or 'validation.seq_len'"));
}

TEST(ConfigErrors, UnknownSectionInToml) {
  std::string message = toml_error("[trainig]\nsteps = 5\n");
  EXPECT_TRUE(contains(message, "unknown config section 'trainig'; did you mean 'training'?"));
  EXPECT_TRUE(contains(message, "job.toml:1:"));
}

TEST(ConfigErrors, UnknownKeyInToml) {
  std::string message = toml_error("[training]\nseq_len = 8\nstesp = 5\n");
  EXPECT_TRUE(
      contains(message, "unknown config key 'training.stesp'; did you mean 'training.steps'?"));
  EXPECT_TRUE(contains(message, "job.toml:3:1"));
}

TEST(ConfigErrors, KeyOutsideAnySectionInToml) {
  std::string message = toml_error("steps = 5\n");
  EXPECT_TRUE(contains(message, "config key 'steps' is outside any [section]"));
  EXPECT_TRUE(contains(message, "did you mean 'training.steps'?"));
  message = toml_error("training = 5\n");
  EXPECT_TRUE(contains(message, "config section 'training' must be a table"));
}

TEST(ConfigErrors, WrongTypeOnCommandLine) {
  std::string message = cli_error({"--training.steps", "ten"});
  EXPECT_TRUE(contains(message, "config key 'training.steps' expects an integer, got 'ten'"));
  EXPECT_TRUE(contains(message, "command line"));

  EXPECT_TRUE(contains(cli_error({"--training.steps=10x"}), "expects an integer, got '10x'"));
  EXPECT_TRUE(contains(cli_error({"--training.steps=1.5"}), "expects an integer, got '1.5'"));
  EXPECT_TRUE(contains(cli_error({"--training.steps= 10"}), "expects an integer, got ' 10'"));
  EXPECT_TRUE(contains(cli_error({"--training.steps=99999999999999999999"}), "expects an integer"));
  EXPECT_TRUE(contains(cli_error({"--optimizer.lr", "fast"}),
                       "config key 'optimizer.lr' expects a number, got 'fast'"));
  EXPECT_TRUE(contains(cli_error({"--optimizer.lr=0x10"}), "expects a number, got '0x10'"));
  EXPECT_TRUE(contains(cli_error({"--optimizer.lr="}), "expects a number, got ''"));
  EXPECT_TRUE(
      contains(cli_error({"--job.print_config=yes"}),
               "config key 'job.print_config' expects a boolean (true or false), got 'yes'"));
}

TEST(ConfigErrors, WrongTypeInToml) {
  std::string message = toml_error("[training]\nsteps = \"ten\"\n");
  EXPECT_TRUE(contains(message, "config key 'training.steps' expects an integer, got 'ten'"));
  EXPECT_TRUE(contains(message, "a string in TOML file"));
  EXPECT_TRUE(contains(message, "job.toml:2:9"));

  EXPECT_TRUE(contains(toml_error("[training]\nsteps = 2.5\n"),
                       "config key 'training.steps' expects an integer, got '2.5' (a float"));
  EXPECT_TRUE(contains(toml_error("[optimizer]\nlr = \"0.1\"\n"),
                       "config key 'optimizer.lr' expects a number, got '0.1' (a string"));
  EXPECT_TRUE(contains(toml_error("[job]\nprint_config = 1\n"),
                       "config key 'job.print_config' expects a boolean (true or false), got '1'"));
  EXPECT_TRUE(contains(toml_error("[model]\nflavor = 8\n"),
                       "config key 'model.flavor' expects a string, got '8' (an integer"));
  EXPECT_TRUE(contains(toml_error("[model]\nflavor = [\"a\"]\n"),
                       "config key 'model.flavor' expects a string, got an array (in TOML file"));
}

TEST(ConfigErrors, StrayPositionalArgument) {
  std::string message = cli_error({"--training.steps", "5", "stray"});
  EXPECT_TRUE(contains(message, "unexpected command-line argument 'stray'"));
  EXPECT_TRUE(contains(cli_error({"-x"}), "unexpected command-line argument '-x'"));
  EXPECT_TRUE(contains(cli_error({"--"}), "unexpected command-line argument '--'"));
  EXPECT_TRUE(contains(cli_error({"--.steps=1"}), "unexpected command-line argument"));
  EXPECT_TRUE(contains(cli_error({"--training.=1"}), "unexpected command-line argument"));
}

TEST(ConfigErrors, KeyWithoutSectionSuggestsFullName) {
  std::string message = cli_error({"--steps", "10"});
  EXPECT_TRUE(contains(message, "unexpected command-line argument '--steps'"));
  EXPECT_TRUE(contains(message, "did you mean '--training.steps' or '--validation.steps'?"));
}

TEST(ConfigErrors, MissingValue) {
  std::string message = cli_error({"--training.steps"});
  EXPECT_TRUE(
      contains(message, "config key 'training.steps' is given no value on the command line"));
  // The next token is another override, not a value.
  message = cli_error({"--model.flavor", "--training.steps", "3"});
  EXPECT_TRUE(contains(message, "config key 'model.flavor' is given no value"));
  message = cli_error({"--job.config_file"});
  EXPECT_TRUE(contains(message, "config key 'job.config_file' is given no value"));
}

TEST(ConfigErrors, UnknownKeyFailsBeforeFileIsRead) {
  std::string message =
      cli_error({"--job.config_file", "/nonexistent/x.toml", "--training.stesp", "1"});
  EXPECT_TRUE(contains(message, "unknown config key 'training.stesp'"));
}

TEST(ConfigErrors, MissingTomlFile) {
  TempDir dir;
  std::string path = dir.path() + "/absent.toml";
  std::string message = cli_error({"--job.config_file", path});
  EXPECT_TRUE(contains(message, "config file '" + path + "'"));
  EXPECT_TRUE(contains(message, "does not exist"));
  message = cli_error({"--job.config_file", dir.path()});
  EXPECT_TRUE(contains(message, "is a directory"));
}

TEST(ConfigErrors, TomlSyntaxErrorHasLineAndColumn) {
  TempDir dir;
  std::string file = dir.write("bad.toml", "[training]\nsteps = 5\nseq_len = = 3\n");
  std::string message = config_error([&] { parse_job_config({"--job.config_file", file}); });
  EXPECT_TRUE(contains(message, "cannot parse TOML config file " + file + ":3:"));
  // The parser's own description follows the location.
  EXPECT_GT(message.size(), (file + ":3:1: ").size() + 30) << message;
}

}  // namespace test_config_errors
}  // namespace titan
