// The vision-language model (models/vlm/model.h): image features land on the placeholder tokens
// and the rest is the Llama 3 decoder (checked against a decoder stage fed the scattered
// embeddings), images only affect later positions of their own sample, gradients reach the
// encoder and the projector, units cover every parameter once, and cached decoding after an
// image prefill equals whole forwards.
#include "titan/common/check.h"
#include "titan/models/registry.h"
#include "titan/models/vlm/model.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

namespace titan {
namespace vlm_test {

constexpr int64_t kSlots = 4;  // patch slots per image

vlm::VlmArgs tiny_args() {
  vlm::VlmArgs a;
  a.decoder = llama3::args_for_flavor("tiny");  // dim 64, 2 layers, vocab 300
  a.decoder.max_seq_len = 32;
  a.encoder.hidden_size = 32;
  a.encoder.intermediate_size = 48;
  a.encoder.num_hidden_layers = 2;
  a.encoder.num_attention_heads = 2;
  a.encoder.patch_size = 2;
  a.encoder.num_patches = 16;
  a.encoder.vision_use_head = false;
  return a;
}

std::shared_ptr<vlm::VlmTransformer> tiny_model() {
  auto model = std::make_shared<vlm::VlmTransformer>(tiny_args());
  model->init_weights(/*seed=*/3);
  return model;
}

// Two samples of 12 tokens: sample 0 has a 2 x 2 image at positions 2..5, sample 1 a 1 x 3 image
// at positions 3..5 (id 299 stands for the placeholder).
struct Inputs {
  at::Tensor tokens;
  ForwardInputs forward;
};
Inputs example(uint64_t seed = 1) {
  Inputs in;
  in.tokens = at::randint(0, 290, {2, 12}, at::make_generator<at::CPUGeneratorImpl>(seed));
  at::Tensor image_mask = at::zeros({2, 12}, at::kLong);
  image_mask[0].narrow(0, 2, 4).fill_(1);
  image_mask[1].narrow(0, 3, 3).fill_(1);
  in.tokens.masked_fill_(image_mask != 0, 299);
  at::Tensor patch_mask = at::zeros({2, kSlots}, at::kLong);
  patch_mask[0].fill_(1);
  patch_mask[1].narrow(0, 0, 3).fill_(1);
  auto& c = in.forward.conditioning;
  c["pixel_values"] =
      at::randn({2, kSlots, 3 * 2 * 2}, at::make_generator<at::CPUGeneratorImpl>(seed + 1));
  c["patch_mask"] = patch_mask;
  c["spatial_shapes"] = at::tensor({2, 2, 1, 3}, at::kLong).view({2, 2});
  c["image_mask"] = image_mask;
  return in;
}

TEST(Vlm, IsTheDecoderOverScatteredImageFeatures) {
  auto model = tiny_model();
  const Inputs in = example();
  at::NoGradGuard no_grad;
  const at::Tensor logits = model->forward(in.tokens, in.forward);
  ASSERT_EQ(logits.sizes(), (std::vector<int64_t>{2, 12, 300}));

  // The reference: encoder -> post norm -> projector, scattered by hand, through a decoder
  // stage (no embedding) holding the same weights.
  const auto& c = in.forward.conditioning;
  const at::Tensor hidden =
      model->encoder->forward(c.at("pixel_values"), c.at("patch_mask"), c.at("spatial_shapes"))
          .last_hidden_state;
  const at::Tensor features = model->projector->forward(hidden);  // (2, 4, 64)
  at::Tensor h = model->tok_embeddings->forward(in.tokens).clone();
  h[0].narrow(0, 2, 4).copy_(features[0]);
  h[1].narrow(0, 3, 3).copy_(features[1].narrow(0, 0, 3));
  auto stage = std::make_shared<llama3::Transformer>(tiny_args().decoder);
  stage->keep_only({"layers.0", "layers.1", "norm", "output"});
  for (const auto& item : stage->named_parameters()) {
    item.value().copy_(model->named_parameters()[item.key()]);
  }
  EXPECT_TRUE(at::allclose(stage->forward(h), logits, /*rtol=*/1e-5, /*atol=*/1e-6));
}

TEST(Vlm, AnImageChangesOnlyLaterPositionsOfItsSample) {
  auto model = tiny_model();
  Inputs in = example();
  at::NoGradGuard no_grad;
  const at::Tensor before = model->forward(in.tokens, in.forward);
  in.forward.conditioning["pixel_values"][0].add_(1.0);
  const at::Tensor after = model->forward(in.tokens, in.forward);
  EXPECT_TRUE(at::equal(before[0].narrow(0, 0, 2), after[0].narrow(0, 0, 2)));
  EXPECT_FALSE(at::allclose(before[0].narrow(0, 2, 10), after[0].narrow(0, 2, 10)));
  EXPECT_TRUE(at::equal(before[1], after[1]));
  // Padding patch slots are not read.
  in.forward.conditioning["pixel_values"][1][3].add_(5.0);
  EXPECT_TRUE(at::equal(after[1], model->forward(in.tokens, in.forward)[1]));
}

TEST(Vlm, PlaceholderCountMustMatchThePatches) {
  auto model = tiny_model();
  Inputs in = example();
  in.forward.conditioning["image_mask"][1][8] = 1;
  try {
    model->forward(in.tokens, in.forward);
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("8 image placeholder tokens for 7 image patches"),
              std::string::npos)
        << e.what();
  }
  in.forward.conditioning.erase("spatial_shapes");
  EXPECT_THROW(model->forward(in.tokens, in.forward), c10::Error);
}

TEST(Vlm, GradientsReachTheEncoderAndTheProjector) {
  auto model = tiny_model();
  const Inputs in = example();
  const at::Tensor logits = model->forward(in.tokens, in.forward);
  at::cross_entropy_loss(logits.flatten(0, 1), at::roll(in.tokens, -1, 1).flatten()).backward();
  for (const auto& item : model->named_parameters()) {
    ASSERT_TRUE(item.value().grad().defined()) << item.key();
    if (item.key().rfind("encoder.", 0) == 0 || item.key().rfind("projector.", 0) == 0) {
      EXPECT_GT(item.value().grad().abs().sum().item<double>(), 0.0) << item.key();
    }
  }
}

TEST(Vlm, UnitsHoldEveryParameterOnceInForwardOrder) {
  auto model = tiny_model();
  std::multiset<std::string> listed;
  const std::vector<ModelUnit> units = model->units();
  for (const ModelUnit& unit : units) listed.insert(unit.params.begin(), unit.params.end());
  std::multiset<std::string> params;
  int64_t numel = 0;
  for (const auto& item : model->named_parameters()) {
    params.insert(item.key());
    numel += item.value().numel();
  }
  EXPECT_EQ(listed, params);
  ASSERT_EQ(units.size(), 1u + 2 + 1 + 1 + 2 + 1);
  EXPECT_EQ(units[0].name, "encoder.embeddings");
  EXPECT_EQ(units[3].name, "encoder.post_layernorm, projector");
  EXPECT_EQ(units[4].name, "tok_embeddings");
  EXPECT_EQ(model->stats(1, 12).n_params, numel);
  EXPECT_TRUE(model->refuses("tensor").empty());
  EXPECT_FALSE(model->refuses("pipeline").empty());
  EXPECT_FALSE(model->refuses("context").empty());
  EXPECT_TRUE(model->refuses("data").empty());
}

TEST(Vlm, CachedDecodingWithAnImageEqualsWholeForwards) {
  auto model = tiny_model();
  const Inputs in = example();
  // The first sample alone as a prompt of its first 8 tokens (its image is whole in them).
  std::map<std::string, at::Tensor> conditioning;
  for (const auto& [key, value] : in.forward.conditioning)
    conditioning[key] = value.narrow(0, 0, 1);
  conditioning["image_mask"] = conditioning["image_mask"].narrow(1, 0, 8);
  const at::Tensor prompt = in.tokens.narrow(0, 0, 1).narrow(1, 0, 8);
  {
    at::NoGradGuard no_grad;
    ForwardInputs inputs;
    inputs.conditioning = conditioning;
    KVCache cache(16);
    EXPECT_TRUE(at::allclose(model->prefill_cached(prompt, conditioning, cache),
                             model->forward(prompt, inputs), 1e-5, 1e-6));
    EXPECT_EQ(cache.length, 8);
  }
  // Greedy decoding: cached steps after the image prefill equal whole forwards over the growing
  // sequence (the image mask extended with zeros).
  at::NoGradGuard no_grad;
  KVCache cache(16);
  at::Tensor cached_logits = model->prefill_cached(prompt, conditioning, cache);
  at::Tensor sequence = prompt;
  for (int step = 0; step < 4; ++step) {
    ForwardInputs inputs;
    inputs.conditioning = conditioning;
    inputs.conditioning["image_mask"] =
        at::constant_pad_nd(conditioning["image_mask"], {0, sequence.size(1) - 8}, 0);
    const at::Tensor full = model->forward(sequence, inputs);
    EXPECT_TRUE(at::allclose(cached_logits[0][-1], full[0][-1], 1e-4, 1e-5)) << step;
    const at::Tensor next = full[0][-1].argmax().view({1, 1});
    sequence = at::cat({sequence, next}, 1);
    cached_logits = model->forward_cached(next, cache, sequence.size(1) - 1);
  }
  // A text-only model refuses images with its prompt.
  auto text_only = std::make_shared<llama3::Transformer>(tiny_args().decoder);
  text_only->init_weights(1);
  KVCache other(16);
  EXPECT_THROW(text_only->prefill_cached(prompt, conditioning, other), ConfigError);
}

TEST(Vlm, Registered) {
  const ModelSpec& spec = get_model_spec("vlm");
  EXPECT_EQ(spec.objective, ModelObjective::kVisionLanguage);
  EXPECT_EQ(spec.flavors, std::vector<std::string>{"debugmodel"});
  ModelBuildOptions options;
  options.max_seq_len = 64;
  options.meta = true;
  const auto model = spec.build("debugmodel", options);
  int64_t numel = 0;
  for (const auto& p : model->parameters()) numel += p.numel();
  EXPECT_EQ(spec.describe("debugmodel", 1, 64, at::kFloat).n_params, numel);
  // Descriptions with args resolve and refuse unknown keys with the nearest.
  const nlohmann::json custom = {{"name", "vlm"},
                                 {"flavor", "debugmodel"},
                                 {"args", {{"encoder", {{"num_hidden_layers", 2}}}}}};
  EXPECT_EQ(spec.resolve_args(custom)["encoder"]["num_hidden_layers"], 2);
  EXPECT_THROW(spec.resolve_args({{"name", "vlm"},
                                  {"flavor", "debugmodel"},
                                  {"args", {{"encoder", {{"hiden_size", 2}}}}}}),
               ConfigError);
}

}  // namespace vlm_test
}  // namespace titan
