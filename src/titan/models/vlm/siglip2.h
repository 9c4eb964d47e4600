// The SigLIP2 vision encoder (transformers' Siglip2VisionModel; the image side of TorchTitan's
// vision-language model): images of any aspect ratio cut into patch_size x patch_size patches
// (flattened, up to a fixed number per batch, the rest padding), a linear patch embedding plus
// the learned square grid of position embeddings resized (bilinear, antialiased) to each image's
// patch grid, pre-LayerNorm blocks attending over each image's own patches, a final LayerNorm,
// and optionally the attention-pooling head (a learned probe attending over the patches).
//
// Built from the layers parallelisms act on (Linear, LayerNorm, Embedding): trainable as part of
// a model. Parameter names follow transformers' (embeddings.patch_embedding,
// encoder.layers.N.self_attn.q_proj, post_layernorm, head.probe, ...) with our biases'
// ".bias.weight"; siglip2_from_hf maps a transformers state dict onto them.
#pragma once

#include "titan/models/common/affine.h"
#include "titan/models/common/linear.h"
#include "titan/models/registry.h"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>
#include <torch/nn/module.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace titan::vlm {

struct Siglip2Args {
  int64_t hidden_size = 768;
  int64_t intermediate_size = 3072;
  int64_t num_hidden_layers = 12;
  int64_t num_attention_heads = 12;
  int64_t num_channels = 3;
  int64_t patch_size = 16;
  int64_t num_patches = 256;  // the position-embedding grid: sqrt(num_patches) per side
  double layer_norm_eps = 1e-6;
  bool vision_use_head = true;
  int64_t grid() const;  // sqrt(num_patches); ConfigError when not a square
};

// The args of a Siglip2VisionConfig (or a Siglip2Config's "vision_config"); ConfigError naming a
// setting this encoder does not implement (hidden_act other than gelu_pytorch_tanh).
Siglip2Args siglip2_args_from_hf(const nlohmann::json& config);

// fc1 -> GELU (tanh) -> fc2.
class Siglip2Mlp : public torch::nn::Module {
 public:
  Siglip2Mlp(const Siglip2Args& args, at::ScalarType compute_dtype);
  at::Tensor forward(const at::Tensor& x);
  std::shared_ptr<BiasedLinear> fc1, fc2;
};

class Siglip2Layer : public torch::nn::Module {
 public:
  Siglip2Layer(const Siglip2Args& args, at::ScalarType compute_dtype);
  // x (bs, len, hidden); key_mask (bs, 1, 1, len) bool, true where a patch is real.
  at::Tensor forward(const at::Tensor& x, const at::Tensor& key_mask);
  std::shared_ptr<LayerNorm> layer_norm1, layer_norm2;
  std::shared_ptr<BiasedLinear> q_proj, k_proj, v_proj, out_proj;  // self_attn.*
  std::shared_ptr<Siglip2Mlp> mlp;
  int64_t num_heads;
};

// The attention-pooling head: a learned probe attends over the patches (one multi-head attention
// with packed q/k/v input projections, as torch.nn.MultiheadAttention), then LayerNorm and the
// MLP with a residual.
class Siglip2Head : public torch::nn::Module {
 public:
  Siglip2Head(const Siglip2Args& args, at::ScalarType compute_dtype);
  // x (bs, len, hidden), key_mask as Siglip2Layer's -> (bs, hidden).
  at::Tensor forward(const at::Tensor& x, const at::Tensor& key_mask);
  std::shared_ptr<Bias> probe;                      // (1, 1, hidden), registered as "probe"
  std::shared_ptr<BiasedLinear> in_proj, out_proj;  // attention.in_proj (3 hidden), out_proj
  std::shared_ptr<LayerNorm> layernorm;
  std::shared_ptr<Siglip2Mlp> mlp;
  int64_t num_heads;
};

struct Siglip2Output {
  at::Tensor last_hidden_state;  // (bs, len, hidden)
  at::Tensor pooled;             // (bs, hidden); undefined without the head
};

class Siglip2VisionEncoder : public torch::nn::Module {
 public:
  Siglip2VisionEncoder(const Siglip2Args& args, at::ScalarType compute_dtype = at::kFloat);
  // pixel_values (bs, len, channels * patch^2) float: each image's patches row-major over its
  // grid, then padding; patch_mask (bs, len) (nonzero: a real patch); spatial_shapes (bs, 2)
  // int64 (rows, columns of patches; rows * columns <= len).
  Siglip2Output forward(const at::Tensor& pixel_values, const at::Tensor& patch_mask,
                        const at::Tensor& spatial_shapes);
  // The pieces of forward, for a model that runs them as its own units (the vision-language
  // model): the patch embedding plus positions (bs, len, hidden) after forward's shape checks,
  // and the attention mask of patch_mask, (bs, 1, 1, len) bool, for the layers.
  at::Tensor embed(const at::Tensor& pixel_values, const at::Tensor& patch_mask,
                   const at::Tensor& spatial_shapes);
  static at::Tensor key_mask(const at::Tensor& patch_mask);
  // The position embeddings resized to each image's grid, (bs, len, hidden): position i < h * w
  // of image b is grid cell i of its (h, w) resize, the padding repeats cell 0 (transformers').
  at::Tensor position_embeddings(const at::Tensor& spatial_shapes, int64_t len) const;
  const Siglip2Args& args() const { return args_; }

  std::shared_ptr<BiasedLinear> patch_embedding;      // embeddings.patch_embedding
  std::shared_ptr<Embedding> position_embedding;      // embeddings.position_embedding
  std::vector<std::shared_ptr<Siglip2Layer>> layers;  // encoder.layers.N
  std::shared_ptr<LayerNorm> post_layernorm;
  std::shared_ptr<Siglip2Head> head;  // null without vision_use_head

 private:
  Siglip2Args args_;
};

// A transformers Siglip2VisionModel state dict (names with or without "vision_model.") in our
// names: biases as "<layer>.bias.weight", the head's attention.in_proj_weight / in_proj_bias as
// head.attention.in_proj. DataError naming an unknown tensor.
TensorMap siglip2_from_hf(const TensorMap& hf);

}  // namespace titan::vlm
