// FLUX's frozen encoders together: the autoencoder (images <-> latents) and the T5 and CLIP text
// encoders, built for a flavor from the job config's [encoder] and training.test_mode, the same
// way for training (trainer/flow_matching.h) and sampling (`titan generate`).
#pragma once

#include "titan/config/job_config.h"
#include "titan/models/encoders/clip.h"
#include "titan/models/encoders/t5.h"
#include "titan/models/flux/args.h"
#include "titan/models/flux/autoencoder.h"

#include <ATen/ATen.h>

#include <memory>
#include <string>

namespace titan::flux {

struct FluxEncoders {
  std::shared_ptr<AutoEncoder> autoencoder;
  std::shared_ptr<encoders::T5Encoder> t5;
  std::shared_ptr<encoders::ClipTextEncoder> clip;
  std::string origin;  // where their configs and weights came from, for the log

  // T5's features (bs, len, d_model) and CLIP's pooled vector (bs, hidden) of token ids.
  at::Tensor encode_t5(const at::Tensor& ids) const { return t5->forward(ids); }
  at::Tensor encode_clip(const at::Tensor& ids) const { return clip->forward(ids).pooled; }
  // "autoencoder ch 32 x 4 levels, 16 latent channels; T5 d_model 64 x 2 layers; ...".
  std::string describe() const;
};

// What the captions' tokenizers give each text encoder: vocabulary sizes (ids must fit the
// encoders' embeddings) and CLIP's end-of-text id (where a debug CLIP pools).
struct CaptionVocab {
  int64_t t5 = 0;
  int64_t clip = 0;
  int64_t clip_eos = 0;
};

// The random encoders of training.test_mode for a FLUX model of `args` (flavor `flavor`) on
// `device`, frozen: the same in every run, rank and command (a fixed seed; a model trained with
// them samples with them); configs from [encoder]'s folders where a config.json exists, else
// debug sizes matching the flavor's text widths and `vocab`. Pretrained encoders are loaded by
// trainer/flux_setup.h (the weight files are read there). ConfigError outside test mode.
FluxEncoders build_flux_encoders(const JobConfig& config, const std::string& flavor,
                                 const FluxArgs& args, const CaptionVocab& vocab,
                                 at::Device device);

// Checks that `encoders` fit the transformer of `args` (widths, latent channels) and the
// captions' `vocab` (ConfigError naming both sides), then moves them to `device`, frozen (no
// gradients, eval).
void finish_flux_encoders(FluxEncoders& encoders, const FluxArgs& args, const CaptionVocab& vocab,
                          at::Device device);

}  // namespace titan::flux
