// Qwen3-Next (model "qwen3_next"): the layer layout (three linear-attention layers, then a gated
// full one), sizes against the built models, packed documents through both kinds of layers,
// KV-cache decoding (with the linear layers' carried state) against the full forward, the
// refused rewind, the refused context parallelism and the tensor-parallel plan, and the Hugging
// Face config and tensor round trips (tests/e2e/test_qwen3_next_hf.sh checks the model against
// transformers).
#include "titan/common/check.h"
#include "titan/models/llama3/model.h"
#include "titan/models/qwen3_next/hf_adapter.h"
#include "titan/models/qwen3_next/spec.h"
#include "titan/models/registry.h"

#include "../test_util.h"
#include "finite_difference.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>

namespace titan {
namespace test_qwen3_next {

std::shared_ptr<llama3::Transformer> tiny_model(uint64_t seed) {
  ModelBuildOptions options;
  options.max_seq_len = 64;
  options.seed = seed;
  return std::dynamic_pointer_cast<llama3::Transformer>(
      get_model_spec("qwen3_next").build("tiny", options));
}

TEST(Qwen3Next, LayerLayoutAndSizes) {
  const auto model = tiny_model(1);
  for (int64_t i = 0; i < 4; ++i) {
    const bool linear = i != 3;
    EXPECT_EQ(model->layers[i]->linear_attention != nullptr, linear) << i;
    EXPECT_EQ(model->layers[i]->attention != nullptr, !linear) << i;
    EXPECT_NE(model->layers[i]->moe, nullptr);
    EXPECT_NE(model->layers[i]->moe->shared_gate, nullptr);
  }
  EXPECT_TRUE(model->norm->zero_centered);
  EXPECT_TRUE(model->layers[3]->attention->q_norm->zero_centered);
  // Zero-centred norms start at zero (scale 1); the gated norm and dt_bias at one.
  const auto params = model->named_parameters();
  EXPECT_TRUE(at::equal(params["norm.weight"], at::zeros({64})));
  EXPECT_TRUE(at::equal(params["layers.0.linear_attention.norm.weight"], at::ones({16})));
  EXPECT_EQ(params["layers.3.attention.wq.weight"].sizes(), (std::vector<int64_t>{256, 64}));
  const ModelSpec& spec = get_model_spec("qwen3_next");
  test::expect_stats_count_parameters(spec, {"tiny", "debugmodel"});
  // Qwen3-Next-80B-A3B: 80B parameters, about 3B active per token.
  const ModelStats big = spec.describe("80B-A3B", 1, 4096, at::kBFloat16);
  EXPECT_NEAR(static_cast<double>(big.n_params) / 1e9, 79.67, 0.01);
  EXPECT_NEAR(static_cast<double>(big.n_active_params) / 1e9, 3.87, 0.01);
  EXPECT_EQ(big.n_window_layers, 36);  // the linear layers
}

TEST(Qwen3Next, PackedDocumentsComputeAsAlone) {
  const auto model = tiny_model(2);
  at::NoGradGuard no_grad;
  const at::Tensor a = at::randint(300, {1, 7}, at::kLong);
  const at::Tensor b = at::randint(300, {1, 11}, at::kLong);
  ForwardInputs inputs;
  inputs.document_ids = at::cat({at::zeros({1, 7}, at::kLong), at::ones({1, 11}, at::kLong)}, 1);
  const at::Tensor packed = model->forward(at::cat({a, b}, 1), inputs);
  EXPECT_LT((packed.narrow(1, 7, 11) - model->forward(b)).abs().max().item<double>(), 1e-4);
}

TEST(Qwen3Next, CachedDecodingEqualsTheFullForward) {
  const auto model = tiny_model(3);
  const at::Tensor tokens = at::randint(300, {2, 20}, at::kLong);
  KVCache cache(/*max_len=*/32);
  test::expect_cached_decoding_matches(*model, tokens, /*prefix=*/9, cache);
  // A new sequence at position 0 starts over; a rewind cannot (the recurrent state).
  test::expect_cached_decoding_matches(*model, tokens.flip(1), /*prefix=*/5, cache);
  at::NoGradGuard no_grad;
  EXPECT_NE(test::message_of([&] {
              model->forward_cached(tokens.narrow(1, 3, 1), cache, 3);
            }).find("cannot"),
            std::string::npos);
}

TEST(Qwen3Next, RefusesContextParallelism) {
  const auto model = tiny_model(4);
  EXPECT_NE(model->refuses("context").find("recurrent state"), std::string::npos);
  EXPECT_TRUE(model->refuses("pipeline").empty());
  EXPECT_TRUE(model->refuses("tensor").empty());
  // Tensor parallelism runs the linear-attention layers replicated over whole sequences.
  const std::vector<TpRule> plan = model->tensor_parallel_plan();
  EXPECT_TRUE(std::any_of(plan.begin(), plan.end(), [](const TpRule& r) {
    return r.module == "layers.*.linear_attention" && r.style == TpStyle::kReplicated;
  }));
}

TEST(Qwen3Next, HuggingFaceRoundTrips) {
  llama3::Llama3Args args = llama3::args_for_flavor("tiny", qwen3_next::family());
  const nlohmann::json config = qwen3_next::hf_config(args);
  EXPECT_EQ(config["layer_types"], nlohmann::json({"linear_attention", "linear_attention",
                                                   "linear_attention", "full_attention"}));
  EXPECT_EQ(llama3::describe_args(qwen3_next::args_from_hf_config(config), qwen3_next::family()),
            nlohmann::json({{"name", "qwen3_next"}, {"flavor", "tiny"}}));
  llama3::Transformer model(args);
  const TensorMap ours = test::random_tensors_like(model);
  const TensorMap hf = qwen3_next::to_hf_tensors(ours, args);
  for (const char* name :
       {"model.layers.0.linear_attn.A_log", "model.layers.0.linear_attn.conv1d.weight",
        "model.layers.3.self_attn.q_proj.weight", "model.layers.3.self_attn.q_norm.weight",
        "model.layers.1.mlp.shared_expert_gate.weight",
        "model.layers.1.mlp.shared_expert.down_proj.weight",
        "model.layers.2.mlp.experts.7.gate_proj.weight", "model.layers.2.mlp.gate.weight",
        "model.norm.weight", "lm_head.weight"}) {
    EXPECT_TRUE(hf.count(name)) << name;
  }
  test::expect_same_tensors(ours, qwen3_next::from_hf_tensors(hf, args));
  // Layer types that no interval describes are refused by name.
  nlohmann::json odd = config;
  odd["layer_types"] = {"linear_attention", "full_attention", "linear_attention",
                        "linear_attention"};
  EXPECT_NE(test::message_of([&] { qwen3_next::args_from_hf_config(odd); }).find("layer_types"),
            std::string::npos);
}

}  // namespace test_qwen3_next
}  // namespace titan
