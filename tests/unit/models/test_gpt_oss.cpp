// gpt-oss on the Llama 3 decoder: the released sizes, attention with sinks and sliding windows
// against a direct float64 computation (values and gradients, with and without documents, and
// its cached form), the biased experts with the clamped SwiGLU (loop and grouped kernels against
// the formula), gradients of the tiny flavor against central differences, KV-cache decoding
// against the full forward past the window, and the Hugging Face adapter's round trip and
// refusals (tests/e2e/test_gpt_oss_hf.sh checks it against transformers).
#include "titan/common/check.h"
#include "titan/models/common/attention.h"
#include "titan/models/common/moe.h"
#include "titan/models/gpt_oss/hf_adapter.h"
#include "titan/models/gpt_oss/spec.h"
#include "titan/models/llama3/model.h"
#include "titan/models/qwen3/spec.h"
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
namespace test_gpt_oss {

std::shared_ptr<llama3::Transformer> tiny_model(uint64_t seed, int64_t max_seq_len = 64) {
  ModelBuildOptions options;
  options.max_seq_len = max_seq_len;
  options.seed = seed;
  auto model = get_model_spec("gpt_oss").build("tiny", options);
  return std::dynamic_pointer_cast<llama3::Transformer>(model);
}

// Hugging Face's eager gpt-oss attention, written out: the whole score matrix, -inf outside the
// causal (windowed, same-document) mask, the sink appended as a last column, softmax, the sink's
// column dropped. q (bs, n, H, hd), k and v (bs, n, G, hd) -> (bs, n, H, hd).
at::Tensor direct_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& sinks, int64_t window, double scale,
                            const at::Tensor& docs) {
  const int64_t bs = q.size(0), n = q.size(1), heads = q.size(2);
  const int64_t rep = heads / k.size(2);
  const at::Tensor qh = q.transpose(1, 2);
  const at::Tensor kh = k.repeat_interleave(rep, 2).transpose(1, 2);
  const at::Tensor vh = v.repeat_interleave(rep, 2).transpose(1, 2);
  const at::Tensor pos = at::arange(n, at::kLong);
  at::Tensor keep = pos.unsqueeze(0).le(pos.unsqueeze(1));  // (n, n): key <= query
  if (window > 0) keep = keep.logical_and(pos.unsqueeze(1).sub(pos.unsqueeze(0)).lt(window));
  keep = keep.unsqueeze(0);
  if (docs.defined()) keep = keep.logical_and(docs.unsqueeze(2).eq(docs.unsqueeze(1)));
  at::Tensor s =
      at::matmul(qh, kh.transpose(-1, -2))
          .mul(scale)
          .masked_fill(keep.unsqueeze(1).logical_not(), -std::numeric_limits<double>::infinity());
  if (sinks.defined()) s = at::cat({s, sinks.view({1, heads, 1, 1}).expand({bs, heads, n, 1})}, -1);
  at::Tensor p = at::softmax(s, -1);
  if (sinks.defined()) p = p.narrow(-1, 0, n);
  return at::matmul(p, vh).transpose(1, 2);
}

TEST(GptOss, ReleasedSizes) {
  const ModelSpec& spec = get_model_spec("gpt_oss");
  // OpenAI's model card: gpt-oss-20b 20.91B parameters, gpt-oss-120b 116.83B.
  EXPECT_NEAR(static_cast<double>(spec.describe("20b", 1, 4096, at::kBFloat16).n_params) / 1e9,
              20.91, 0.01);
  EXPECT_NEAR(static_cast<double>(spec.describe("120b", 1, 4096, at::kBFloat16).n_params) / 1e9,
              116.83, 0.01);
  test::expect_stats_count_parameters(spec, {"tiny", "debugmodel", "20b"});
  // Half the layers slide over 128 keys: their attention FLOPs count 128 keys, not seq_len.
  const ModelStats st = spec.describe("20b", 1, 4096, at::kBFloat16);
  EXPECT_EQ(st.n_window_layers, 12);
  EXPECT_DOUBLE_EQ(st.flops_per_token(4096) -
                       6.0 * static_cast<double>(st.active_params() - st.n_embedding_params),
                   12.0 * 64 * 64 * (12 * 4096 + 12 * 128));
  EXPECT_EQ(spec.describe_flavor("20b"),
            "dim 2880, 24 layers, 64 heads, 8 kv heads of 64, attention biases, sinks, sliding "
            "window 128 (global every 2), YaRN x32, MoE 32 experts top-4 of ffn 2880, vocab "
            "201088");
  const auto model = tiny_model(0);
  std::set<std::string> names;
  for (const auto& item : model->named_parameters()) names.insert(item.key());
  for (const char* name : {"layers.0.attention.bq.weight", "layers.0.attention.bo.weight",
                           "layers.1.attention.sinks.weight", "layers.0.moe.gate_bias.weight",
                           "layers.1.moe.experts.b1.weight", "layers.1.moe.experts.b2.weight"}) {
    EXPECT_TRUE(names.count(name)) << name;
  }
  EXPECT_EQ(model->layers[0]->attention->extras.window, 8);  // sliding
  EXPECT_EQ(model->layers[1]->attention->extras.window, 0);  // global
}

TEST(GptOss, SinkWindowAttentionMatchesDirectComputation) {
  at::manual_seed(11);
  // 300 positions: three query chunks of the kernel, windows across their borders.
  const int64_t bs = 2, n = 300, heads = 4, kv = 2, hd = 8;
  const at::Tensor docs = at::rand({bs, n}).lt(0.02).cumsum(1);
  for (int64_t window : {0, 5, 130}) {
    for (bool with_docs : {false, true}) {
      for (bool with_sinks : {true, false}) {
        at::Tensor q = at::randn({bs, n, heads, hd}, at::kDouble).requires_grad_();
        at::Tensor k = at::randn({bs, n, kv, hd}, at::kDouble).requires_grad_();
        at::Tensor v = at::randn({bs, n, kv, hd}, at::kDouble).requires_grad_();
        at::Tensor sinks =
            with_sinks ? at::randn({heads}, at::kDouble).requires_grad_() : at::Tensor();
        const at::Tensor d = with_docs ? docs : at::Tensor();
        const double scale = 0.3;
        const at::Tensor probe = at::randn({bs, n, heads, hd}, at::kDouble);
        const std::string what = "window " + std::to_string(window) + (with_docs ? " docs" : "") +
                                 (with_sinks ? " sinks" : "");
        const at::Tensor got = sink_window_attention(q, k.transpose(1, 2), v.transpose(1, 2), 0,
                                                     AttentionVariant{sinks, window, scale}, d);
        (got * probe).sum().backward();
        const std::vector<at::Tensor> grads = {q.grad().clone(), k.grad().clone(), v.grad().clone(),
                                               with_sinks ? sinks.grad().clone() : at::Tensor()};
        for (auto* t : {&q, &k, &v}) t->mutable_grad() = at::Tensor();
        if (with_sinks) sinks.mutable_grad() = at::Tensor();
        const at::Tensor want = direct_attention(q, k, v, sinks, window, scale, d);
        (want * probe).sum().backward();
        EXPECT_LT((got - want).abs().max().item<double>(), 1e-12) << what;
        EXPECT_LT((grads[0] - q.grad()).abs().max().item<double>(), 1e-12) << what;
        EXPECT_LT((grads[1] - k.grad()).abs().max().item<double>(), 1e-12) << what;
        EXPECT_LT((grads[2] - v.grad()).abs().max().item<double>(), 1e-12) << what;
        if (with_sinks) {
          EXPECT_LT((grads[3] - sinks.grad()).abs().max().item<double>(), 1e-10) << what;
          EXPECT_GT(sinks.grad().abs().max().item<double>(), 1e-3) << what;
        }
        // Cached form: queries from position 170 on against the keys of positions 0.. (no
        // documents at inference).
        if (!with_docs) {
          at::NoGradGuard no_grad;
          const at::Tensor tail =
              sink_window_attention(q.narrow(1, 170, n - 170), k.transpose(1, 2), v.transpose(1, 2),
                                    170, AttentionVariant{sinks, window, scale});
          EXPECT_LT((tail - want.narrow(1, 170, n - 170)).abs().max().item<double>(), 1e-12)
              << what;
        }
      }
    }
  }
}

TEST(GptOss, BiasedExpertsWithTheClampedSwiGLU) {
  at::manual_seed(4);
  const int64_t experts = 3, dim = 16, hidden = 24;
  GroupedExperts loop(experts, dim, hidden, at::kFloat, /*use_grouped_mm=*/false,
                      /*biases=*/true);
  loop.swiglu_limit = 1.5;  // low enough that the clamps bite
  loop.swiglu_alpha = 1.702;
  {
    at::NoGradGuard no_grad;
    for (auto& p : loop.parameters()) p.copy_(at::randn(p.sizes()));
  }
  const std::vector<int64_t> counts = {5, 0, 7};
  const at::Tensor x = at::randn({12, dim});
  const at::Tensor got = loop.forward_loop(x, counts);
  // The formula, expert by expert.
  std::vector<at::Tensor> want;
  int64_t offset = 0;
  for (int64_t e = 0; e < experts; ++e) {
    const at::Tensor xe = x.narrow(0, offset, counts[e]);
    offset += counts[e];
    const at::Tensor g =
        (at::matmul(xe, loop.w1->weight[e].t()) + loop.b1->weight[e]).clamp_max(1.5);
    const at::Tensor u =
        (at::matmul(xe, loop.w3->weight[e].t()) + loop.b3->weight[e]).clamp(-1.5, 1.5);
    const at::Tensor h = g * at::sigmoid(1.702 * g) * (u + 1);
    want.push_back(at::matmul(h, loop.w2->weight[e].t()) + loop.b2->weight[e]);
  }
  EXPECT_LT((got - at::cat(want)).abs().max().item<double>(), 1e-4);
  // The grouped kernel (bf16 compute) on the same weights.
  GroupedExperts grouped(experts, dim, hidden, at::kBFloat16, /*use_grouped_mm=*/true,
                         /*biases=*/true);
  grouped.swiglu_limit = 1.5;
  {
    at::NoGradGuard no_grad;
    const auto from = loop.named_parameters();
    for (auto& item : grouped.named_parameters()) item.value().copy_(from[item.key()]);
  }
  const at::Tensor g = grouped.forward(x, counts).to(at::kFloat);
  EXPECT_LT((g - got).abs().max().item<double>(), 0.05 * got.abs().max().item<double>());
}

TEST(GptOss, TinyGradientsMatchFiniteDifferences) {
  auto model = tiny_model(/*seed=*/3, /*max_seq_len=*/16);
  model->to(at::kDouble);
  {
    at::NoGradGuard no_grad;  // nonzero biases, so that every gradient is exercised at a point
    for (auto& item : model->named_parameters()) {
      if (item.key().find("bias") != std::string::npos ||
          item.key().find(".b") != std::string::npos) {
        item.value().copy_(0.1 * at::randn(item.value().sizes(), at::kDouble));
      }
    }
  }
  at::manual_seed(5);
  const at::Tensor tokens = at::randint(300, {2, 16}, at::kLong);
  const at::Tensor probe = at::randn({2, 16, 300}, at::kDouble);
  const auto loss = [&] { return (model->forward(tokens) * probe).sum(); };
  loss().backward();
  test::expect_top_gradients_match(
      *model,
      {"layers.0.attention.sinks.weight", "layers.1.attention.sinks.weight",
       "layers.0.attention.bq.weight", "layers.0.attention.bk.weight",
       "layers.1.attention.bv.weight", "layers.1.attention.bo.weight",
       "layers.0.moe.gate_bias.weight", "layers.0.moe.experts.b1.weight",
       "layers.1.moe.experts.b2.weight", "layers.1.moe.experts.w3.weight",
       "layers.0.attention.wq.weight"},
      loss);
}

TEST(GptOss, CachedDecodingEqualsTheFullForward) {
  const auto model = tiny_model(/*seed=*/7, /*max_seq_len=*/32);
  at::manual_seed(2);
  const at::Tensor tokens = at::randint(300, {2, 20}, at::kLong);  // past the window of 8
  KVCache cache(/*max_len=*/32);
  test::expect_cached_decoding_matches(*model, tokens, /*prefix=*/11, cache);
}

TEST(GptOss, HuggingFaceRoundTrip) {
  const auto model = tiny_model(/*seed=*/2);
  const llama3::Llama3Args& args = model->args();
  const nlohmann::json config = gpt_oss::hf_config(args);
  EXPECT_EQ(config["layer_types"], nlohmann::json({"sliding_attention", "full_attention"}));
  EXPECT_EQ(config["rope_parameters"]["truncate"], false);
  EXPECT_EQ(
      llama3::describe_args(gpt_oss::args_from_hf_config(config), gpt_oss::family()),
      nlohmann::json({{"name", "gpt_oss"}, {"flavor", "tiny"}, {"args", {{"max_seq_len", 64}}}}));
  const TensorMap ours = test::random_tensors_like(*model);
  const TensorMap hf = gpt_oss::to_hf_tensors(ours, args);
  const at::Tensor gate_up = hf.at("model.layers.1.mlp.experts.gate_up_proj");
  EXPECT_EQ(gate_up.sizes(), at::IntArrayRef({4, 64, 128}));
  // Gate in the even columns, up in the odd ones, (in, out) per expert.
  EXPECT_TRUE(at::equal(gate_up.select(0, 2).select(-1, 6),
                        ours.at("layers.1.moe.experts.w1.weight")[2].select(0, 3)));
  EXPECT_TRUE(at::equal(gate_up.select(0, 2).select(-1, 7),
                        ours.at("layers.1.moe.experts.w3.weight")[2].select(0, 3)));
  for (const char* name :
       {"model.layers.0.self_attn.sinks", "model.layers.0.self_attn.q_proj.bias",
        "model.layers.1.mlp.router.bias", "model.layers.0.mlp.experts.gate_up_proj_bias",
        "model.layers.0.mlp.experts.down_proj_bias", "lm_head.weight"}) {
    EXPECT_TRUE(hf.count(name)) << name;
  }
  const TensorMap back = gpt_oss::from_hf_tensors(hf, args);
  test::expect_same_tensors(ours, back);
  const auto refusal = test::message_of;
  nlohmann::json odd = config;
  odd["layer_types"] = {"full_attention", "sliding_attention"};
  EXPECT_NE(refusal([&] { gpt_oss::args_from_hf_config(odd); }).find("every N-th layer"),
            std::string::npos);
  nlohmann::json scaled = config;
  scaled["rope_parameters"]["attention_factor"] = 2.0;
  EXPECT_NE(refusal([&] { gpt_oss::args_from_hf_config(scaled); }).find("attention_factor"),
            std::string::npos);
  EXPECT_NE(refusal([] {
              gpt_oss::hf_config(llama3::args_for_flavor("debugmodel_moe", qwen3::family()));
            }).find("GptOssForCausalLM"),
            std::string::npos);
}

}  // namespace test_gpt_oss
}  // namespace titan
