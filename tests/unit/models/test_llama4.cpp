// Llama 4 on the Llama 3 decoder: the released sizes and the layer layout (dense and MoE layers,
// RoPE layers chunked with the L2 qk norm, NoPE layers global with temperature-tuned queries),
// chunked attention against a direct float64 computation (values, gradients, documents, the
// cached form), gradients of the tiny flavor against central differences, KV-cache decoding
// against the full forward past the chunks and the temperature floor, and the Hugging Face
// adapter's round trip and refusals (tests/e2e/test_llama4_hf.sh checks it against transformers).
#include "titan/common/check.h"
#include "titan/models/common/attention.h"
#include "titan/models/gpt_oss/spec.h"
#include "titan/models/llama3/model.h"
#include "titan/models/llama4/hf_adapter.h"
#include "titan/models/llama4/spec.h"
#include "titan/models/registry.h"

#include "../test_util.h"
#include "finite_difference.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <set>
#include <string>

namespace titan {
namespace test_llama4 {

std::shared_ptr<llama3::Transformer> tiny_model(uint64_t seed, int64_t max_seq_len = 64) {
  ModelBuildOptions options;
  options.max_seq_len = max_seq_len;
  options.seed = seed;
  auto model = get_model_spec("llama4").build("tiny", options);
  return std::dynamic_pointer_cast<llama3::Transformer>(model);
}

std::string refusal(const std::function<void()>& f) { return test::message_of(f); }

TEST(Llama4, ReleasedSizesAndLayerLayout) {
  const ModelSpec& spec = get_model_spec("llama4");
  // Meta's model cards: Scout 109B parameters (its text model 107.8B; the vision tower the rest),
  // Maverick 400B, both 17B active.
  const ModelStats scout = spec.describe("17bx16e_irope", 1, 8192, at::kBFloat16);
  const ModelStats maverick = spec.describe("17bx128e_irope", 1, 8192, at::kBFloat16);
  EXPECT_NEAR(static_cast<double>(scout.n_params) / 1e9, 107.8, 0.1);  // text model only
  EXPECT_NEAR(static_cast<double>(maverick.n_params) / 1e9, 400.7, 0.1);
  // 17B active: everything a token uses but the embedding table (the output head included).
  EXPECT_NEAR(static_cast<double>(scout.n_active_params) / 1e9, 17.17, 0.01);
  EXPECT_NEAR(static_cast<double>(maverick.n_active_params) / 1e9, 17.18, 0.01);
  test::expect_stats_count_parameters(spec, {"tiny", "debugmodel", "debugmodel_irope"});
  // 36 of Scout's 48 layers attend within chunks of 8192 keys.
  EXPECT_EQ(scout.n_window_layers, 36);
  EXPECT_DOUBLE_EQ(scout.flops_per_token(16384) -
                       6.0 * static_cast<double>(scout.active_params() - scout.n_embedding_params),
                   12.0 * 40 * 128 * (12 * 16384 + 36 * 8192));
  EXPECT_EQ(spec.describe_flavor("17bx128e_irope"),
            "dim 5120, 48 layers, 40 heads, 8 kv heads, NoPE every 4, chunked attention 8192, ffn "
            "16384, MoE 128 experts top-1 of ffn 8192 + 1 shared every 2 layers, vocab 202048");
  const auto model = tiny_model(0);
  ASSERT_EQ(model->layers.size(), 4u);
  for (int64_t i = 0; i < 4; ++i) {
    const AttentionExtras& e = model->layers[i]->attention->extras;
    const bool nope = i == 3;
    EXPECT_EQ(e.rope, !nope) << i;
    EXPECT_EQ(e.chunk, nope ? 0 : 8) << i;
    EXPECT_EQ(e.l2_qk_norm, !nope) << i;
    EXPECT_EQ(e.temperature_floor, nope ? 4 : 0) << i;
    EXPECT_EQ(model->layers[i]->moe != nullptr, i % 2 == 1) << i;  // layers 1 and 3
  }
  EXPECT_EQ(model->layers[0]->feed_forward->w1->weight.size(0), 128);
  EXPECT_EQ(model->layers[1]->moe->experts->w1->weight.size(1), 64);
  EXPECT_NE(model->layers[1]->moe->shared_experts, nullptr);
}

// Hugging Face's chunked causal mask, written out: query i sees key j when j <= i, i / chunk ==
// j / chunk and (with documents) both are in one document. q (bs, n, H, hd), k and v (bs, n, G,
// hd), float64.
at::Tensor direct_chunked(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          int64_t chunk, const at::Tensor& docs) {
  const int64_t n = q.size(1), rep = q.size(2) / k.size(2);
  const at::Tensor pos = at::arange(n, at::kLong);
  at::Tensor keep = pos.unsqueeze(0).le(pos.unsqueeze(1));
  keep = keep.logical_and(
      pos.div(chunk, "floor").unsqueeze(0).eq(pos.div(chunk, "floor").unsqueeze(1)));
  keep = keep.unsqueeze(0);
  if (docs.defined()) keep = keep.logical_and(docs.unsqueeze(2).eq(docs.unsqueeze(1)));
  const at::Tensor s =
      at::matmul(q.transpose(1, 2), k.repeat_interleave(rep, 2).permute({0, 2, 3, 1}))
          .div(std::sqrt(static_cast<double>(q.size(3))))
          .masked_fill(keep.unsqueeze(1).logical_not(), -std::numeric_limits<double>::infinity());
  return at::matmul(at::softmax(s, -1), v.repeat_interleave(rep, 2).transpose(1, 2))
      .transpose(1, 2);
}

TEST(Llama4, ChunkedAttentionMatchesDirectComputation) {
  at::manual_seed(12);
  const int64_t bs = 2, n = 300, heads = 4, kv = 2, hd = 8;
  const at::Tensor docs = at::rand({bs, n}).lt(0.02).cumsum(1);
  // Chunks shorter than the kernel's query blocks, across them, and longer.
  for (int64_t chunk : {7, 100, 200}) {
    for (bool with_docs : {false, true}) {
      at::Tensor q = at::randn({bs, n, heads, hd}, at::kDouble).requires_grad_();
      at::Tensor k = at::randn({bs, n, kv, hd}, at::kDouble).requires_grad_();
      at::Tensor v = at::randn({bs, n, kv, hd}, at::kDouble).requires_grad_();
      const at::Tensor d = with_docs ? docs : at::Tensor();
      const at::Tensor probe = at::randn({bs, n, heads, hd}, at::kDouble);
      const std::string what = "chunk " + std::to_string(chunk) + (with_docs ? " docs" : "");
      AttentionVariant variant;
      variant.chunk = chunk;
      const at::Tensor got =
          sink_window_attention(q, k.transpose(1, 2), v.transpose(1, 2), 0, variant, d);
      (got * probe).sum().backward();
      const std::vector<at::Tensor> grads = {q.grad().clone(), k.grad().clone(), v.grad().clone()};
      for (auto* t : {&q, &k, &v}) t->mutable_grad() = at::Tensor();
      const at::Tensor want = direct_chunked(q, k, v, chunk, d);
      (want * probe).sum().backward();
      EXPECT_LT((got - want).abs().max().item<double>(), 1e-12) << what;
      EXPECT_LT((grads[0] - q.grad()).abs().max().item<double>(), 1e-12) << what;
      EXPECT_LT((grads[1] - k.grad()).abs().max().item<double>(), 1e-12) << what;
      EXPECT_LT((grads[2] - v.grad()).abs().max().item<double>(), 1e-12) << what;
      if (!with_docs) {
        at::NoGradGuard no_grad;
        const at::Tensor tail = sink_window_attention(q.narrow(1, 170, n - 170), k.transpose(1, 2),
                                                      v.transpose(1, 2), 170, variant);
        EXPECT_LT((tail - want.narrow(1, 170, n - 170)).abs().max().item<double>(), 1e-12) << what;
      }
    }
  }
  // The scores kept for backward: a chunk of 7 keeps at most 7 keys per query.
  EXPECT_LT(sink_window_kept_scores(300, 0, false, 7), 300 * 128);
  EXPECT_EQ(sink_window_kept_scores(300, 0, false, 0), sink_window_kept_scores(300, 0, false));
}

TEST(Llama4, TinyGradientsMatchFiniteDifferences) {
  // 16 positions: two chunks of 8, and queries past the temperature floor of 4 in layer 3.
  auto model = tiny_model(/*seed=*/3, /*max_seq_len=*/16);
  model->to(at::kDouble);
  at::manual_seed(5);
  const at::Tensor tokens = at::randint(300, {2, 16}, at::kLong);
  const at::Tensor probe = at::randn({2, 16, 300}, at::kDouble);
  const auto loss = [&] { return (model->forward(tokens) * probe).sum(); };
  loss().backward();
  test::expect_top_gradients_match(
      *model,
      {"layers.0.attention.wq.weight", "layers.3.attention.wq.weight",
       "layers.3.attention.wk.weight", "layers.1.moe.gate.weight", "layers.1.moe.experts.w1.weight",
       "layers.3.moe.shared_experts.w2.weight", "layers.2.feed_forward.w3.weight",
       "tok_embeddings.weight"},
      loss);
}

TEST(Llama4, CachedDecodingEqualsTheFullForward) {
  const auto model = tiny_model(/*seed=*/7, /*max_seq_len=*/32);
  at::manual_seed(2);
  const at::Tensor tokens = at::randint(300, {2, 21}, at::kLong);  // three chunks of 8
  KVCache cache(/*max_len=*/32);
  test::expect_cached_decoding_matches(*model, tokens, /*prefix=*/11, cache);
}

TEST(Llama4, HuggingFaceRoundTrip) {
  const auto model = tiny_model(/*seed=*/2);
  const llama3::Llama3Args& args = model->args();
  const nlohmann::json config = llama4::hf_config(args);
  EXPECT_EQ(config["layer_types"], nlohmann::json({"chunked_attention", "chunked_attention",
                                                   "chunked_attention", "full_attention"}));
  EXPECT_EQ(config["moe_layers"], nlohmann::json({1, 3}));
  EXPECT_EQ(config["no_rope_layers"], nlohmann::json({1, 1, 1, 0}));
  EXPECT_EQ(config["rope_parameters"]["rope_type"], "llama3");
  EXPECT_EQ(config["intermediate_size_mlp"], 128);
  EXPECT_EQ(
      llama3::describe_args(llama4::args_from_hf_config(config), llama4::family()),
      nlohmann::json({{"name", "llama4"}, {"flavor", "tiny"}, {"args", {{"max_seq_len", 64}}}}));
  // Llama4ForConditionalGeneration's config: the text model's.
  const nlohmann::json full = {{"model_type", "llama4"},
                               {"text_config", config},
                               {"vision_config", nlohmann::json::object()}};
  EXPECT_EQ(llama3::resolved_args(llama4::args_from_hf_config(full)),
            llama3::resolved_args(llama4::args_from_hf_config(config)));
  // The TorchTitan flavors without iRoPE: every layer RoPE and global. Their balancing bias has
  // no Hugging Face form: an import does not balance.
  const llama3::Llama3Args debug = llama3::args_for_flavor("debugmodel", llama4::family());
  const nlohmann::json plain = llama4::hf_config(debug);
  EXPECT_EQ(plain["layer_types"][0], "full_attention");
  llama3::Llama3Args imported = llama4::args_from_hf_config(plain);
  EXPECT_EQ(imported.moe.load_balance_coeff, 0.0);
  imported.moe.load_balance_coeff = debug.moe.load_balance_coeff;
  EXPECT_EQ(llama3::resolved_args(imported), llama3::resolved_args(debug));
  const TensorMap ours = test::random_tensors_like(*model);
  const TensorMap hf = llama4::to_hf_tensors(ours, args);
  const at::Tensor gate_up = hf.at("model.layers.1.feed_forward.experts.gate_up_proj");
  EXPECT_EQ(gate_up.sizes(), at::IntArrayRef({4, 64, 128}));
  // Gate columns, then up columns, (in, out) per expert; q_proj not permuted.
  EXPECT_TRUE(at::equal(gate_up.select(0, 2).select(-1, 3),
                        ours.at("layers.1.moe.experts.w1.weight")[2].select(0, 3)));
  EXPECT_TRUE(at::equal(gate_up.select(0, 2).select(-1, 64 + 3),
                        ours.at("layers.1.moe.experts.w3.weight")[2].select(0, 3)));
  EXPECT_TRUE(at::equal(hf.at("model.layers.0.self_attn.q_proj.weight"),
                        ours.at("layers.0.attention.wq.weight")));
  for (const char* name :
       {"model.layers.0.feed_forward.gate_proj.weight", "model.layers.1.feed_forward.router.weight",
        "model.layers.3.feed_forward.shared_expert.down_proj.weight",
        "model.layers.3.feed_forward.experts.down_proj", "lm_head.weight"}) {
    EXPECT_TRUE(hf.count(name)) << name;
  }
  const TensorMap back = llama4::from_hf_tensors(hf, args);
  test::expect_same_tensors(ours, back);
  // Llama4ForConditionalGeneration's names: the text model's under language_model., the vision
  // tower's skipped.
  TensorMap wrapped;
  for (const auto& [name, t] : hf) wrapped.emplace("language_model." + name, t);
  wrapped.emplace("vision_model.patch_embedding.linear.weight", at::zeros({4, 4}));
  EXPECT_EQ(llama4::from_hf_tensors(wrapped, args).size(), ours.size());

  nlohmann::json odd = config;
  odd["moe_layers"] = {1, 2};
  EXPECT_NE(refusal([&] { llama4::args_from_hf_config(odd); }).find("every N-th layer"),
            std::string::npos);
  odd = config;
  odd["no_rope_layers"] = {1, 0, 1, 1};
  EXPECT_NE(refusal([&] { llama4::args_from_hf_config(odd); }).find("without RoPE"),
            std::string::npos);
  odd = config;
  odd["model_type"] = 192;  // found by the parsers' fuzzer: was an uncaught JSON type error
  EXPECT_NE(refusal([&] { llama4::args_from_hf_config(odd); }).find("must be a string"),
            std::string::npos);
  odd = config;
  odd["layer_types"] = {"chunked_attention", "full_attention", "chunked_attention",
                        "full_attention"};
  EXPECT_NE(refusal([&] { llama4::args_from_hf_config(odd); }).find("every RoPE layer"),
            std::string::npos);
  EXPECT_NE(refusal([] {
              llama4::hf_config(llama3::args_for_flavor("20b", gpt_oss::family()));
            }).find("Llama4ForCausalLM"),
            std::string::npos);
}

}  // namespace test_llama4
}  // namespace titan
