// Sampling images from a FLUX transformer (see sampling.h).
#include "titan/models/flux/sampling.h"

#include "titan/common/check.h"
#include "titan/models/flux/latents.h"

namespace titan::flux {

at::Tensor sample_images(Model& model, const FluxArgs& args, const FluxEncoders& encoders,
                         const at::Tensor& t5_ids, const at::Tensor& clip_ids,
                         const at::Tensor& empty_t5, const at::Tensor& empty_clip,
                         const FluxSamplingOptions& o) {
  at::NoGradGuard no_grad;
  const AutoEncoderArgs& ae = encoders.autoencoder->args();
  const int64_t f = int64_t{1} << ae.downsampling();
  TITAN_CONFIG_CHECK(o.img_size > 0 && o.img_size % (2 * f) == 0, "flux sampling: the image size ",
                     o.img_size, " must be a positive multiple of ", 2 * f, " (the autoencoder's ",
                     f, " x the 2 x 2 patches)");
  TITAN_CONFIG_CHECK(o.steps >= 1, "flux sampling: steps must be >= 1, got ", o.steps);
  const at::Device device = encoders.autoencoder->encoder->conv_in->weight.device();
  const bool cfg = o.cfg_scale > 1.0;
  const int64_t bs = t5_ids.size(0), side = o.img_size / f;
  at::Tensor txt = encoders.encode_t5(t5_ids.to(device));
  at::Tensor y = encoders.encode_clip(clip_ids.to(device));
  if (cfg) {  // [unconditional, conditional]
    txt = at::cat({encoders.encode_t5(empty_t5.to(device)).expand({bs, -1, -1}), txt});
    y = at::cat({encoders.encode_clip(empty_clip.to(device)).expand({bs, -1}), y});
  }
  const int64_t rows = cfg ? 2 * bs : bs;
  ForwardInputs inputs;
  inputs.conditioning["txt"] = txt;
  inputs.conditioning["y"] = y;
  inputs.conditioning["img_ids"] = latent_position_ids(side, side).to(device);
  inputs.conditioning["txt_ids"] = at::zeros({txt.size(1), 3}, at::kFloat).to(device);
  if (args.guidance_embed) {
    inputs.conditioning["guidance"] = at::full({rows}, o.guidance, at::kFloat).to(device);
  }
  auto gen = at::make_generator<at::CPUGeneratorImpl>(o.seed);
  const at::Tensor noise = at::randn({bs, ae.z_channels, side, side}, gen, at::kFloat);
  const std::vector<double> times = flow_schedule(o.steps, (side / 2) * (side / 2), o.shift);
  const at::Tensor packed =
      euler_sample(pack_latents(noise).to(device), times, [&](const at::Tensor& x, double t) {
        inputs.conditioning["timesteps"] = at::full({rows}, t, at::kFloat).to(device);
        if (!cfg) return model.forward(x, inputs);
        const std::vector<at::Tensor> pred = model.forward(at::cat({x, x}), inputs).chunk(2);
        return pred[0] + o.cfg_scale * (pred[1] - pred[0]);
      });
  return encoders.autoencoder->decode(unpack_latents(packed, side, side));
}

at::Tensor to_rgb8(const at::Tensor& image) {
  return ((image.to(at::kFloat).clamp(-1.0, 1.0) + 1.0) * 127.5).round().to(at::kByte);
}

}  // namespace titan::flux
