// Generation on a randomly initialized `tiny` llama3: greedy decoding with and without the KV
// cache gives the same tokens; sampling is a pure function of the seed; stop conditions; the
// sampler's cuts and frequencies; UTF-8-safe text streaming.
#include "titan/common/check.h"
#include "titan/components/tokenizer/tokenizer.h"
#include "titan/inference/generator.h"
#include "titan/inference/sampler.h"
#include "titan/inference/text_stream.h"
#include "titan/models/common/linear.h"
#include "titan/models/llama3/model.h"
#include "titan/models/registry.h"

#include <c10/core/InferenceMode.h>

#include <gtest/gtest.h>

#include <limits>
#include <map>
#include <set>

namespace titan {
namespace test_generate {

std::shared_ptr<Model> tiny_model(at::ScalarType compute_dtype = at::kFloat,
                                  int64_t max_seq_len = 128) {
  ModelBuildOptions options;
  options.max_seq_len = max_seq_len;
  options.compute_dtype = compute_dtype;
  at::manual_seed(0);
  return get_model_spec("llama3").build("tiny", options);
}

const std::vector<int64_t> kPrompt = {256, 72, 101, 108, 108, 111};  // BOS "Hello"

GenerationOptions greedy(int64_t max_new_tokens, bool use_kv_cache) {
  GenerationOptions options;
  options.max_new_tokens = max_new_tokens;
  options.max_seq_len = 128;
  options.use_kv_cache = use_kv_cache;
  options.sampler.temperature = 0.0;
  return options;
}

std::vector<int64_t> generated(const GenerationResult& result) {
  return {result.tokens.begin() + result.n_prompt, result.tokens.end()};
}

TEST(Generate, GreedyWithAndWithoutKVCacheAgree) {
  const auto model = tiny_model();
  const GenerationResult cached = generate(*model, kPrompt, greedy(40, true));
  const GenerationResult uncached = generate(*model, kPrompt, greedy(40, false));
  EXPECT_EQ(cached.n_generated, 40);
  EXPECT_EQ(cached.stop_reason, StopReason::kMaxNewTokens);
  EXPECT_EQ(cached.tokens, uncached.tokens);
  // The output is not degenerate (a random model's greedy run still moves between tokens).
  const std::vector<int64_t> ids = generated(cached);
  EXPECT_GT(std::set<int64_t>(ids.begin(), ids.end()).size(), 1u);
  EXPECT_EQ(std::vector<int64_t>(cached.tokens.begin(), cached.tokens.begin() + 6), kPrompt);
}

TEST(Generate, GreedyAgreesUnderBFloat16WithCastParameters) {
  // Inference casts the weights to bf16 once; the cached and uncached paths then round the same
  // weights, and greedy tokens agree on this model.
  const auto model = tiny_model(at::kBFloat16);
  cast_parameters_for_inference(*model, at::kBFloat16);
  for (const auto& param : model->parameters()) {
    EXPECT_EQ(param.scalar_type(), at::kBFloat16);
  }
  const GenerationResult cached = generate(*model, kPrompt, greedy(20, true));
  const GenerationResult uncached = generate(*model, kPrompt, greedy(20, false));
  EXPECT_EQ(cached.tokens, uncached.tokens);
}

// The largest |a - b| relative to the largest |b|.
double relative_gap(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>() /
         b.to(at::kDouble).abs().max().item<double>();
}

TEST(Generate, PreparedModelComputesTheSame) {
  const auto plain = tiny_model();
  const auto prepared = tiny_model();  // same seed: the same weights
  std::vector<at::Tensor> before;
  for (const auto& p : prepared->parameters()) before.push_back(p.clone());
  const InferencePreparation prep = prepare_for_inference(*prepared);
  // tiny: 2 layers, each wq/wk/wv and w1/w3; 5 RMSNorm (2 per layer, final), 2 SwiGLU, 1 RoPE.
  EXPECT_EQ(prep.packed, 4);
  EXPECT_EQ(prep.fused, 8);
  const auto params = prepared->named_parameters();
  ASSERT_EQ(params.size(), before.size());
  for (size_t i = 0; i < before.size(); ++i) {
    EXPECT_TRUE(at::equal(params[i].value(), before[i])) << params[i].key();
  }
  // The packed layers read one matrix: wk's rows follow wq's in memory.
  const at::Tensor wq = params["layers.0.attention.wq.weight"];
  const at::Tensor wk = params["layers.0.attention.wk.weight"];
  EXPECT_EQ(static_cast<const float*>(wk.const_data_ptr()),
            static_cast<const float*>(wq.const_data_ptr()) + wq.numel());

  const at::Tensor tokens = at::tensor(kPrompt, at::kLong).view({1, -1});
  {
    c10::InferenceMode inference;
    EXPECT_LT(relative_gap(prepared->forward(tokens), plain->forward(tokens)), 1e-5);
    // The KV-cache path, prefill then one step, against the full forward.
    KVCache cache(16);
    prepared->forward_cached(tokens.narrow(1, 0, 5), cache, 0);
    const at::Tensor step = prepared->forward_cached(tokens.narrow(1, 5, 1), cache, 5);
    EXPECT_LT(relative_gap(step[0][0], plain->forward(tokens)[0][5]), 1e-5);
  }
  const GenerationResult a = generate(*plain, kPrompt, greedy(40, true));
  EXPECT_EQ(generate(*prepared, kPrompt, greedy(40, true)).tokens, a.tokens);
  EXPECT_EQ(generate(*prepared, kPrompt, greedy(40, false)).tokens, a.tokens);
}

TEST(Generate, PackingFollowsLaterChanges) {
  // Preparing before the bf16 cast: the cast rebinds every parameter, the packs are no longer
  // intact and the layers compute one by one, still correctly.
  const auto model = tiny_model(at::kBFloat16);
  const auto reference = tiny_model(at::kBFloat16);
  cast_parameters_for_inference(*reference, at::kBFloat16);
  EXPECT_EQ(prepare_for_inference(*model).packed, 4);
  cast_parameters_for_inference(*model, at::kBFloat16);
  const auto* block = dynamic_cast<llama3::Transformer*>(model.get())->layers[0].get();
  EXPECT_FALSE(block->attention->packed_qkv.intact());
  EXPECT_FALSE(block->feed_forward->packed_w13.intact());
  const GenerationResult expected = generate(*reference, kPrompt, greedy(20, true));
  EXPECT_EQ(generate(*model, kPrompt, greedy(20, true)).tokens, expected.tokens);
  // Prepared after the cast (as `titan generate` does): packed in bf16, same tokens.
  const auto packed = tiny_model(at::kBFloat16);
  cast_parameters_for_inference(*packed, at::kBFloat16);
  EXPECT_EQ(prepare_for_inference(*packed).packed, 4);
  EXPECT_TRUE(
      dynamic_cast<llama3::Transformer*>(packed.get())->layers[1]->attention->packed_qkv.intact());
  EXPECT_EQ(generate(*packed, kPrompt, greedy(20, true)).tokens, expected.tokens);
}

TEST(PackedLinear, OutputsMatchTheLayersAndRefusesWhatItCannotPack) {
  at::manual_seed(3);
  const auto make = [](int64_t in, int64_t out) {
    auto layer = std::make_shared<Linear>(in, out);
    at::NoGradGuard no_grad;
    layer->weight.normal_();
    return layer;
  };
  auto a = make(7, 5), b = make(7, 3), c = make(7, 4);
  const at::Tensor wa = a->weight.clone(), wb = b->weight.clone(), wc = c->weight.clone();
  PackedLinear packed;
  EXPECT_FALSE(packed.intact());
  ASSERT_TRUE(packed.pack({a.get(), b.get(), c.get()}));
  EXPECT_TRUE(packed.intact());
  EXPECT_TRUE(at::equal(a->weight, wa) && at::equal(b->weight, wb) && at::equal(c->weight, wc));
  EXPECT_TRUE(a->weight.is_same(a->registered_weight()));
  at::NoGradGuard no_grad;
  for (const int64_t rows : {1, 4}) {
    const at::Tensor x = at::randn({1, rows, 7});
    const std::vector<at::Tensor> outs = packed.forward(x);
    ASSERT_EQ(outs.size(), 3u);
    EXPECT_LT(relative_gap(outs[0], at::linear(x, wa)), 1e-6);
    EXPECT_LT(relative_gap(outs[1], at::linear(x, wb)), 1e-6);
    EXPECT_LT(relative_gap(outs[2], at::linear(x, wc)), 1e-6);
    EXPECT_EQ(outs[2].sizes(), (std::vector<int64_t>{1, rows, 4}));
  }
  // A rebound weight (a cast, a move) breaks the pack; the layer keeps its own tensor.
  b->weight.set_data(wb.clone());
  EXPECT_FALSE(packed.intact());

  PackedLinear refused;
  auto other_in = make(6, 2);
  EXPECT_FALSE(refused.pack({a.get(), other_in.get()}));
  auto f8 = make(7, 2);
  f8->float8 = Float8LinearOptions{};
  EXPECT_FALSE(refused.pack({a.get(), f8.get()}));
  auto half = make(7, 2);
  half->weight.set_data(half->weight.to(at::kBFloat16));
  EXPECT_FALSE(refused.pack({a.get(), half.get()}));
  EXPECT_FALSE(refused.intact());
  EXPECT_TRUE(at::equal(a->weight, wa));  // untouched by the refusals
}

TEST(Generate, SamplingIsDeterministicPerSeed) {
  const auto model = tiny_model();
  GenerationOptions options = greedy(30, true);
  options.sampler.temperature = 1.0;
  options.sampler.top_k = 50;
  options.sampler.top_p = 0.95;
  options.sampler.seed = 1234;
  const GenerationResult a = generate(*model, kPrompt, options);
  const GenerationResult b = generate(*model, kPrompt, options);
  EXPECT_EQ(a.tokens, b.tokens);
  options.use_kv_cache = false;  // same logits up to rounding, so the same draws here
  EXPECT_EQ(generate(*model, kPrompt, options).tokens, a.tokens);
  options.use_kv_cache = true;
  options.sampler.seed = 4321;
  // 30 draws from a near-uniform distribution over 50 tokens: equal only by a ~1e-50 chance.
  EXPECT_NE(generate(*model, kPrompt, options).tokens, a.tokens);
}

TEST(Generate, StopsAtEos) {
  const auto model = tiny_model();
  const GenerationResult free_run = generate(*model, kPrompt, greedy(10, true));
  GenerationOptions options = greedy(10, true);
  options.eos_id = free_run.tokens[kPrompt.size() + 2];  // the third generated token
  const GenerationResult result = generate(*model, kPrompt, options);
  EXPECT_EQ(result.stop_reason, StopReason::kEos);
  // Stops at the first occurrence, EOS included.
  const std::vector<int64_t> ids = generated(result);
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids.back(), options.eos_id);
  EXPECT_LE(ids.size(), 3u);
  EXPECT_EQ(ids.size(), static_cast<size_t>(result.n_generated));
}

TEST(Generate, StopsAtMaxSeqLen) {
  const auto model = tiny_model();
  GenerationOptions options = greedy(50, true);
  options.max_seq_len = 10;
  const GenerationResult result = generate(*model, kPrompt, options);
  EXPECT_EQ(result.stop_reason, StopReason::kMaxSeqLen);
  EXPECT_EQ(result.tokens.size(), 10u);
  EXPECT_EQ(result.n_generated, 4);
  EXPECT_STREQ(to_string(result.stop_reason), "max_seq_len");
  // A prompt that already fills max_seq_len leaves no room: a usage error.
  options.max_seq_len = 6;
  EXPECT_THROW(generate(*model, kPrompt, options), ConfigError);
  EXPECT_THROW(generate(*model, {}, greedy(5, true)), ConfigError);
}

TEST(Generate, VocabLimitAndStreamingCallback) {
  const auto model = tiny_model();
  GenerationOptions options = greedy(0, true);
  options.max_new_tokens = 25;
  options.sampler.temperature = 1.0;
  options.vocab_limit = 5;
  std::vector<int64_t> streamed;
  const GenerationResult result =
      generate(*model, kPrompt, options, [&](int64_t id) { streamed.push_back(id); });
  EXPECT_EQ(streamed, generated(result));
  for (int64_t id : streamed) {
    EXPECT_LT(id, 5);
  }
  EXPECT_GT(result.prefill_seconds, 0.0);
  EXPECT_GT(result.decode_seconds, 0.0);
  EXPECT_GT(result.decode_tokens_per_second(), 0.0);
  // Zero new tokens is a valid (empty) generation.
  EXPECT_EQ(generate(*model, kPrompt, greedy(0, true)).n_generated, 0);
}

TEST(Sampler, CutsAndFrequencies) {
  const at::Tensor logits = at::log(at::tensor({0.1, 0.2, 0.3, 0.4}, at::kFloat));
  SamplerOptions options;
  options.temperature = 0.0;
  EXPECT_EQ(Sampler(options).sample(logits), 3);
  // top_k 1 and a tiny nucleus both reduce to greedy.
  options.temperature = 1.0;
  options.top_k = 1;
  Sampler top1(options);
  options.top_k = 0;
  options.top_p = 1e-6;
  Sampler nucleus_of_one(options);
  for (int i = 0; i < 20; ++i) {
    EXPECT_EQ(top1.sample(logits), 3);
    EXPECT_EQ(nucleus_of_one.sample(logits), 3);
  }
  // top_p 0.65: {3, 2} reach 0.7 >= 0.65, so only ids 3 and 2, in ratio 4:3.
  options.top_p = 0.65;
  Sampler nucleus(options);
  std::map<int64_t, int> counts;
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    ++counts[nucleus.sample(logits)];
  }
  EXPECT_EQ(counts.size(), 2u);
  EXPECT_NEAR(counts[3] / static_cast<double>(n), 4.0 / 7.0, 0.015);
  // Plain sampling follows the distribution (4-sigma bounds at n = 20000 are about 0.013).
  options.top_p = 1.0;
  Sampler plain(options);
  counts.clear();
  for (int i = 0; i < n; ++i) {
    ++counts[plain.sample(logits)];
  }
  for (int64_t id = 0; id < 4; ++id) {
    EXPECT_NEAR(counts[id] / static_cast<double>(n), 0.1 * (id + 1), 0.015) << "id " << id;
  }
  // A low temperature sharpens towards the argmax.
  options.temperature = 0.05;
  Sampler cold(options);
  counts.clear();
  for (int i = 0; i < 1000; ++i) {
    ++counts[cold.sample(logits)];
  }
  EXPECT_GT(counts[3], 990);
}

TEST(Sampler, RejectsBadOptions) {
  SamplerOptions options;
  options.temperature = -1.0;
  EXPECT_THROW(Sampler{options}, ConfigError);
  options = SamplerOptions();
  options.top_k = -2;
  EXPECT_THROW(Sampler{options}, ConfigError);
  options = SamplerOptions();
  options.top_p = 0.0;
  EXPECT_THROW(Sampler{options}, ConfigError);
  options.top_p = 1.5;
  EXPECT_THROW(Sampler{options}, ConfigError);
}

TEST(TextStream, HoldsBackSplitCharacters) {
  EXPECT_EQ(utf8_complete_prefix("abc"), 3u);
  EXPECT_EQ(utf8_complete_prefix("a\xC3"), 1u);             // first byte of é
  EXPECT_EQ(utf8_complete_prefix("a\xC3\xA9"), 3u);         // é complete
  EXPECT_EQ(utf8_complete_prefix("\xE2\x82"), 0u);          // 2 of the 3 bytes of €
  EXPECT_EQ(utf8_complete_prefix("\xF0\x9F\x98\x80"), 4u);  // a 4-byte emoji
  EXPECT_EQ(utf8_complete_prefix("\x80\x80"), 2u);          // malformed: print it
  ByteTokenizer tokenizer;
  TextStream stream(tokenizer);
  EXPECT_EQ(stream.put('a'), "a");
  EXPECT_EQ(stream.put(0xE2), "");
  EXPECT_EQ(stream.put(0x82), "");
  EXPECT_EQ(stream.put(0xAC), "\xE2\x82\xAC");
  EXPECT_EQ(stream.put(ByteTokenizer::kEosId), "");  // specials decode to nothing
  EXPECT_EQ(stream.put(0xC3), "");
  EXPECT_EQ(stream.flush(), "\xC3");  // an unfinished character is still printed at the end
  EXPECT_EQ(stream.flush(), "");
}

// A model whose logits are NaN (a broken weight or config value) stops generation with an error
// naming the token, greedy or sampled, instead of printing ids chosen from NaN; an absurd
// max_new_tokens is bounded by max_seq_len, not overflowed into the cache size.
TEST(Generate, NonFiniteLogitsStopAndHugeMaxNewTokensIsBounded) {
  const auto model = tiny_model();
  const GenerationResult capped =
      generate(*model, kPrompt, greedy(std::numeric_limits<int64_t>::max(), true));
  EXPECT_EQ(capped.stop_reason, StopReason::kMaxSeqLen);
  EXPECT_EQ(static_cast<int64_t>(capped.tokens.size()), 128);
  {
    at::NoGradGuard no_grad;
    model->parameters()[0].fill_(std::numeric_limits<float>::quiet_NaN());
  }
  for (const double temperature : {0.0, 0.8}) {
    GenerationOptions options = greedy(4, true);
    options.sampler.temperature = temperature;
    try {
      generate(*model, kPrompt, options);
      ADD_FAILURE() << "NaN logits sampled at temperature " << temperature;
    } catch (const DataError& e) {
      EXPECT_NE(std::string(e.what()).find("generated token 1: the model's logits hold "),
                std::string::npos)
          << e.what();
    }
  }
}

}  // namespace test_generate
}  // namespace titan
