// FLUX's precomputed encodings (`titan flux encode`): each sample's autoencoder moments (the
// Gaussian's mean and log-variance, so that training still draws its latent) and its caption's
// T5 features and CLIP pooled vector, computed once by the frozen encoders and read back by
// training with training.dataset = "flux_latents" (dataset_path: the folder), which then skips
// the encoders. The samples are the image batches' (image_batches.h) first pass, cropped as it
// crops them; caption drops for classifier-free guidance still happen while training, from the
// same (seed, serial) draws, with the empty caption's encodings stored once.
//
// Folder: index.json ({"format": "titan-flux-latents", "version": 1, "rows", "shards",
// "flavor", "img_size", "max_t5_encoding_len", "encoders", "tokenizer"}) and
// latents-NNNNN.safetensors shards holding "moments" (n, 2 z, h, w), "t5" (n, len, d), "clip"
// (n, d) float32, plus "empty_t5" (1, len, d) and "empty_clip" (1, d) in the first.
#pragma once

#include "titan/components/data/data_loader.h"
#include "titan/config/job_config.h"

#include <cstdint>
#include <memory>
#include <string>

namespace titan {

// Encodes the first `rows` samples (all when <= 0) of the training dataset of `config` into
// the folder `output` (which must not exist; written atomically). Returns the samples written.
int64_t encode_flux_latents(const JobConfig& config, const std::string& output, int64_t rows,
                            int64_t batch_size = 16);

// A folder written by encode_flux_latents, read as the trainer's batches.
class FluxLatentLoader : public BatchLoader {
 public:
  // DataError naming the folder when it is not one, or when it was encoded for another flavor,
  // image size or caption length than `config` trains with (the message says which).
  FluxLatentLoader(const std::string& folder, const JobConfig& config, int64_t batch_size,
                   double cfg_drop_prob, uint64_t seed, bool infinite);
  ~FluxLatentLoader() override;

  // Batch::inputs the moments (bs, 2 z, h, w); conditioning "txt" (bs, len, d), "y" (bs, d),
  // "sample_ids" (bs).
  std::optional<Batch> next() override;
  nlohmann::json state_json() const override;
  void load_state_json(const nlohmann::json& state) override;
  int64_t rows() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace titan
