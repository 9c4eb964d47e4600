// config.json values our checks refuse are named by their config.json key and value (a negative
// rms_norm_eps used to be reported as the whole args JSON, without the field), and every model
// argument read from one is range-checked (a routed_scaling_factor of -1e300 used to convert
// with rc 0 and give NaN logits; a kv_lora_rank of 0 used to end in a missing tensor).
#include "titan/common/check.h"
#include "titan/models/deepseek_v3/hf_adapter.h"
#include "titan/models/deepseek_v3/spec.h"
#include "titan/models/llama3/args.h"
#include "titan/models/llama3/hf_adapter.h"
#include "titan/models/qwen3/hf_adapter.h"

#include <functional>

#include "../test_util.h"

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
  EXPECT_EQ(msg, "config.json \"rms_norm_eps\" must be a finite number in (0, 1], got -1e-05");
  config = good;
  config["rope_theta"] = 0;
  msg = config_error(config);
  EXPECT_NE(msg.find("config.json \"rope_theta\" must be a finite number in (0, 1e+12], got 0"),
            std::string::npos)
      << msg;
}

TEST(HfConfigHints, EveryArgumentIsRangeCheckedByItsKey) {
  const auto refusal = [](const std::function<void()>& f) {
    const std::string message = test::message_of(f);
    return message.empty() ? std::string("no ConfigError") : message;
  };
  const nlohmann::json deepseek =
      deepseek_v3::hf_config(llama3::args_for_flavor("tiny", deepseek_v3::family()));
  EXPECT_EQ(refusal([&] { deepseek_v3::args_from_hf_config(deepseek); }), "no ConfigError");
  const std::vector<std::pair<std::pair<const char*, nlohmann::json>, const char*>> cases = {
      {{"routed_scaling_factor", -1e300},
       "config.json \"routed_scaling_factor\" must be a finite number in (0, 10000], got -1e+300"},
      {{"kv_lora_rank", 0}, "config.json \"kv_lora_rank\" must be in [1, 1048576], got 0"},
      {{"rms_norm_eps", 1e300}, "\"rms_norm_eps\" must be a finite number in (0, 1]"},
      {{"num_experts_per_tok", 1000}, "\"num_experts_per_tok\" must be in [1, "},
      {{"topk_group", 0}, "\"topk_group\" must be in [1, "},
      {{"qk_rope_head_dim", 0}, "\"qk_rope_head_dim\" must be in [2, "},
      {{"first_k_dense_replace", -1}, "\"first_k_dense_replace\" must be in [0, "},
  };
  for (const auto& [edit, expected] : cases) {
    nlohmann::json c = deepseek;
    c[edit.first] = edit.second;
    const std::string msg = refusal([&] { deepseek_v3::args_from_hf_config(c); });
    EXPECT_NE(msg.find(expected), std::string::npos) << edit.first << ": " << msg;
  }
  nlohmann::json yarn = deepseek;
  yarn["rope_scaling"]["beta_fast"] = -3;
  EXPECT_NE(refusal([&] {
              deepseek_v3::args_from_hf_config(yarn);
            }).find("\"rope_scaling.beta_fast\" must be a finite number in (0, "),
            std::string::npos);
  // Qwen3 (through the Llama reader) and its own keys.
  nlohmann::json qwen = {{"model_type", "qwen3"},    {"hidden_size", 64},
                         {"intermediate_size", 128}, {"num_hidden_layers", 2},
                         {"num_attention_heads", 4}, {"num_key_value_heads", 2},
                         {"vocab_size", 300},        {"head_dim", 16}};
  EXPECT_EQ(refusal([&] { qwen3::args_from_hf_config(qwen); }), "no ConfigError");
  nlohmann::json odd = qwen;
  odd["head_dim"] = -16;
  EXPECT_NE(refusal([&] { qwen3::args_from_hf_config(odd); }).find("\"head_dim\" must be in [2, "),
            std::string::npos);
  nlohmann::json scaled = qwen;
  scaled["rope_scaling"] = {{"rope_type", "llama3"},
                            {"factor", 8.0},
                            {"low_freq_factor", 4.0},
                            {"high_freq_factor", 1.0}};
  EXPECT_NE(refusal([&] { qwen3::args_from_hf_config(scaled); }).find("must be at least"),
            std::string::npos);
  // Equal factors (Llama 4's) leave no band to blend: accepted.
  scaled["rope_scaling"]["high_freq_factor"] = 4.0;
  EXPECT_EQ(refusal([&] { qwen3::args_from_hf_config(scaled); }), "no ConfigError");
}

}  // namespace test_hf_config_hints
}  // namespace titan
