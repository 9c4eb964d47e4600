// DeepSeek-V3 on the Llama 3 decoder: the released sizes (total and active parameters), the MLA
// parameter names, multi-head latent attention against a direct float64 computation, YaRN
// frequencies against their formula, gradients of the tiny flavor against central differences,
// KV-cache decoding against the full forward, the tensor-parallel plan and refusals, a few
// optimizer steps that lower the loss, and the Hugging Face adapter's names, config and round trip
// (tests/e2e/test_deepseek_v3_hf.sh checks it against transformers).
#include "titan/common/check.h"
#include "titan/distributed/parallel_dims.h"
#include "titan/models/common/mla.h"
#include "titan/models/deepseek_v3/hf_adapter.h"
#include "titan/models/deepseek_v3/spec.h"
#include "titan/models/llama3/model.h"
#include "titan/models/registry.h"
#include "titan/parallel/parallelize.h"

#include "../test_util.h"
#include "finite_difference.h"

#include <gtest/gtest.h>
#include <torch/optim/adamw.h>

#include <cmath>
#include <functional>
#include <set>
#include <string>

namespace titan {
namespace test_deepseek_v3 {

std::shared_ptr<llama3::Transformer> tiny_model(uint64_t seed, int64_t max_seq_len = 64) {
  ModelBuildOptions options;
  options.max_seq_len = max_seq_len;
  options.seed = seed;
  auto model = get_model_spec("deepseek_v3").build("tiny", options);
  return std::dynamic_pointer_cast<llama3::Transformer>(model);
}

at::Tensor loss_of(const at::Tensor& logits, const at::Tensor& targets) {
  return at::nll_loss(at::log_softmax(logits.reshape({-1, logits.size(-1)}), -1),
                      targets.reshape(-1));
}

TEST(DeepSeekV3, ReleasedSizes) {
  const ModelSpec& spec = get_model_spec("deepseek_v3");
  struct Size {
    const char* flavor;
    double total, active;  // billions
  };
  // DeepSeek's reports: V2-Lite 15.7B (2.4B activated), V2 236B (21B), V3 671B (37B; the 14B of
  // its multi-token-prediction module not included). The activated counts leave out the
  // embedding lookup (ours: 2.45B, 20.85B, 36.63B without it; 2.66B, 21.38B, 37.55B with it).
  for (const Size& s : {Size{"16B", 15.7, 2.4}, Size{"236B", 236, 21}, Size{"671B", 671, 37}}) {
    const ModelStats st = spec.describe(s.flavor, 1, 4096, at::kBFloat16);
    EXPECT_NEAR(static_cast<double>(st.n_params) / 1e9, s.total, 0.01 * s.total) << s.flavor;
    EXPECT_NEAR(static_cast<double>(st.active_params() - st.n_embedding_params) / 1e9, s.active,
                0.03 * s.active)
        << s.flavor;
  }
  // The analytic count is the built model's (on the meta device: shapes only).
  test::expect_stats_count_parameters(spec, {"tiny", "debugmodel", "16B"});
  // Attention FLOPs as TorchTitan counts them: 6 * L * heads * (qk + v) * seq_len per token.
  const ModelStats st = spec.describe("671B", 1, 4096, at::kBFloat16);
  EXPECT_DOUBLE_EQ(st.flops_per_token(4096) -
                       6.0 * static_cast<double>(st.active_params() - st.n_embedding_params),
                   6.0 * 61 * 128 * (192 + 128) * 4096);
  EXPECT_EQ(spec.describe_flavor("671B"),
            "dim 7168, 61 layers, 128 heads, MLA (q rank 1536, kv rank 512, qk 128 + rope 64, v "
            "128), YaRN x40, ffn 18432, MoE 256 experts top-8 of ffn 2048 + 1 shared after 3 "
            "dense layers, vocab 129280");
}

TEST(DeepSeekV3, ParameterNamesFollowTorchTitan) {
  const auto model = tiny_model(0);
  std::set<std::string> names;
  for (const auto& item : model->named_parameters()) names.insert(item.key());
  for (const char* name : {"layers.0.attention.wq_a.weight", "layers.0.attention.q_norm.weight",
                           "layers.0.attention.wq_b.weight", "layers.0.attention.wkv_a.weight",
                           "layers.0.attention.kv_norm.weight", "layers.0.attention.wkv_b.weight",
                           "layers.0.attention.wo.weight", "layers.0.feed_forward.w1.weight",
                           "layers.1.moe.gate.weight", "layers.1.moe.experts.w1.weight",
                           "layers.2.moe.shared_experts.w2.weight", "output.weight"}) {
    EXPECT_TRUE(names.count(name)) << name;
  }
  EXPECT_FALSE(names.count("layers.0.attention.wq.weight"));
  EXPECT_FALSE(names.count("layers.1.feed_forward.w1.weight"));
  const auto params = model->named_parameters();
  // (kv_lora + rope, dim), (heads * (nope + v), kv_lora), (dim, heads * v)
  EXPECT_EQ(params["layers.0.attention.wkv_a.weight"].sizes(), at::IntArrayRef({32 + 8, 64}));
  EXPECT_EQ(params["layers.0.attention.wkv_b.weight"].sizes(), at::IntArrayRef({4 * 32, 32}));
  EXPECT_EQ(params["layers.0.attention.wo.weight"].sizes(), at::IntArrayRef({64, 4 * 16}));
  // debugmodel has no q latent: one wq.
  ModelBuildOptions options;
  options.meta = true;
  options.max_seq_len = 16;
  const auto debug = get_model_spec("deepseek_v3").build("debugmodel", options);
  EXPECT_EQ(debug->named_parameters()["layers.0.attention.wq.weight"].sizes(),
            at::IntArrayRef({16 * 192, 256}));
  // The plan splits heads by the query and wkv_b rows and wo's columns.
  std::set<std::string> rules;
  for (const TpRule& r : model->tensor_parallel_plan()) rules.insert(r.module);
  for (const char* rule : {"layers.*.attention", "layers.*.attention.wq_b",
                           "layers.*.attention.wkv_b", "layers.*.attention.wo"}) {
    EXPECT_TRUE(rules.count(rule)) << rule;
  }
  EXPECT_FALSE(rules.count("layers.*.attention.wk"));
  // Descriptions round-trip, and a bad MLA key names the nearest one.
  const ModelSpec& spec = get_model_spec("deepseek_v3");
  const nlohmann::json described = llama3::describe_args(model->args(), deepseek_v3::family());
  EXPECT_EQ(described["flavor"], "tiny");
  EXPECT_EQ(spec.resolve_args({{"name", "deepseek_v3"},
                               {"flavor", "custom"},
                               {"args", llama3::args_to_json(model->args())}}),
            spec.resolve_args({{"name", "deepseek_v3"}, {"flavor", "tiny"}}));
  try {
    spec.resolve_args(
        {{"name", "deepseek_v3"}, {"flavor", "tiny"}, {"args", {{"mla", {{"kv_lora", 8}}}}}});
    ADD_FAILURE() << "no ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("kv_lora_rank"), std::string::npos) << e.what();
  }
}

TEST(DeepSeekV3, YarnFrequenciesMatchTheFormula) {
  // DeepSeek-V3's rotary setting: 64 dims, theta 1e4, x40 over 4096 positions, betas 32 and 1.
  YarnScaling yarn;
  yarn.factor = 40;
  const int64_t dim = 64;
  const double theta = 10000;
  const at::Tensor got = yarn_frequencies(dim, theta, yarn);
  ASSERT_EQ(got.numel(), dim / 2);
  // Correction range: floor/ceil of dim * ln(4096 / (2 pi beta)) / (2 ln theta), clamped.
  const auto corr = [&](double beta) {
    return dim * std::log(4096.0 / (2 * M_PI * beta)) / (2 * std::log(theta));
  };
  const double low = std::max(0.0, std::floor(corr(32))), high = std::ceil(corr(1));
  EXPECT_EQ(low, 10);   // the fastest 10 frequencies are kept
  EXPECT_EQ(high, 23);  // those from 23 on are divided by 40
  for (int64_t i = 0; i < dim / 2; ++i) {
    const double base = std::pow(theta, -2.0 * static_cast<double>(i) / dim);
    const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
    const double want = base / 40 * ramp + base * (1 - ramp);
    EXPECT_NEAR(got[i].item<double>(), want, 1e-6 * want) << i;
  }
  // No scaling at factor 1; the softmax correction 0.1 * mscale * ln(factor) + 1.
  yarn.factor = 1;
  EXPECT_TRUE(at::equal(yarn_frequencies(dim, theta, yarn),
                        rope_frequencies(dim, theta, /*scaling=*/nullptr)));
  EXPECT_DOUBLE_EQ(yarn_mscale(40, 0.7), 0.07 * std::log(40.0) + 1);
  EXPECT_DOUBLE_EQ(yarn_mscale(1, 0.7), 1.0);
  MlaArgs args;
  args.kv_lora_rank = 512;
  args.yarn.factor = 40;
  args.mscale = 0.7;
  const double m = 0.07 * std::log(40.0) + 1;
  EXPECT_DOUBLE_EQ(mla_softmax_scale(args), m * m / std::sqrt(192.0));
}

// MLA of one layer in float64 against the formula written out head by head: interleaved-pair
// rotation with the YaRN table, the rotary key shared by the heads, an explicit causal softmax.
TEST(DeepSeekV3, LatentAttentionMatchesDirectComputation) {
  for (const int64_t q_lora : {0, 12}) {
    SCOPED_TRACE("q_lora_rank " + std::to_string(q_lora));
    MlaArgs args;
    args.q_lora_rank = q_lora;
    args.kv_lora_rank = 10;
    args.qk_nope_head_dim = 6;
    args.qk_rope_head_dim = 4;
    args.v_head_dim = 12;  // wider than q/k (10): the padding goes the other way too
    args.mscale = 0.7;
    args.yarn.factor = 8;
    args.yarn.original_seq_len = 16;
    const int64_t dim = 16, heads = 3, bs = 2, n = 7;
    const RotaryEmbedding rope(args.qk_rope_head_dim, 32, 10000.0, args.yarn);
    MultiHeadLatentAttention mla(dim, heads, args);
    mla.to(at::kDouble);
    at::manual_seed(1);
    {
      at::NoGradGuard no_grad;
      for (auto& p : mla.parameters()) p.normal_(0, 0.3);
    }
    const at::Tensor x = at::randn({bs, n, dim}, at::kDouble);
    const at::Tensor got = mla.forward(x, rope);

    const auto lin = [](const at::Tensor& t, const std::shared_ptr<Linear>& l) {
      return at::matmul(t, l->weight.t());
    };
    const auto rms = [](const at::Tensor& t, const std::shared_ptr<RMSNorm>& norm) {
      return t / at::sqrt(t.pow(2).mean(-1, /*keepdim=*/true) + norm->eps) * norm->weight;
    };
    // The rotation by the module's float32 tables (YaRNFrequenciesMatchTheFormula checks them).
    const auto rotate = [&](const at::Tensor& t, int64_t pos) {  // t (rope)
      at::Tensor out = t.clone();
      for (int64_t i = 0; i < args.qk_rope_head_dim / 2; ++i) {
        const double c = rope.cos[pos][i].item<double>(), s = rope.sin[pos][i].item<double>();
        const at::Tensor x0 = t[2 * i], x1 = t[2 * i + 1];
        out[2 * i] = x0 * c - x1 * s;
        out[2 * i + 1] = x0 * s + x1 * c;
      }
      return out;
    };
    const at::Tensor q_all =
        q_lora == 0 ? lin(x, mla.wq) : lin(rms(lin(x, mla.wq_a), mla.q_norm), mla.wq_b);
    const at::Tensor kv = lin(x, mla.wkv_a);
    const at::Tensor kvb = lin(rms(kv.narrow(-1, 0, 10), mla.kv_norm), mla.wkv_b);
    const double scale = mla_softmax_scale(args);
    at::Tensor heads_out = at::zeros({bs, n, heads * 12}, at::kDouble);
    for (int64_t b = 0; b < bs; ++b) {
      for (int64_t h = 0; h < heads; ++h) {
        std::vector<at::Tensor> qs, ks, vs;
        for (int64_t t = 0; t < n; ++t) {
          const at::Tensor qh = q_all[b][t].narrow(0, h * 10, 10);
          qs.push_back(at::cat({qh.narrow(0, 0, 6), rotate(qh.narrow(0, 6, 4), t)}));
          const at::Tensor kh = kvb[b][t].narrow(0, h * 18, 18);
          ks.push_back(at::cat({kh.narrow(0, 0, 6), rotate(kv[b][t].narrow(0, 10, 4), t)}));
          vs.push_back(kh.narrow(0, 6, 12));
        }
        for (int64_t t = 0; t < n; ++t) {
          std::vector<double> s;
          double top = -1e300;
          for (int64_t u = 0; u <= t; ++u) {
            s.push_back(at::dot(qs[t], ks[u]).item<double>() * scale);
            top = std::max(top, s.back());
          }
          double total = 0;
          for (double& e : s) total += (e = std::exp(e - top));
          at::Tensor o = at::zeros({12}, at::kDouble);
          for (int64_t u = 0; u <= t; ++u) o += vs[u] * (s[u] / total);
          heads_out[b][t].narrow(0, h * 12, 12).copy_(o);
        }
      }
    }
    const at::Tensor want = lin(heads_out, mla.wo);
    EXPECT_LT((got - want).abs().max().item<double>(), 1e-12);
  }
}

// The whole tiny model in float64 (MLA with a q latent, a dense layer, sigmoid group-limited MoE
// with a shared expert): autograd against central differences.
TEST(DeepSeekV3, TinyGradientsMatchFiniteDifferences) {
  auto model = tiny_model(/*seed=*/3, /*max_seq_len=*/8);
  model->to(at::kDouble);
  at::manual_seed(5);
  const at::Tensor tokens = at::randint(300, {2, 8}, at::kLong);
  const at::Tensor probe = at::randn({2, 8, 300}, at::kDouble);
  const auto loss = [&] { return (model->forward(tokens) * probe).sum(); };
  loss().backward();
  test::expect_top_gradients_match(
      *model,
      {"layers.0.attention.wq_a.weight", "layers.0.attention.q_norm.weight",
       "layers.1.attention.wkv_a.weight", "layers.1.attention.kv_norm.weight",
       "layers.2.attention.wkv_b.weight", "layers.0.feed_forward.w2.weight",
       "layers.1.moe.gate.weight", "layers.2.moe.experts.w1.weight",
       "layers.1.moe.shared_experts.w3.weight", "tok_embeddings.weight"},
      loss);
}

TEST(DeepSeekV3, CachedDecodingEqualsTheFullForward) {
  const auto model = tiny_model(/*seed=*/7, /*max_seq_len=*/32);
  at::manual_seed(2);
  const at::Tensor tokens = at::randint(300, {2, 12}, at::kLong);
  KVCache cache(/*max_len=*/32);
  const at::Tensor full = test::expect_cached_decoding_matches(*model, tokens, /*prefix=*/5, cache);
  EXPECT_EQ(cache.length, 12);
  // Rewinding reuses the cache: positions 8.. again give the same logits.
  const at::Tensor again = model->forward_cached(tokens.narrow(1, 8, 4), cache, 8);
  EXPECT_LT((again - full.narrow(1, 8, 4)).abs().max().item<double>(), 1e-4);
}

TEST(DeepSeekV3, BlockCausalKeepsDocumentsApart) {
  const auto model = tiny_model(/*seed=*/4, /*max_seq_len=*/16);
  at::NoGradGuard no_grad;
  at::manual_seed(3);
  const at::Tensor a = at::randint(300, {1, 6}, at::kLong);
  const at::Tensor b = at::randint(300, {1, 10}, at::kLong);
  // The second document alone, and packed after the first with document ids 0 / 1.
  const at::Tensor alone = model->forward(b);
  ForwardInputs inputs;
  inputs.document_ids = at::cat({at::zeros({1, 6}, at::kLong), at::ones({1, 10}, at::kLong)}, 1);
  const at::Tensor packed = model->forward(at::cat({a, b}, 1), inputs);
  // RoPE sees other positions, but relative rotations are what the scores depend on.
  EXPECT_LT((packed.narrow(1, 6, 10) - alone).abs().max().item<double>(), 1e-4);
}

TEST(DeepSeekV3, RefusesSplitHeads) {
  // The refusal comes from the degrees alone, before any group is used.
  const ParallelizeFn parallelize = parallelize_fn("deepseek_v3");
  const auto refusal = [&](const ParallelDegrees& degrees, int64_t world) {
    try {
      parallelize(tiny_model(0), ParallelDims(degrees, world), /*rank=*/0, ParallelizeOptions{});
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no ConfigError");
  };
  ParallelDegrees tp;
  tp.tp = 3;  // 4 heads
  EXPECT_NE(refusal(tp, 3).find("n_heads 4 is not divisible by tensor_parallel_degree 3"),
            std::string::npos)
      << refusal(tp, 3);
}

// A few AdamW steps on one batch: the loss falls, and the balancing step moves expert biases.
TEST(DeepSeekV3, TrainingLowersTheLoss) {
  const auto model = tiny_model(/*seed=*/1, /*max_seq_len=*/32);
  at::manual_seed(6);
  const at::Tensor data = at::randint(300, {4, 33}, at::kLong);
  const at::Tensor inputs = data.narrow(1, 0, 32), targets = data.narrow(1, 1, 32);
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(3e-3));
  double first = 0, last = 0;
  for (int step = 0; step < 25; ++step) {
    opt.zero_grad();
    const at::Tensor loss = loss_of(model->forward(inputs), targets);
    loss.backward();
    opt.step();
    for (auto& module : model->modules()) {
      if (auto* moe = dynamic_cast<MoE*>(module.get())) moe->update_expert_bias();
    }
    (step == 0 ? first : last) = loss.item<double>();
  }
  EXPECT_LT(last, first - 1.0) << "first " << first << ", last " << last;
  bool moved = false;
  for (auto& module : model->modules()) {
    if (auto* moe = dynamic_cast<MoE*>(module.get()))
      moved |= moe->expert_bias.abs().sum().item<double>() > 0;
  }
  EXPECT_TRUE(moved);
}

TEST(DeepSeekV3, HuggingFaceRoundTrip) {
  const auto model = tiny_model(/*seed=*/2);
  const llama3::Llama3Args& args = model->args();
  // config.json back to the same flavor.
  const nlohmann::json config = deepseek_v3::hf_config(args);
  EXPECT_EQ(config["q_lora_rank"], 32);
  EXPECT_EQ(config["n_group"], 4);
  EXPECT_EQ(config["rope_scaling"]["rope_type"], "yarn");
  // (max_position_embeddings carries the model's RoPE table length, 64 here.)
  EXPECT_EQ(llama3::describe_args(deepseek_v3::args_from_hf_config(config), deepseek_v3::family()),
            nlohmann::json(
                {{"name", "deepseek_v3"}, {"flavor", "tiny"}, {"args", {{"max_seq_len", 64}}}}));
  // Tensors (parameters and expert biases) to HF names and back, bit for bit.
  TensorMap ours;
  for (const auto& item : model->named_parameters()) ours.emplace(item.key(), item.value());
  for (const auto& item : model->named_buffers()) {
    if (item.key().find("expert_bias") != std::string::npos) {
      ours.emplace(item.key(), at::randn(item.value().sizes()));
    }
  }
  const TensorMap hf = deepseek_v3::to_hf_tensors(ours, args);
  for (const char* name : {"model.layers.0.self_attn.q_a_proj.weight",
                           "model.layers.0.self_attn.kv_a_proj_with_mqa.weight",
                           "model.layers.1.mlp.gate.e_score_correction_bias",
                           "model.layers.2.mlp.experts.7.down_proj.weight",
                           "model.layers.1.mlp.shared_experts.up_proj.weight", "lm_head.weight"}) {
    EXPECT_TRUE(hf.count(name)) << name;
  }
  const TensorMap back = deepseek_v3::from_hf_tensors(hf, args);
  test::expect_same_tensors(ours, back);
  // The released folders' multi-token prediction layer (model.layers.<n_layers>.*) is not read
  // (with a warning), as transformers skips it.
  TensorMap with_mtp = hf;
  with_mtp.emplace("model.layers.3.eh_proj.weight", at::zeros({64, 128}));
  with_mtp.emplace("model.layers.3.enorm.weight", at::ones({64}));
  test::expect_same_tensors(ours, deepseek_v3::from_hf_tensors(with_mtp, args));
  // What DeepseekV3ForCausalLM cannot express, and what we cannot read, is refused by name.
  const auto refusal = test::message_of;
  EXPECT_NE(refusal([] {
              deepseek_v3::hf_config(llama3::args_for_flavor("16B", deepseek_v3::family()));
            }).find("sigmoid"),
            std::string::npos);
  nlohmann::json halves = config;
  halves["rope_interleave"] = false;
  EXPECT_NE(refusal([&] { deepseek_v3::args_from_hf_config(halves); }).find("rope_interleave"),
            std::string::npos);
  nlohmann::json fp8 = config;
  fp8["quantization_config"] = {{"quant_method", "fp8"}};
  EXPECT_NE(refusal([&] { deepseek_v3::args_from_hf_config(fp8); }).find("dequantize"),
            std::string::npos);
  nlohmann::json scaled = config;
  scaled["rope_scaling"]["mscale"] = 0.5;  // cos/sin scaled by mscale(0.5) / mscale(1)
  EXPECT_NE(refusal([&] { deepseek_v3::args_from_hf_config(scaled); }).find("attention factor"),
            std::string::npos);
}

}  // namespace test_deepseek_v3
}  // namespace titan
