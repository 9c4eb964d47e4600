// The KV-cache inference path against the training forward: logits of a prefill followed by
// decode steps (and multi-token steps that start mid-sequence) must equal the full forward's
// logits at every position, on the `tiny` flavor with random init (logits up to ~4.5).
// Tolerances (absolute, on logits; measured differences in brackets): float64 1e-12 [2e-15],
// float32 2e-5 [1.4e-6] (only summation orders differ), bfloat16 compute 0.0625 [0.016], two bf16
// ulps at magnitude 4-8 (the two paths round different intermediates to bf16).
#include "titan/models/common/linear.h"
#include "titan/models/llama3/model.h"
#include "titan/models/registry.h"

#include <gtest/gtest.h>

#include <vector>

namespace titan {
namespace test_kv_cache {

std::shared_ptr<Model> tiny_model(at::ScalarType compute_dtype, int64_t max_seq_len,
                                  uint64_t seed = 0) {
  ModelBuildOptions options;
  options.max_seq_len = max_seq_len;
  options.compute_dtype = compute_dtype;
  at::manual_seed(seed);
  return get_model_spec("llama3").build("tiny", options);
}

at::Tensor random_tokens(int64_t bs, int64_t seqlen, uint64_t seed) {
  at::manual_seed(seed);
  return at::randint(/*high=*/300, {bs, seqlen}, at::kLong);  // tiny's vocab is 300
}

// Runs `tokens` (bs, seqlen) through the cache in steps of the given sizes (summing to seqlen)
// and returns the concatenated logits (bs, seqlen, vocab).
at::Tensor cached_logits(Model& model, const at::Tensor& tokens, const std::vector<int64_t>& steps,
                         int64_t cache_len) {
  KVCache cache(cache_len);
  std::vector<at::Tensor> parts;
  int64_t pos = 0;
  for (int64_t n : steps) {
    parts.push_back(model.forward_cached(tokens.narrow(1, pos, n), cache, pos));
    pos += n;
    EXPECT_EQ(cache.length, pos);
  }
  EXPECT_EQ(pos, tokens.size(1));
  return at::cat(parts, 1);
}

at::Tensor full_logits(Model& model, const at::Tensor& tokens) {
  at::NoGradGuard no_grad;
  return model.forward(tokens);
}

double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

// Prefill 7, decode 1 at a time, a 5-token block mid-sequence, then single steps again.
const std::vector<int64_t> kSteps = {7, 1, 1, 1, 5, 1, 1, 1, 1, 1};  // 20 positions

TEST(KVCache, PrefillAndDecodeMatchFullForwardFloat32) {
  const auto model = tiny_model(at::kFloat, /*max_seq_len=*/64);
  const at::Tensor tokens = random_tokens(/*bs=*/2, /*seqlen=*/20, /*seed=*/1);
  const at::Tensor full = full_logits(*model, tokens);
  const at::Tensor cached = cached_logits(*model, tokens, kSteps, /*cache_len=*/20);
  ASSERT_EQ(cached.sizes(), full.sizes());
  EXPECT_EQ(cached.scalar_type(), at::kFloat);
  EXPECT_GT(full.abs().max().item<double>(), 0.1);  // the comparison is not of zeros
  EXPECT_LT(max_abs_diff(cached, full), 2e-5);
}

TEST(KVCache, MatchesFullForwardInFloat64) {
  const auto model = tiny_model(at::kFloat, /*max_seq_len=*/64);
  model->to(at::kDouble);  // parameters and RoPE tables
  const at::Tensor tokens = random_tokens(/*bs=*/1, /*seqlen=*/20, /*seed=*/2);
  const at::Tensor full = full_logits(*model, tokens);
  EXPECT_EQ(full.scalar_type(), at::kDouble);
  EXPECT_LT(max_abs_diff(cached_logits(*model, tokens, kSteps, 32), full), 1e-12);
}

TEST(KVCache, PrefillAndDecodeMatchFullForwardBFloat16) {
  const auto model = tiny_model(at::kBFloat16, /*max_seq_len=*/64);
  const at::Tensor tokens = random_tokens(/*bs=*/2, /*seqlen=*/20, /*seed=*/3);
  const at::Tensor full = full_logits(*model, tokens);
  const at::Tensor cached = cached_logits(*model, tokens, kSteps, /*cache_len=*/20);
  EXPECT_EQ(cached.scalar_type(), at::kFloat);  // logits come back in float32
  EXPECT_LT(max_abs_diff(cached, full), 0.0625);
  // The cache itself is held in the compute dtype.
  KVCache cache(8);
  model->forward_cached(tokens.narrow(1, 0, 4), cache, 0);
  EXPECT_EQ(cache.layers.size(), 2u);
  EXPECT_EQ(cache.layers[0].k.scalar_type(), at::kBFloat16);
  // (bs, n_kv_heads, max_len, head_dim): tiny has 2 kv heads of 16 dims.
  EXPECT_EQ(cache.layers[0].k.sizes(), at::IntArrayRef({2, 2, 8, 16}));
}

TEST(KVCache, LongPrefillSpansSeveralQueryChunks) {
  // More than one attention chunk (128 queries) in the prefill, with a key range that starts
  // past 0 in the second chunk.
  const auto model = tiny_model(at::kFloat, /*max_seq_len=*/200);
  const at::Tensor tokens = random_tokens(/*bs=*/1, /*seqlen=*/150, /*seed=*/4);
  const at::Tensor full = full_logits(*model, tokens);
  std::vector<int64_t> steps = {140};
  steps.insert(steps.end(), 10, 1);
  EXPECT_LT(max_abs_diff(cached_logits(*model, tokens, steps, 150), full), 2e-5);
  // A 130-token block that starts at position 20.
  EXPECT_LT(max_abs_diff(cached_logits(*model, tokens, {20, 130}, 150), full), 2e-5);
}

TEST(KVCache, RewindOverwritesTheTail) {
  const auto model = tiny_model(at::kFloat, /*max_seq_len=*/32);
  const at::Tensor a = random_tokens(1, 12, /*seed=*/5);
  at::Tensor b = a.clone();
  b.narrow(1, 8, 4).copy_(random_tokens(1, 4, /*seed=*/6));
  KVCache cache(12);
  model->forward_cached(a, cache, 0);
  // Rewind to position 8 and continue with b's tail: the result is b's full forward.
  const at::Tensor tail = model->forward_cached(b.narrow(1, 8, 4), cache, 8);
  EXPECT_LT(max_abs_diff(tail, full_logits(*model, b).narrow(1, 8, 4)), 2e-5);
}

TEST(KVCache, RejectsGapsAndOverflow) {
  const auto model = tiny_model(at::kFloat, /*max_seq_len=*/16);
  const at::Tensor tokens = random_tokens(1, 4, /*seed=*/7);
  KVCache cache(8);
  EXPECT_THROW(model->forward_cached(tokens, cache, /*start_pos=*/2), c10::Error);  // gap
  model->forward_cached(tokens, cache, 0);
  model->forward_cached(tokens, cache, 4);
  EXPECT_THROW(model->forward_cached(tokens.narrow(1, 0, 1), cache, 8), c10::Error);  // full
  KVCache long_cache(32);  // longer than the RoPE table
  EXPECT_THROW(model->forward_cached(random_tokens(1, 17, 8), long_cache, 0), c10::Error);
}

TEST(KVCache, TrainingForwardStillDifferentiable) {
  // The cached path lives next to the training path; make sure a training step after inference
  // still records gradients.
  const auto model = tiny_model(at::kFloat, /*max_seq_len=*/16);
  KVCache cache(8);
  model->forward_cached(random_tokens(1, 4, 9), cache, 0);
  const at::Tensor loss = model->forward(random_tokens(1, 8, 10)).square().mean();
  loss.backward();
  for (const auto& param : model->parameters()) {
    ASSERT_TRUE(param.grad().defined());
  }
}

TEST(KVCache, SingleRowLinearMatchesMatrixProduct) {
  // A decode step multiplies one row by each weight, which mixed_linear turns into a
  // matrix-vector product; values and gradients must match the matrix product.
  at::manual_seed(11);
  const at::Tensor weight = at::randn({24, 16}, at::kDouble).requires_grad_();
  const at::Tensor x = at::randn({1, 1, 16}, at::kDouble).requires_grad_();
  const at::Tensor out = mixed_linear(x, weight, at::kFloat);
  ASSERT_EQ(out.sizes(), at::IntArrayRef({1, 1, 24}));
  EXPECT_LT(max_abs_diff(out, at::matmul(x, weight.t())), 1e-12);
  out.sum().backward();
  EXPECT_LT(max_abs_diff(weight.grad(), x.detach().view({1, 16}).expand({24, 16})), 1e-12);
  EXPECT_LT(max_abs_diff(x.grad().view({16}), weight.detach().sum(0)), 1e-12);
}

}  // namespace test_kv_cache
}  // namespace titan
