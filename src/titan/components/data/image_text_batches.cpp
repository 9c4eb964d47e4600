// Batches of an image-caption dataset for the vision-language model (see image_text_batches.h).
#include "titan/components/data/image_text_batches.h"

#include "titan/common/check.h"
#include "titan/common/logging.h"
#include "titan/components/data/image_transforms.h"
#include "titan/kernels/cross_entropy.h"

#include <algorithm>
#include <cmath>

namespace titan {
namespace {

// Python's round(x) for the non-negative values here: half to even (the default rounding mode).
int64_t python_round(double x) { return static_cast<int64_t>(std::nearbyint(x)); }

// TorchTitan's _smart_resize (min_patch_per_image 1): (height, width) in whole patches.
std::pair<int64_t, int64_t> smart_resize(int64_t height, int64_t width, int64_t f,
                                         int64_t max_patches) {
  if (height < f || width < f) {
    throw DataError(message("an image side of ", std::min(height, width),
                            " pixels is under one patch (", f, " pixels) after resizing"));
  }
  const double aspect = static_cast<double>(std::max(height, width)) / std::min(height, width);
  if (aspect > 200) {
    throw DataError(message("an aspect ratio of ", aspect, " is over 200"));
  }
  int64_t h = python_round(static_cast<double>(height) / f) * f;
  int64_t w = python_round(static_cast<double>(width) / f) * f;
  if ((h * w) / (f * f) > max_patches) {
    const double beta =
        std::sqrt(static_cast<double>(h * w) / static_cast<double>(max_patches * f * f));
    h = static_cast<int64_t>(std::floor(height / beta / f)) * f;
    w = static_cast<int64_t>(std::floor(width / beta / f)) * f;
  }
  return {h, w};
}

}  // namespace

ImageTokens ImageTokens::after_vocab(const Tokenizer& tokenizer) {
  const int64_t v = tokenizer.vocab_size();
  return ImageTokens{v, v + 1, v + 2, v + 3};
}

std::pair<int64_t, int64_t> vlm_image_size(int64_t width, int64_t height, int64_t patch,
                                           int64_t max_patches) {
  TITAN_CHECK(width > 0 && height > 0 && patch > 0 && max_patches > 0,
              "vlm_image_size: sizes must be positive");
  const int64_t current = (height * width) / (patch * patch);
  std::pair<int64_t, int64_t> hw;
  if (current < 1) {  // under one patch: scaled up until the shorter side is one patch
    const double scale =
        std::max(static_cast<double>(patch) / width, static_cast<double>(patch) / height);
    hw = smart_resize(static_cast<int64_t>(height * scale), static_cast<int64_t>(width * scale),
                      patch, max_patches);
  } else if (current <= max_patches) {
    hw = smart_resize(height, width, patch, max_patches);
  } else {
    const double scale = std::sqrt(static_cast<double>(max_patches) / current);
    hw = smart_resize(static_cast<int64_t>(height * scale), static_cast<int64_t>(width * scale),
                      patch, max_patches);
  }
  if (hw.first < patch || hw.second < patch) {
    throw DataError(message("a ", width, "x", height, " image cannot be cut into at most ",
                            max_patches, " patches of ", patch, " pixels keeping its aspect"));
  }
  return {hw.second, hw.first};
}

VlmImage vlm_preprocess(const at::Tensor& rgb, int64_t patch, int64_t max_patches) {
  TITAN_CHECK(rgb.dim() == 3 && rgb.size(0) == 3 && rgb.scalar_type() == at::kByte,
              "vlm_preprocess: expected a (3, height, width) uint8 image, got ", rgb.sizes());
  const auto [width, height] = vlm_image_size(rgb.size(2), rgb.size(1), patch, max_patches);
  const at::Tensor resized = (width == rgb.size(2) && height == rgb.size(1))
                                 ? rgb
                                 : resize_bicubic(rgb, width, height);  // (3, height, width)
  // As numpy computes it: float64 v / 255, minus the mean, over the std, then float32.
  const at::Tensor mean =
      at::tensor({0.48145466, 0.4578275, 0.40821073}, at::kDouble).view({3, 1, 1});
  const at::Tensor std =
      at::tensor({0.26862954, 0.26130258, 0.27577711}, at::kDouble).view({3, 1, 1});
  const at::Tensor pixels = ((resized.to(at::kDouble) / 255.0 - mean) / std).to(at::kFloat);
  VlmImage out;
  out.rows = height / patch;
  out.columns = width / patch;
  // (3, rows, p, columns, p) -> (rows, columns, p, p, 3) -> (rows * columns, p * p * 3)
  out.patches = pixels.view({3, out.rows, patch, out.columns, patch})
                    .permute({1, 3, 2, 4, 0})
                    .reshape({out.rows * out.columns, patch * patch * 3});
  return out;
}

std::vector<int64_t> vlm_sample_tokens(const Tokenizer& tokenizer, const ImageTokens& ids,
                                       const std::string& caption, int64_t n_patches,
                                       int64_t max_len, bool* cut) {
  const int64_t frame = n_patches + 4;  // BOS, begin, patches, end, EOS
  TITAN_CONFIG_CHECK(
      frame <= max_len, "an image of ", n_patches, " patches needs ", frame,
      " positions with its framing tokens, more than training.seq_len + 1 = ", max_len,
      ". HINT: raise training.seq_len or lower "
      "training.max_patches_per_image");
  std::vector<int64_t> out = {tokenizer.bos_id(), ids.begin_image};
  out.insert(out.end(), static_cast<size_t>(n_patches), ids.image);
  out.push_back(ids.end_image);
  std::vector<int64_t> text = tokenizer.encode(caption);
  const auto room = static_cast<size_t>(max_len - frame);
  if (cut != nullptr) *cut = text.size() > room;
  if (text.size() > room) text.resize(room);
  out.insert(out.end(), text.begin(), text.end());
  out.push_back(tokenizer.eos_id());
  return out;
}

ImageTextBatchLoader::ImageTextBatchLoader(std::shared_ptr<const ImageCaptionSource> source,
                                           const Tokenizer& tokenizer, ImageTextOptions options)
    : source_(std::move(source)),
      tokenizer_(tokenizer),
      options_(options),
      ids_(ImageTokens::after_vocab(tokenizer)) {
  TITAN_CHECK(options_.batch_size >= 1 && options_.seq_len >= 1 && options_.patch_size >= 1 &&
                  options_.max_patches_per_image >= 1,
              "image-text batches: batch size, seq_len, patch size and patches per image must "
              "be >= 1");
}

std::optional<Batch> ImageTextBatchLoader::next() {
  const int64_t bs = options_.batch_size, seq = options_.seq_len;
  const int64_t patch = options_.patch_size, slots = options_.max_patches_per_image;
  at::Tensor tokens = at::full({bs, seq + 1}, ids_.pad, at::kLong);
  at::Tensor pixels = at::zeros({bs, slots, 3 * patch * patch}, at::kFloat);
  at::Tensor patch_mask = at::zeros({bs, slots}, at::kLong);
  at::Tensor shapes = at::zeros({bs, 2}, at::kLong);
  for (int64_t b = 0; b < bs;) {
    std::optional<ImageCaption> next =
        cursor_.next(*source_, options_.infinite, options_.skip_unreadable);
    if (!next) return std::nullopt;  // a partial last batch is dropped
    const ImageCaption& sample = *next;
    VlmImage image;
    try {
      image = vlm_preprocess(sample.image, patch, slots);
    } catch (const DataError& e) {
      if (!options_.skip_unreadable) {
        throw DataError(message(sample.origin, ": ", e.what(),
                                ". HINT: training.skip_unreadable_images = true passes over "
                                "such images (counted)"));
      }
      ++cursor_.unreadable;
      continue;
    }
    const int64_t n = image.rows * image.columns;
    bool cut = false;
    const std::vector<int64_t> ids =
        vlm_sample_tokens(tokenizer_, ids_, sample.caption, n, seq + 1, &cut);
    if (cut && cut_++ == 0) {
      log_warning("image-text data: ", sample.origin, "'s caption is cut to fit training.seq_len ",
                  seq, " (such cuts are counted in the loader's state)");
    }
    tokens[b].narrow(0, 0, static_cast<int64_t>(ids.size())).copy_(at::tensor(ids, at::kLong));
    pixels[b].narrow(0, 0, n).copy_(image.patches);
    patch_mask[b].narrow(0, 0, n).fill_(1);
    shapes[b][0] = image.rows;
    shapes[b][1] = image.columns;
    ++b;
  }
  Batch batch;
  batch.inputs = tokens.narrow(1, 0, seq).contiguous();
  at::Tensor targets = tokens.narrow(1, 1, seq).clone();
  const at::Tensor untrained = (targets == ids_.image) | (targets == ids_.begin_image) |
                               (targets == ids_.end_image) | (targets == ids_.pad);
  batch.labels = targets.masked_fill(untrained, kernels::kIgnoreIndex);
  batch.conditioning["pixel_values"] = pixels;
  batch.conditioning["patch_mask"] = patch_mask;
  batch.conditioning["spatial_shapes"] = shapes;
  batch.conditioning["image_mask"] = (batch.inputs == ids_.image).to(at::kLong);
  return batch;
}

nlohmann::json ImageTextBatchLoader::state_json() const {
  return {{"kind", "image_text_batches"},     {"row", cursor_.row},   {"epoch", cursor_.epoch},
          {"unreadable", cursor_.unreadable}, {"captions_cut", cut_}, {"rows", source_->size()},
          {"batch_size", options_.batch_size}};
}

void ImageTextBatchLoader::load_state_json(const nlohmann::json& state) {
  if (state.value("kind", std::string()) != "image_text_batches") {
    throw DataError(
        "image-text batches: the checkpoint's data loader state is not an image-text dataset's "
        "(was it written by another model's run?)");
  }
  if (state.value("rows", int64_t{-1}) != source_->size()) {
    throw DataError(message("image-text batches: the checkpoint's dataset had ",
                            state.value("rows", int64_t{-1}), " rows, this one has ",
                            source_->size(), "; resume with the same dataset"));
  }
  cursor_.row = state.at("row").get<int64_t>();
  cursor_.epoch = state.at("epoch").get<int64_t>();
  cursor_.unreadable = state.value("unreadable", int64_t{0});
  cut_ = state.value("captions_cut", int64_t{0});
}

}  // namespace titan
