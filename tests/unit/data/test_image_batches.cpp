// Image batches for text-to-image training (image_batches.h): each sample's crop and caption
// drops depend only on (seed, its serial number), so batch sizes and resumes see the same
// samples; captions tokenized with BOS/EOS and padded or cut; small images passed over.
#include "titan/components/data/image_batches.h"

#include "titan/common/check.h"
#include "titan/components/tokenizer/tokenizer.h"

#include <gtest/gtest.h>

#include <memory>

namespace titan {
namespace image_batches_test {

std::shared_ptr<const ImageCaptionSource> shapes(int64_t size, int64_t count = 64) {
  ImageDatasetOptions o;
  o.shapes_size = size;
  o.shapes_count = count;
  return std::make_shared<ImageCaptionSource>("shapes", o);
}

ImageBatchOptions options(int64_t batch) {
  ImageBatchOptions o;
  o.batch_size = batch;
  o.img_size = 32;
  o.t5_tokens = 40;
  o.clip_tokens = 12;
  o.seed = 5;
  return o;
}

TEST(ImageBatches, SamplesDoNotDependOnTheBatchSize) {
  ByteTokenizer tok;
  auto source = shapes(48);  // larger than img_size: a random crop along no side (square)
  ImageBatchLoader big(source, tok, options(4));
  ImageBatchLoader small(source, tok, options(2));
  const Batch b = *big.next();
  const Batch s1 = *small.next(), s2 = *small.next();
  EXPECT_EQ(b.inputs.sizes(), (std::vector<int64_t>{4, 3, 32, 32}));
  EXPECT_TRUE(at::equal(b.inputs, at::cat({s1.inputs, s2.inputs})));
  for (const char* key : {"t5_tokens", "clip_tokens", "sample_ids"}) {
    EXPECT_TRUE(at::equal(b.conditioning.at(key),
                          at::cat({s1.conditioning.at(key), s2.conditioning.at(key)})))
        << key;
  }
  EXPECT_TRUE(at::equal(b.conditioning.at("sample_ids"), at::arange(4, at::kLong)));
  EXPECT_GE(b.inputs.min().item<float>(), -1.0f);
  EXPECT_LE(b.inputs.max().item<float>(), 1.0f);
}

TEST(ImageBatches, CaptionsAreFramedPaddedAndCut) {
  ByteTokenizer tok;
  auto source = shapes(32);
  ImageBatchOptions o = options(1);
  o.t5_tokens = 80;
  ImageBatchLoader loader(source, tok, o);
  const Batch b = *loader.next();
  const std::string caption = source->get(0).caption;
  const at::Tensor t5 = b.conditioning.at("t5_tokens")[0];
  const at::Tensor clip = b.conditioning.at("clip_tokens")[0];
  // T5's 80: BOS, the caption's bytes, EOS, zeros (the caption is shorter than 78 bytes).
  ASSERT_LT(static_cast<int64_t>(caption.size()), 78);
  EXPECT_EQ(t5[0].item<int64_t>(), tok.bos_id());
  EXPECT_EQ(t5[1].item<int64_t>(), static_cast<unsigned char>(caption[0]));
  EXPECT_EQ(t5[static_cast<int64_t>(caption.size()) + 1].item<int64_t>(), tok.eos_id());
  EXPECT_EQ(t5[79].item<int64_t>(), 0);
  // CLIP's 12: cut, no EOS.
  EXPECT_EQ(clip[11].item<int64_t>(), static_cast<unsigned char>(caption[10]));
}

// The pretrained encoders' framings (transformers' padding "max_length", truncation): T5 cuts
// the caption to make room for EOS and pads with the tokenizer's padding id (0 when it names
// none); CLIP keeps BOS and EOS around the cut caption and pads with EOS when it names none.
TEST(ImageBatches, PretrainedFramingsKeepEosAndPad) {
  ByteTokenizer tok;  // BOS 256, EOS 257, no padding id
  using Ids = std::vector<int64_t>;
  EXPECT_EQ(caption_ids(tok, "abc", 5, CaptionFraming::kT5), (Ids{97, 98, 99, 257, 0}));
  EXPECT_EQ(caption_ids(tok, "abc", 3, CaptionFraming::kT5), (Ids{97, 98, 257}));
  EXPECT_EQ(caption_ids(tok, "", 2, CaptionFraming::kT5), (Ids{257, 0}));
  EXPECT_EQ(caption_ids(tok, "abc", 4, CaptionFraming::kClip), (Ids{256, 97, 98, 257}));
  EXPECT_EQ(caption_ids(tok, "ab", 6, CaptionFraming::kClip), (Ids{256, 97, 98, 257, 257, 257}));
  EXPECT_EQ(caption_ids(tok, "abc", 4, CaptionFraming::kTest), (Ids{256, 97, 98, 99}));
  // A loader with separate tokenizers frames each encoder's ids its own way.
  const CaptionTokenizers pretrained{&tok, &tok, /*pretrained=*/true};
  ImageBatchLoader loader(shapes(32), pretrained, options(1));
  const Batch b = *loader.next();
  const at::Tensor clip = b.conditioning.at("clip_tokens")[0];
  EXPECT_EQ(clip[0].item<int64_t>(), 256);
  EXPECT_EQ(clip[11].item<int64_t>(), 257);  // cut to 10 bytes, EOS kept
  EXPECT_NE(b.conditioning.at("t5_tokens")[0][0].item<int64_t>(), 256);  // T5: no BOS
}

TEST(ImageBatches, GuidanceDropsEachEncodersCaptionIndependently) {
  ByteTokenizer tok;
  ImageBatchOptions o = options(200);
  o.cfg_drop_prob = 0.5;
  ImageBatchLoader loader(shapes(32, 400), tok, o);
  const Batch b = *loader.next();
  // A dropped caption is the empty one: BOS, EOS, zeros.
  const at::Tensor t5_dropped = b.conditioning.at("t5_tokens").select(1, 2) == 0;
  const at::Tensor clip_dropped = b.conditioning.at("clip_tokens").select(1, 2) == 0;
  const double t5_rate = t5_dropped.to(at::kFloat).mean().item<double>();
  const double clip_rate = clip_dropped.to(at::kFloat).mean().item<double>();
  EXPECT_NEAR(t5_rate, 0.5, 0.12);
  EXPECT_NEAR(clip_rate, 0.5, 0.12);
  // Independent: both dropped in about a quarter of the samples, not in half.
  const double both = (t5_dropped & clip_dropped).to(at::kFloat).mean().item<double>();
  EXPECT_NEAR(both, 0.25, 0.1);
}

TEST(ImageBatches, ResumesFromItsState) {
  ByteTokenizer tok;
  auto source = shapes(32, 10);
  ImageBatchLoader a(source, tok, options(4));
  a.next();
  a.next();
  a.next();  // wraps into the second epoch
  const nlohmann::json state = a.state_json();
  EXPECT_EQ(state["epoch"], 1);
  const Batch want = *a.next();
  ImageBatchLoader b(source, tok, options(4));
  b.load_state_json(state);
  const Batch got = *b.next();
  EXPECT_TRUE(at::equal(got.inputs, want.inputs));
  EXPECT_TRUE(at::equal(got.conditioning.at("sample_ids"), want.conditioning.at("sample_ids")));
  // Another dataset's state is refused.
  ImageBatchLoader other(shapes(32, 11), tok, options(4));
  EXPECT_THROW(other.load_state_json(state), DataError);
}

TEST(ImageBatches, SmallImagesArePassedOverAndAFinitePassEnds) {
  ByteTokenizer tok;
  ImageBatchOptions o = options(2);
  o.img_size = 48;  // larger than the 32px shapes
  o.infinite = false;
  ImageBatchLoader loader(shapes(32, 5), tok, o);
  EXPECT_FALSE(loader.next().has_value());
  EXPECT_EQ(loader.too_small(), 5);
}

}  // namespace image_batches_test
}  // namespace titan
