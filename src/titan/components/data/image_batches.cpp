// Batches of an image-caption dataset for text-to-image training (see image_batches.h).
#include "titan/components/data/image_batches.h"

#include "titan/common/check.h"
#include "titan/common/logging.h"
#include "titan/common/splitmix.h"
#include "titan/components/data/image_transforms.h"

#include <algorithm>

namespace titan {
namespace {

// The generator of everything random about sample `serial` of the stream seeded `seed` (its
// crop offset, then its caption drops): depends on nothing else.
SplitMix64 sample_stream(uint64_t seed, int64_t serial) {
  return keyed_stream(seed ^ 0x5EED0F1A6E5ull, serial);
}

}  // namespace

CaptionDrops caption_drops(uint64_t seed, int64_t serial, double prob) {
  SplitMix64 rng = sample_stream(seed, serial);
  rng.next();  // the crop offset's draw
  CaptionDrops drops;
  drops.t5 = rng.uniform() < prob;
  drops.clip = rng.uniform() < prob;
  return drops;
}

std::vector<int64_t> caption_ids(const Tokenizer& tokenizer, const std::string& caption,
                                 int64_t len, CaptionFraming framing) {
  const size_t n = static_cast<size_t>(len);
  std::vector<int64_t> text = tokenizer.encode(caption);
  std::vector<int64_t> ids;
  ids.reserve(std::max(n, text.size() + 2));
  switch (framing) {
    case CaptionFraming::kTest:
      ids.push_back(tokenizer.bos_id());
      ids.insert(ids.end(), text.begin(), text.end());
      ids.push_back(tokenizer.eos_id());
      ids.resize(n, 0);
      return ids;
    case CaptionFraming::kT5:
      TITAN_CHECK(len >= 1, "a T5 caption needs at least 1 id (EOS)");
      text.resize(std::min(text.size(), n - 1));
      ids = std::move(text);
      ids.push_back(tokenizer.eos_id());
      ids.resize(n, tokenizer.pad_id().value_or(0));
      return ids;
    case CaptionFraming::kClip:
      TITAN_CHECK(len >= 2, "a CLIP caption needs at least 2 ids (BOS, EOS)");
      ids.push_back(tokenizer.bos_id());
      ids.insert(ids.end(), text.begin(), text.begin() + std::min(text.size(), n - 2));
      ids.push_back(tokenizer.eos_id());
      ids.resize(n, tokenizer.pad_id().value_or(tokenizer.eos_id()));
      return ids;
  }
  return ids;
}

std::vector<int64_t> CaptionTokenizers::t5_ids(const std::string& caption, int64_t len) const {
  return caption_ids(*t5, caption, len, pretrained ? CaptionFraming::kT5 : CaptionFraming::kTest);
}

std::vector<int64_t> CaptionTokenizers::clip_ids(const std::string& caption, int64_t len) const {
  return caption_ids(*clip, caption, len,
                     pretrained ? CaptionFraming::kClip : CaptionFraming::kTest);
}

ImageBatchLoader::ImageBatchLoader(std::shared_ptr<const ImageCaptionSource> source,
                                   CaptionTokenizers tokenizers, ImageBatchOptions options)
    : source_(std::move(source)), tokenizers_(tokenizers), options_(options) {
  TITAN_CHECK(options_.batch_size >= 1 && options_.img_size >= 1 && options_.t5_tokens >= 1 &&
                  options_.clip_tokens >= 1,
              "image batches: batch size, image size and token counts must be >= 1");
  TITAN_CHECK(tokenizers_.t5 != nullptr && tokenizers_.clip != nullptr,
              "image batches: no caption tokenizers");
  empty_t5_ = at::tensor(tokenizers_.t5_ids("", options_.t5_tokens), at::kLong);
  empty_clip_ = at::tensor(tokenizers_.clip_ids("", options_.clip_tokens), at::kLong);
}

std::optional<Batch> ImageBatchLoader::next() {
  const int64_t bs = options_.batch_size, size = options_.img_size;
  at::Tensor images = at::empty({bs, 3, size, size}, at::kFloat);
  at::Tensor t5 = at::empty({bs, options_.t5_tokens}, at::kLong);
  at::Tensor clip = at::empty({bs, options_.clip_tokens}, at::kLong);
  at::Tensor ids = at::empty({bs}, at::kLong);
  for (int64_t b = 0; b < bs;) {
    std::optional<ImageCaption> next =
        cursor_.next(*source_, options_.infinite, options_.skip_unreadable);
    if (!next) return std::nullopt;  // a partial last batch is dropped
    const ImageCaption& sample = *next;
    SplitMix64 rng = sample_stream(options_.seed, serial_);
    const int64_t choices = flux_crop_choices(sample.image.size(2), sample.image.size(1), size);
    if (choices == 0) {  // smaller than img_size: TorchTitan passes over such images
      if (too_small_++ == 0) {
        log_warning("image dataset: ", sample.origin, " is ", sample.image.size(2), "x",
                    sample.image.size(1), ", smaller than training.img_size ", size,
                    " on a side; such images are passed over (counted in the loader's state)");
      }
      continue;
    }
    const std::optional<at::Tensor> image = flux_preprocess(sample.image, size, rng.below(choices));
    images[b].copy_(*image);
    const bool drop_t5 = rng.uniform() < options_.cfg_drop_prob;
    const bool drop_clip = rng.uniform() < options_.cfg_drop_prob;
    t5[b].copy_(
        drop_t5 ? empty_t5_
                : at::tensor(tokenizers_.t5_ids(sample.caption, options_.t5_tokens), at::kLong));
    clip[b].copy_(drop_clip ? empty_clip_
                            : at::tensor(tokenizers_.clip_ids(sample.caption, options_.clip_tokens),
                                         at::kLong));
    ids[b] = serial_++;
    ++b;
  }
  Batch batch;
  batch.inputs = images;
  batch.conditioning["t5_tokens"] = t5;
  batch.conditioning["clip_tokens"] = clip;
  batch.conditioning["sample_ids"] = ids;
  return batch;
}

nlohmann::json ImageBatchLoader::state_json() const {
  return {{"kind", "image_batches"},          {"row", cursor_.row},
          {"epoch", cursor_.epoch},           {"serial", serial_},
          {"unreadable", cursor_.unreadable}, {"too_small", too_small_},
          {"rows", source_->size()},          {"batch_size", options_.batch_size}};
}

void ImageBatchLoader::load_state_json(const nlohmann::json& state) {
  if (state.value("kind", std::string()) != "image_batches") {
    throw DataError(
        "image batches: the checkpoint's data loader state is not an image "
        "dataset's (was it written by a text model's run?)");
  }
  if (state.value("rows", int64_t{-1}) != source_->size()) {
    throw DataError(message("image batches: the checkpoint's dataset had ",
                            state.value("rows", int64_t{-1}), " rows, this one has ",
                            source_->size(), "; resume with the same dataset"));
  }
  cursor_.row = state.at("row").get<int64_t>();
  cursor_.epoch = state.at("epoch").get<int64_t>();
  serial_ = state.at("serial").get<int64_t>();
  cursor_.unreadable = state.value("unreadable", int64_t{0});
  too_small_ = state.value("too_small", int64_t{0});
}

}  // namespace titan
