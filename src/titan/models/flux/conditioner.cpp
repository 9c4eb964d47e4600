// FLUX's frozen encoders (see conditioner.h).
#include "titan/models/flux/conditioner.h"

#include "titan/common/check.h"
#include "titan/models/common/init.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

namespace titan::flux {
namespace {

// The seed of the random encoders of training.test_mode: fixed, so that every run, rank and
// command (training, validation, sampling) holds the same ones.
constexpr uint64_t kTestModeEncoderSeed = 0x7E57E5C0DEull;

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

std::string FluxEncoders::describe() const {
  const AutoEncoderArgs& a = autoencoder->args();
  std::ostringstream out;
  out << "autoencoder ch " << a.ch << " x " << a.ch_mult.size() << " levels, " << a.z_channels
      << " latent channels; T5 d_model " << t5->args().d_model << " x " << t5->args().num_layers
      << " layers; CLIP hidden " << clip->args().hidden_size << " x "
      << clip->args().num_hidden_layers << " layers; " << origin;
  return out.str();
}

void finish_flux_encoders(FluxEncoders& encoders, const FluxArgs& args, const CaptionVocab& vocab,
                          at::Device device) {
  const AutoEncoderArgs& ae = encoders.autoencoder->args();
  if (ae.z_channels * 4 != args.in_channels) {
    throw ConfigError(message(
        "flux: the autoencoder's ", ae.z_channels, " latent channels make ", ae.z_channels * 4,
        " features per 2x2 patch, the transformer takes in_channels ", args.in_channels));
  }
  const encoders::T5Args& t5 = encoders.t5->args();
  const encoders::ClipTextArgs& clip = encoders.clip->args();
  if (t5.d_model != args.context_in_dim || clip.hidden_size != args.vec_in_dim) {
    throw ConfigError(message("flux: the text encoders give ", t5.d_model,
                              " features per token (T5 d_model) and ", clip.hidden_size,
                              " pooled (CLIP hidden_size); the transformer takes context_in_dim ",
                              args.context_in_dim, " and vec_in_dim ", args.vec_in_dim));
  }
  if (t5.vocab_size < vocab.t5 || clip.vocab_size < vocab.clip) {
    throw ConfigError(message("flux: the captions' tokenizers have ", vocab.t5, " (T5) and ",
                              vocab.clip, " (CLIP) ids; the text encoders' vocabularies hold ",
                              t5.vocab_size, " and ", clip.vocab_size));
  }
  for (torch::nn::Module* m : {static_cast<torch::nn::Module*>(encoders.autoencoder.get()),
                               static_cast<torch::nn::Module*>(encoders.t5.get()),
                               static_cast<torch::nn::Module*>(encoders.clip.get())}) {
    m->to(device);
    m->eval();
    for (auto& p : m->parameters()) p.requires_grad_(false);
  }
}

FluxEncoders build_flux_encoders(const JobConfig& config, const std::string& flavor,
                                 const FluxArgs& args, const CaptionVocab& vocab,
                                 at::Device device) {
  const EncoderSection& e = config.encoder;
  TITAN_CHECK(config.training.test_mode,
              "build_flux_encoders builds the random encoders of training.test_mode");
  std::ostringstream origin;
  encoders::T5Args t5_args = debug_t5(args.context_in_dim, vocab.t5);
  if (auto json = folder_config(e.t5_encoder)) {
    t5_args = encoders::t5_args_from_hf(*json);
    origin << "T5 config from " << e.t5_encoder;
  } else {
    origin << "debug T5";
  }
  encoders::ClipTextArgs clip_args = debug_clip(args.vec_in_dim, vocab.clip, vocab.clip_eos);
  if (auto json = folder_config(e.clip_encoder)) {
    clip_args = encoders::clip_text_args_from_hf(*json);
    origin << ", CLIP config from " << e.clip_encoder;
  } else {
    origin << ", debug CLIP";
  }
  FluxEncoders out;
  out.autoencoder = std::make_shared<AutoEncoder>(autoencoder_args_for_flavor(flavor));
  out.t5 = std::make_shared<encoders::T5Encoder>(t5_args);
  out.clip = std::make_shared<encoders::ClipTextEncoder>(clip_args);
  random_init(*out.autoencoder, kTestModeEncoderSeed, "autoencoder.");
  random_init(*out.t5, kTestModeEncoderSeed, "t5.");
  random_init(*out.clip, kTestModeEncoderSeed, "clip.");
  finish_flux_encoders(out, args, vocab, device);
  origin << " (random weights, fixed seed: training.test_mode)";
  out.origin = origin.str();
  return out;
}

}  // namespace titan::flux
