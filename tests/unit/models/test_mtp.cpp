// Multi-token prediction (DeepSeek-V3's MTP modules, Llama3Args::num_mtp_layers): the targets
// each depth predicts (shifted, cut at the sequence end and at document boundaries), the
// auxiliary losses forward reports against the depths composed by hand and against the
// mtp_logits path, the fused and plain heads alike, gradients reaching the depths and the shared
// embedding and head, the units and how often each runs, the sizes, the parallelisms refused, and
// the Hugging Face names (tests/e2e/test_mtp.sh checks the depths against transformers' MtpModel).
#include "titan/common/check.h"
#include "titan/models/deepseek_v3/hf_adapter.h"
#include "titan/models/deepseek_v3/spec.h"
#include "titan/models/llama3/model.h"
#include "titan/models/registry.h"

#include "../test_util.h"
#include "finite_difference.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

namespace titan {
namespace test_mtp {

std::shared_ptr<llama3::Transformer> build(const std::string& flavor, uint64_t seed = 3) {
  ModelBuildOptions options;
  options.max_seq_len = 64;
  options.seed = seed;
  return std::dynamic_pointer_cast<llama3::Transformer>(
      get_model_spec("deepseek_v3").build(flavor, options));
}

// Each depth's mean cross-entropy, composed from the model's pieces: the trunk, the main norm,
// then per depth the module on [embedding of the tokens k ahead, previous h] and the output head.
std::vector<at::Tensor> by_hand(llama3::Transformer& m, const at::Tensor& tokens,
                                const at::Tensor& targets, const at::Tensor& docs) {
  at::Tensor h = m.embed(tokens);
  for (const auto& layer : m.layers) h = layer->forward(h, *m.rope, {}, nullptr, docs);
  at::Tensor hidden = m.norm->forward(h);
  std::vector<at::Tensor> out;
  const int64_t seq = tokens.size(1);
  for (size_t j = 0; j < m.mtp.size(); ++j) {
    const auto k = static_cast<int64_t>(j + 1);
    // The tokens k ahead; the last k positions read anything (here: zeros), they predict nothing.
    const at::Tensor ahead = at::cat(
        {tokens.narrow(1, k, seq - k), at::zeros({tokens.size(0), k}, tokens.options())}, 1);
    hidden = m.mtp[j]->forward(at::cat({m.embed(ahead), hidden}, -1), *m.rope, {}, docs);
    const at::Tensor logits = m.output->forward(hidden).to(at::kFloat);
    out.push_back(at::cross_entropy_loss(logits.flatten(0, 1),
                                         llama3::mtp_targets(targets, docs, k).flatten(), {},
                                         at::Reduction::Mean, -100));
  }
  return out;
}

TEST(MultiTokenPrediction, TargetsShiftAndStopAtTheEndAndAtDocuments) {
  const at::Tensor targets = at::arange(10, 16, at::kLong).view({1, 6});
  EXPECT_TRUE(at::equal(llama3::mtp_targets(targets, {}, 2),
                        at::tensor(std::vector<int64_t>{12, 13, 14, 15, -100, -100}).view({1, 6})));
  const at::Tensor docs = at::tensor(std::vector<int64_t>{0, 0, 0, 1, 1, 1}).view({1, 6});
  EXPECT_TRUE(
      at::equal(llama3::mtp_targets(targets, docs, 2),
                at::tensor(std::vector<int64_t>{12, -100, -100, 15, -100, -100}).view({1, 6})));
  // Labels that predict nothing (-100, chat prompts) stay so.
  at::Tensor masked = targets.clone();
  masked[0][3] = -100;
  EXPECT_EQ(llama3::mtp_targets(masked, {}, 1)[0][2].item<int64_t>(), -100);
}

TEST(MultiTokenPrediction, AuxiliaryLossesAreTheDepthsComposedByHand) {
  auto model = build("tiny_mtp");
  ASSERT_EQ(model->mtp.size(), 2u);
  const at::Tensor tokens = at::randint(0, 300, {2, 24}, at::kLong);
  const at::Tensor targets = at::randint(0, 300, {2, 24}, at::kLong);
  // Two documents per row: depths do not predict across them.
  const at::Tensor docs = (at::arange(24, at::kLong) >= 10).to(at::kLong).expand({2, 24});
  for (const at::Tensor& d : {at::Tensor(), docs}) {
    std::vector<AuxiliaryLoss> aux;
    ForwardInputs inputs;
    inputs.document_ids = d;
    inputs.targets = targets;
    inputs.auxiliary_losses = &aux;
    const at::Tensor logits = model->forward(tokens, inputs);
    ForwardInputs plain;
    plain.document_ids = d;
    // The main model's logits are the same with and without the depths.
    EXPECT_TRUE(at::equal(logits, model->forward(tokens, plain)));
    ASSERT_EQ(aux.size(), 2u);
    const std::vector<at::Tensor> want = by_hand(*model, tokens, targets, d);
    for (size_t k = 0; k < 2; ++k) {
      EXPECT_EQ(aux[k].name, "mtp_loss");
      EXPECT_NEAR(aux[k].value.item<double>(), want[k].item<double>(), 1e-5) << k;
      EXPECT_TRUE(at::equal(aux[k].labels, llama3::mtp_targets(targets, d, k + 1)));
    }
  }
  // No targets, or nowhere to put the losses: the main model alone.
  std::vector<AuxiliaryLoss> none;
  ForwardInputs no_targets;
  no_targets.auxiliary_losses = &none;
  model->forward(tokens, no_targets);
  EXPECT_TRUE(none.empty());
}

TEST(MultiTokenPrediction, MtpLogitsFusedLossAndGradients) {
  auto model = build("tiny_mtp");
  const at::Tensor tokens = at::randint(0, 300, {2, 16}, at::kLong);
  const at::Tensor targets = at::roll(tokens, -1, 1);
  // mtp_logits (conversion, drafting) and the training path agree.
  const std::vector<at::Tensor> logits = model->mtp_logits(tokens);
  ASSERT_EQ(logits.size(), 2u);
  std::vector<AuxiliaryLoss> aux;
  ForwardInputs inputs;
  inputs.targets = targets;
  inputs.auxiliary_losses = &aux;
  const at::Tensor main_logits = model->forward(tokens, inputs);
  for (size_t k = 0; k < 2; ++k) {
    const at::Tensor ce = at::cross_entropy_loss(logits[k].flatten(0, 1), aux[k].labels.flatten(),
                                                 {}, at::Reduction::Mean, -100);
    EXPECT_NEAR(ce.item<double>(), aux[k].value.item<double>(), 1e-5);
  }
  // The fused linear + cross-entropy computes the depths' losses too.
  std::vector<AuxiliaryLoss> fused;
  ForwardInputs with_loss = inputs;
  with_loss.loss_labels = targets;
  with_loss.auxiliary_losses = &fused;
  const at::Tensor loss = model->forward(tokens, with_loss);
  EXPECT_EQ(loss.dim(), 0);
  ASSERT_EQ(fused.size(), 2u);
  for (size_t k = 0; k < 2; ++k) {
    EXPECT_NEAR(fused[k].value.item<double>(), aux[k].value.item<double>(), 1e-5);
  }
  // The depths' losses train the depths, the shared embedding and head, and the main blocks
  // (through the hidden state depth 1 reads).
  model->zero_grad();
  (fused[0].value + fused[1].value).backward();
  for (const char* name :
       {"mtp.0.eh_proj.weight", "mtp.1.block.attention.wkv_a.weight", "mtp.1.norm.weight",
        "mtp.0.block.moe.experts.w2.weight", "tok_embeddings.weight", "output.weight",
        "norm.weight", "layers.0.attention.wo.weight"}) {
    const at::Tensor g = model->named_parameters()[name].grad();
    ASSERT_TRUE(g.defined()) << name;
    EXPECT_GT(g.abs().max().item<double>(), 0.0) << name;
  }
}

// Counts each unit's runs.
class CountingRunner : public UnitRunner {
 public:
  at::Tensor run(int64_t index, const at::Tensor& input, const UnitFn& next) override {
    ++runs[index];
    return next(input);
  }
  void begin_forward() override { ++forwards; }
  std::map<int64_t, int> runs;
  int forwards = 0;
};

TEST(MultiTokenPrediction, UnitsRunOncePerDepthMore) {
  auto model = build("tiny_mtp");
  const std::vector<ModelUnit> units = model->units();
  // tok_embeddings, layers.0..2, "norm, output", mtp.0, mtp.1.
  ASSERT_EQ(units.size(), 7u);
  EXPECT_TRUE(units[0].reused_in_forward);
  EXPECT_EQ(units[4].name, "norm, output");
  EXPECT_TRUE(units[4].reused_in_forward);
  EXPECT_EQ(units[5].name, "mtp.0");
  EXPECT_EQ(units[5].block, 3);  // layer id n_layers + depth - 1: activation checkpointing's
  EXPECT_EQ(units[6].block, 4);
  int64_t listed = 0;
  for (const auto& u : units) listed += static_cast<int64_t>(u.params.size());
  EXPECT_EQ(listed, static_cast<int64_t>(model->named_parameters().size()));
  CountingRunner counter;
  model->add_unit_runner(&counter);
  std::vector<AuxiliaryLoss> aux;
  ForwardInputs inputs;
  inputs.targets = at::zeros({1, 8}, at::kLong);
  inputs.auxiliary_losses = &aux;
  model->forward(at::zeros({1, 8}, at::kLong), inputs);
  EXPECT_EQ(counter.forwards, 1);
  // The embedding once per depth more; the head for the logits, the normed hidden state and each
  // depth's projection; each depth's module once.
  EXPECT_EQ(counter.runs,
            (std::map<int64_t, int>{{0, 3}, {1, 1}, {2, 1}, {3, 1}, {4, 4}, {5, 1}, {6, 1}}));
  model->remove_unit_runner(&counter);
}

TEST(MultiTokenPrediction, SizesRefusalsAndFlavors) {
  const ModelSpec& spec = get_model_spec("deepseek_v3");
  test::expect_stats_count_parameters(spec, {"tiny_mtp", "debugmodel_mtp"});
  // One depth of debugmodel: an MoE block, eh_proj and three norms more; the head once more per
  // token in the FLOPs.
  const ModelStats base = spec.describe("debugmodel", 1, 128, at::kFloat);
  const ModelStats mtp = spec.describe("debugmodel_mtp", 1, 128, at::kFloat);
  EXPECT_EQ(mtp.n_mtp_layers, 1);
  EXPECT_GT(mtp.n_params - base.n_params, 2 * 256 * 256);
  EXPECT_GT(mtp.flops_per_token(128) - base.flops_per_token(128), 6.0 * 256 * 2048);
  EXPECT_GT(mtp.activation_bytes, base.activation_bytes);

  auto model = build("tiny_mtp");
  for (const char* parallelism : {"pipeline", "tensor", "context"}) {
    EXPECT_NE(model->refuses(parallelism).find("multi-token prediction"), std::string::npos);
  }
  EXPECT_TRUE(model->refuses("expert").empty());
  EXPECT_TRUE(build("tiny")->refuses("pipeline").empty());
  EXPECT_NE(test::message_of([&] {
              model->keep_only({"tok_embeddings", "layers.0"});
            }).find("pipeline parallelism"),
            std::string::npos);
  // num_mtp_layers is an argument of descriptions, checked.
  nlohmann::json custom = {
      {"name", "deepseek_v3"}, {"flavor", "tiny"}, {"args", {{"num_mtp_layers", 17}}}};
  EXPECT_NE(test::message_of([&] { spec.resolve_args(custom); }).find("num_mtp_layers"),
            std::string::npos);
  custom["args"]["num_mtp_layers"] = 2;
  EXPECT_EQ(spec.resolve_args(custom),
            spec.resolve_args({{"name", "deepseek_v3"}, {"flavor", "tiny_mtp"}}));
}

TEST(MultiTokenPrediction, HuggingFaceNames) {
  llama3::Llama3Args args = llama3::args_for_flavor("tiny_mtp", deepseek_v3::family());
  args.max_seq_len = 64;
  llama3::Transformer model(args);
  TensorMap ours = test::random_tensors_like(model);
  for (const auto& item : model.named_buffers()) {
    if (item.key().find("expert_bias") != std::string::npos) {
      ours.emplace(item.key(), at::randn(item.value().sizes()));
    }
  }
  const TensorMap hf = deepseek_v3::to_hf_tensors(ours, args);
  // DeepSeek-V3's layout: depth j is layer n_layers + j, with the embedding and head repeated.
  for (const char* name :
       {"model.layers.3.enorm.weight", "model.layers.3.hnorm.weight",
        "model.layers.3.eh_proj.weight", "model.layers.3.shared_head.norm.weight",
        "model.layers.4.shared_head.head.weight", "model.layers.4.embed_tokens.weight",
        "model.layers.4.self_attn.kv_a_proj_with_mqa.weight",
        "model.layers.4.mlp.gate.e_score_correction_bias",
        "model.layers.3.mlp.experts.7.down_proj.weight", "model.layers.3.input_layernorm.weight"}) {
    EXPECT_TRUE(hf.count(name)) << name;
  }
  EXPECT_TRUE(at::equal(hf.at("model.layers.4.shared_head.head.weight"), ours.at("output.weight")));
  EXPECT_EQ(deepseek_v3::hf_config(args)["num_nextn_predict_layers"], 2);
  test::expect_same_tensors(ours, deepseek_v3::from_hf_tensors(hf, args));
  // A model with fewer depths reads the ones it has (the rest with a warning).
  llama3::Llama3Args one = args;
  one.num_mtp_layers = 1;
  const TensorMap fewer = deepseek_v3::from_hf_tensors(hf, one);
  EXPECT_TRUE(fewer.count("mtp.0.block.attention.wo.weight"));
  EXPECT_FALSE(fewer.count("mtp.1.eh_proj.weight"));
  // The description follows the layers a folder holds (transformers writes
  // num_nextn_predict_layers 1 without saving the layer).
  const nlohmann::json described = llama3::describe_args(args, deepseek_v3::family());
  std::vector<std::string> names;
  for (const auto& [name, t] : hf) {
    if (name.rfind("model.layers.4.", 0) != 0) names.push_back(name);
  }
  nlohmann::json fitted = deepseek_v3::fit_to_tensors(described, names);
  EXPECT_EQ(llama3::args_from_description(fitted, deepseek_v3::family()).num_mtp_layers, 1);
  std::vector<std::string> main_only;
  for (const auto& name : names) {
    if (name.rfind("model.layers.3.", 0) != 0) main_only.push_back(name);
  }
  fitted = deepseek_v3::fit_to_tensors(described, main_only);
  EXPECT_EQ(fitted["flavor"], "tiny");
}

}  // namespace test_mtp
}  // namespace titan
