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
                                 int64_t len) {
  std::vector<int64_t> ids = {tokenizer.bos_id()};
  const std::vector<int64_t> text = tokenizer.encode(caption);
  ids.insert(ids.end(), text.begin(), text.end());
  ids.push_back(tokenizer.eos_id());
  ids.resize(static_cast<size_t>(len), 0);
  return ids;
}

ImageBatchLoader::ImageBatchLoader(std::shared_ptr<const ImageCaptionSource> source,
                                   const Tokenizer& tokenizer, ImageBatchOptions options)
    : source_(std::move(source)), tokenizer_(tokenizer), options_(options) {
  TITAN_CHECK(options_.batch_size >= 1 && options_.img_size >= 1 && options_.t5_tokens >= 1 &&
                  options_.clip_tokens >= 1,
              "image batches: batch size, image size and token counts must be >= 1");
  empty_t5_ = at::tensor(caption_ids(tokenizer_, "", options_.t5_tokens), at::kLong);
  empty_clip_ = at::tensor(caption_ids(tokenizer_, "", options_.clip_tokens), at::kLong);
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
    // Tokenized once, framed for the longer encoder; the other's ids are a prefix of those.
    const at::Tensor caption =
        drop_t5 && drop_clip
            ? at::Tensor()
            : at::tensor(caption_ids(tokenizer_, sample.caption,
                                     std::max(options_.t5_tokens, options_.clip_tokens)),
                         at::kLong);
    t5[b].copy_(drop_t5 ? empty_t5_ : caption.narrow(0, 0, options_.t5_tokens));
    clip[b].copy_(drop_clip ? empty_clip_ : caption.narrow(0, 0, options_.clip_tokens));
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
