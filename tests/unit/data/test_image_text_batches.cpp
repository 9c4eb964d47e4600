// Image-text batches for the vision-language model (image_text_batches.h): TorchTitan's resize by
// patch count (Python's rounding included), patches in (row, column, channel) order, framing
// tokens with -100 labels on everything but text, and resumable, deterministic streams.
#include "titan/components/data/image_text_batches.h"

#include "titan/common/check.h"
#include "titan/common/file_io.h"
#include "titan/components/data/image.h"
#include "titan/components/tokenizer/tokenizer.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>

namespace titan {
namespace image_text_batches_test {

std::shared_ptr<const ImageCaptionSource> shapes(int64_t size, int64_t count = 32) {
  ImageDatasetOptions o;
  o.shapes_size = size;
  o.shapes_count = count;
  return std::make_shared<ImageCaptionSource>("shapes", o);
}

ImageTextOptions options(int64_t batch, int64_t seq_len) {
  ImageTextOptions o;
  o.batch_size = batch;
  o.seq_len = seq_len;
  o.patch_size = 16;
  o.max_patches_per_image = 16;
  return o;
}

using Size = std::pair<int64_t, int64_t>;

TEST(ImageTextBatches, ResizeByPatchCountFollowsTorchTitan) {
  EXPECT_EQ(vlm_image_size(64, 64, 16, 256), Size(64, 64));
  // 100 x 50: 19 patches, rounded to 6.25 -> 6 and 3.125 -> 3 patches per side.
  EXPECT_EQ(vlm_image_size(100, 50, 16, 256), Size(96, 48));
  // Python's round(2.5) is 2 and round(3.5) is 4 (half to even).
  EXPECT_EQ(vlm_image_size(40, 40, 16, 256), Size(32, 32));
  EXPECT_EQ(vlm_image_size(56, 56, 16, 256), Size(64, 64));
  // Over the budget: scaled by sqrt(16 / 4096) first.
  EXPECT_EQ(vlm_image_size(1024, 1024, 16, 16), Size(64, 64));
  // Under one patch: scaled up to one.
  EXPECT_EQ(vlm_image_size(8, 8, 16, 4), Size(16, 16));
  // Rounding up past the budget: 3 x 3 = 9 > 8 patches, scaled down by sqrt(9 / 8).
  EXPECT_EQ(vlm_image_size(48, 48, 16, 8), Size(32, 32));
  // Thinner than a patch.
  EXPECT_THROW(vlm_image_size(1000, 10, 16, 256), DataError);
}

TEST(ImageTextBatches, PatchesAreRowMajorWithChannelsLast) {
  // A 32 x 16 image (2 patch columns, 1 row) whose pixels encode their position and channel.
  at::Tensor rgb = at::zeros({3, 16, 32}, at::kByte);
  rgb[0].narrow(1, 16, 16).fill_(255);  // the right patch is red
  const VlmImage image = vlm_preprocess(rgb, 16, 16);
  ASSERT_EQ(image.rows, 1);
  ASSERT_EQ(image.columns, 2);
  ASSERT_EQ(image.patches.sizes(), (std::vector<int64_t>{2, 16 * 16 * 3}));
  const double black_r = (0 - 0.48145466) / 0.26862954, red_r = (1 - 0.48145466) / 0.26862954;
  // Channel is the fastest index: element 0 is red of pixel (0, 0), element 1 its green.
  EXPECT_NEAR(image.patches[0][0].item<double>(), black_r, 1e-6);
  EXPECT_NEAR(image.patches[1][0].item<double>(), red_r, 1e-6);
  EXPECT_NEAR(image.patches[1][1].item<double>(), (0 - 0.4578275) / 0.26130258, 1e-6);
  EXPECT_NEAR(image.patches[1][3].item<double>(), red_r, 1e-6);  // pixel (0, 1)'s red
}

// Against TorchTitan's preprocessing written out by tests/e2e/vlm_image_reference.py (Pillow and
// numpy) on random images of sizes through every branch of the resize; run by test_vlm.sh.
TEST(ImageTextBatches, PreprocessingMatchesTorchTitan) {
  const char* dir = std::getenv("TITAN_VLM_IMAGE_FIXTURE");
  if (dir == nullptr) GTEST_SKIP() << "run by tests/e2e/test_vlm.sh";
  if (!image_codecs_built()) GTEST_SKIP() << "built without the image codecs";
  const std::string folder = dir;
  const nlohmann::json index =
      nlohmann::json::parse(read_regular_file(folder + "/index.json", "fixture index"));
  const int64_t patch = index.at("patch"), max_patches = index.at("max_patches");
  double worst = 0;
  for (const auto& entry : index.at("images")) {
    const std::string png = folder + "/" + entry.at("png").get<std::string>();
    const VlmImage ours = vlm_preprocess(decode_image(read_regular_file(png, "fixture image"), png),
                                         patch, max_patches);
    ASSERT_EQ(ours.rows, entry.at("rows").get<int64_t>()) << png;
    ASSERT_EQ(ours.columns, entry.at("columns").get<int64_t>()) << png;
    const std::string bytes =
        read_regular_file(folder + "/" + entry.at("patches").get<std::string>(), "fixture patches");
    const at::Tensor theirs =
        at::from_blob(const_cast<char*>(bytes.data()),
                      {ours.rows * ours.columns, patch * patch * 3}, at::kFloat)
            .clone();
    worst = std::max(worst, (ours.patches - theirs).abs().max().item<double>());
  }
  std::printf("vlm preprocessing vs TorchTitan's (Pillow, numpy): %zu images, max abs diff %g\n",
              index.at("images").size(), worst);
  EXPECT_LE(worst, 1e-6);
}

TEST(ImageTextBatches, SamplesAreFramedAndOnlyTextIsTrained) {
  ByteTokenizer tok;
  auto source = shapes(64);
  ImageTextBatchLoader loader(source, tok, options(2, 96));
  const Batch b = *loader.next();
  const ImageTokens ids = ImageTokens::after_vocab(tok);
  ASSERT_EQ(b.inputs.sizes(), (std::vector<int64_t>{2, 96}));
  const std::string caption = source->get(0).caption;
  const std::vector<int64_t> expected =
      vlm_sample_tokens(tok, ids, caption, /*n_patches=*/16, /*max_len=*/97);
  ASSERT_EQ(expected.size(), 1 + 1 + 16 + 1 + caption.size() + 1);
  for (size_t i = 0; i < expected.size() - 1; ++i) {
    EXPECT_EQ(b.inputs[0][static_cast<int64_t>(i)].item<int64_t>(), expected[i]) << i;
  }
  // Labels: the next token where it is text (the caption and EOS), -100 elsewhere.
  int64_t trained = 0;
  for (int64_t i = 0; i < 96; ++i) {
    const int64_t label = b.labels[0][i].item<int64_t>();
    const int64_t next = i + 1 < static_cast<int64_t>(expected.size()) ? expected[i + 1] : ids.pad;
    const bool text = next < tok.vocab_size();
    EXPECT_EQ(label, text ? next : -100) << i;
    trained += text;
  }
  EXPECT_EQ(trained, static_cast<int64_t>(caption.size()) + 1);
  // The images: 4 x 4 patches in 16 slots, one placeholder per patch.
  EXPECT_TRUE(at::equal(b.conditioning.at("spatial_shapes"),
                        at::tensor({4, 4, 4, 4}, at::kLong).view({2, 2})));
  EXPECT_EQ(b.conditioning.at("patch_mask").sum().item<int64_t>(), 32);
  EXPECT_EQ(b.conditioning.at("image_mask").sum().item<int64_t>(), 32);
  EXPECT_TRUE(at::equal(b.conditioning.at("pixel_values")[1],
                        vlm_preprocess(source->get(1).image, 16, 16).patches));
}

TEST(ImageTextBatches, LongCaptionsAreCutAndLargeImagesRefused) {
  ByteTokenizer tok;
  const ImageTokens ids = ImageTokens::after_vocab(tok);
  bool cut = false;
  const std::vector<int64_t> t = vlm_sample_tokens(tok, ids, "a long caption", 4, 12, &cut);
  EXPECT_TRUE(cut);
  ASSERT_EQ(t.size(), 12u);
  EXPECT_EQ(t.back(), tok.eos_id());
  EXPECT_EQ(t[7], static_cast<int64_t>('a'));  // after BOS, begin, 4 patches, end
  EXPECT_THROW(vlm_sample_tokens(tok, ids, "x", 16, 19), ConfigError);
  // In a loader the cut is counted.
  ImageTextBatchLoader loader(shapes(64), tok, options(1, 24));
  loader.next();
  EXPECT_EQ(loader.captions_cut(), 1);
}

TEST(ImageTextBatches, ResumesWhereItStopped) {
  ByteTokenizer tok;
  auto source = shapes(32, 5);
  ImageTextBatchLoader a(source, tok, options(2, 80));
  a.next();
  a.next();
  const nlohmann::json state = a.state_json();
  const Batch expected = *a.next();  // wraps around the 5 rows
  ImageTextBatchLoader b(source, tok, options(2, 80));
  b.load_state_json(state);
  const Batch got = *b.next();
  EXPECT_TRUE(at::equal(expected.inputs, got.inputs));
  EXPECT_TRUE(
      at::equal(expected.conditioning.at("pixel_values"), got.conditioning.at("pixel_values")));
  EXPECT_EQ(b.state_json().at("epoch").get<int64_t>(), 1);
  // A finite pass ends with the last whole batch.
  ImageTextOptions once = options(2, 80);
  once.infinite = false;
  ImageTextBatchLoader c(source, tok, once);
  EXPECT_TRUE(c.next().has_value());
  EXPECT_TRUE(c.next().has_value());
  EXPECT_FALSE(c.next().has_value());
}

}  // namespace image_text_batches_test
}  // namespace titan
