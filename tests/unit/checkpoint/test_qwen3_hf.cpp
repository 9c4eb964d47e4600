// The Qwen3 Hugging Face adapter without files: tensor names and shapes of Qwen3ForCausalLM and
// Qwen3MoeForCausalLM, bitwise round trips (dense and MoE), the q/k norm permutation, config.json
// and model descriptions, and the configs it refuses. tests/e2e/test_qwen3_hf.sh checks the
// numbers against transformers itself.
#include "hf_test_util.h"

#include "titan/checkpoint/hf_convert.h"
#include "titan/common/check.h"
#include "titan/models/llama3/hf_adapter.h"

#include <gtest/gtest.h>

namespace titan {
namespace test_qwen3_hf {

using test::bit_equal;
using test::contains;
using test::message_of;

const nlohmann::json kTiny = {{"name", "qwen3"}, {"flavor", "tiny"}};
const nlohmann::json kTinyMoe = {{"name", "qwen3"}, {"flavor", "tiny_moe"}};

// The parameters by FQN, as the converters hand them to the adapter.
TensorMap params_of(const Model& model) { return ckpt::model_tensors(model); }

TEST(Qwen3Hf, RoundTripIsBitIdentical) {
  const HfAdapter& hf = get_model_spec("qwen3").hf;
  for (const nlohmann::json& description : {kTiny, kTinyMoe}) {
    SCOPED_TRACE(description.dump());
    const TensorMap ours = params_of(*test::seeded_model(description, 3));
    const TensorMap back = hf.from_hf(hf.to_hf(ours, description), description);
    ASSERT_EQ(back.size(), ours.size());
    for (const auto& [name, tensor] : ours) {
      ASSERT_EQ(back.count(name), 1u) << name;
      EXPECT_TRUE(bit_equal(back.at(name), tensor)) << name;
    }
  }
}

TEST(Qwen3Hf, NamesAndShapesAreTransformers) {
  const HfAdapter& hf = get_model_spec("qwen3").hf;
  // tiny: dim 64, 4 heads of 32, 2 kv heads, ffn 128, vocab 300, untied.
  const TensorMap dense = hf.to_hf(params_of(*test::seeded_model(kTiny, 0)), kTiny);
  EXPECT_EQ(dense.size(), 3u + 2u * 11u);
  EXPECT_EQ(dense.at("model.layers.1.self_attn.q_norm.weight").sizes(), at::IntArrayRef({32}));
  EXPECT_EQ(dense.at("model.layers.1.self_attn.k_proj.weight").sizes(), at::IntArrayRef({64, 64}));
  EXPECT_EQ(dense.at("model.layers.0.mlp.gate_proj.weight").sizes(), at::IntArrayRef({128, 64}));
  EXPECT_EQ(dense.count("lm_head.weight"), 1u);
  // tiny_moe: 4 experts of hidden 64, one 2-D tensor per expert and projection.
  const TensorMap moe = hf.to_hf(params_of(*test::seeded_model(kTinyMoe, 0)), kTinyMoe);
  EXPECT_EQ(moe.size(), 3u + 2u * (8u + 1u + 4u * 3u));
  EXPECT_EQ(moe.at("model.layers.1.mlp.gate.weight").sizes(), at::IntArrayRef({4, 64}));
  EXPECT_EQ(moe.at("model.layers.1.mlp.experts.3.gate_proj.weight").sizes(),
            at::IntArrayRef({64, 64}));
  EXPECT_EQ(moe.at("model.layers.0.mlp.experts.0.down_proj.weight").sizes(),
            at::IntArrayRef({64, 64}));
  EXPECT_EQ(moe.count("model.layers.0.mlp.gate_proj.weight"), 0u);
}

TEST(Qwen3Hf, NormWeightsFollowTheRowPermutation) {
  const HfAdapter& hf = get_model_spec("qwen3").hf;
  const TensorMap ours = params_of(*test::seeded_model(kTiny, 1));
  const TensorMap out = hf.to_hf(ours, kTiny);
  const at::Tensor q_norm = ours.at("layers.0.attention.q_norm.weight");
  const at::Tensor hf_norm = out.at("model.layers.0.self_attn.q_norm.weight");
  // As for wq's rows within a head: HF entry p * hd/2 + i holds our entry 2i + p.
  const int64_t hd = q_norm.size(0);
  for (int64_t i = 0; i < hd / 2; ++i) {
    for (int64_t p = 0; p < 2; ++p) {
      EXPECT_TRUE(bit_equal(hf_norm[p * hd / 2 + i], q_norm[2 * i + p]));
    }
  }
  EXPECT_TRUE(bit_equal(out.at("model.layers.0.self_attn.q_proj.weight"),
                        llama3::permute_to_hf(ours.at("layers.0.attention.wq.weight"), 4)));
}

TEST(Qwen3Hf, FusedExpertTensorsAreRead) {
  const HfAdapter& hf = get_model_spec("qwen3").hf;
  const TensorMap ours = params_of(*test::seeded_model(kTinyMoe, 2));
  TensorMap fused;
  for (const auto& [name, t] : hf.to_hf(ours, kTinyMoe)) {
    if (name.find(".mlp.experts.") == std::string::npos) fused.emplace(name, t);
  }
  for (int layer = 0; layer < 2; ++layer) {
    const std::string l = "layers." + std::to_string(layer);
    fused.emplace(
        "model." + l + ".mlp.experts.gate_up_proj",
        at::cat({ours.at(l + ".moe.experts.w1.weight"), ours.at(l + ".moe.experts.w3.weight")},
                /*dim=*/1));
    fused.emplace("model." + l + ".mlp.experts.down_proj", ours.at(l + ".moe.experts.w2.weight"));
  }
  const TensorMap back = hf.from_hf(fused, kTinyMoe);
  ASSERT_EQ(back.size(), ours.size());
  for (const auto& [name, tensor] : ours) EXPECT_TRUE(bit_equal(back.at(name), tensor)) << name;
}

TEST(Qwen3Hf, ConfigRoundTripsToTheFlavor) {
  const HfAdapter& hf = get_model_spec("qwen3").hf;
  for (const char* flavor : {"tiny", "tiny_moe", "0.6B", "8B", "30B-A3B"}) {
    SCOPED_TRACE(flavor);
    const nlohmann::json description = {{"name", "qwen3"}, {"flavor", flavor}};
    const nlohmann::json config = hf.to_hf_config(description);
    EXPECT_EQ(hf.from_hf_config(config), description);
  }
  const nlohmann::json moe = hf.to_hf_config({{"name", "qwen3"}, {"flavor", "30B-A3B"}});
  EXPECT_EQ(moe["model_type"], "qwen3_moe");
  EXPECT_EQ(moe["architectures"][0], "Qwen3MoeForCausalLM");
  EXPECT_EQ(moe["num_experts"], 128);
  EXPECT_EQ(moe["num_experts_per_tok"], 8);
  EXPECT_EQ(moe["moe_intermediate_size"], 768);
  EXPECT_EQ(moe["norm_topk_prob"], true);
  EXPECT_EQ(moe["head_dim"], 128);
  const nlohmann::json dense = hf.to_hf_config({{"name", "qwen3"}, {"flavor", "0.6B"}});
  EXPECT_EQ(dense["model_type"], "qwen3");
  EXPECT_EQ(dense["tie_word_embeddings"], true);
  EXPECT_EQ(dense["head_dim"], 128);  // != hidden_size / num_attention_heads (64)
}

TEST(Qwen3Hf, RefusesWhatItCannotRepresent) {
  const HfAdapter& hf = get_model_spec("qwen3").hf;
  nlohmann::json config = hf.to_hf_config(kTinyMoe);
  config["decoder_sparse_step"] = 2;
  EXPECT_TRUE(contains(message_of([&] { hf.from_hf_config(config); }), "decoder_sparse_step"));
  config = hf.to_hf_config(kTinyMoe);
  config["mlp_only_layers"] = {1};
  EXPECT_TRUE(contains(message_of([&] { hf.from_hf_config(config); }), "mlp_only_layers"));
  config = hf.to_hf_config(kTiny);
  config["use_sliding_window"] = true;
  EXPECT_TRUE(contains(message_of([&] { hf.from_hf_config(config); }), "use_sliding_window"));
  // The first dense layers are mlp_only_layers [0, ..., n - 1].
  config = hf.to_hf_config(kTinyMoe);
  config["mlp_only_layers"] = {0};
  const nlohmann::json description = hf.from_hf_config(config);
  EXPECT_EQ(description["args"]["n_dense_layers"], 1);
  EXPECT_EQ(hf.to_hf_config(description)["mlp_only_layers"], nlohmann::json({0}));
  // Missing experts are named.
  TensorMap out = hf.to_hf(params_of(*test::seeded_model(kTinyMoe, 0)), kTinyMoe);
  out.erase("model.layers.1.mlp.experts.2.up_proj.weight");
  EXPECT_TRUE(contains(message_of([&] { hf.from_hf(out, kTinyMoe); }), "layer 1 has 3 w3"));
}

}  // namespace test_qwen3_hf
}  // namespace titan
