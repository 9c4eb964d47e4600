// FLUX.1's autoencoder (see autoencoder.h).
#include "titan/models/flux/autoencoder.h"

#include "titan/common/check.h"

#include <set>
#include <string>

namespace titan::flux {
namespace {

constexpr double kEps = 1e-6;

torch::nn::Conv2d conv(int64_t in, int64_t out, int64_t kernel, int64_t stride, int64_t padding) {
  return torch::nn::Conv2d(
      torch::nn::Conv2dOptions(in, out, kernel).stride(stride).padding(padding));
}

torch::nn::GroupNorm group_norm(int64_t groups, int64_t channels) {
  return torch::nn::GroupNorm(torch::nn::GroupNormOptions(groups, channels).eps(kEps));
}

// Registers `levels` under `parent` as "<name>.<i>.block.<j>" and "<name>.<i>.<resample>.conv".
void register_levels(torch::nn::Module& parent, const std::string& name,
                     const std::vector<Level>& levels, const std::string& resample) {
  auto list = parent.register_module(name, std::make_shared<torch::nn::Module>());
  for (size_t i = 0; i < levels.size(); ++i) {
    auto level = list->register_module(std::to_string(i), std::make_shared<torch::nn::Module>());
    auto blocks = level->register_module("block", std::make_shared<torch::nn::Module>());
    for (size_t j = 0; j < levels[i].blocks.size(); ++j) {
      blocks->register_module(std::to_string(j), levels[i].blocks[j]);
    }
    if (!levels[i].resample.is_empty()) {
      auto holder = level->register_module(resample, std::make_shared<torch::nn::Module>());
      holder->register_module("conv", levels[i].resample);
    }
  }
}

}  // namespace

void AutoEncoderArgs::validate() const {
  if (in_channels <= 0 || out_ch <= 0 || ch <= 0 || num_res_blocks <= 0 || z_channels <= 0 ||
      norm_groups <= 0 || ch_mult.empty()) {
    throw ConfigError(
        "flux autoencoder: channels, ch_mult, num_res_blocks, z_channels and "
        "norm_groups must be positive and non-empty");
  }
  for (const int64_t m : ch_mult) {
    if (m <= 0 || (ch * m) % norm_groups != 0) {
      throw ConfigError(message("flux autoencoder: level width ch * ch_mult = ", ch, " * ", m,
                                " = ", ch * m, " is not a positive multiple of norm_groups ",
                                norm_groups));
    }
  }
  if (scale_factor == 0.0) throw ConfigError("flux autoencoder: scale_factor must not be 0");
}

ResnetBlock::ResnetBlock(int64_t in_channels, int64_t out_channels, int64_t groups) {
  norm1 = register_module("norm1", group_norm(groups, in_channels));
  conv1 = register_module("conv1", conv(in_channels, out_channels, 3, 1, 1));
  norm2 = register_module("norm2", group_norm(groups, out_channels));
  conv2 = register_module("conv2", conv(out_channels, out_channels, 3, 1, 1));
  if (in_channels != out_channels) {
    nin_shortcut = register_module("nin_shortcut", conv(in_channels, out_channels, 1, 1, 0));
  }
}

at::Tensor ResnetBlock::forward(const at::Tensor& x) {
  at::Tensor h = conv1->forward(at::silu(norm1->forward(x)));
  h = conv2->forward(at::silu(norm2->forward(h)));
  return (nin_shortcut.is_empty() ? x : nin_shortcut->forward(x)) + h;
}

AttnBlock::AttnBlock(int64_t channels, int64_t groups) {
  norm = register_module("norm", group_norm(groups, channels));
  q = register_module("q", conv(channels, channels, 1, 1, 0));
  k = register_module("k", conv(channels, channels, 1, 1, 0));
  v = register_module("v", conv(channels, channels, 1, 1, 0));
  proj_out = register_module("proj_out", conv(channels, channels, 1, 1, 0));
}

at::Tensor AttnBlock::forward(const at::Tensor& x) {
  const at::Tensor h = norm->forward(x);
  const int64_t bs = x.size(0), c = x.size(1), height = x.size(2), width = x.size(3);
  // (bs, c, h, w) -> (bs, 1, h * w, c): one head over the pixels
  const auto tokens = [&](const at::Tensor& t) {
    return t.flatten(2).transpose(1, 2).unsqueeze(1);
  };
  const at::Tensor out = at::scaled_dot_product_attention(
      tokens(q->forward(h)), tokens(k->forward(h)), tokens(v->forward(h)));
  // (bs, 1, h * w, c) -> (bs, c, h, w)
  const at::Tensor image = out.squeeze(1).transpose(1, 2).reshape({bs, c, height, width});
  return x + proj_out->forward(image);
}

MidBlock::MidBlock(int64_t channels, int64_t groups) {
  block_1 = register_module("block_1", std::make_shared<ResnetBlock>(channels, channels, groups));
  attn_1 = register_module("attn_1", std::make_shared<AttnBlock>(channels, groups));
  block_2 = register_module("block_2", std::make_shared<ResnetBlock>(channels, channels, groups));
}

at::Tensor MidBlock::forward(const at::Tensor& x) {
  return block_2->forward(attn_1->forward(block_1->forward(x)));
}

Encoder::Encoder(const AutoEncoderArgs& a) {
  const int64_t g = a.norm_groups;
  conv_in = register_module("conv_in", conv(a.in_channels, a.ch, 3, 1, 1));
  int64_t width = a.ch;
  for (size_t i = 0; i < a.ch_mult.size(); ++i) {
    Level level;
    const int64_t out = a.ch * a.ch_mult[i];
    for (int64_t j = 0; j < a.num_res_blocks; ++j) {
      level.blocks.push_back(std::make_shared<ResnetBlock>(width, out, g));
      width = out;
    }
    if (i + 1 < a.ch_mult.size()) level.resample = conv(width, width, 3, 2, 0);
    down.push_back(std::move(level));
  }
  register_levels(*this, "down", down, "downsample");
  mid = register_module("mid", std::make_shared<MidBlock>(width, g));
  norm_out = register_module("norm_out", group_norm(g, width));
  conv_out = register_module("conv_out", conv(width, 2 * a.z_channels, 3, 1, 1));
}

at::Tensor Encoder::forward(const at::Tensor& x) {
  at::Tensor h = conv_in->forward(x);
  for (Level& level : down) {
    for (auto& block : level.blocks) h = block->forward(h);
    // Stride 2 after padding one zero row and column at the bottom and right.
    if (!level.resample.is_empty()) {
      h = level.resample->forward(at::constant_pad_nd(h, {0, 1, 0, 1}, 0.0));
    }
  }
  h = mid->forward(h);
  return conv_out->forward(at::silu(norm_out->forward(h)));
}

Decoder::Decoder(const AutoEncoderArgs& a) {
  const int64_t g = a.norm_groups;
  int64_t width = a.ch * a.ch_mult.back();
  conv_in = register_module("conv_in", conv(a.z_channels, width, 3, 1, 1));
  mid = register_module("mid", std::make_shared<MidBlock>(width, g));
  up.resize(a.ch_mult.size());
  for (size_t r = a.ch_mult.size(); r-- > 0;) {
    Level& level = up[r];
    const int64_t out = a.ch * a.ch_mult[r];
    for (int64_t j = 0; j <= a.num_res_blocks; ++j) {
      level.blocks.push_back(std::make_shared<ResnetBlock>(width, out, g));
      width = out;
    }
    if (r != 0) level.resample = conv(width, width, 3, 1, 1);
  }
  register_levels(*this, "up", up, "upsample");
  norm_out = register_module("norm_out", group_norm(g, width));
  conv_out = register_module("conv_out", conv(width, a.out_ch, 3, 1, 1));
}

at::Tensor Decoder::forward(const at::Tensor& z) {
  at::Tensor h = mid->forward(conv_in->forward(z));
  for (size_t r = up.size(); r-- > 0;) {
    for (auto& block : up[r].blocks) h = block->forward(h);
    if (!up[r].resample.is_empty()) {
      h = up[r].resample->forward(at::upsample_nearest2d(h, {h.size(2) * 2, h.size(3) * 2}));
    }
  }
  return conv_out->forward(at::silu(norm_out->forward(h)));
}

AutoEncoder::AutoEncoder(const AutoEncoderArgs& args) : args_(args) {
  args_.validate();
  encoder = register_module("encoder", std::make_shared<Encoder>(args_));
  decoder = register_module("decoder", std::make_shared<Decoder>(args_));
}

at::Tensor AutoEncoder::encode(const at::Tensor& images, std::optional<at::Generator> generator) {
  const int64_t f = int64_t{1} << args_.downsampling();
  TITAN_CHECK(images.dim() == 4 && images.size(1) == args_.in_channels && images.size(2) % f == 0 &&
                  images.size(3) % f == 0,
              "flux autoencoder: images must be (bs, ", args_.in_channels,
              ", H, W) with H and W multiples of ", f, ", got ", images.sizes());
  const std::vector<at::Tensor> moments = encoder->forward(images).chunk(2, 1);
  at::Tensor z = moments[0];
  if (generator.has_value()) {
    const at::Tensor noise = at::empty_like(z).normal_(0.0, 1.0, *generator);
    z = z + at::exp(0.5 * moments[1]) * noise;
  }
  return args_.scale_factor * (z - args_.shift_factor);
}

at::Tensor AutoEncoder::decode(const at::Tensor& latents) {
  TITAN_CHECK(latents.dim() == 4 && latents.size(1) == args_.z_channels,
              "flux autoencoder: latents must be (bs, ", args_.z_channels, ", h, w), got ",
              latents.sizes());
  return decoder->forward(latents / args_.scale_factor + args_.shift_factor);
}

AutoEncoderArgs autoencoder_args_for_flavor(const std::string& flavor) {
  AutoEncoderArgs a;
  if (flavor == "debugmodel") {
    a.ch = 32;
    a.ch_mult = {1, 1, 2, 2};
    a.num_res_blocks = 1;
  }
  return a;
}

AutoEncoderArgs ae_args_from_diffusers(const nlohmann::json& config) {
  const auto need = [&](const char* key) -> const nlohmann::json& {
    if (!config.contains(key)) {
      throw ConfigError(message("flux autoencoder: diffusers config.json lacks '", key, "'"));
    }
    return config.at(key);
  };
  for (const char* key : {"use_quant_conv", "use_post_quant_conv"}) {
    if (config.value(key, true)) {
      throw ConfigError(message("flux autoencoder: ", key,
                                " = true (a Stable Diffusion VAE's "
                                "quantization convolution); FLUX.1's autoencoder has none"));
    }
  }
  if (!config.value("mid_block_add_attention", true)) {
    throw ConfigError(
        "flux autoencoder: mid_block_add_attention = false; FLUX.1's autoencoder "
        "attends in its middle block");
  }
  for (const auto& [key, want] : {std::pair{"down_block_types", "DownEncoderBlock2D"},
                                  std::pair{"up_block_types", "UpDecoderBlock2D"}}) {
    for (const auto& type : need(key)) {
      if (type != want) {
        throw ConfigError(message("flux autoencoder: ", key, " holds ", type.dump(), "; only ",
                                  want, " is FLUX.1's"));
      }
    }
  }
  if (config.value("act_fn", std::string("silu")) != "silu") {
    throw ConfigError("flux autoencoder: act_fn must be silu");
  }
  AutoEncoderArgs a;
  const auto widths = need("block_out_channels").get<std::vector<int64_t>>();
  if (widths.empty()) throw ConfigError("flux autoencoder: block_out_channels is empty");
  a.ch = widths[0];
  a.ch_mult.clear();
  for (const int64_t w : widths) {
    if (w % a.ch != 0) {
      throw ConfigError(message("flux autoencoder: block_out_channels ",
                                need("block_out_channels").dump(),
                                " are not multiples of the first"));
    }
    a.ch_mult.push_back(w / a.ch);
  }
  a.in_channels = need("in_channels").get<int64_t>();
  a.out_ch = need("out_channels").get<int64_t>();
  a.num_res_blocks = need("layers_per_block").get<int64_t>();
  a.z_channels = need("latent_channels").get<int64_t>();
  a.norm_groups = need("norm_num_groups").get<int64_t>();
  a.scale_factor = need("scaling_factor").get<double>();
  a.shift_factor = config.contains("shift_factor") && !config.at("shift_factor").is_null()
                       ? config.at("shift_factor").get<double>()
                       : 0.0;
  a.validate();
  return a;
}

TensorMap ae_from_diffusers(const TensorMap& hf, const AutoEncoderArgs& a) {
  TensorMap ours;
  std::set<std::string> used;
  // weight and bias of hf `from` as ours `to`; `to_conv`: a linear weight (c, c) as a 1x1
  // convolution's (c, c, 1, 1).
  const auto move = [&](const std::string& from, const std::string& to, bool to_conv = false) {
    for (const char* part : {".weight", ".bias"}) {
      const auto it = hf.find(from + part);
      if (it == hf.end()) {
        throw DataError(message("flux autoencoder: the diffusers tensors lack '", from, part, "'"));
      }
      used.insert(from + part);
      at::Tensor t = it->second;
      if (to_conv && std::string(part) == ".weight") t = t.view({t.size(0), t.size(1), 1, 1});
      ours[to + part] = t;
    }
  };
  const auto resnet = [&](const std::string& from, const std::string& to, bool shortcut) {
    for (const char* n : {"norm1", "conv1", "norm2", "conv2"}) move(from + n, to + n);
    if (shortcut) move(from + "conv_shortcut", to + "nin_shortcut");
  };
  const auto mid = [&](const std::string& from, const std::string& to) {
    resnet(from + "resnets.0.", to + "block_1.", false);
    resnet(from + "resnets.1.", to + "block_2.", false);
    const std::string attn = from + "attentions.0.";
    move(attn + "group_norm", to + "attn_1.norm");
    move(attn + "to_q", to + "attn_1.q", true);
    move(attn + "to_k", to + "attn_1.k", true);
    move(attn + "to_v", to + "attn_1.v", true);
    move(attn + "to_out.0", to + "attn_1.proj_out", true);
  };
  const auto levels = static_cast<int64_t>(a.ch_mult.size());
  move("encoder.conv_in", "encoder.conv_in");
  int64_t width = a.ch;
  for (int64_t i = 0; i < levels; ++i) {
    const std::string from = "encoder.down_blocks." + std::to_string(i) + ".";
    const std::string to = "encoder.down." + std::to_string(i) + ".";
    for (int64_t j = 0; j < a.num_res_blocks; ++j) {
      const int64_t out = a.ch * a.ch_mult[i];
      resnet(from + "resnets." + std::to_string(j) + ".", to + "block." + std::to_string(j) + ".",
             width != out);
      width = out;
    }
    if (i + 1 < levels) move(from + "downsamplers.0.conv", to + "downsample.conv");
  }
  mid("encoder.mid_block.", "encoder.mid.");
  move("encoder.conv_norm_out", "encoder.norm_out");
  move("encoder.conv_out", "encoder.conv_out");

  move("decoder.conv_in", "decoder.conv_in");
  mid("decoder.mid_block.", "decoder.mid.");
  for (int64_t k = 0; k < levels; ++k) {  // diffusers' up_blocks run from the lowest resolution
    const int64_t r = levels - 1 - k;
    const std::string from = "decoder.up_blocks." + std::to_string(k) + ".";
    const std::string to = "decoder.up." + std::to_string(r) + ".";
    for (int64_t j = 0; j <= a.num_res_blocks; ++j) {
      const int64_t out = a.ch * a.ch_mult[r];
      resnet(from + "resnets." + std::to_string(j) + ".", to + "block." + std::to_string(j) + ".",
             width != out);
      width = out;
    }
    if (r != 0) move(from + "upsamplers.0.conv", to + "upsample.conv");
  }
  move("decoder.conv_norm_out", "decoder.norm_out");
  move("decoder.conv_out", "decoder.conv_out");
  for (const auto& [name, tensor] : hf) {
    if (used.count(name) == 0) {
      throw DataError(message("flux autoencoder: unknown diffusers tensor '", name,
                              "' (not part of this FLUX.1 autoencoder configuration)"));
    }
  }
  return ours;
}

}  // namespace titan::flux
