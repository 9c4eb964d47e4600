// The model registry and Llama 3 flavor arithmetic: lookups, error messages that name the
// nearest flavor, and parameter counts checked against published figures and real modules.
#include "titan/common/check.h"
#include "titan/models/common/attention.h"
#include "titan/models/llama3/args.h"
#include "titan/models/llama3/hf_adapter.h"
#include "titan/models/llama3/model.h"
#include "titan/models/registry.h"

#include <gtest/gtest.h>

#include <chrono>

namespace titan {
namespace test_registry {

int64_t count_parameters(const torch::nn::Module& module) {
  int64_t n = 0;
  for (const auto& p : module.parameters()) {
    n += p.numel();
  }
  return n;
}

std::string config_error_message(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(Registry, Llama3IsRegisteredWithAllFlavors) {
  const auto models = registered_models();
  ASSERT_NE(std::find(models.begin(), models.end(), "llama3"), models.end());
  const ModelSpec& spec = get_model_spec("llama3");
  const std::vector<std::string> expected = {"tiny",        "debugmodel",   "debugmodel_narrow",
                                             "bench_small", "bench_medium", "1B",
                                             "3B",          "8B_cut",       "8B",
                                             "70B",         "405B"};
  EXPECT_EQ(spec.flavors, expected);
}

TEST(Registry, UnknownFlavorNamesTheNearest) {
  const ModelSpec& spec = get_model_spec("llama3");
  EXPECT_NO_THROW(check_flavor(spec, "debugmodel"));
  const std::string msg = config_error_message([&] { check_flavor(spec, "debugmodl"); });
  EXPECT_EQ(msg.rfind("unknown model.flavor 'debugmodl' for model 'llama3'; did you mean "
                      "'debugmodel'? (flavors: tiny, debugmodel, ",
                      0),
            0u)
      << msg;
  EXPECT_NE(config_error_message([&] { check_flavor(spec, "8b"); }).find("did you mean '8B'"),
            std::string::npos);
  // The spec's own functions reject unknown flavors the same way.
  EXPECT_NE(config_error_message([&] {
              spec.build("bench_smal", ModelBuildOptions{});
            }).find("did you mean 'bench_small'"),
            std::string::npos);
}

TEST(Registry, UnknownModelNamesTheNearest) {
  const std::string msg = config_error_message([] { get_model_spec("lama3"); });
  EXPECT_NE(msg.find("unknown model.name 'lama3'; did you mean 'llama3'?"), std::string::npos)
      << msg;
}

TEST(Registry, DuplicateRegistrationIsRejected) {
  ModelSpec spec;
  spec.name = "llama3";
  EXPECT_THROW(register_model(spec), c10::Error);
}

TEST(Registry, DescribeFlavor) {
  const ModelSpec& spec = get_model_spec("llama3");
  EXPECT_EQ(spec.describe_flavor("8B"),
            "dim 4096, 32 layers, 32 heads, 8 kv heads, ffn 14336, vocab 128256");
  EXPECT_EQ(spec.describe_flavor("1B"),
            "dim 2048, 16 layers, 32 heads, 8 kv heads, ffn 8192, vocab 128256, tied embeddings");
}

TEST(Llama3Args, FfnHiddenDimsMatchTorchTitan) {
  const std::map<std::string, int64_t> expected = {
      {"tiny", 192},        {"debugmodel", 768},    {"debugmodel_narrow", 384},
      {"bench_small", 768}, {"bench_medium", 1536}, {"1B", 8192},
      {"3B", 8192},         {"8B_cut", 14336},      {"8B", 14336},
      {"70B", 28672},       {"405B", 53248}};
  for (const auto& [flavor, hidden] : expected) {
    EXPECT_EQ(llama3::args_for_flavor(flavor).ffn_hidden_dim(), hidden) << flavor;
  }
}

TEST(Llama3Args, ParamCountsOfLargeFlavorsWithoutAllocating) {
  const ModelSpec& spec = get_model_spec("llama3");
  const auto start = std::chrono::steady_clock::now();
  const ModelStats stats_8b = spec.describe("8B", 1, 8192, at::kBFloat16);
  const double elapsed_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(elapsed_ms, 50.0);
  EXPECT_EQ(stats_8b.n_params, 8030261248);
  EXPECT_EQ(stats_8b.n_embedding_params, 128256 * 4096);
  EXPECT_EQ(stats_8b.head_dim, 128);
  // Published sizes of Llama 3.2 1B/3B (tied), Llama 3.1 70B/405B.
  EXPECT_EQ(spec.describe("1B", 1, 2048, at::kFloat).n_params, 1235814400);
  EXPECT_EQ(spec.describe("3B", 1, 2048, at::kFloat).n_params, 3212749824);
  EXPECT_EQ(spec.describe("70B", 1, 2048, at::kFloat).n_params, 70553706496);
  EXPECT_EQ(spec.describe("405B", 1, 2048, at::kFloat).n_params, 405853388800);
  // 8B with 8 layers: both embeddings and 8 of the 32 blocks (218,112,000 parameters each).
  EXPECT_EQ(spec.describe("8B_cut", 1, 8192, at::kBFloat16).n_params,
            int64_t{2} * 128256 * 4096 + 8 * int64_t{218112000} + 4096);
}

TEST(Llama3Args, FlopsPerTokenFormula) {
  const ModelStats s = get_model_spec("llama3").describe("8B", 1, 8192, at::kFloat);
  const double expected = 6.0 * (8030261248.0 - 128256.0 * 4096) + 12.0 * 32 * 32 * 128 * 8192;
  EXPECT_DOUBLE_EQ(s.flops_per_token(8192), expected);
}

TEST(Llama3Args, AnalyticCountEqualsModuleCount) {
  for (const std::string flavor :
       {"tiny", "debugmodel", "debugmodel_narrow", "bench_small", "bench_medium"}) {
    for (const bool tied : {false, true}) {
      llama3::Llama3Args args = llama3::args_for_flavor(flavor);
      args.tie_embeddings = tied;
      args.max_seq_len = 16;
      const llama3::Transformer model(args);
      const ModelStats stats = llama3::compute_stats(args, 1, 16, at::kFloat);
      EXPECT_EQ(count_parameters(model), stats.n_params) << flavor << " tied=" << tied;
      EXPECT_EQ(model.tok_embeddings->weight.numel(), stats.n_embedding_params);
    }
  }
}

TEST(Llama3Args, ActivationBytesGrowWithBatchAndShrinkInBf16) {
  const ModelSpec& spec = get_model_spec("llama3");
  const ModelStats one = spec.describe("debugmodel", 1, 2048, at::kFloat);
  const ModelStats two = spec.describe("debugmodel", 2, 2048, at::kFloat);
  const ModelStats bf16 = spec.describe("debugmodel", 2, 2048, at::kBFloat16);
  EXPECT_GT(one.activation_bytes, 0);
  EXPECT_GT(two.activation_bytes, one.activation_bytes);
  EXPECT_LT(bf16.activation_bytes, two.activation_bytes);
  EXPECT_GT(bf16.activation_bytes, two.activation_bytes / 3);
  // More than the float32 logits with their log-softmax plus, per layer, the attention inputs
  // and output (q, k, v, out) and the SwiGLU intermediates.
  const int64_t tokens = 2048;
  const llama3::Llama3Args args = llama3::args_for_flavor("debugmodel");
  EXPECT_GT(one.activation_bytes, 2 * 4 * tokens * args.vocab_size +
                                      args.n_layers * 4 * tokens *
                                          ((args.n_heads + 2 * args.kv_heads()) * args.head_dim() +
                                           args.dim + 4 * args.ffn_hidden_dim()));
}

TEST(Llama3Args, InvalidHeadsAreConfigErrors) {
  llama3::Llama3Args args = llama3::args_for_flavor("tiny");
  args.n_kv_heads = 3;
  EXPECT_THROW(args.validate(), ConfigError);
  args = llama3::args_for_flavor("tiny");
  args.n_heads = 5;
  EXPECT_THROW(args.validate(), ConfigError);
}

// Reported by UBSan in the config.json fuzz harness (tests/fuzz/corpus/hf_config/
// crash-huge-hidden-size.json): sizes this large overflowed the int64 size arithmetic (4 * dim in
// ffn_hidden_dim); now ConfigErrors naming the field, from a config.json or a description's args.
TEST(Llama3Args, HugeOrNegativeSizesAreConfigErrors) {
  nlohmann::json config = {{"hidden_size", int64_t{1} << 62},
                           {"intermediate_size", 0},
                           {"num_hidden_layers", 1},
                           {"num_attention_heads", 2},
                           {"vocab_size", 10}};
  EXPECT_NE(config_error_message([&] {
              llama3::args_from_hf_config(config);
            }).find("dim = 4611686018427387904 is out of range"),
            std::string::npos);
  config["hidden_size"] = 64;
  config["intermediate_size"] = -1;
  EXPECT_NE(config_error_message([&] {
              llama3::args_from_hf_config(config);
            }).find("ffn_dim = -1 is out of range"),
            std::string::npos);
  const nlohmann::json model = {
      {"name", "llama3"}, {"flavor", "tiny"}, {"args", {{"n_layers", int64_t{1} << 40}}}};
  EXPECT_NE(config_error_message([&] {
              llama3::args_from_description(model);
            }).find("n_layers = 1099511627776 is out of range"),
            std::string::npos);
  // The largest flavor stays valid.
  EXPECT_NO_THROW(llama3::args_for_flavor("405B").validate());
}

}  // namespace test_registry
}  // namespace titan
