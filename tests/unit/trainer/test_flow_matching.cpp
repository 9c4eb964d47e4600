// Rectified-flow inputs for FLUX (trainer/flow_matching.h): latent packing against the einops
// pattern written out by hand, the noisy input / velocity target identity, per-sample noise that
// does not depend on the batch, and the stratified validation timesteps.
#include "titan/trainer/flow_matching.h"

#include "titan/models/flux/latents.h"

#include "titan/common/check.h"
#include "titan/components/data/image_batches.h"
#include "titan/components/tokenizer/tokenizer.h"

#include <gtest/gtest.h>

namespace titan {
namespace flow_matching_test {

TEST(FlowMatching, PackingFollowsTheEinopsPatternAndRoundTrips) {
  const at::Tensor x = at::arange(2 * 3 * 4 * 6, at::kFloat).view({2, 3, 4, 6});
  const at::Tensor packed = flux::pack_latents(x);
  ASSERT_EQ(packed.sizes(), (std::vector<int64_t>{2, 6, 12}));
  // "b c (h ph) (w pw) -> b (h w) (c ph pw)": token (h, w) = (1, 2), feature (c, ph, pw) =
  // (2, 1, 0) is x[b, 2, 2 * 1 + 1, 2 * 2 + 0].
  EXPECT_EQ(packed[1][1 * 3 + 2][2 * 4 + 1 * 2 + 0].item<float>(), x[1][2][3][4].item<float>());
  EXPECT_TRUE(at::equal(flux::unpack_latents(packed, 4, 6), x));
  const at::Tensor ids = flux::latent_position_ids(4, 6);
  ASSERT_EQ(ids.sizes(), (std::vector<int64_t>{6, 3}));
  EXPECT_TRUE(at::equal(ids[5], at::tensor({0.0f, 1.0f, 2.0f})));
}

class FlowMatchingBatches : public ::testing::Test {
 protected:
  FlowMatchingBatches() {
    config.training.test_mode = true;
    config.training.img_size = 32;
    config.encoder.max_t5_encoding_len = 16;
    config.encoder.t5_encoder = "";
    config.encoder.clip_encoder = "";
    ImageDatasetOptions o;
    o.shapes_size = 32;
    source = std::make_shared<ImageCaptionSource>("shapes", o);
  }
  Batch images(int64_t batch) {
    ImageBatchOptions o;
    o.batch_size = batch;
    o.img_size = 32;
    o.t5_tokens = 16;
    o.clip_tokens = 77;
    ImageBatchLoader loader(source, tok, o);
    return *loader.next();
  }
  JobConfig config;
  ByteTokenizer tok;
  std::shared_ptr<const ImageCaptionSource> source;
};

TEST_F(FlowMatchingBatches, InputsTargetsAndNoiseDoNotDependOnTheBatch) {
  const flux::FluxArgs args = flux::args_for_flavor("debugmodel");
  const FlowMatching flow(config, "debugmodel", args, *build_flux_tokenizers(config, tok), at::kCPU,
                          /*seed=*/9);
  EXPECT_EQ(flow.image_tokens(), 4);  // 32px -> 4x4 latents -> 2x2 patches
  const Batch three = images(3);
  const Batch out = flow.prepare(three, /*validation=*/false);
  ASSERT_EQ(out.inputs.sizes(), (std::vector<int64_t>{3, 4, 64}));
  ASSERT_EQ(out.labels.sizes(), out.inputs.sizes());
  EXPECT_EQ(out.conditioning.at("txt").sizes(), (std::vector<int64_t>{3, 16, 64}));
  EXPECT_EQ(out.conditioning.at("y").sizes(), (std::vector<int64_t>{3, 64}));
  EXPECT_EQ(out.conditioning.at("img_ids").sizes(), (std::vector<int64_t>{4, 3}));
  EXPECT_EQ(out.conditioning.count("guidance"), 0u);
  // The rows of sample 2 alone equal its rows in the batch of three.
  Batch last = three;
  last.inputs = three.inputs.narrow(0, 2, 1);
  for (auto& [key, t] : last.conditioning) t = t.narrow(0, 2, 1);
  const Batch alone = flow.prepare(last, /*validation=*/false);
  EXPECT_TRUE(at::allclose(alone.inputs, out.inputs.narrow(0, 2, 1), 1e-5, 1e-6));
  EXPECT_TRUE(at::allclose(alone.labels, out.labels.narrow(0, 2, 1), 1e-5, 1e-6));
  // inputs = (1 - t) x + t e and labels = e - x, so inputs + (1 - t) labels = e: noise of
  // unit variance, different per sample.
  const at::Tensor t = out.conditioning.at("timesteps").view({3, 1, 1});
  const at::Tensor e = out.inputs + (1 - t) * out.labels;
  EXPECT_NEAR(e.std().item<double>(), 1.0, 0.25);
  EXPECT_FALSE(at::allclose(e[0], e[1]));
  EXPECT_GE(t.min().item<float>(), 0.0f);
  EXPECT_LT(t.max().item<float>(), 1.0f);
}

TEST_F(FlowMatchingBatches, ValidationUsesTheStratifiedTimesteps) {
  const flux::FluxArgs args = flux::args_for_flavor("debugmodel");
  const FlowMatching flow(config, "debugmodel", args, *build_flux_tokenizers(config, tok), at::kCPU,
                          9);
  const Batch out = flow.prepare(images(3), /*validation=*/true);
  EXPECT_TRUE(
      at::allclose(out.conditioning.at("timesteps"), at::tensor({0.0625f, 0.1875f, 0.3125f})));
}

TEST_F(FlowMatchingBatches, GuidanceModelsGetTheGuidanceAndMismatchesAreRefused) {
  flux::FluxArgs args = flux::args_for_flavor("debugmodel");
  args.guidance_embed = true;
  config.training.guidance = 2.5;
  const FlowMatching flow(config, "debugmodel", args, *build_flux_tokenizers(config, tok), at::kCPU,
                          9);
  const Batch out = flow.prepare(images(2), false);
  EXPECT_TRUE(at::equal(out.conditioning.at("guidance"), at::full({2}, 2.5f)));

  args.in_channels = 32;  // the autoencoder's 16 latent channels make 64 per patch
  try {
    FlowMatching bad(config, "debugmodel", args, *build_flux_tokenizers(config, tok), at::kCPU, 9);
    ADD_FAILURE() << "not refused";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("make 64 features per 2x2 patch"), std::string::npos)
        << e.what();
  }
  config.training.test_mode = false;
  EXPECT_THROW(FlowMatching(config, "debugmodel", flux::args_for_flavor("debugmodel"),
                            *build_flux_tokenizers(config, tok), at::kCPU, 9),
               ConfigError);
}

}  // namespace flow_matching_test
}  // namespace titan
