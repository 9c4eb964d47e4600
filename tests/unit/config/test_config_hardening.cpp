// Values that parse but can never be meant: inf/nan in any float key (checked once, over the
// whole field table, whatever the source), an empty job.dump_folder, a thread count that would
// stall start-up.
#include "titan/common/cpu.h"
#include "titan/config/config_manager.h"
#include "titan/config/field_table.h"

#include "config_test_util.h"

#include <cmath>
#include <limits>

namespace titan {
namespace test_config_hardening {

using config_test::config_error;
using config_test::contains;
using config_test::TempDir;

TEST(ConfigHardening, EveryFloatKeyRefusesInfAndNan) {
  JobConfig defaults;
  int float_keys = 0;
  const detail::FieldTable table = detail::FieldTable::of(defaults);
  for (const detail::FieldRef& field : table.fields()) {
    if (field.type != detail::FieldType::kDouble) continue;
    ++float_keys;
    for (double bad :
         {std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity(),
          std::numeric_limits<double>::quiet_NaN()}) {
      JobConfig config;
      const detail::FieldTable edited = detail::FieldTable::of(config);
      for (const detail::FieldRef& f : edited.fields()) {
        if (f.name() == field.name()) *static_cast<double*>(f.value) = bad;
      }
      const std::string error = config_error([&] { validate_job_config(config); });
      EXPECT_TRUE(contains(error, "config key '" + field.name() + "' must be a finite number"));
      EXPECT_TRUE(contains(error, std::isnan(bad) ? "got nan" : bad > 0 ? "got inf" : "got -inf"));
    }
  }
  EXPECT_GE(float_keys, 9);  // peak_flops, lr, betas, eps, weight_decay, decay, min_lr, max_norm
}

TEST(ConfigHardening, NonFiniteFromCommandLineAndToml) {
  EXPECT_TRUE(contains(config_error([] {
                         parse_job_config({"--optimizer.lr", "inf"});
                       }),
                       "config key 'optimizer.lr' must be a finite number, got inf"));
  // max_norm <= 0 disables clipping; nan used to do so silently.
  EXPECT_TRUE(contains(config_error([] { parse_job_config({"--training.max_norm=nan"}); }),
                       "config key 'training.max_norm' must be a finite number, got nan"));
  TempDir dir;
  const std::string file = dir.write("bad.toml", "[optimizer]\nweight_decay = -inf\n");
  EXPECT_TRUE(contains(config_error([&] {
                         parse_job_config({"--job.config_file", file});
                       }),
                       "config key 'optimizer.weight_decay' must be a finite number, got -inf"));
  EXPECT_NO_THROW(parse_job_config({"--optimizer.lr", "1e-3", "--training.max_norm", "0"}));
}

TEST(ConfigHardening, EmptyDumpFolderIsRefused) {
  EXPECT_TRUE(contains(config_error([] {
                         parse_job_config({"--job.dump_folder", ""});
                       }),
                       "job.dump_folder is empty"));
  EXPECT_NO_THROW(parse_job_config({"--job.dump_folder", "."}));
}

TEST(ConfigHardening, ThreadCountIsCapped) {
  EXPECT_TRUE(contains(config_error([] {
                         parse_job_config({"--training.num_threads", "100000"});
                       }),
                       "training.num_threads 100000 is above the cap of 1024 threads per rank"));
  EXPECT_NO_THROW(parse_job_config({"--training.num_threads", std::to_string(kMaxNumThreads)}));
  EXPECT_TRUE(contains(render_help("train"), "At most 1024"));
}

}  // namespace test_config_hardening
}  // namespace titan
