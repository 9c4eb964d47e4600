// Rectified-flow training inputs for FLUX (TorchTitan's FluxTrainer.forward_backward_step and
// its validator): a rank's rows of an image batch (image_batches.h) become the transformer's
// inputs. The frozen autoencoder encodes each image to latents x (a sample of its Gaussian),
// T5 and CLIP encode the captions; with noise e and a timestep t per sample the model sees
// (1 - t) x + t e packed into 2x2 patches and learns the velocity e - x (ParallelizedModel's
// loss: the mean squared error against floating-point labels).
//
// Training draws t uniformly in [0, 1); validation uses the stratified timesteps (i + 0.5) / 8
// in turn by the sample's serial number (TorchTitan's round robin). The noise, t and the latent
// sample come from generators seeded by (seed, the sample's serial number), so every layout of
// ranks trains on the same values.
#pragma once

#include "titan/components/data/data_loader.h"
#include "titan/config/job_config.h"
#include "titan/models/flux/args.h"
#include "titan/models/flux/conditioner.h"
#include "titan/trainer/flux_setup.h"

#include <ATen/ATen.h>

#include <memory>
#include <string>

namespace titan {

class ImageCaptionSource;

// The image-caption dataset of a config section: "shapes" (the built-in procedural set, at
// training.img_size; `seed` picks its images), or the rows at `path`. ConfigError for another
// dataset name without a path (the message lists the choices).
std::shared_ptr<const ImageCaptionSource> open_image_dataset(const std::string& section,
                                                             const std::string& dataset,
                                                             const std::string& path,
                                                             const TrainingSection& t,
                                                             uint64_t seed);

// The dataset name of a folder of precomputed FLUX encodings (flux_latents.h).
inline constexpr const char* kFluxLatents = "flux_latents";

class FlowMatching {
 public:
  // With the frozen encoders of load_flux_encoders (flux_setup.h; same arguments); `seed` draws
  // the samples' latents, noise and timesteps.
  FlowMatching(const JobConfig& config, const std::string& flavor, const flux::FluxArgs& args,
               const FluxTokenizers& tokenizers, at::Device device, uint64_t seed);

  // A rank's rows of an image batch (on the device) -> the transformer's batch: inputs the
  // packed noisy latents, labels the packed velocity target, conditioning txt, y, timesteps,
  // img_ids, txt_ids (and guidance). A batch of precomputed encodings (FluxLatentLoader's:
  // inputs the autoencoder's moments, conditioning txt and y) skips the encoders.
  Batch prepare(const Batch& images, bool validation) const;

  // "autoencoder (...), T5 (...), CLIP (...)" for the log.
  std::string describe() const;
  // Image tokens per sample (the transformer's sequence length).
  int64_t image_tokens() const;
  // The transformer's training FLOPs per image token with these text and image lengths
  // (flux::flops_per_image_token), for MFU.
  double flops_per_image_token() const;

  const flux::FluxEncoders& encoders() const { return encoders_; }

 private:
  flux::FluxArgs args_;
  flux::FluxEncoders encoders_;
  at::Device device_;
  uint64_t seed_;
  int64_t img_size_;
  int64_t txt_len_;
  double guidance_;
};

}  // namespace titan
