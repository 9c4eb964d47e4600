// The CLIP text encoder (transformers' CLIPTextModel; FLUX.1 conditions on CLIP ViT-L/14's
// pooled output), frozen: no training path. Module and parameter names are transformers' own
// without the "text_model." prefix that older saves carry (embeddings.token_embedding.weight,
// encoder.layers.0.self_attn.q_proj.weight, ...; clip_text_tensors_from_hf strips it).
//
// Token plus learned position embeddings, pre-LayerNorm blocks with causal attention, a final
// LayerNorm; the pooled output is the final hidden state at the end-of-text token.
#pragma once

#include "titan/models/registry.h"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>
#include <torch/nn/module.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace titan::encoders {

struct ClipTextArgs {
  int64_t vocab_size = 49408;
  int64_t hidden_size = 768;
  int64_t intermediate_size = 3072;
  int64_t num_hidden_layers = 12;
  int64_t num_attention_heads = 12;
  int64_t max_position_embeddings = 77;
  double layer_norm_eps = 1e-5;
  std::string hidden_act = "quick_gelu";  // x * sigmoid(1.702 x); or "gelu"
  // The end-of-text token whose hidden state is pooled. 2 is transformers' legacy value, for
  // which the pooled position is that of the largest token id (the end-of-text token is the
  // vocabulary's last), as the original CLIP did.
  int64_t eos_token_id = 2;
};

// The args of a CLIPTextModel config.json (or a CLIPModel's "text_config"); ConfigError naming
// a setting this encoder does not implement.
ClipTextArgs clip_text_args_from_hf(const nlohmann::json& config);

class ClipEncoderLayer : public torch::nn::Module {
 public:
  explicit ClipEncoderLayer(const ClipTextArgs& args);
  // x (bs, len, hidden) -> (bs, len, hidden), causal.
  at::Tensor forward(const at::Tensor& x);
  torch::nn::LayerNorm layer_norm1{nullptr}, layer_norm2{nullptr};
  torch::nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, out_proj{nullptr};
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  ClipTextArgs args;
};

// What the text encoder returns: every token's final hidden state and the pooled vector.
struct ClipTextOutput {
  at::Tensor last_hidden_state;  // (bs, len, hidden)
  at::Tensor pooled;             // (bs, hidden)
};

class ClipTextEncoder : public torch::nn::Module {
 public:
  explicit ClipTextEncoder(const ClipTextArgs& args);
  // ids (bs, len <= max_position_embeddings) int64.
  ClipTextOutput forward(const at::Tensor& ids);
  const ClipTextArgs& args() const { return args_; }
  torch::nn::Embedding token_embedding{nullptr}, position_embedding{nullptr};
  std::vector<std::shared_ptr<ClipEncoderLayer>> layers;
  torch::nn::LayerNorm final_layer_norm{nullptr};

 private:
  ClipTextArgs args_;
};

// A CLIPTextModel's tensors as ClipTextEncoder names them: "text_model." stripped (saves before
// transformers 5 carry it), the position-id buffer of older saves dropped.
TensorMap clip_text_tensors_from_hf(const TensorMap& hf);

}  // namespace titan::encoders
