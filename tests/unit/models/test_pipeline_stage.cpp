// Pipeline stages of the Llama 3 Transformer (Model::keep_only, TorchTitan's
// pipeline_module_split): stages composed in order give bitwise the whole model's logits and,
// feeding each stage's input gradient to the stage before, bitwise its parameter gradients; the
// stages' parameters partition the whole model's under the same names; units, plans, init and
// errors follow what each stage holds.
#include "../distributed/multirank.h"

#include "titan/common/check.h"
#include "titan/models/llama3/model.h"
#include "titan/models/registry.h"
#include "titan/parallel/tensor_parallel.h"
#include "titan/plan/pipeline_split.h"

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

namespace titan {
namespace test_pipeline_stage {

using Parts = std::vector<std::vector<std::string>>;

constexpr int64_t kLayers = 4;

std::shared_ptr<llama3::Transformer> tiny_model(at::ScalarType compute_dtype = at::kFloat,
                                                bool tied = false) {
  llama3::Llama3Args args = llama3::args_for_flavor("tiny");
  args.n_layers = kLayers;
  args.max_seq_len = 32;
  args.tie_embeddings = tied;
  auto model = std::make_shared<llama3::Transformer>(args, compute_dtype);
  model->init_weights(/*seed=*/7);
  return model;
}

std::vector<std::shared_ptr<llama3::Transformer>> stages_of(const Parts& parts,
                                                            at::ScalarType compute_dtype) {
  std::vector<std::shared_ptr<llama3::Transformer>> stages;
  for (const auto& part : parts) {
    stages.push_back(tiny_model(compute_dtype));
    stages.back()->keep_only(part);
  }
  return stages;
}

// Mean next-token cross-entropy, as the trainer computes it.
at::Tensor loss_of(const at::Tensor& logits, const at::Tensor& targets) {
  return at::nll_loss(at::log_softmax(logits.reshape({-1, logits.size(-1)}), -1),
                      targets.reshape(-1));
}

std::set<std::string> param_names(torch::nn::Module& module) {
  std::set<std::string> names;
  for (const auto& item : module.named_parameters()) names.insert(item.key());
  return names;
}

const Parts kTwoStages = {{"tok_embeddings", "layers.0", "layers.1"},
                          {"layers.2", "layers.3", "norm", "output"}};
const Parts kFourStages = {
    {"tok_embeddings", "layers.0"}, {"layers.1"}, {"layers.2"}, {"layers.3", "norm", "output"}};
const Parts kUneven = {{"tok_embeddings", "layers.0"},
                       {"layers.1", "layers.2", "layers.3", "norm", "output"}};
// Stages that hold no layer: the embedding alone, the head alone.
const Parts kBareEnds = {
    {"tok_embeddings"}, {"layers.0", "layers.1", "layers.2", "layers.3"}, {"norm", "output"}};

// Runs the stages in order on `tokens`, then backward from the loss through each stage, feeding
// each stage's input gradient to the stage before; checks logits and every parameter gradient
// bitwise against the whole model.
void expect_stages_match_whole(const Parts& parts, at::ScalarType compute_dtype) {
  SCOPED_TRACE(::testing::Message()
               << parts.size() << " stages, compute " << at::toString(compute_dtype));
  at::manual_seed(3);
  const auto whole = tiny_model(compute_dtype);
  const int64_t vocab = whole->args().vocab_size;
  const at::Tensor tokens = at::randint(vocab, {2, 16}, at::kLong);
  const at::Tensor targets = at::randint(vocab, {2, 16}, at::kLong);
  const at::Tensor logits = whole->forward(tokens);
  loss_of(logits, targets).backward();

  auto stages = stages_of(parts, compute_dtype);
  std::vector<at::Tensor> inputs, outputs;
  for (size_t s = 0; s < stages.size(); ++s) {
    EXPECT_EQ(stages[s]->is_first_stage(), s == 0);
    EXPECT_EQ(stages[s]->is_last_stage(), s + 1 == stages.size());
    // A later stage's input is a leaf, as a received activation is.
    const at::Tensor input = s == 0 ? tokens : outputs.back().detach().requires_grad_(true);
    inputs.push_back(input);
    outputs.push_back(stages[s]->forward(input));
    if (s + 1 < stages.size()) {
      EXPECT_EQ(outputs.back().sizes(), at::IntArrayRef({2, 16, whole->args().dim}));
      EXPECT_EQ(outputs.back().scalar_type(), llama3::residual_dtype(compute_dtype));
    }
  }
  ASSERT_TRUE(at::equal(outputs.back(), logits));

  loss_of(outputs.back(), targets).backward();
  for (size_t s = stages.size() - 1; s > 0; --s) outputs[s - 1].backward(inputs[s].grad());

  const auto expected = whole->named_parameters();
  size_t checked = 0;
  for (const auto& stage : stages) {
    for (const auto& item : stage->named_parameters()) {
      ASSERT_TRUE(item.value().grad().defined()) << item.key();
      EXPECT_TRUE(at::equal(item.value().grad(), expected[item.key()].grad())) << item.key();
      ++checked;
    }
  }
  EXPECT_EQ(checked, expected.size());
}

TEST(PipelineStage, ComposedStagesMatchTheWholeModelBitwise) {
  for (const Parts& parts : {kTwoStages, kFourStages, kUneven, kBareEnds}) {
    expect_stages_match_whole(parts, at::kFloat);
  }
}

TEST(PipelineStage, ComposedBf16StagesMatchTheWholeModelBitwise) {
  // The hidden state between stages is bf16 (the residual dtype), as embed returns it.
  expect_stages_match_whole(kTwoStages, at::kBFloat16);
  expect_stages_match_whole(kFourStages, at::kBFloat16);
}

TEST(PipelineStage, ParametersPartitionTheWholeModelUnderGlobalNames) {
  const auto whole = tiny_model();
  const auto expected = whole->named_parameters();
  for (const Parts& parts : {kTwoStages, kFourStages, kUneven, kBareEnds}) {
    std::set<std::string> seen;
    for (const auto& stage : stages_of(parts, at::kFloat)) {
      for (const auto& item : stage->named_parameters()) {
        EXPECT_TRUE(seen.insert(item.key()).second) << item.key() << " in two stages";
        ASSERT_NE(expected.find(item.key()), nullptr) << item.key();
        // Same init, whatever the split.
        EXPECT_TRUE(at::equal(item.value(), expected[item.key()])) << item.key();
      }
    }
    EXPECT_EQ(seen, param_names(*whole));
  }
  const auto middle = stages_of({{"layers.1", "layers.2"}}, at::kFloat)[0];
  std::set<std::string> names = param_names(*middle);
  EXPECT_EQ(names.count("layers.1.attention.wq.weight"), 1u);
  EXPECT_EQ(names.count("layers.2.feed_forward.w2.weight"), 1u);
  EXPECT_EQ(names.size(), 18u);  // 9 per block
  // Re-initializing a stage gives the values the whole model has at those names.
  middle->init_weights(/*seed=*/7);
  for (const auto& item : middle->named_parameters()) {
    EXPECT_TRUE(at::equal(item.value(), expected[item.key()])) << item.key();
  }
}

TEST(PipelineStage, UnitsAreThoseOfThePresentModules) {
  const auto stages = stages_of(kTwoStages, at::kFloat);
  auto names_of = [](const std::vector<ModelUnit>& units) {
    std::vector<std::string> names;
    for (const auto& u : units) names.push_back(u.name);
    return names;
  };
  const auto first = stages[0]->units(), last = stages[1]->units();
  EXPECT_EQ(names_of(first), (std::vector<std::string>{"tok_embeddings", "layers.0", "layers.1"}));
  EXPECT_EQ(names_of(last), (std::vector<std::string>{"layers.2", "layers.3", "norm, output"}));
  EXPECT_EQ(first[0].block, -1);
  EXPECT_EQ(first[2].block, 1);
  EXPECT_EQ(last[0].block, 2);  // the block's index in the whole model
  EXPECT_EQ(last[1].block, 3);
  EXPECT_EQ(last[2].block, -1);
  EXPECT_EQ(last[0].params.front(), "layers.2.attention.wq.weight");
  for (size_t s = 0; s < stages.size(); ++s) {
    std::set<std::string> in_units;
    for (const auto& u : stages[s]->units()) {
      EXPECT_FALSE(u.reused_in_forward);
      for (const auto& p : u.params) EXPECT_TRUE(in_units.insert(p).second) << p;
    }
    EXPECT_EQ(in_units, param_names(*stages[s]));
  }
}

TEST(PipelineStage, TensorParallelStagesComposeToTheWholeModel) {
  // Each stage's plan has rules for its own modules only (tensor parallelism rejects a rule that
  // matches nothing); over 2 ranks the stages pass sequence-sharded hidden states along.
  size_t rules = 0;
  for (const auto& stage : stages_of(kBareEnds, at::kFloat)) {
    rules += stage->tensor_parallel_plan().size();
  }
  EXPECT_EQ(rules, tiny_model()->tensor_parallel_plan().size());

  at::manual_seed(5);
  const at::Tensor tokens = at::randint(tiny_model()->args().vocab_size, {2, 16}, at::kLong);
  const at::Tensor expected = tiny_model()->forward(tokens);
  std::vector<std::vector<std::shared_ptr<llama3::Transformer>>> stages = {
      stages_of(kBareEnds, at::kFloat), stages_of(kBareEnds, at::kFloat)};
  test::run_ranks(2, [&](int rank, std::shared_ptr<dist::Group> world) {
    std::vector<std::unique_ptr<TensorParallel>> tp;
    at::Tensor x = tokens;
    for (const auto& stage : stages[rank]) {
      tp.push_back(std::make_unique<TensorParallel>(*stage, world, /*loss_parallel=*/false));
      x = stage->forward(x);
    }
    EXPECT_TRUE(at::allclose(x, expected, 1e-4, 1e-5))
        << "rank " << rank << ": max diff " << (x - expected).abs().max().item<double>();
  });
}

TEST(PipelineStage, MetaModelsFromTheRegistrySplitAsTorchTitanSplits) {
  ModelBuildOptions options;
  options.meta = true;
  options.max_seq_len = 64;
  const ModelSpec& spec = get_model_spec("llama3");
  const auto whole = spec.build("debugmodel", options);
  const ModelStats whole_stats = whole->stats(/*batch=*/2, /*seq_len=*/64);
  const Parts parts = pp::generate_llm_fqns_per_stage(/*n_stages=*/4, /*n_layers=*/6,
                                                      /*input_weight=*/1, /*output_weight=*/1);
  std::set<std::string> seen;
  for (size_t s = 0; s < parts.size(); ++s) {
    const auto stage = spec.build("debugmodel", options);
    stage->keep_only(parts[s]);
    EXPECT_EQ(stage->is_first_stage(), s == 0);
    EXPECT_EQ(stage->is_last_stage(), s + 1 == parts.size());
    for (const auto& item : stage->named_parameters()) {
      EXPECT_TRUE(item.value().is_meta()) << item.key();
      EXPECT_TRUE(seen.insert(item.key()).second) << item.key();
    }
    // Whole-model numbers on every stage.
    EXPECT_EQ(stage->stats(2, 64).n_params, whole_stats.n_params);
  }
  EXPECT_EQ(seen, param_names(*whole));
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// The message of the ConfigError that keep_only(modules) throws on a fresh tiny model.
std::string keep_only_error(const std::vector<std::string>& modules, bool tied = false) {
  try {
    tiny_model(at::kFloat, tied)->keep_only(modules);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(PipelineStage, BadModuleListsAreConfigErrors) {
  EXPECT_PRED2(contains, keep_only_error({}), "empty");
  EXPECT_PRED2(contains, keep_only_error({"layers.4"}), "no module 'layers.4'");
  EXPECT_PRED2(contains, keep_only_error({"tok_embedding"}), "did you mean 'tok_embeddings'");
  EXPECT_PRED2(contains, keep_only_error({"layers.0", "layers.0"}), "listed twice");
  EXPECT_PRED2(contains, keep_only_error({"layers.1", "layers.0"}), "comes before it");
  EXPECT_PRED2(contains, keep_only_error({"layers.0", "layers.2"}), "skipping 'layers.1'");
  EXPECT_PRED2(contains, keep_only_error({"layers.3", "norm"}), "norm without output");
  EXPECT_PRED2(contains, keep_only_error({"output"}), "output without norm");
  // A stage splits again only within what it holds.
  const auto stage = tiny_model();
  stage->keep_only({"layers.2", "layers.3", "norm", "output"});
  EXPECT_THROW(stage->keep_only({"layers.1"}), ConfigError);
  stage->keep_only({"layers.3", "norm", "output"});
  EXPECT_EQ(stage->units().size(), 2u);
}

TEST(PipelineStage, TiedEmbeddingsKeepTheWholeModelOnly) {
  EXPECT_PRED2(contains, keep_only_error({"tok_embeddings", "layers.0"}, /*tied=*/true),
               "tied embeddings");
  EXPECT_PRED2(contains, keep_only_error({"layers.3", "norm", "output"}, /*tied=*/true),
               "HINT: set tie_embeddings = false");
  const auto tied = tiny_model(at::kFloat, /*tied=*/true);
  const size_t n_params = tied->named_parameters().size();
  tied->keep_only(pp::generate_llm_fqns_per_stage(1, kLayers, 1, 1)[0]);
  EXPECT_EQ(tied->named_parameters().size(), n_params);
  EXPECT_TRUE(tied->units()[0].reused_in_forward);
}

TEST(PipelineStage, StagesCheckTheirInputAndRefuseCachedInference) {
  const auto whole = tiny_model(at::kBFloat16);
  auto middle = stages_of({{"layers.1", "layers.2"}}, at::kBFloat16)[0];
  const at::Tensor tokens = at::zeros({1, 4}, at::kLong);
  EXPECT_THROW(middle->forward(tokens), c10::Error);  // tokens where the hidden state belongs
  // float32 where the bf16 residual stream belongs.
  EXPECT_THROW(middle->forward(at::zeros({1, 4, whole->args().dim})), c10::Error);
  EXPECT_EQ(middle->forward(whole->embed(tokens)).scalar_type(), at::kBFloat16);
  KVCache cache(/*max_len=*/16);
  EXPECT_THROW(middle->forward_cached(tokens, cache, 0), c10::Error);
}

// A model without a pipeline split.
class Unsplittable : public Model {
 public:
  at::Tensor run_forward(const at::Tensor& tokens, const ForwardInputs&) override { return tokens; }
  ParamInit param_init(const std::string&) const override { return ParamInit::zeros(); }
  ModelStats stats(int64_t, int64_t) const override { return {}; }
  std::vector<ModelUnit> units() const override { return {}; }
};

TEST(PipelineStage, ModelsWithoutASplitSaySo) {
  Unsplittable model;
  EXPECT_TRUE(model.is_first_stage());
  EXPECT_TRUE(model.is_last_stage());
  try {
    model.keep_only({"layers.0"});
    FAIL() << "keep_only should throw";
  } catch (const ConfigError& e) {
    EXPECT_PRED2(contains, std::string(e.what()), "does not support pipeline");
  }
}

}  // namespace test_pipeline_stage
}  // namespace titan
