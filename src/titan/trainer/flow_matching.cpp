// Rectified-flow training inputs for FLUX (see flow_matching.h).
#include "titan/trainer/flow_matching.h"

#include "titan/common/check.h"
#include "titan/common/splitmix.h"
#include "titan/models/flux/latents.h"

#include <sstream>

namespace titan {
namespace {

// Serial-number seeds of the per-sample generators (one stream per use, so that adding a draw
// to one never shifts another).
enum class Draw : uint64_t { kLatent = 1, kNoise = 2, kTimestep = 3 };

at::Generator sample_generator(uint64_t seed, int64_t serial, Draw draw) {
  SplitMix64 stream = keyed_stream(seed ^ (0xF10Bull << 20) ^ static_cast<uint64_t>(draw), serial);
  return at::make_generator<at::CPUGeneratorImpl>(stream.next());
}

}  // namespace

FlowMatching::FlowMatching(const JobConfig& config, const std::string& flavor,
                           const flux::FluxArgs& args, const FluxTokenizers& tokenizers,
                           at::Device device, uint64_t seed)
    : args_(args),
      encoders_(load_flux_encoders(config, flavor, args, tokenizers, device)),
      device_(device),
      seed_(seed),
      img_size_(config.training.img_size),
      txt_len_(config.encoder.max_t5_encoding_len),
      guidance_(config.training.guidance) {}

int64_t FlowMatching::image_tokens() const {
  const int64_t latent = img_size_ >> encoders_.autoencoder->args().downsampling();
  return (latent / 2) * (latent / 2);
}

double FlowMatching::flops_per_image_token() const {
  return flux::flops_per_image_token(args_, txt_len_, image_tokens());
}

std::string FlowMatching::describe() const {
  std::ostringstream out;
  out << encoders_.describe() << "; " << image_tokens() << " image tokens per " << img_size_
      << "px image";
  return out.str();
}

Batch FlowMatching::prepare(const Batch& images, bool validation) const {
  at::NoGradGuard no_grad;
  const bool cached = images.conditioning.count("txt") != 0;
  const at::Tensor serials = images.conditioning.at("sample_ids").to(at::kCPU);
  const int64_t bs = images.inputs.size(0);
  const flux::AutoEncoderArgs& a = encoders_.autoencoder->args();
  // The Gaussian's moments (precomputed, or from the images in [-1, 1]), then a sample of it
  // per image from that image's generator.
  const std::vector<at::Tensor> moments =
      (cached ? images.inputs.to(at::kFloat)
              : encoders_.autoencoder->encoder->forward(images.inputs.to(at::kFloat)))
          .chunk(2, 1);
  const int64_t c = moments[0].size(1), h = moments[0].size(2), w = moments[0].size(3);
  std::vector<at::Tensor> latent_noise, noise, timesteps;
  for (int64_t i = 0; i < bs; ++i) {
    const int64_t serial = serials[i].item<int64_t>();
    auto g_latent = sample_generator(seed_, serial, Draw::kLatent);
    auto g_noise = sample_generator(seed_, serial, Draw::kNoise);
    latent_noise.push_back(at::randn({c, h, w}, g_latent, at::kFloat));
    noise.push_back(at::randn({c, h, w}, g_noise, at::kFloat));
    if (validation) {
      timesteps.push_back(at::full({1}, ((serial % 8) + 0.5) / 8.0, at::kFloat));
    } else {
      auto g_t = sample_generator(seed_, serial, Draw::kTimestep);
      timesteps.push_back(at::rand({1}, g_t, at::kFloat));
    }
  }
  const at::Tensor z = moments[0] + at::exp(0.5 * moments[1]) * at::stack(latent_noise).to(device_);
  const at::Tensor x = a.scale_factor * (z - a.shift_factor);  // the clean latents
  const at::Tensor e = at::stack(noise).to(device_);
  const at::Tensor t = at::cat(timesteps).to(device_);
  const at::Tensor sigma = t.view({bs, 1, 1, 1});
  Batch out;
  out.inputs = flux::pack_latents((1 - sigma) * x + sigma * e);
  out.labels = flux::pack_latents(e - x);
  out.conditioning["txt"] = cached ? images.conditioning.at("txt")
                                   : encoders_.encode_t5(images.conditioning.at("t5_tokens"));
  out.conditioning["y"] = cached ? images.conditioning.at("y")
                                 : encoders_.encode_clip(images.conditioning.at("clip_tokens"));
  const int64_t txt_len = out.conditioning["txt"].size(1);
  out.conditioning["timesteps"] = t;
  out.conditioning["img_ids"] = flux::latent_position_ids(h, w).to(device_);
  out.conditioning["txt_ids"] = at::zeros({txt_len, 3}, at::kFloat).to(device_);
  if (args_.guidance_embed) {
    out.conditioning["guidance"] = at::full({bs}, guidance_, at::kFloat).to(device_);
  }
  return out;
}

}  // namespace titan
