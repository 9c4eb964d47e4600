// The Llama 3 Hugging Face adapter without files: the q/k row permutation (inverse, and the
// rotary equivalence it exists for), tensor names, bitwise round trips, config.json and model
// descriptions, and the errors for what cannot be represented.
#include "hf_test_util.h"

#include "titan/common/check.h"
#include "titan/models/common/rope.h"
#include "titan/models/llama3/hf_adapter.h"

#include <gtest/gtest.h>

#include <set>

namespace titan {
namespace test_hf_adapter {

using test::bit_equal;
using test::contains;
using test::message_of;

const nlohmann::json kTiny = {{"name", "llama3"}, {"flavor", "tiny"}};

TensorMap params_of(const Model& model) {
  TensorMap out;
  for (const auto& item : model.named_parameters()) out.emplace(item.key(), item.value());
  return out;
}

TEST(HfAdapter, PermutationMovesRowsAsHfExpectsAndInverts) {
  const int64_t n_heads = 3;
  const int64_t head_dim = 8;
  const at::Tensor w = at::randn({n_heads * head_dim, 5});
  const at::Tensor hf = llama3::permute_to_hf(w, n_heads);
  // HF row h * hd + p * hd/2 + i holds our row h * hd + 2i + p.
  for (int64_t h = 0; h < n_heads; ++h) {
    for (int64_t i = 0; i < head_dim / 2; ++i) {
      for (int64_t p = 0; p < 2; ++p) {
        EXPECT_TRUE(
            bit_equal(hf[h * head_dim + p * head_dim / 2 + i], w[h * head_dim + 2 * i + p]));
      }
    }
  }
  EXPECT_TRUE(bit_equal(llama3::permute_from_hf(hf, n_heads), w));
  EXPECT_FALSE(bit_equal(hf, w));
  EXPECT_TRUE(contains(message_of([&] {
                         llama3::permute_to_hf(at::randn({10, 4}), 3);
                       }),
                       "3 heads"));
}

// Our interleaved RoPE on q = x wq^T equals HF's rotate_half RoPE on x (permuted wq)^T, up to
// the same per-head permutation of the output features: the reason for the permutation.
TEST(HfAdapter, PermutedWeightsGiveHfRotaryTheSameQueries) {
  const int64_t n_heads = 4, head_dim = 16, dim = 32, seqlen = 7, half = head_dim / 2;
  at::manual_seed(1);
  const at::Tensor x = at::randn({1, seqlen, dim});
  const at::Tensor wq = at::randn({n_heads * head_dim, dim});
  RopeScaling scaling;
  scaling.original_max_position_embeddings = 4;  // puts some frequencies in each band
  const at::Tensor freqs = rope_frequencies(head_dim, 500000.0, &scaling);
  const at::Tensor angles = at::outer(at::arange(seqlen, at::kFloat), freqs);  // (seqlen, half)

  const at::Tensor q = at::matmul(x, wq.t()).view({1, seqlen, n_heads, head_dim});
  const at::Tensor ours = apply_rotary_emb(q, angles.cos(), angles.sin());

  const at::Tensor q_hf =
      at::matmul(x, llama3::permute_to_hf(wq, n_heads).t()).view({1, seqlen, n_heads, head_dim});
  const at::Tensor emb = at::cat({angles, angles}, -1).view({1, seqlen, 1, head_dim});
  const at::Tensor rotated = at::cat({-q_hf.narrow(-1, half, half), q_hf.narrow(-1, 0, half)}, -1);
  const at::Tensor theirs = q_hf * emb.cos() + rotated * emb.sin();
  // HF feature p * half + i is our feature 2i + p.
  const at::Tensor theirs_in_our_order =
      theirs.view({1, seqlen, n_heads, 2, half}).transpose(-1, -2).reshape(ours.sizes());
  EXPECT_TRUE(at::allclose(theirs_in_our_order, ours, /*rtol=*/1e-5, /*atol=*/1e-5));
}

TEST(HfAdapter, TensorNamesMatchTransformersLlama) {
  const auto model = test::seeded_model(kTiny, 0);
  const auto hf = get_model_spec("llama3").hf.to_hf(params_of(*model), kTiny);
  std::set<std::string> names;
  for (const auto& item : hf) names.insert(item.first);
  std::set<std::string> expected = {"model.embed_tokens.weight", "model.norm.weight",
                                    "lm_head.weight"};
  for (int layer = 0; layer < 2; ++layer) {
    const std::string p = "model.layers." + std::to_string(layer) + ".";
    for (const char* n :
         {"self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
          "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
          "mlp.down_proj.weight", "input_layernorm.weight", "post_attention_layernorm.weight"}) {
      expected.insert(p + n);
    }
  }
  EXPECT_EQ(names, expected);
  // gate = w1, up = w3, down = w2 (SwiGLU: w2(silu(w1 x) * w3 x)); v and o unpermuted.
  const TensorMap ours = params_of(*model);
  EXPECT_TRUE(bit_equal(hf.at("model.layers.1.mlp.gate_proj.weight"),
                        ours.at("layers.1.feed_forward.w1.weight")));
  EXPECT_TRUE(bit_equal(hf.at("model.layers.1.mlp.up_proj.weight"),
                        ours.at("layers.1.feed_forward.w3.weight")));
  EXPECT_TRUE(bit_equal(hf.at("model.layers.1.mlp.down_proj.weight"),
                        ours.at("layers.1.feed_forward.w2.weight")));
  EXPECT_TRUE(bit_equal(hf.at("model.layers.0.self_attn.v_proj.weight"),
                        ours.at("layers.0.attention.wv.weight")));
  // tiny has 4 heads and 2 kv heads.
  EXPECT_TRUE(bit_equal(hf.at("model.layers.0.self_attn.k_proj.weight"),
                        llama3::permute_to_hf(ours.at("layers.0.attention.wk.weight"), 2)));
  EXPECT_TRUE(bit_equal(hf.at("model.layers.0.self_attn.q_proj.weight"),
                        llama3::permute_to_hf(ours.at("layers.0.attention.wq.weight"), 4)));
}

void expect_round_trip(const nlohmann::json& description) {
  const ModelSpec& spec = get_model_spec("llama3");
  const auto model = test::seeded_model(description, 7);
  const TensorMap ours = params_of(*model);
  const TensorMap hf = spec.hf.to_hf(ours, description);
  const TensorMap back = spec.hf.from_hf(hf, description);
  ASSERT_EQ(back.size(), ours.size());
  for (const auto& [name, tensor] : ours) {
    ASSERT_TRUE(back.count(name)) << name;
    EXPECT_TRUE(bit_equal(back.at(name), tensor)) << name;
  }
}

TEST(HfAdapter, RoundTripIsBitIdentical) {
  expect_round_trip(kTiny);
  expect_round_trip({{"name", "llama3"}, {"flavor", "debugmodel"}});
  const nlohmann::json tied = test::custom_tied_gqa_description();
  expect_round_trip(tied);
  const auto hf = get_model_spec("llama3").hf.to_hf(params_of(*test::seeded_model(tied, 0)), tied);
  EXPECT_EQ(hf.count("lm_head.weight"), 0u);  // tied: transformers re-ties it on load
}

TEST(HfAdapter, FromHfDropsBuffersAndTiedHeadRejectsUnknownNames) {
  const ModelSpec& spec = get_model_spec("llama3");
  const nlohmann::json tied = test::custom_tied_gqa_description();
  TensorMap hf = spec.hf.to_hf(params_of(*test::seeded_model(tied, 0)), tied);
  const size_t n = hf.size();
  hf["model.layers.0.self_attn.rotary_emb.inv_freq"] = at::ones({8});
  hf["lm_head.weight"] = hf.at("model.embed_tokens.weight");
  EXPECT_EQ(spec.hf.from_hf(hf, tied).size(), n);
  hf["model.layers.0.mlp.extra.weight"] = at::ones({2});
  EXPECT_TRUE(contains(message_of([&] { spec.hf.from_hf(hf, tied); }),
                       "unexpected tensor 'model.layers.0.mlp.extra.weight'"));
  TensorMap ours = {{"layers.0.attention.wz.weight", at::ones({2})}};
  EXPECT_TRUE(
      contains(message_of([&] { spec.hf.to_hf(ours, tied); }), "layers.0.attention.wz.weight"));
}

TEST(HfAdapter, ConfigJsonOfAFlavor) {
  const nlohmann::json config =
      get_model_spec("llama3").hf.to_hf_config({{"name", "llama3"}, {"flavor", "8B"}});
  EXPECT_EQ(config["architectures"], nlohmann::json({"LlamaForCausalLM"}));
  EXPECT_EQ(config["model_type"], "llama");
  EXPECT_EQ(config["hidden_size"], 4096);
  EXPECT_EQ(config["intermediate_size"], 14336);
  EXPECT_EQ(config["num_hidden_layers"], 32);
  EXPECT_EQ(config["num_attention_heads"], 32);
  EXPECT_EQ(config["num_key_value_heads"], 8);
  EXPECT_EQ(config["vocab_size"], 128256);
  EXPECT_EQ(config["rms_norm_eps"], 1e-5);
  EXPECT_EQ(config["rope_theta"], 500000.0);
  EXPECT_EQ(config["tie_word_embeddings"], false);
  EXPECT_EQ(config["rope_scaling"]["rope_type"], "llama3");
  EXPECT_EQ(config["rope_scaling"]["factor"], 8.0);
  EXPECT_EQ(config["rope_scaling"]["original_max_position_embeddings"], 8192);
}

// Meta's published Llama-3.1-8B config.json (the keys that matter) maps to our 8B flavor.
TEST(HfAdapter, PublishedLlama31ConfigIsThe8BFlavor) {
  const nlohmann::json config = nlohmann::json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 4096,
    "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 131072,
    "mlp_bias": false, "model_type": "llama", "num_attention_heads": 32,
    "num_hidden_layers": 32, "num_key_value_heads": 8, "pretraining_tp": 1,
    "rms_norm_eps": 1e-05, "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0,
    "high_freq_factor": 4.0, "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
    "transformers_version": "4.43.0.dev0", "use_cache": true, "vocab_size": 128256})");
  const nlohmann::json description = get_model_spec("llama3").hf.from_hf_config(config);
  EXPECT_EQ(description, nlohmann::json({{"name", "llama3"}, {"flavor", "8B"}}));
}

// transformers >= 5 writes RoPE as one "rope_parameters" object (theta inside, no top-level
// "rope_theta") and "dtype" for "torch_dtype": LlamaConfig(...).save_pretrained of the tiny
// flavor's sizes.
TEST(HfAdapter, Transformers5RopeParametersAreRead) {
  nlohmann::json config = nlohmann::json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 1, "dtype": "bfloat16", "eos_token_id": 2, "head_dim": 16,
    "hidden_act": "silu", "hidden_size": 64, "initializer_range": 0.02, "intermediate_size": 192,
    "max_position_embeddings": 16384, "mlp_bias": false, "model_type": "llama",
    "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 2,
    "pad_token_id": null, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_parameters": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
      "original_max_position_embeddings": 8192, "rope_theta": 500000.0, "rope_type": "llama3"},
    "tie_word_embeddings": false, "transformers_version": "5.23.0", "use_cache": true,
    "vocab_size": 300})");
  const HfAdapter& hf = get_model_spec("llama3").hf;
  EXPECT_EQ(
      hf.from_hf_config(config),
      nlohmann::json({{"name", "llama3"}, {"flavor", "tiny"}, {"args", {{"max_seq_len", 16384}}}}));

  // Other llama3 parameters and theta; original_max_position_embeddings defaults to
  // max_position_embeddings, as transformers 5 fills it in.
  config["rope_parameters"] = {{"rope_type", "llama3"},
                               {"rope_theta", 20000.0},
                               {"factor", 4.0},
                               {"low_freq_factor", 2.0},
                               {"high_freq_factor", 8.0}};
  llama3::Llama3Args args = llama3::args_from_hf_config(config);
  EXPECT_EQ(args.rope_theta, 20000.0);
  EXPECT_TRUE(args.use_rope_scaling);
  EXPECT_EQ(args.rope_scaling.scaling_factor, 4.0);
  EXPECT_EQ(args.rope_scaling.low_freq_factor, 2.0);
  EXPECT_EQ(args.rope_scaling.high_freq_factor, 8.0);
  EXPECT_EQ(args.rope_scaling.original_max_position_embeddings, 16384);

  // The default rope type: no scaling, theta from the object.
  config["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 123456.0}};
  args = llama3::args_from_hf_config(config);
  EXPECT_FALSE(args.use_rope_scaling);
  EXPECT_EQ(args.rope_theta, 123456.0);

  // A non-empty "rope_scaling" wins, with the top-level "rope_theta" (older files with both).
  config["rope_theta"] = 7000.0;
  config["rope_scaling"] = {{"rope_type", "llama3"},
                            {"factor", 2.0},
                            {"low_freq_factor", 1.0},
                            {"high_freq_factor", 4.0},
                            {"original_max_position_embeddings", 64}};
  config["rope_parameters"] = {{"rope_type", "default"}};
  args = llama3::args_from_hf_config(config);
  EXPECT_TRUE(args.use_rope_scaling);
  EXPECT_EQ(args.rope_theta, 7000.0);
  EXPECT_EQ(args.rope_scaling.scaling_factor, 2.0);
  EXPECT_EQ(args.rope_scaling.original_max_position_embeddings, 64);

  config.erase("rope_scaling");
  config["rope_parameters"] = {{"rope_type", "yarn"}, {"rope_theta", 1e4}, {"factor", 4.0}};
  EXPECT_TRUE(contains(message_of([&] { hf.from_hf_config(config); }),
                       "rope_parameters type 'yarn' is not supported"));
  config["rope_parameters"] = {{"rope_type", "default"}, {"partial_rotary_factor", 0.5}};
  EXPECT_TRUE(contains(message_of([&] { hf.from_hf_config(config); }), "partial_rotary_factor"));
  config["rope_parameters"] = {{"rope_type", 3}};
  EXPECT_TRUE(contains(message_of([&] { hf.from_hf_config(config); }),
                       "\"rope_parameters\".rope_type must be a string"));
}

TEST(HfAdapter, ConfigRoundTripsThroughADescription) {
  const HfAdapter& hf = get_model_spec("llama3").hf;
  for (const nlohmann::json& description :
       {kTiny, test::custom_tied_gqa_description(),
        nlohmann::json{{"name", "llama3"}, {"flavor", "3B"}, {"args", {{"max_seq_len", 4096}}}}}) {
    const nlohmann::json config = hf.to_hf_config(description);
    const nlohmann::json back = hf.from_hf_config(config);
    EXPECT_EQ(hf.to_hf_config(back), config) << description.dump();
    EXPECT_EQ(get_model_spec("llama3").resolve_args(back),
              get_model_spec("llama3").resolve_args(description));
  }
  // The custom description comes back as "custom" with full args that rebuild the same config.
  const nlohmann::json custom =
      hf.from_hf_config(hf.to_hf_config(test::custom_tied_gqa_description()));
  EXPECT_EQ(custom["flavor"], "custom");
  EXPECT_EQ(custom["args"]["ffn_dim"], 200);
  EXPECT_EQ(custom["args"]["tie_embeddings"], true);
  // A registered flavor with another max_position_embeddings keeps the flavor name.
  nlohmann::json config = hf.to_hf_config(kTiny);
  config["max_position_embeddings"] = 1024;
  EXPECT_EQ(
      hf.from_hf_config(config),
      nlohmann::json({{"name", "llama3"}, {"flavor", "tiny"}, {"args", {{"max_seq_len", 1024}}}}));
}

TEST(HfAdapter, MinimalConfigUsesTransformersDefaults) {
  const nlohmann::json config = {{"model_type", "llama"},    {"hidden_size", 64},
                                 {"num_hidden_layers", 1},   {"num_attention_heads", 4},
                                 {"intermediate_size", 100}, {"vocab_size", 50}};
  const llama3::Llama3Args args = llama3::args_from_hf_config(config);
  EXPECT_EQ(args.kv_heads(), 4);
  EXPECT_EQ(args.ffn_hidden_dim(), 100);
  EXPECT_EQ(args.norm_eps, 1e-6);
  EXPECT_EQ(args.rope_theta, 10000.0);
  EXPECT_FALSE(args.use_rope_scaling);
  EXPECT_FALSE(args.tie_embeddings);
  EXPECT_EQ(args.max_seq_len, 2048);
}

TEST(HfAdapter, UnsupportedConfigsAreNamed) {
  const HfAdapter& hf = get_model_spec("llama3").hf;
  const nlohmann::json base = hf.to_hf_config(kTiny);
  const auto error_with = [&](const std::string& key, const nlohmann::json& value) {
    nlohmann::json config = base;
    if (value.is_discarded()) {
      config.erase(key);
    } else {
      config[key] = value;
    }
    return message_of([&] { hf.from_hf_config(config); });
  };
  EXPECT_TRUE(contains(error_with("hidden_act", "gelu"), "\"hidden_act\""));
  EXPECT_TRUE(contains(error_with("attention_bias", true), "\"attention_bias\""));
  EXPECT_TRUE(contains(error_with("head_dim", 32), "head_dim 32"));
  EXPECT_TRUE(
      contains(error_with("rope_scaling", {{"rope_type", "yarn"}, {"factor", 4.0}}), "'yarn'"));
  EXPECT_TRUE(
      contains(error_with("hidden_size", nlohmann::json::value_t::discarded), "hidden_size"));
  EXPECT_TRUE(
      contains(error_with("num_key_value_heads", 3), "n_kv_heads (3) must divide n_heads (4)"));
  EXPECT_TRUE(contains(error_with("vocab_size", "many"), "\"vocab_size\" must be an integer"));
  // rope_type "default" (and the older "type" key) are understood.
  nlohmann::json config = base;
  config["rope_scaling"] = {{"type", "default"}};
  EXPECT_EQ(hf.from_hf_config(config)["flavor"], "custom");  // tiny scales rope; this does not
}

TEST(HfAdapter, DescriptionErrorsNameTheNearestKey) {
  const ModelSpec& spec = get_model_spec("llama3");
  EXPECT_TRUE(contains(
      message_of([&] {
        spec.resolve_args({{"name", "llama3"}, {"flavor", "tiny"}, {"args", {{"n_head", 2}}}});
      }),
      "unknown key 'n_head' in llama3 args; did you mean 'n_heads'?"));
  EXPECT_TRUE(contains(message_of([&] {
                         spec.resolve_args({{"name", "llama3"}, {"flavor", "tinyy"}});
                       }),
                       "did you mean 'tiny'?"));
  EXPECT_TRUE(contains(
      message_of([&] {
        spec.resolve_args({{"name", "llama3"}, {"flavor", "tiny"}, {"args", {{"dim", 1.5}}}});
      }),
      "dim must be an integer"));
  EXPECT_TRUE(contains(message_of([&] {
                         spec_for_description({{"flavor", "tiny"}});
                       }),
                       "no \"name\""));
  EXPECT_TRUE(contains(message_of([&] { spec_for_hf_model_type("mistral"); }),
                       "model_type 'mistral' is not supported"));
  // A description's args are exactly what args_to_json writes.
  const llama3::Llama3Args args = llama3::args_for_flavor("bench_small");
  const nlohmann::json custom = {
      {"name", "llama3"}, {"flavor", "custom"}, {"args", llama3::args_to_json(args)}};
  EXPECT_EQ(llama3::args_to_json(llama3::args_from_description(custom)),
            llama3::args_to_json(args));
  EXPECT_EQ(llama3::describe_args(args),
            nlohmann::json({{"name", "llama3"}, {"flavor", "bench_small"}}));
}

}  // namespace test_hf_adapter
}  // namespace titan
