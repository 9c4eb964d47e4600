// The pieces of FLUX.1's transformer (MMDiT): biased linear layers, the timestep and text
// embedders, adaptive-LayerNorm modulation, the double-stream block (text and image each with
// their own weights, attending jointly), the single-stream block (one joint sequence, attention
// and MLP in parallel) and the final layer; the 3-axis rotary embedding and the sinusoidal
// timestep embedding.
//
// Module names follow TorchTitan's flux model (img_attn.qkv, img_mlp.0, modulation.lin,
// final_layer.adaLN_modulation.1, ...); biased layers are common/affine.h's BiasedLinear.
#pragma once

#include "titan/models/common/affine.h"
#include "titan/models/common/linear.h"
#include "titan/models/common/norms.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace titan::flux {

// in_layer -> SiLU -> out_layer (the timestep, guidance and pooled-text embedders).
class MLPEmbedder : public torch::nn::Module {
 public:
  MLPEmbedder(int64_t in_dim, int64_t hidden, at::ScalarType compute_dtype);
  at::Tensor forward(const at::Tensor& x);
  std::shared_ptr<BiasedLinear> in_layer, out_layer;
};

// RMSNorm (eps 1e-6, learned scale) over each head of q and of k, returned in v's dtype.
class QKNorm : public torch::nn::Module {
 public:
  explicit QKNorm(int64_t head_dim);
  std::shared_ptr<RMSNorm> query_norm, key_norm;
};

// One stream's attention weights in a double block: qkv, the q/k norms, the output projection.
class StreamAttention : public torch::nn::Module {
 public:
  StreamAttention(int64_t hidden, int64_t head_dim, at::ScalarType compute_dtype);
  std::shared_ptr<BiasedLinear> qkv;
  std::shared_ptr<QKNorm> norm;
  std::shared_ptr<BiasedLinear> proj;
};

// linear "0" -> GELU (tanh) -> linear "2" (TorchTitan's nn.Sequential numbering).
class StreamMlp : public torch::nn::Module {
 public:
  StreamMlp(int64_t hidden, int64_t mlp_hidden, at::ScalarType compute_dtype);
  at::Tensor forward(const at::Tensor& x);
  std::shared_ptr<BiasedLinear> fc1, fc2;  // registered as "0" and "2"
};

// shift, scale and gate of one adaptive LayerNorm (each (bs, 1, hidden)).
struct ModulationOut {
  at::Tensor shift, scale, gate;
};

// lin(SiLU(vec)) cut into 3 (single) or 6 (double) pieces of `hidden`.
class Modulation : public torch::nn::Module {
 public:
  Modulation(int64_t hidden, bool is_double, at::ScalarType compute_dtype);
  // vec (bs, hidden) -> the first and (double) the second set.
  std::vector<ModulationOut> forward(const at::Tensor& vec);
  std::shared_ptr<BiasedLinear> lin;
  bool is_double;
};

// The rotary embedding of positions `ids` (bs or 1, len, n_axes), each axis i rotating
// axes_dim[i] dims with frequencies theta^(-2j / axes_dim[i]): cos and sin of the angles, each
// (bs or 1, 1, len, head_dim / 2) float32 (computed in float64 as diffusers does).
struct FluxRope {
  at::Tensor cos, sin;
};
FluxRope flux_rope(const at::Tensor& ids, const std::vector<int64_t>& axes_dim, double theta);
// x (bs, heads, len, head_dim) with consecutive pairs (2j, 2j + 1) rotated by angle j, computed
// in float32 and returned in x's dtype.
at::Tensor apply_flux_rope(const at::Tensor& x, const FluxRope& rope);

// The sinusoidal embedding (bs, dim) float32 of timesteps t (bs) in [0, 1]: [cos, sin] of
// 1000 t times frequencies 10000^(-j / (dim / 2)).
at::Tensor timestep_embedding(const at::Tensor& t, int64_t dim);

// LayerNorm without a learned affine (eps 1e-6) in float32, returned in x's dtype.
at::Tensor plain_layer_norm(const at::Tensor& x);

// (1 + scale) * norm(x) + shift.
at::Tensor modulate(const at::Tensor& normed, const ModulationOut& mod);

// Text and image streams with their own weights attending jointly over [text, image].
class DoubleStreamBlock : public torch::nn::Module {
 public:
  DoubleStreamBlock(int64_t hidden, int64_t num_heads, int64_t mlp_hidden,
                    at::ScalarType compute_dtype);
  // x = [txt, img] (bs, txt_len + img_len, hidden) -> the same layout after the block; vec
  // (bs, hidden), rope over the joint positions.
  at::Tensor forward(const at::Tensor& x, int64_t txt_len, const at::Tensor& vec,
                     const FluxRope& rope);
  std::shared_ptr<Modulation> img_mod, txt_mod;
  std::shared_ptr<StreamAttention> img_attn, txt_attn;
  std::shared_ptr<StreamMlp> img_mlp, txt_mlp;
  int64_t num_heads, head_dim;
};

// One joint sequence: linear1 gives q, k, v and the MLP's input at once; linear2 maps
// [attention, GELU(mlp)] back to hidden.
class SingleStreamBlock : public torch::nn::Module {
 public:
  SingleStreamBlock(int64_t hidden, int64_t num_heads, int64_t mlp_hidden,
                    at::ScalarType compute_dtype);
  // x (bs, len, hidden) -> (bs, len, hidden).
  at::Tensor forward(const at::Tensor& x, const at::Tensor& vec, const FluxRope& rope);
  std::shared_ptr<BiasedLinear> linear1, linear2;
  std::shared_ptr<QKNorm> norm;
  std::shared_ptr<Modulation> modulation;
  int64_t num_heads;
  int64_t hidden, mlp_hidden;
};

// Adaptive LayerNorm (shift, scale from SiLU(vec)) and the projection to the output channels.
class LastLayer : public torch::nn::Module {
 public:
  LastLayer(int64_t hidden, int64_t out_channels, at::ScalarType compute_dtype);
  // img (bs, img_len, hidden) -> (bs, img_len, out_channels).
  at::Tensor forward(const at::Tensor& img, const at::Tensor& vec);
  std::shared_ptr<BiasedLinear> linear;
  std::shared_ptr<BiasedLinear> adaln;  // registered as adaLN_modulation.1
};

// Non-causal attention over the joint sequence: q, k, v (bs, heads, len, head_dim), q and k
// rotated -> (bs, len, heads * head_dim).
at::Tensor joint_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v);

}  // namespace titan::flux
