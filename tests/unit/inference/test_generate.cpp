// Generation on a randomly initialized `tiny` llama3: greedy decoding with and without the KV
// cache gives the same tokens; sampling is a pure function of the seed; stop conditions; the
// sampler's cuts and frequencies; UTF-8-safe text streaming.
#include "titan/common/check.h"
#include "titan/components/tokenizer/tokenizer.h"
#include "titan/inference/generator.h"
#include "titan/inference/sampler.h"
#include "titan/inference/text_stream.h"
#include "titan/models/registry.h"

#include <gtest/gtest.h>

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

}  // namespace test_generate
}  // namespace titan
