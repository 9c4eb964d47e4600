// The T5 text encoder (transformers' T5EncoderModel; FLUX.1 conditions on T5 v1.1 XXL's token
// features), frozen: no training path. Module and parameter names are transformers' own
// (shared.weight, encoder.block.0.layer.0.SelfAttention.q.weight, ...), so a Hugging Face folder
// loads as it is.
//
// Each block: x += SelfAttention(RMSNorm(x)); x += FeedForward(RMSNorm(x)). Attention is
// bidirectional, unscaled (T5 folds the scale into its init) and biased by learned relative
// position buckets that block 0 holds and every block reuses.
#pragma once

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>
#include <torch/nn/module.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace titan::encoders {

struct T5Args {
  int64_t vocab_size = 32128;
  int64_t d_model = 4096;
  int64_t d_kv = 64;  // per head
  int64_t d_ff = 10240;
  int64_t num_layers = 24;
  int64_t num_heads = 64;
  int64_t relative_attention_num_buckets = 32;
  int64_t relative_attention_max_distance = 128;
  double layer_norm_epsilon = 1e-6;
  // "gated-gelu" (T5 v1.1: wi_0, wi_1, tanh GELU) or "relu" (original T5: wi).
  std::string feed_forward_proj = "gated-gelu";
  bool gated() const { return feed_forward_proj.rfind("gated-", 0) == 0; }
};

// The args of a T5 config.json; ConfigError naming a setting this encoder does not implement.
T5Args t5_args_from_hf(const nlohmann::json& config);

// T5's bidirectional relative position buckets of key - query offsets `relative` (int64):
// half the buckets for each sign, exact below num_buckets / 4, logarithmic up to max_distance.
at::Tensor t5_relative_buckets(const at::Tensor& relative, int64_t num_buckets,
                               int64_t max_distance);

// RMS norm without a mean or bias, computed in float32 and returned in the weight's dtype.
class T5LayerNorm : public torch::nn::Module {
 public:
  T5LayerNorm(int64_t dim, double eps);
  at::Tensor forward(const at::Tensor& x);
  at::Tensor weight;
  double eps;
};

class T5Attention : public torch::nn::Module {
 public:
  T5Attention(const T5Args& args, bool has_relative_bias);
  // x (bs, len, d_model), bias (1, heads, len, len) -> (bs, len, d_model).
  at::Tensor forward(const at::Tensor& x, const at::Tensor& bias);
  // The position bias (1, heads, len, len) from this layer's relative_attention_bias.
  at::Tensor position_bias(int64_t len) const;
  torch::nn::Linear q{nullptr}, k{nullptr}, v{nullptr}, o{nullptr};
  torch::nn::Embedding relative_attention_bias{nullptr};  // block 0 only
  T5Args args;
};

class T5FeedForward : public torch::nn::Module {
 public:
  explicit T5FeedForward(const T5Args& args);
  at::Tensor forward(const at::Tensor& x);
  torch::nn::Linear wi{nullptr}, wi_0{nullptr}, wi_1{nullptr}, wo{nullptr};
};

class T5Block : public torch::nn::Module {
 public:
  T5Block(const T5Args& args, bool has_relative_bias);
  at::Tensor forward(const at::Tensor& x, const at::Tensor& bias);
  std::shared_ptr<T5Attention> attention;                // layer.0.SelfAttention
  std::shared_ptr<T5LayerNorm> attention_norm, ff_norm;  // layer.0/1.layer_norm
  std::shared_ptr<T5FeedForward> ff;                     // layer.1.DenseReluDense
};

class T5Encoder : public torch::nn::Module {
 public:
  explicit T5Encoder(const T5Args& args);
  // ids (bs, len) int64 -> the last hidden state (bs, len, d_model) in the parameters' dtype.
  at::Tensor forward(const at::Tensor& ids);
  const T5Args& args() const { return args_; }
  torch::nn::Embedding shared{nullptr};
  std::vector<std::shared_ptr<T5Block>> blocks;   // encoder.block.N
  std::shared_ptr<T5LayerNorm> final_layer_norm;  // encoder.final_layer_norm

 private:
  T5Args args_;
};

}  // namespace titan::encoders
