// Sampling images from a FLUX transformer (TorchTitan's flux inference, black-forest-labs'
// Euler sampler): noise latents, the flow schedule (shifted toward noise for guidance-distilled
// models and from-scratch ones, unshifted for schnell), an Euler step per time with optional
// classifier-free guidance (the unconditional prediction from the empty caption, pushed toward
// the conditional one by cfg_scale), then the autoencoder's decoding.
#pragma once

#include "titan/models/flux/args.h"
#include "titan/models/flux/conditioner.h"
#include "titan/models/model.h"

#include <ATen/ATen.h>

#include <cstdint>

namespace titan::flux {

struct FluxSamplingOptions {
  int64_t img_size = 256;  // a multiple of 16
  int64_t steps = 50;
  double cfg_scale = 1.0;  // > 1: classifier-free guidance (two predictions a step)
  double guidance = 3.5;   // given to a guidance embedding (flux-dev); unused otherwise
  bool shift = true;       // flow_schedule's shift (false for flux-schnell, as black-forest-labs)
  uint64_t seed = 0;       // of the noise
};

// Images (bs, 3, img_size, img_size) float32, roughly [-1, 1], for the captions' token ids
// t5_ids (bs, t5 length) and clip_ids (bs, clip length); with cfg_scale > 1, empty_t5 and
// empty_clip (1, length each) are the empty caption's. `model` is a FLUX transformer of `args`
// (forward with ForwardInputs::conditioning), on the encoders' device. No autograd.
at::Tensor sample_images(Model& model, const FluxArgs& args, const FluxEncoders& encoders,
                         const at::Tensor& t5_ids, const at::Tensor& clip_ids,
                         const at::Tensor& empty_t5, const at::Tensor& empty_clip,
                         const FluxSamplingOptions& options);

// images in [-1, 1] -> (3, H, W) uint8 RGB each: clamped, (x + 1) / 2 * 255 rounded.
at::Tensor to_rgb8(const at::Tensor& image);

}  // namespace titan::flux
