// Batches of an image-caption dataset for text-to-image training (FLUX): each sample's image
// resized on its shorter side and cropped to a square (TorchTitan's FLUX preprocessing,
// image_transforms.h), its caption tokenized for both text encoders, and, with probability
// cfg_drop_prob for each encoder independently, replaced by the empty caption's tokens
// (classifier-free guidance's unconditional samples).
//
// Every rank reads the same global stream (the trainer keeps its rows), so everything random
// about a sample (its crop, its caption drops, later its noise and timestep) is drawn from
// (seed, its serial number in the stream): any layout of ranks trains on the same samples.
#pragma once

#include "titan/components/data/data_loader.h"
#include "titan/components/data/image_dataset.h"
#include "titan/components/tokenizer/tokenizer.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace titan {

// How a caption becomes a text encoder's `len` ids.
enum class CaptionFraming {
  // TorchTitan's FLUX test tokenizer: BOS, the caption's tokens, EOS, then 0 up to `len`, cut
  // to `len` (the empty caption is BOS, EOS, zeros).
  kTest,
  // transformers' T5 tokenizer (padding "max_length", truncation): the caption's tokens cut to
  // len - 1, EOS (</s>), then the padding id (<pad>).
  kT5,
  // transformers' CLIP tokenizer: BOS, the tokens cut to len - 2, EOS, then the padding id
  // (<|endoftext|>).
  kClip,
};
std::vector<int64_t> caption_ids(const Tokenizer& tokenizer, const std::string& caption,
                                 int64_t len, CaptionFraming framing = CaptionFraming::kTest);

// The tokenizers of a caption's two text encoders (not owned: they outlive the loader) and how
// they frame it: one shared tokenizer framed as TorchTitan's test tokenizer (training.test_mode),
// or T5's and CLIP's own tokenizers framed as transformers does.
struct CaptionTokenizers {
  const Tokenizer* t5 = nullptr;
  const Tokenizer* clip = nullptr;
  bool pretrained = false;  // kT5 / kClip framing; else kTest for both
  static CaptionTokenizers shared_test(const Tokenizer& tokenizer) {
    return {&tokenizer, &tokenizer, false};
  }
  std::vector<int64_t> t5_ids(const std::string& caption, int64_t len) const;
  std::vector<int64_t> clip_ids(const std::string& caption, int64_t len) const;
};

// Classifier-free guidance's drops of sample `serial`'s caption (each with probability `prob`,
// T5's and CLIP's independently), drawn as ImageBatchLoader draws them (after the crop), so that
// precomputed encodings (trainer/flux_latents.h) drop the same captions.
struct CaptionDrops {
  bool t5 = false;
  bool clip = false;
};
CaptionDrops caption_drops(uint64_t seed, int64_t serial, double prob);

struct ImageBatchOptions {
  int64_t batch_size = 1;  // rows per batch (the global batch: every data rank's rows)
  int64_t img_size = 256;
  int64_t t5_tokens = 256;   // tokens per caption for T5 (padded with 0 or cut)
  int64_t clip_tokens = 77;  // and for CLIP
  double cfg_drop_prob = 0.0;
  uint64_t seed = 0;
  bool infinite = true;  // training: wraps around epochs; validation: one pass, then nullopt
  bool skip_unreadable = false;
};

// Batch::inputs (bs, 3, img_size, img_size) float32 in [-1, 1]; Batch::labels undefined;
// Batch::conditioning: "t5_tokens" (bs, t5_tokens) and "clip_tokens" (bs, clip_tokens) int64
// (framed by CaptionTokenizers), "sample_ids" (bs) int64, the samples' serial numbers.
class ImageBatchLoader : public BatchLoader {
 public:
  ImageBatchLoader(std::shared_ptr<const ImageCaptionSource> source, CaptionTokenizers tokenizers,
                   ImageBatchOptions options);
  // One tokenizer for both encoders, framed as TorchTitan's test tokenizer.
  ImageBatchLoader(std::shared_ptr<const ImageCaptionSource> source, const Tokenizer& tokenizer,
                   ImageBatchOptions options)
      : ImageBatchLoader(std::move(source), CaptionTokenizers::shared_test(tokenizer), options) {}
  std::optional<Batch> next() override;
  nlohmann::json state_json() const override;
  void load_state_json(const nlohmann::json& state) override;

  // Rows passed over so far: unreadable (skip_unreadable) and smaller than img_size.
  int64_t unreadable() const { return cursor_.unreadable; }
  int64_t too_small() const { return too_small_; }

 private:
  std::shared_ptr<const ImageCaptionSource> source_;
  CaptionTokenizers tokenizers_;
  ImageBatchOptions options_;
  at::Tensor empty_t5_, empty_clip_;  // the empty caption's ids (int64)
  ImageRowCursor cursor_;
  int64_t serial_ = 0;  // samples emitted so far
  int64_t too_small_ = 0;
};

}  // namespace titan
