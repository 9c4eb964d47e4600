// FLUX.1's autoencoder (a KL-regularized convolutional VAE, frozen during training): images
// (bs, 3, H, W) in [-1, 1] to latents (bs, z_channels, H / 8, W / 8) and back. Module and
// parameter names are black-forest-labs' (the ae.safetensors TorchTitan loads:
// encoder.down.0.block.1.conv1.weight, decoder.mid.attn_1.q.weight, ...); diffusers'
// AutoencoderKL folders load through ae_from_diffusers.
//
// Shapes use `ch * ch_mult[i]` channels at resolution level i; the encoder halves the size
// after every level but the last (a stride-2 convolution after zero padding on the right and
// bottom), the decoder doubles it (nearest neighbour, then a convolution).
#pragma once

#include "titan/models/registry.h"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>
#include <torch/nn/module.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/normalization.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace titan::flux {

struct AutoEncoderArgs {
  int64_t in_channels = 3;
  int64_t out_ch = 3;
  int64_t ch = 128;
  std::vector<int64_t> ch_mult = {1, 2, 4, 4};
  int64_t num_res_blocks = 2;
  int64_t z_channels = 16;
  int64_t norm_groups = 32;  // GroupNorm groups (32 in every released model)
  // Latents the transformer sees: scale_factor * (z - shift_factor).
  double scale_factor = 0.3611;
  double shift_factor = 0.1159;
  // How many times the encoder halves the image size: ch_mult.size() - 1.
  int64_t downsampling() const { return static_cast<int64_t>(ch_mult.size()) - 1; }
  // ConfigError naming the rule broken (channels divisible by the groups, positive sizes).
  void validate() const;
};

// GroupNorm -> SiLU -> 3x3 conv, twice, plus the input (through a 1x1 conv where the channel
// count changes: nin_shortcut).
class ResnetBlock : public torch::nn::Module {
 public:
  ResnetBlock(int64_t in_channels, int64_t out_channels, int64_t groups);
  at::Tensor forward(const at::Tensor& x);
  torch::nn::GroupNorm norm1{nullptr}, norm2{nullptr};
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr}, nin_shortcut{nullptr};
};

// Single-head self-attention over the pixels (1x1 convolutions q, k, v, proj_out), residual.
class AttnBlock : public torch::nn::Module {
 public:
  AttnBlock(int64_t channels, int64_t groups);
  at::Tensor forward(const at::Tensor& x);
  torch::nn::GroupNorm norm{nullptr};
  torch::nn::Conv2d q{nullptr}, k{nullptr}, v{nullptr}, proj_out{nullptr};
};

// resnet, attention, resnet at the lowest resolution ("mid").
class MidBlock : public torch::nn::Module {
 public:
  MidBlock(int64_t channels, int64_t groups);
  at::Tensor forward(const at::Tensor& x);
  std::shared_ptr<ResnetBlock> block_1, block_2;
  std::shared_ptr<AttnBlock> attn_1;
};

// One resolution level: its resnets ("block.N") and the resampling convolution
// ("downsample.conv" / "upsample.conv"), absent at the last level.
struct Level {
  std::vector<std::shared_ptr<ResnetBlock>> blocks;
  torch::nn::Conv2d resample{nullptr};
};

class Encoder : public torch::nn::Module {
 public:
  explicit Encoder(const AutoEncoderArgs& args);
  // (bs, in_channels, H, W) -> the Gaussian's mean and log-variance, (bs, 2 z_channels, H / f,
  // W / f) with f = 2^downsampling.
  at::Tensor forward(const at::Tensor& x);
  torch::nn::Conv2d conv_in{nullptr}, conv_out{nullptr};
  std::vector<Level> down;
  std::shared_ptr<MidBlock> mid;
  torch::nn::GroupNorm norm_out{nullptr};
};

class Decoder : public torch::nn::Module {
 public:
  explicit Decoder(const AutoEncoderArgs& args);
  // (bs, z_channels, h, w) -> (bs, out_ch, h * f, w * f).
  at::Tensor forward(const at::Tensor& z);
  torch::nn::Conv2d conv_in{nullptr}, conv_out{nullptr};
  std::vector<Level> up;  // up[i] is resolution level i (up[0] the full size), run last to first
  std::shared_ptr<MidBlock> mid;
  torch::nn::GroupNorm norm_out{nullptr};
};

class AutoEncoder : public torch::nn::Module {
 public:
  explicit AutoEncoder(const AutoEncoderArgs& args);
  // images (bs, in_channels, H, W) in [-1, 1], H and W multiples of 2^downsampling -> the
  // transformer's latents scale * (z - shift), z the Gaussian's mean, or a sample of it drawn
  // with `generator` when one is given (TorchTitan samples while training).
  at::Tensor encode(const at::Tensor& images,
                    std::optional<at::Generator> generator = std::nullopt);
  // latents as encode returns them -> images (bs, out_ch, H, W), roughly [-1, 1].
  at::Tensor decode(const at::Tensor& latents);
  const AutoEncoderArgs& args() const { return args_; }
  std::shared_ptr<Encoder> encoder;
  std::shared_ptr<Decoder> decoder;

 private:
  AutoEncoderArgs args_;
};

// The autoencoder of a FLUX flavor: the released one (128 channels x 4 levels, 16 latent
// channels, FLUX.1's scale and shift) for every flavor but debugmodel, whose small one (32
// channels) keeps CPU runs quick; both halve the image size 3 times.
AutoEncoderArgs autoencoder_args_for_flavor(const std::string& flavor);

// The args of a diffusers AutoencoderKL config.json (block_out_channels = ch * ch_mult,
// layers_per_block, latent_channels, norm_num_groups, scaling_factor, shift_factor); ConfigError
// naming what FLUX's autoencoder cannot express (quantization convolutions, other block types,
// no mid-block attention).
AutoEncoderArgs ae_args_from_diffusers(const nlohmann::json& config);
// diffusers' AutoencoderKL tensors in our names (attention projections from linear to 1x1
// convolution shape); DataError naming an unknown or missing tensor.
TensorMap ae_from_diffusers(const TensorMap& hf, const AutoEncoderArgs& args);

}  // namespace titan::flux
