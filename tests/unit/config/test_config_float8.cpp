// model.converters and [quantize.linear.float8] as validate_job_config checks them: TorchTitan's
// two names of the float8 linear converter load, other converters are refused by name, unknown
// names suggest the nearest one, and the float8 all-gather switches (not built) are refused while
// the converter is on.
#include "titan/config/config_manager.h"

#include "config_test_util.h"

#include <gtest/gtest.h>

namespace titan {
namespace test_config_float8 {

using config_test::config_error;
using config_test::contains;
using config_test::TempDir;

JobConfig with_converters(std::vector<std::string> converters) {
  JobConfig c;
  c.model.converters = std::move(converters);
  return c;
}

TEST(ConfigFloat8, BothTorchTitanNamesLoad) {
  EXPECT_NO_THROW(validate_job_config(with_converters({"float8"})));
  EXPECT_NO_THROW(validate_job_config(with_converters({"quantize.linear.float8"})));
  TempDir dir;
  const std::string file = dir.write(
      "float8.toml",
      "[model]\nconverters = [\"quantize.linear.float8\"]\n[quantize.linear.float8]\n"
      "recipe_name = \"rowwise\"\nemulate = true\nfilter_fqns = [\"output\", \"auto_filter_small_kn\"]\n");
  const JobConfig c = parse_job_config({"--job.config_file", file});
  EXPECT_EQ(c.model.converters, std::vector<std::string>{"quantize.linear.float8"});
  EXPECT_EQ(c.quantize.linear.float8.recipe_name, "rowwise");
  EXPECT_TRUE(c.quantize.linear.float8.emulate);
  // From the command line, as TorchTitan spells it.
  const JobConfig d =
      parse_job_config({"--model.converters", "float8", "--quantize.linear.float8.emulate"});
  EXPECT_EQ(d.model.converters, std::vector<std::string>{"float8"});
  EXPECT_TRUE(d.quantize.linear.float8.emulate);
}

TEST(ConfigFloat8, UnknownConverterNamesTheNearest) {
  const std::string m = config_error([] { validate_job_config(with_converters({"flaot8"})); });
  EXPECT_TRUE(contains(m, "model.converters entry 'flaot8' is not a model converter"));
  EXPECT_TRUE(contains(m, "did you mean 'float8'?"));
  const std::string n =
      config_error([] { validate_job_config(with_converters({"quantize.linear.float"})); });
  EXPECT_TRUE(contains(n, "did you mean 'quantize.linear.float8'?"));
}

TEST(ConfigFloat8, OldMxNameAndDuplicatesAreRefused) {
  const std::string m = config_error([&] { validate_job_config(with_converters({"mx"})); });
  EXPECT_TRUE(contains(m, "'mx' (TorchTitan's older name of the MX linear converter)"));
  EXPECT_TRUE(contains(m, "HINT: use model.converters = [\"quantize.linear.mx\"]"));
  const std::string twice = config_error([] {
    validate_job_config(with_converters({"float8", "quantize.linear.float8"}));
  });
  EXPECT_TRUE(contains(twice, "twice"));
}

TEST(ConfigFloat8, GroupedGemmConvertersNeedFqnsAndOneFormat) {
  for (const char* name : {"quantize.grouped_mm.mx", "quantize.grouped_mm.float8"}) {
    JobConfig c = with_converters({name});
    EXPECT_TRUE(contains(config_error([&] { validate_job_config(c); }),
                         std::string(name) + ".fqns, and that list is empty. HINT: " + name +
                             ".fqns = [\"experts\"]"))
        << name;
    c.quantize.grouped_mm.mx.fqns = {"experts"};
    c.quantize.grouped_mm.float8.fqns = {"experts"};
    EXPECT_NO_THROW(validate_job_config(c)) << name;
    c.parallelism.expert_tensor_parallel_degree = 2;
    c.parallelism.tensor_parallel_degree = 2;
    EXPECT_TRUE(contains(config_error([&] { validate_job_config(c); }),
                         "expert_tensor_parallel_degree = 2: quantized expert GEMMs under expert "
                         "tensor parallelism are not built"))
        << name;
    // With the linear converters: different layers.
    JobConfig both = with_converters({name, "quantize.linear.float8"});
    both.quantize.grouped_mm.mx.fqns = {"experts"};
    both.quantize.grouped_mm.float8.fqns = {"experts"};
    both.quantize.linear.float8.emulate = true;
    EXPECT_NO_THROW(validate_job_config(both)) << name;
    JobConfig twice = with_converters({name, name});
    twice.quantize.grouped_mm.mx.fqns = {"experts"};
    twice.quantize.grouped_mm.float8.fqns = {"experts"};
    EXPECT_TRUE(contains(config_error([&] { validate_job_config(twice); }), "twice")) << name;
  }
  JobConfig c = with_converters({"quantize.grouped_mm.mx", "quantize.grouped_mm.float8"});
  c.quantize.grouped_mm.mx.fqns = {"experts"};
  c.quantize.grouped_mm.float8.fqns = {"experts"};
  EXPECT_TRUE(contains(config_error([&] { validate_job_config(c); }),
                       "lists both quantize.grouped_mm.float8 and quantize.grouped_mm.mx"));
}

TEST(ConfigFloat8, MxConverterTakesItsRecipeAndNotFloat8Too) {
  EXPECT_NO_THROW(validate_job_config(with_converters({"quantize.linear.mx"})));
  JobConfig c = with_converters({"quantize.linear.mx"});
  c.quantize.linear.mx.recipe_name = "mxfp8_cublas_rceil";
  EXPECT_NO_THROW(validate_job_config(c));
  c.quantize.linear.mx.recipe_name = "mxfp4_cutlass";
  EXPECT_TRUE(contains(config_error([&] { validate_job_config(c); }),
                       "quantize.linear.mx.recipe_name 'mxfp4_cutlass' is not built"));
  EXPECT_TRUE(contains(config_error([] {
                         validate_job_config(with_converters({"quantize.linear.mx", "float8"}));
                       }),
                       "lists both the float8 and the MX linear converters"));
}

TEST(ConfigFloat8, Float8AllGatherNeedsTensorwiseAndPrecomputeNeedsTheGather) {
  JobConfig c;
  c.quantize.linear.float8.enable_fsdp_float8_all_gather = true;
  c.quantize.linear.float8.precompute_float8_dynamic_scale_for_fsdp = true;
  EXPECT_NO_THROW(validate_job_config(c));  // TorchTitan's 405B file: inert without the converter
  c.model.converters = {"float8"};
  EXPECT_NO_THROW(validate_job_config(c));  // the 405B file with the converter on
  c.quantize.linear.float8.recipe_name = "tensorwise";
  EXPECT_NO_THROW(validate_job_config(c));
  for (const char* recipe : {"rowwise", "rowwise_with_gw_hp"}) {
    c.quantize.linear.float8.recipe_name = recipe;
    const std::string m = config_error([&] { validate_job_config(c); });
    EXPECT_TRUE(contains(m,
                         "enable_fsdp_float8_all_gather = true needs the tensorwise recipe, "
                         "but recipe_name = '" +
                             std::string(recipe) + "'"))
        << m;
    EXPECT_TRUE(contains(m, "HINT"));
  }
  c.quantize.linear.float8.recipe_name = "";
  c.quantize.linear.float8.enable_fsdp_float8_all_gather = false;
  const std::string m = config_error([&] { validate_job_config(c); });
  EXPECT_TRUE(contains(m,
                       "precompute_float8_dynamic_scale_for_fsdp = true precomputes the "
                       "scales of the float8 all-gather, which is off"))
      << m;
  c.quantize.linear.float8.precompute_float8_dynamic_scale_for_fsdp = false;
  EXPECT_NO_THROW(validate_job_config(c));
}

}  // namespace test_config_float8
}  // namespace titan
