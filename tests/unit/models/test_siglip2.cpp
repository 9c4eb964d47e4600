// The SigLIP2 vision encoder (models/vlm/siglip2.h): against transformers' Siglip2VisionModel on
// a tiny random folder (written by tests/e2e/siglip2_reference.py, run by test_vlm.sh), padding
// patches' independence, and the name mapping's refusals.
#include "titan/checkpoint/safetensors.h"
#include "titan/common/check.h"
#include "titan/models/encoders/load.h"
#include "titan/models/vlm/siglip2.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

namespace titan {
namespace siglip2_test {

vlm::Siglip2Args tiny() {
  vlm::Siglip2Args a;
  a.hidden_size = 32;
  a.intermediate_size = 64;
  a.num_hidden_layers = 2;
  a.num_attention_heads = 4;
  a.patch_size = 4;
  a.num_patches = 16;
  return a;
}

void randomize(torch::nn::Module& m, uint64_t seed) {
  at::NoGradGuard no_grad;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  for (auto& p : m.parameters()) p.normal_(0.0, 0.2, gen);
}

TEST(Siglip2, MatchesTransformers) {
  const char* dir = std::getenv("TITAN_SIGLIP2_FIXTURE");
  if (dir == nullptr) GTEST_SKIP() << "run by tests/e2e/test_vlm.sh";
  const std::string folder = dir;
  std::ifstream config_file(folder + "/config.json");
  const vlm::Siglip2Args args = vlm::siglip2_args_from_hf(nlohmann::json::parse(config_file));
  EXPECT_TRUE(args.vision_use_head);
  vlm::Siglip2VisionEncoder encoder(args);
  const ckpt::SafetensorsReader weights(folder + "/model.safetensors");
  TensorMap hf;
  for (const auto& e : weights.entries()) hf[e.name] = weights.read(e.name);
  encoders::load_named_tensors(encoder, vlm::siglip2_from_hf(hf), "siglip2");

  const ckpt::SafetensorsReader io(folder + "/io.safetensors");
  at::NoGradGuard no_grad;
  const vlm::Siglip2Output out = encoder.forward(
      io.read("pixel_values"), io.read("pixel_attention_mask"), io.read("spatial_shapes"));
  const auto check = [](const at::Tensor& got, const at::Tensor& want, const char* what) {
    ASSERT_EQ(got.sizes(), want.sizes()) << what;
    const double err = (got - want).abs().max().item<double>();
    EXPECT_LT(err, 2e-5 * std::max(1.0, want.abs().max().item<double>())) << what;
    std::printf(
        "siglip2 vision encoder vs transformers Siglip2VisionModel: %s max abs diff %.3g "
        "(max %.3g)\n",
        what, err, want.abs().max().item<double>());
  };
  check(out.last_hidden_state, io.read("last_hidden_state"), "last hidden state");
  check(out.pooled, io.read("pooler_output"), "pooled output");
}

TEST(Siglip2, PaddingPatchesChangeNothingReal) {
  vlm::Siglip2VisionEncoder encoder(tiny());
  randomize(encoder, 1);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(2);
  at::Tensor pixels = at::randn({1, 16, 48}, gen);
  const at::Tensor mask = (at::arange(16) < 6).to(at::kLong).view({1, 16});
  const at::Tensor shapes = at::tensor({2, 3}, at::kLong).view({1, 2});
  at::NoGradGuard no_grad;
  const vlm::Siglip2Output a = encoder.forward(pixels, mask, shapes);
  pixels.narrow(1, 6, 10).normal_(0.0, 5.0, gen);  // other padding
  const vlm::Siglip2Output b = encoder.forward(pixels, mask, shapes);
  EXPECT_TRUE(at::allclose(a.last_hidden_state.narrow(1, 0, 6), b.last_hidden_state.narrow(1, 0, 6),
                           1e-5, 1e-6));
  EXPECT_TRUE(at::allclose(a.pooled, b.pooled, 1e-5, 1e-6));
  // The same image with fewer slots (less padding) gives the same outputs.
  const vlm::Siglip2Output c =
      encoder.forward(pixels.narrow(1, 0, 8), mask.narrow(1, 0, 8), shapes);
  EXPECT_TRUE(at::allclose(c.pooled, a.pooled, 1e-5, 1e-6));
}

TEST(Siglip2, RefusesWhatItCannotHold) {
  nlohmann::json config = {{"hidden_size", 32}, {"num_attention_heads", 4}, {"num_patches", 15}};
  EXPECT_THROW(vlm::siglip2_args_from_hf(config), ConfigError);
  config["num_patches"] = 16;
  config["hidden_act"] = "relu";
  EXPECT_THROW(vlm::siglip2_args_from_hf(config), ConfigError);
  EXPECT_THROW(vlm::siglip2_from_hf({{"logit_scale", at::zeros({1})}}), DataError);
  vlm::Siglip2VisionEncoder encoder(tiny());
  EXPECT_THROW(encoder.forward(at::zeros({1, 4, 48}), at::ones({1, 4}, at::kLong),
                               at::tensor({3, 3}, at::kLong).view({1, 2})),
               c10::Error);  // a 3 x 3 grid in 4 slots
}

}  // namespace siglip2_test
}  // namespace titan
