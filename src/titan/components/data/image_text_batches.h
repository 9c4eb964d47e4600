// Batches of an image-caption dataset for the vision-language model (models/vlm/model.h), as
// TorchTitan's VLM data builds them (datasets/mm_datasets.py, utils/image.py): each image
// resized to a grid of whole patches with at most max_patches_per_image patches, keeping its
// aspect ratio (Pillow's bicubic resize), normalized with CLIP's mean and std and cut into
// patches; its caption becomes the token sequence
//   BOS <|begin_of_image|> <|image|> x (patches) <|end_of_image|> caption EOS <|pad|> ...
// with the next-token labels of the image and pad tokens set to -100 (the loss reads text only).
//
// One image per sample; samples are not packed (TorchTitan's packing_buffer_size = 0). Every
// rank reads the same global stream (the trainer keeps its rows), in order, deterministically.
#pragma once

#include "titan/components/data/data_loader.h"
#include "titan/components/data/image_dataset.h"
#include "titan/components/tokenizer/tokenizer.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

namespace titan {

// The ids of the model's image tokens: the four ids after the tokenizer's vocabulary
// (image, begin_of_image, end_of_image, pad), so any tokenizer serves; the model's vocabulary
// must hold them (the trainer checks).
struct ImageTokens {
  int64_t image = 0, begin_image = 0, end_image = 0, pad = 0;
  static ImageTokens after_vocab(const Tokenizer& tokenizer);
  int64_t count() const { return 4; }
};

// TorchTitan's resize by patch count (_resize_image_by_patch_count with merge size 1): the
// (width, height), multiples of `patch`, that an image of (width, height) is resized to, with
// at most max_patches patches and at least one. Python's rounding (half to even) included.
std::pair<int64_t, int64_t> vlm_image_size(int64_t width, int64_t height, int64_t patch,
                                           int64_t max_patches);

struct VlmImage {
  at::Tensor patches;  // (rows * columns, 3 * patch^2) float32: (patch row, patch column, channel)
  int64_t rows = 0, columns = 0;
};
// One image (3, height, width) uint8 RGB as the encoder reads it: resized (vlm_image_size,
// Pillow's bicubic), scaled to [0, 1], normalized with CLIP's mean and std, cut into patches.
VlmImage vlm_preprocess(const at::Tensor& rgb, int64_t patch, int64_t max_patches);

// A sample's tokens: BOS, begin_image, `n_patches` x image, end_image, the caption, EOS; the
// caption's tokens cut so that the whole fits `max_len` (its EOS kept), `*cut` set when they were.
// ConfigError when the image alone does not fit.
std::vector<int64_t> vlm_sample_tokens(const Tokenizer& tokenizer, const ImageTokens& ids,
                                       const std::string& caption, int64_t n_patches,
                                       int64_t max_len, bool* cut = nullptr);

struct ImageTextOptions {
  int64_t batch_size = 1;  // rows per batch (the global batch: every data rank's rows)
  int64_t seq_len = 2048;
  int64_t patch_size = 16;
  int64_t max_patches_per_image = 256;
  bool infinite = true;  // training: wraps around epochs; validation: one pass, then nullopt
  bool skip_unreadable = false;
};

// Batch::inputs (bs, seq_len) int64, Batch::labels (bs, seq_len) int64 (-100: not trained);
// Batch::conditioning (models/vlm/model.h): pixel_values (bs, max_patches_per_image,
// 3 * patch^2) float32, patch_mask (bs, max_patches_per_image) int64, spatial_shapes (bs, 2)
// int64, image_mask (bs, seq_len) int64.
class ImageTextBatchLoader : public BatchLoader {
 public:
  ImageTextBatchLoader(std::shared_ptr<const ImageCaptionSource> source, const Tokenizer& tokenizer,
                       ImageTextOptions options);
  std::optional<Batch> next() override;
  nlohmann::json state_json() const override;
  void load_state_json(const nlohmann::json& state) override;

  int64_t unreadable() const { return cursor_.unreadable; }
  int64_t captions_cut() const { return cut_; }

 private:
  std::shared_ptr<const ImageCaptionSource> source_;
  const Tokenizer& tokenizer_;
  ImageTextOptions options_;
  ImageTokens ids_;
  ImageRowCursor cursor_;
  int64_t cut_ = 0;  // captions cut to fit seq_len
};

}  // namespace titan
