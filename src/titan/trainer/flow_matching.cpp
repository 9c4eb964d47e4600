// Rectified-flow training inputs for FLUX (see flow_matching.h).
#include "titan/trainer/flow_matching.h"

#include "titan/common/check.h"
#include "titan/common/splitmix.h"
#include "titan/models/common/init.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace titan {
namespace {

// Serial-number seeds of the per-sample generators (one stream per use, so that adding a draw
// to one never shifts another).
enum class Draw : uint64_t { kLatent = 1, kNoise = 2, kTimestep = 3 };

at::Generator sample_generator(uint64_t seed, int64_t serial, Draw draw) {
  SplitMix64 mix(seed ^ (0xF10Bull << 20) ^ static_cast<uint64_t>(draw));
  const uint64_t key = mix.next() + static_cast<uint64_t>(serial) * 0x9E3779B97F4A7C15ull;
  return at::make_generator<at::CPUGeneratorImpl>(SplitMix64(key).next());
}

// Random weights for a frozen component under training.test_mode, the same on every rank (from
// the seed and each parameter's name): norm scales one, biases zero, embeddings N(0, 1), other
// weights uniform within 1 / sqrt(fan_in) (PyTorch's default scale for linear and convolution
// layers).
void random_init(torch::nn::Module& module, uint64_t seed, const std::string& prefix) {
  at::NoGradGuard no_grad;
  for (auto& item : module.named_parameters()) {
    const std::string name = prefix + item.key();
    at::Tensor p = item.value();
    ParamInit init = ParamInit::zeros();
    const bool is_norm = name.find("norm") != std::string::npos;
    const bool is_bias = name.size() >= 5 && name.compare(name.size() - 5, 5, ".bias") == 0;
    if (is_norm && !is_bias) {
      init = ParamInit::ones();
    } else if (is_bias) {
      init = ParamInit::zeros();
    } else if (name.find("embedding") != std::string::npos ||
               name.find("shared.") != std::string::npos ||
               name.find("relative_attention_bias") != std::string::npos) {
      init = ParamInit::normal(0.0, 1.0);
    } else {
      const double bound = 1.0 / std::sqrt(static_cast<double>(p.numel() / p.size(0)));
      init = ParamInit::uniform(-bound, bound);
    }
    init_whole(p, init, seed, name);
  }
  module.eval();
}

std::optional<nlohmann::json> folder_config(const std::string& folder) {
  const std::filesystem::path path = std::filesystem::path(folder) / "config.json";
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return std::nullopt;
  std::ifstream in(path);
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw DataError(message(path.string(), ": not valid JSON (", e.what(), ")"));
  }
}

// Debug-sized encoders for a flavor whose text features are `dim` wide.
encoders::T5Args debug_t5(int64_t dim, int64_t vocab) {
  encoders::T5Args a;
  a.vocab_size = vocab;
  a.d_model = dim;
  a.num_heads = dim % 16 == 0 ? dim / 16 : 1;
  a.d_kv = dim / a.num_heads;
  a.d_ff = 2 * dim;
  a.num_layers = 2;
  return a;
}

encoders::ClipTextArgs debug_clip(int64_t dim, int64_t vocab, int64_t eos) {
  encoders::ClipTextArgs a;
  a.vocab_size = vocab;
  a.hidden_size = dim;
  a.num_attention_heads = dim % 16 == 0 ? dim / 16 : 1;
  a.intermediate_size = 2 * dim;
  a.num_hidden_layers = 2;
  a.eos_token_id = eos;
  return a;
}

}  // namespace

at::Tensor pack_latents(const at::Tensor& latents) {
  const int64_t b = latents.size(0), c = latents.size(1), h = latents.size(2) / 2,
                w = latents.size(3) / 2;
  // (b, c, h, 2, w, 2) -> (b, h, w, c, 2, 2)
  return latents.reshape({b, c, h, 2, w, 2}).permute({0, 2, 4, 1, 3, 5}).reshape({b, h * w, c * 4});
}

at::Tensor unpack_latents(const at::Tensor& packed, int64_t height, int64_t width) {
  const int64_t b = packed.size(0), h = height / 2, w = width / 2, c = packed.size(2) / 4;
  // (b, h, w, c, 2, 2) -> (b, c, h, 2, w, 2)
  return packed.reshape({b, h, w, c, 2, 2})
      .permute({0, 3, 1, 4, 2, 5})
      .reshape({b, c, height, width});
}

at::Tensor latent_position_ids(int64_t height, int64_t width) {
  const int64_t h = height / 2, w = width / 2;
  const at::Tensor rows = at::arange(h, at::kFloat).view({h, 1}).expand({h, w});
  const at::Tensor cols = at::arange(w, at::kFloat).view({1, w}).expand({h, w});
  return at::stack({at::zeros_like(rows), rows, cols}, -1).reshape({h * w, 3});
}

FlowMatching::FlowMatching(const JobConfig& config, const std::string& flavor,
                           const flux::FluxArgs& args, int64_t vocab_size, int64_t eos_id,
                           at::Device device, uint64_t seed)
    : args_(args),
      device_(device),
      seed_(seed),
      img_size_(config.training.img_size),
      txt_len_(config.encoder.max_t5_encoding_len),
      guidance_(config.training.guidance) {
  const EncoderSection& e = config.encoder;
  if (!config.training.test_mode) {
    throw ConfigError(
        "FLUX training with pretrained T5 and CLIP encoders needs their tokenizers (T5's "
        "SentencePiece unigram model, CLIP's byte-pair encoding), which titan does not read yet. "
        "HINT: set training.test_mode = true to train with random encoders and captions "
        "tokenized by model.hf_assets_path's tokenizer (TorchTitan's test mode)");
  }
  flux::AutoEncoderArgs ae_args = flux::autoencoder_args_for_flavor(flavor);
  if (ae_args.z_channels * 4 != args_.in_channels) {
    throw ConfigError(message("flux: the autoencoder's ", ae_args.z_channels,
                              " latent channels make ", ae_args.z_channels * 4,
                              " features per 2x2 patch, the transformer takes in_channels ",
                              args_.in_channels));
  }
  std::ostringstream origin;
  encoders::T5Args t5_args = debug_t5(args_.context_in_dim, vocab_size);
  if (auto json = folder_config(e.t5_encoder)) {
    t5_args = encoders::t5_args_from_hf(*json);
    origin << "T5 config from " << e.t5_encoder;
  } else {
    origin << "debug T5";
  }
  encoders::ClipTextArgs clip_args = debug_clip(args_.vec_in_dim, vocab_size, eos_id);
  if (auto json = folder_config(e.clip_encoder)) {
    clip_args = encoders::clip_text_args_from_hf(*json);
    origin << ", CLIP config from " << e.clip_encoder;
  } else {
    origin << ", debug CLIP";
  }
  if (t5_args.d_model != args_.context_in_dim || clip_args.hidden_size != args_.vec_in_dim) {
    throw ConfigError(message("flux: the text encoders give ", t5_args.d_model,
                              " features per token (T5 d_model) and ", clip_args.hidden_size,
                              " pooled (CLIP hidden_size); the transformer takes context_in_dim ",
                              args_.context_in_dim, " and vec_in_dim ", args_.vec_in_dim));
  }
  if (t5_args.vocab_size < vocab_size || clip_args.vocab_size < vocab_size) {
    throw ConfigError(message("flux: the tokenizer's ", vocab_size,
                              " ids do not fit the text encoders' vocabularies (T5 ",
                              t5_args.vocab_size, ", CLIP ", clip_args.vocab_size, ")"));
  }
  if (config.encoder.max_t5_encoding_len < 1) {
    throw ConfigError("encoder.max_t5_encoding_len must be >= 1");
  }
  ae_ = std::make_shared<flux::AutoEncoder>(ae_args);
  t5_ = std::make_shared<encoders::T5Encoder>(t5_args);
  clip_ = std::make_shared<encoders::ClipTextEncoder>(clip_args);
  // Random, but the same on every rank and run of this seed (test mode).
  random_init(*ae_, seed_, "autoencoder.");
  random_init(*t5_, seed_, "t5.");
  random_init(*clip_, seed_, "clip.");
  for (torch::nn::Module* m :
       {static_cast<torch::nn::Module*>(ae_.get()), static_cast<torch::nn::Module*>(t5_.get()),
        static_cast<torch::nn::Module*>(clip_.get())}) {
    m->to(device_);
    for (auto& p : m->parameters()) p.requires_grad_(false);
  }
  origin << " (random weights: training.test_mode)";
  origin_ = origin.str();
}

int64_t FlowMatching::image_tokens() const {
  const int64_t latent = img_size_ >> ae_->args().downsampling();
  return (latent / 2) * (latent / 2);
}

double FlowMatching::flops_per_image_token() const {
  return flux::flops_per_image_token(args_, txt_len_, image_tokens());
}

std::string FlowMatching::describe() const {
  const flux::AutoEncoderArgs& a = ae_->args();
  std::ostringstream out;
  out << "autoencoder ch " << a.ch << " x " << a.ch_mult.size() << " levels, " << a.z_channels
      << " latent channels; T5 d_model " << t5_->args().d_model << " x " << t5_->args().num_layers
      << " layers; CLIP hidden " << clip_->args().hidden_size << " x "
      << clip_->args().num_hidden_layers << " layers; " << origin_ << "; " << image_tokens()
      << " image tokens per " << img_size_ << "px image";
  return out.str();
}

Batch FlowMatching::prepare(const Batch& images, bool validation) const {
  at::NoGradGuard no_grad;
  const at::Tensor& pixels = images.inputs;  // (bs, 3, S, S) in [-1, 1]
  const at::Tensor serials = images.conditioning.at("sample_ids").to(at::kCPU);
  const int64_t bs = pixels.size(0);
  const flux::AutoEncoderArgs& a = ae_->args();
  // The Gaussian's moments, then a sample of it per image from that image's generator.
  const std::vector<at::Tensor> moments = ae_->encoder->forward(pixels.to(at::kFloat)).chunk(2, 1);
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
  out.inputs = pack_latents((1 - sigma) * x + sigma * e);
  out.labels = pack_latents(e - x);
  const at::Tensor t5_tokens = images.conditioning.at("t5_tokens");
  out.conditioning["txt"] = t5_->forward(t5_tokens);
  out.conditioning["y"] = clip_->forward(images.conditioning.at("clip_tokens")).pooled;
  out.conditioning["timesteps"] = t;
  out.conditioning["img_ids"] = latent_position_ids(h, w).to(device_);
  out.conditioning["txt_ids"] = at::zeros({t5_tokens.size(1), 3}, at::kFloat).to(device_);
  if (args_.guidance_embed) {
    out.conditioning["guidance"] = at::full({bs}, guidance_, at::kFloat).to(device_);
  }
  return out;
}

}  // namespace titan
