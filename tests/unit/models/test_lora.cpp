// LoRA (models/lora.h): the adapted layer's output and gradients against W x + s B A x written
// out with plain ATen ops, which layers the converter adapts (our names and Hugging Face's), what
// it freezes, its initialization (PEFT's), merging, and PEFT's names and layouts both ways; the
// routed experts' adapters (targets, refusals, merging, PEFT's target_parameters layout).
#include "titan/common/check.h"
#include "titan/models/common/init.h"
#include "titan/models/common/linear.h"
#include "titan/models/common/moe.h"
#include "titan/models/llama3/hf_adapter.h"
#include "titan/models/llama3/model.h"
#include "titan/models/lora.h"
#include "titan/models/registry.h"

#include "../parallel/parallel_test_util.h"

#include <gtest/gtest.h>

#include <cmath>

namespace titan {
namespace test_lora {

constexpr int64_t kVocab = 61;

llama3::Llama3Args tiny_args() { return test::tiny_args(/*tied=*/false, kVocab); }

// The description of tiny_args(), for the Hugging Face names.
nlohmann::json tiny_description() { return test::tiny_description(kVocab); }

std::shared_ptr<llama3::Transformer> tiny_model() {
  auto m = std::make_shared<llama3::Transformer>(tiny_args());
  m->init_weights(7);
  return m;
}

nlohmann::json moe_description() { return {{"name", "qwen3"}, {"flavor", "tiny_moe"}}; }

LoraSpec spec(std::vector<std::string> targets, int64_t rank = 4) {
  LoraSpec s;
  s.rank = rank;
  s.alpha = 8;
  s.target_modules = std::move(targets);
  return s;
}

// Gives every lora_b a non-zero value (it starts at zero), so that every adapter moves the output.
void perturb_adapters(Model& model) {
  at::NoGradGuard no_grad;
  for (auto& item : model.named_parameters()) {
    if (is_lora_param(item.key()) && item.key().find("lora_b") != std::string::npos) {
      init_whole(item.value(), ParamInit::normal(0, 0.1), 3, item.key());
    }
  }
}

TEST(LoraLinear, OutputAndGradientsAreTheLowRankUpdate) {
  at::manual_seed(0);
  auto layer = std::make_shared<Linear>(12, 10);
  const at::Tensor w = at::randn({10, 12});
  layer->weight.set_data(w.clone());
  layer->lora_a = layer->register_module("lora_a", std::make_shared<Linear>(12, 3));
  layer->lora_b = layer->register_module("lora_b", std::make_shared<Linear>(3, 10));
  layer->lora_a->weight.set_data(at::randn({3, 12}));
  layer->lora_b->weight.set_data(at::randn({10, 3}));
  layer->lora_scaling = 0.75;
  layer->weight.set_requires_grad(false);
  const at::Tensor x = at::randn({2, 5, 12}).requires_grad_();
  const at::Tensor y = layer->forward(x);
  // The same function with plain ops, on separate leaves.
  const at::Tensor a = layer->lora_a->weight.detach().clone().requires_grad_();
  const at::Tensor b = layer->lora_b->weight.detach().clone().requires_grad_();
  const at::Tensor x2 = x.detach().clone().requires_grad_();
  const at::Tensor want = at::matmul(x2, w.t()) + at::matmul(at::matmul(x2, a.t()), b.t()) * 0.75;
  EXPECT_TRUE(at::allclose(y, want, 1e-5, 1e-5));
  const at::Tensor g = at::randn(y.sizes());
  y.backward(g);
  want.backward(g);
  ASSERT_TRUE(layer->lora_a->weight.grad().defined());
  ASSERT_TRUE(layer->lora_b->weight.grad().defined());
  ASSERT_TRUE(a.grad().defined());
  ASSERT_TRUE(x.grad().defined());
  EXPECT_TRUE(at::allclose(layer->lora_a->weight.grad(), a.grad(), 1e-5, 1e-5));
  EXPECT_TRUE(at::allclose(layer->lora_b->weight.grad(), b.grad(), 1e-5, 1e-5));
  EXPECT_TRUE(at::allclose(x.grad(), x2.grad(), 1e-5, 1e-5));
  EXPECT_FALSE(layer->weight.grad().defined());  // frozen: no weight-gradient GEMM
}

TEST(LoraConverter, AdaptsTheTargetsByEitherNameAndFreezesTheRest) {
  auto m = tiny_model();
  const LoraApplied a = apply_lora(*m, spec({"wq", "v_proj"}), tiny_description());
  EXPECT_EQ(a.adapted,
            (std::vector<std::string>{"layers.0.attention.wq", "layers.0.attention.wv",
                                      "layers.1.attention.wq", "layers.1.attention.wv"}));
  int64_t trained = 0, frozen = 0;
  for (const auto& item : m->named_parameters()) {
    if (is_lora_param(item.key())) {
      EXPECT_TRUE(item.value().requires_grad()) << item.key();
      trained += item.value().numel();
    } else {
      EXPECT_FALSE(item.value().requires_grad()) << item.key();
      frozen += item.value().numel();
    }
  }
  EXPECT_EQ(trained, a.adapter_params);
  EXPECT_EQ(frozen, a.frozen_params);
  // wq: A (4, 24), B (16, 4); wv: B (12, 4) with 2 kv heads of 6.
  EXPECT_EQ(trained, 2 * (4 * 24 + 24 * 4 + 4 * 24 + 12 * 4));
  const auto params = m->named_parameters();
  EXPECT_EQ(params["layers.1.attention.wv.lora_b.weight"].sizes(), at::IntArrayRef({12, 4}));
  EXPECT_EQ(params["layers.0.attention.wq.lora_a.weight"].sizes(), at::IntArrayRef({4, 24}));
}

TEST(LoraConverter, AllLinearAdaptsEveryLayerOfTheBlocksOnly) {
  auto m = tiny_model();
  const LoraApplied a = apply_lora(*m, spec({kAllLinear}), tiny_description());
  EXPECT_EQ(a.adapted.size(), 14u);  // 7 per block
  for (const std::string& name : a.adapted) EXPECT_EQ(name.rfind("layers.", 0), 0u) << name;
}

TEST(LoraConverter, UnknownTargetsNameTheNearestLayer) {
  auto m = tiny_model();
  try {
    apply_lora(*m, spec({"wq", "q_prj"}), tiny_description());
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("'q_prj' matches no linear layer"), std::string::npos) << what;
    EXPECT_NE(what.find("did you mean 'q_proj'"), std::string::npos) << what;
  }
  // Nothing was changed by the failed call.
  for (const auto& item : m->named_parameters()) EXPECT_TRUE(item.value().requires_grad());
}

TEST(LoraConverter, StartsAsTheBaseModelWithPeftsInit) {
  auto base = tiny_model();
  auto m = tiny_model();
  apply_lora(*m, spec({"wq", "wk", "wv", "wo", "w2"}), tiny_description());
  m->init_weights(7);  // base weights as before; adapters from set_param_init
  const at::Tensor tokens = at::randint(0, kVocab, {2, 8});
  EXPECT_TRUE(at::equal(m->forward(tokens), base->forward(tokens)));  // B = 0
  for (const auto& item : m->named_parameters()) {
    if (item.key().find("lora_a") == std::string::npos) continue;
    const double bound = 1.0 / std::sqrt(static_cast<double>(item.value().size(1)));
    EXPECT_LE(item.value().abs().max().item<double>(), bound) << item.key();
    EXPECT_GT(item.value().abs().max().item<double>(), 0.8 * bound) << item.key();
    // The mean of n uniforms on [-b, b] has standard deviation b / sqrt(3 n): 4 of them.
    const double n = static_cast<double>(item.value().numel());
    EXPECT_NEAR(item.value().mean().item<double>(), 0.0, 4 * bound / std::sqrt(3 * n))
        << item.key();
  }
  for (const auto& item : m->named_parameters()) {
    if (item.key().find("lora_b") != std::string::npos) {
      EXPECT_EQ(item.value().abs().max().item<double>(), 0.0) << item.key();
    }
  }
}

TEST(LoraInit, UniformBoxesAgreeWithTheWholeParameter) {
  const ParamInit init = ParamInit::uniform(-0.5, 0.25);
  at::Tensor whole = at::empty({6, 10});
  init_whole(whole, init, 11, "p");
  EXPECT_GE(whole.min().item<double>(), -0.5);
  EXPECT_LT(whole.max().item<double>(), 0.25);
  at::Tensor box = at::empty({3, 4});
  ShardBox b = ShardBox::whole({6, 10});
  b.offsets = {2, 5};
  init_box(box, init, 11, "p", b);
  EXPECT_TRUE(at::equal(box, whole.narrow(0, 2, 3).narrow(1, 5, 4)));
}

TEST(LoraMerge, MergedWeightsGiveTheAdaptedModelsLogits) {
  auto m = tiny_model();
  const LoraSpec s = spec({kAllLinear});
  apply_lora(*m, s, tiny_description());
  m->init_weights(7);
  perturb_adapters(*m);
  TensorMap params;
  for (const auto& item : m->named_parameters()) params.emplace(item.key(), item.value().detach());
  const TensorMap merged = merge_lora(params, s);
  EXPECT_EQ(merged.size(), params.size() - 28);
  auto plain = tiny_model();
  {
    at::NoGradGuard no_grad;
    for (auto& item : plain->named_parameters()) item.value().copy_(merged.at(item.key()));
  }
  const at::Tensor tokens = at::randint(0, kVocab, {2, 8});
  at::NoGradGuard no_grad;
  const at::Tensor want = m->forward(tokens);
  const at::Tensor got = plain->forward(tokens);
  EXPECT_GT((want - tiny_model()->forward(tokens)).abs().max().item<double>(), 1e-3);
  EXPECT_LT((got - want).abs().max().item<double>(), 1e-4);
}

TEST(LoraPeft, NamesAndLayoutsRoundTrip) {
  auto m = tiny_model();
  apply_lora(*m, spec({"wq", "w2"}), tiny_description());
  m->init_weights(7);
  perturb_adapters(*m);
  TensorMap params;
  for (const auto& item : m->named_parameters()) params.emplace(item.key(), item.value().detach());
  const TensorMap peft = to_peft_tensors(params, tiny_description());
  ASSERT_EQ(peft.size(), 8u);
  const std::string q = "base_model.model.model.layers.1.self_attn.q_proj.";
  ASSERT_TRUE(peft.count(q + "lora_A.weight"));
  ASSERT_TRUE(peft.count(q + "lora_B.weight"));
  ASSERT_TRUE(peft.count("base_model.model.model.layers.0.mlp.down_proj.lora_B.weight"));
  // B's rows follow the q projection's rotary layout; A is as trained.
  EXPECT_TRUE(
      at::equal(peft.at(q + "lora_B.weight"),
                llama3::permute_to_hf(params.at("layers.1.attention.wq.lora_b.weight"), 4)));
  EXPECT_TRUE(
      at::equal(peft.at(q + "lora_A.weight"), params.at("layers.1.attention.wq.lora_a.weight")));
  const TensorMap back = from_peft_tensors(peft, tiny_description(), spec({"wq", "w2"}));
  ASSERT_EQ(back.size(), 8u);
  for (const auto& [name, t] : back) EXPECT_TRUE(at::equal(t, params.at(name))) << name;
  const nlohmann::json config = peft_adapter_config(params, tiny_description(), spec({"wq", "w2"}));
  EXPECT_EQ(config["target_modules"], nlohmann::json({"down_proj", "q_proj"}));
  EXPECT_EQ(config["r"], 4);
  const LoraSpec read = lora_spec_from_peft_config(config, "adapter_config.json");
  EXPECT_EQ(read.rank, 4);
  EXPECT_EQ(read.alpha, 8);
  nlohmann::json dora = config;
  dora["use_dora"] = true;
  EXPECT_THROW(lora_spec_from_peft_config(dora, "adapter_config.json"), ConfigError);
  TensorMap stray = peft;
  stray["base_model.model.model.layers.0.self_attn.q_proj.lora_magnitude_vector"] = at::ones({2});
  EXPECT_THROW(from_peft_tensors(stray, tiny_description(), spec({"wq", "w2"})), DataError);
}

TEST(LoraDescription, LoadersRebuildTheAdapters) {
  const nlohmann::json d = with_lora(tiny_description(), spec({"wv"}, 2));
  ModelBuildOptions options;
  options.max_seq_len = 16;
  const std::shared_ptr<Model> m = build_described_model(d, options);
  const auto params = m->named_parameters();
  ASSERT_NE(params.find("layers.0.attention.wv.lora_a.weight"), nullptr);
  EXPECT_EQ(params["layers.0.attention.wv.lora_a.weight"].sizes(), at::IntArrayRef({2, 24}));
  EXPECT_EQ(base_description(d), tiny_description());
  EXPECT_EQ(LoraSpec::from_json(d["lora"]).to_json(), spec({"wv"}, 2).to_json());
}

// The routed experts of a Qwen3-MoE model (2 MoE layers, 4 experts of hidden 64 over dim 64).
std::shared_ptr<Model> moe_model(const LoraSpec& lora) {
  ModelBuildOptions options;
  options.max_seq_len = 16;
  auto m = build_described_model(with_lora(moe_description(), lora), options);
  m->init_weights(5);
  perturb_adapters(*m);
  return m;
}

TEST(LoraExperts, AdaptTheRoutedExpertsOnlyWhenNamed) {
  auto m = moe_model(spec({"q_proj", "experts"}));
  const auto params = m->named_parameters();
  const std::string e = "layers.1.moe.experts.";
  // w1 and w3 share one A (PEFT's gate_up_proj), w2 has its own; (experts, ...) each.
  EXPECT_EQ(params[e + "w1.lora_a.weight"].sizes(), at::IntArrayRef({4, 4, 64}));
  EXPECT_EQ(params[e + "w1.lora_b.weight"].sizes(), at::IntArrayRef({4, 64, 4}));
  EXPECT_EQ(params[e + "w3.lora_b.weight"].sizes(), at::IntArrayRef({4, 64, 4}));
  EXPECT_EQ(params.find(e + "w3.lora_a.weight"), nullptr);
  EXPECT_EQ(params[e + "w2.lora_a.weight"].sizes(), at::IntArrayRef({4, 4, 64}));
  EXPECT_EQ(params[e + "w2.lora_b.weight"].sizes(), at::IntArrayRef({4, 64, 4}));
  EXPECT_FALSE(params[e + "w1.weight"].requires_grad());
  for (const auto& [name, moe] : moe_layers(*m)) EXPECT_TRUE(moe->expert_bias_frozen) << name;
  // all-linear leaves them (as PEFT's does); one part alone; w1 without w3 is refused.
  EXPECT_EQ(moe_model(spec({kAllLinear}))->named_parameters().find(e + "w1.lora_a.weight"),
            nullptr);
  const auto down = moe_model(spec({"experts.down_proj"}))->named_parameters();
  EXPECT_EQ(down.find(e + "w1.lora_a.weight"), nullptr);
  EXPECT_NE(down.find(e + "w2.lora_a.weight"), nullptr);
  EXPECT_NE(moe_model(spec({"experts.w1", "experts.w3"}))
                ->named_parameters()
                .find(e + "w3.lora_b.weight"),
            nullptr);
  const auto refused = [&](const LoraSpec& s, const std::string& text) {
    try {
      moe_model(s);
      ADD_FAILURE() << "no error for " << s.to_json().dump();
    } catch (const ConfigError& err) {
      EXPECT_NE(std::string(err.what()).find(text), std::string::npos) << err.what();
    }
  };
  refused(spec({"experts.w1"}), "names experts.w1 without experts.w3");
  LoraSpec dropout = spec({"experts"});
  dropout.dropout = 0.1;
  refused(dropout, "with adapters on the routed experts");
  try {
    auto dense = tiny_model();
    apply_lora(*dense, spec({"experts"}), tiny_description());
    ADD_FAILURE() << "a dense model took an experts target";
  } catch (const ConfigError& err) {
    EXPECT_NE(std::string(err.what()).find("'experts' matches no linear layer"), std::string::npos)
        << err.what();
  }
}

// The adapted experts compute with W + s B A per expert: merging gives the same logits, and the
// PEFT layout (A (experts * r, in), B (out, r * experts), gate_up's B w1's rows then w3's) goes
// there and back bit for bit.
TEST(LoraExperts, MergeAndPeftRoundTrip) {
  const LoraSpec s = spec({"wq", "experts"});
  auto m = moe_model(s);
  TensorMap params;
  for (const auto& item : m->named_parameters()) params.emplace(item.key(), item.value().detach());
  const TensorMap merged = merge_lora(params, s);
  ModelBuildOptions options;
  options.max_seq_len = 16;
  auto plain = build_described_model(moe_description(), options);
  {
    at::NoGradGuard no_grad;
    for (auto& item : plain->named_parameters()) item.value().copy_(merged.at(item.key()));
  }
  const at::Tensor tokens = at::randint(0, 300, {2, 8});
  at::NoGradGuard no_grad;
  const at::Tensor want = m->forward(tokens);
  EXPECT_LT((plain->forward(tokens) - want).abs().max().item<double>(), 1e-4);

  const nlohmann::json description = with_lora(moe_description(), s);
  const TensorMap peft = to_peft_tensors(params, description);
  const std::string e = "base_model.model.model.layers.0.mlp.experts.";
  ASSERT_TRUE(peft.count(e + "base_layer.lora_A.weight")) << "gate_up_proj nests under down_proj";
  const at::Tensor a = peft.at(e + "base_layer.lora_A.weight");  // (experts * r, dim)
  const at::Tensor b = peft.at(e + "base_layer.lora_B.weight");  // (2 hidden, r * experts)
  EXPECT_EQ(a.sizes(), at::IntArrayRef({16, 64}));
  EXPECT_EQ(b.sizes(), at::IntArrayRef({128, 16}));
  // Expert 2's rank-1 row of A, and its column of B (w3's half).
  const std::string o = "layers.0.moe.experts.";
  EXPECT_TRUE(at::equal(a[2 * 4 + 1], params.at(o + "w1.lora_a.weight")[2][1]));
  EXPECT_TRUE(at::equal(b.narrow(0, 64, 64).select(1, 1 * 4 + 2),
                        params.at(o + "w3.lora_b.weight")[2].select(1, 1)));
  const TensorMap back = from_peft_tensors(peft, description, s);
  ASSERT_EQ(back.size(), params.size() - merged.size());
  for (const auto& [name, t] : back) EXPECT_TRUE(at::equal(t, params.at(name))) << name;
  const nlohmann::json config = peft_adapter_config(params, description, s);
  EXPECT_EQ(config["target_modules"], nlohmann::json({"q_proj"}));
  EXPECT_EQ(config["target_parameters"],
            nlohmann::json({"experts.down_proj", "experts.gate_up_proj"}));
  const LoraSpec read = lora_spec_from_peft_config(config, "adapter_config.json");
  EXPECT_EQ(read.target_modules,
            std::vector<std::string>({"q_proj", "experts.down_proj", "experts.gate_up_proj"}));
  // peft adapts parameters without dropout: such an export of adapters trained with it is refused.
  LoraSpec with_dropout = s;
  with_dropout.dropout = 0.1;
  EXPECT_THROW(peft_adapter_config(params, description, with_dropout), DataError);
  nlohmann::json other = config;
  other["target_parameters"] = {"experts.gate_proj"};
  EXPECT_THROW(lora_spec_from_peft_config(other, "adapter_config.json"), ConfigError);
}

}  // namespace test_lora
}  // namespace titan
