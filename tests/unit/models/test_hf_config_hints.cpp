// config.json values our checks refuse are named by their config.json key and value (a negative
// rms_norm_eps used to be reported as the whole args JSON, without the field).
#include "titan/common/check.h"
#include "titan/models/llama3/hf_adapter.h"

#include <gtest/gtest.h>

namespace titan {
namespace test_hf_config_hints {

std::string config_error(const nlohmann::json& config) {
  try {
    llama3::args_from_hf_config(config);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(HfConfigHints, NonPositiveFloatsAreNamedByTheirKey) {
  const nlohmann::json good = {{"hidden_size", 64},
                               {"intermediate_size", 128},
                               {"num_hidden_layers", 2},
                               {"num_attention_heads", 4},
                               {"vocab_size", 300}};
  EXPECT_EQ(config_error(good), "");
  nlohmann::json config = good;
  config["rms_norm_eps"] = -1e-5;
  std::string msg = config_error(config);
  EXPECT_EQ(msg, "config.json \"rms_norm_eps\" must be a finite number > 0, got -1e-05");
  config = good;
  config["rope_theta"] = 0;
  msg = config_error(config);
  EXPECT_NE(msg.find("config.json \"rope_theta\" must be a finite number > 0, got 0"),
            std::string::npos)
      << msg;
}

}  // namespace test_hf_config_hints
}  // namespace titan
