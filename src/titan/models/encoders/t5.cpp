// The T5 text encoder (see t5.h).
#include "titan/models/encoders/t5.h"

#include "titan/common/check.h"

#include <cmath>

namespace titan::encoders {
namespace {

torch::nn::Linear bare_linear(int64_t in, int64_t out) {
  return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(false));
}

int64_t int_key(const nlohmann::json& config, const char* key, int64_t fallback) {
  return config.contains(key) && !config.at(key).is_null() ? config.at(key).get<int64_t>()
                                                           : fallback;
}

}  // namespace

T5Args t5_args_from_hf(const nlohmann::json& config) {
  T5Args a;
  a.vocab_size = int_key(config, "vocab_size", a.vocab_size);
  a.d_model = int_key(config, "d_model", a.d_model);
  a.d_kv = int_key(config, "d_kv", a.d_kv);
  a.d_ff = int_key(config, "d_ff", a.d_ff);
  a.num_layers = int_key(config, "num_layers", a.num_layers);
  a.num_heads = int_key(config, "num_heads", a.num_heads);
  a.relative_attention_num_buckets =
      int_key(config, "relative_attention_num_buckets", a.relative_attention_num_buckets);
  a.relative_attention_max_distance =
      int_key(config, "relative_attention_max_distance", a.relative_attention_max_distance);
  a.layer_norm_epsilon = config.value("layer_norm_epsilon", a.layer_norm_epsilon);
  a.feed_forward_proj = config.value("feed_forward_proj", std::string("relu"));
  if (a.feed_forward_proj != "gated-gelu" && a.feed_forward_proj != "relu") {
    throw ConfigError(message("t5: feed_forward_proj '", a.feed_forward_proj,
                              "' is not implemented (gated-gelu, relu)"));
  }
  if (a.d_model <= 0 || a.d_kv <= 0 || a.num_heads <= 0 || a.num_layers <= 0 ||
      a.relative_attention_num_buckets < 4) {
    throw ConfigError(
        "t5: d_model, d_kv, num_heads and num_layers must be positive and "
        "relative_attention_num_buckets at least 4");
  }
  return a;
}

at::Tensor t5_relative_buckets(const at::Tensor& relative, int64_t num_buckets,
                               int64_t max_distance) {
  const int64_t half = num_buckets / 2;  // one half per direction
  const at::Tensor base = (relative > 0).to(at::kLong) * half;
  const at::Tensor n = relative.abs();
  const int64_t max_exact = half / 2;
  // Offsets from max_exact to max_distance share the other buckets logarithmically.
  const at::Tensor large =
      max_exact + (at::log(n.to(at::kFloat) / static_cast<double>(max_exact)) /
                   std::log(static_cast<double>(max_distance) / static_cast<double>(max_exact)) *
                   static_cast<double>(half - max_exact))
                      .to(at::kLong);
  return base + at::where(n < max_exact, n, at::clamp_max(large, half - 1));
}

T5LayerNorm::T5LayerNorm(int64_t dim, double eps) : eps(eps) {
  weight = register_parameter("weight", at::ones({dim}));
}

at::Tensor T5LayerNorm::forward(const at::Tensor& x) {
  const at::Tensor wide = x.to(at::kFloat);
  const at::Tensor normed = wide * at::rsqrt(wide.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return weight * normed.to(weight.scalar_type());
}

T5Attention::T5Attention(const T5Args& args, bool has_relative_bias) : args(args) {
  const int64_t inner = args.num_heads * args.d_kv;
  q = register_module("q", bare_linear(args.d_model, inner));
  k = register_module("k", bare_linear(args.d_model, inner));
  v = register_module("v", bare_linear(args.d_model, inner));
  o = register_module("o", bare_linear(inner, args.d_model));
  if (has_relative_bias) {
    relative_attention_bias =
        register_module("relative_attention_bias",
                        torch::nn::Embedding(args.relative_attention_num_buckets, args.num_heads));
  }
}

at::Tensor T5Attention::position_bias(int64_t len) const {
  const at::Tensor pos =
      at::arange(len, relative_attention_bias->weight.options().dtype(at::kLong));
  // (q, k): key position minus query position
  const at::Tensor relative = pos.unsqueeze(0) - pos.unsqueeze(1);
  const at::Tensor buckets = t5_relative_buckets(relative, args.relative_attention_num_buckets,
                                                 args.relative_attention_max_distance);
  // (q, k, heads) -> (1, heads, q, k)
  return at::embedding(relative_attention_bias->weight, buckets).permute({2, 0, 1}).unsqueeze(0);
}

at::Tensor T5Attention::forward(const at::Tensor& x, const at::Tensor& bias) {
  const int64_t bs = x.size(0), len = x.size(1);
  const auto heads = [&](const at::Tensor& t) {  // (bs, len, h * d) -> (bs, h, len, d)
    return t.view({bs, len, args.num_heads, args.d_kv}).transpose(1, 2);
  };
  const at::Tensor qh = heads(q->forward(x)), kh = heads(k->forward(x)), vh = heads(v->forward(x));
  // Unscaled scores plus the position bias; softmax in float32.
  const at::Tensor scores = at::matmul(qh, kh.transpose(-1, -2)) + bias.to(qh.scalar_type());
  const at::Tensor weights = at::softmax(scores.to(at::kFloat), -1).to(scores.scalar_type());
  const at::Tensor out = at::matmul(weights, vh).transpose(1, 2).reshape({bs, len, -1});
  return o->forward(out);
}

T5FeedForward::T5FeedForward(const T5Args& args) {
  if (args.gated()) {
    wi_0 = register_module("wi_0", bare_linear(args.d_model, args.d_ff));
    wi_1 = register_module("wi_1", bare_linear(args.d_model, args.d_ff));
  } else {
    wi = register_module("wi", bare_linear(args.d_model, args.d_ff));
  }
  wo = register_module("wo", bare_linear(args.d_ff, args.d_model));
}

at::Tensor T5FeedForward::forward(const at::Tensor& x) {
  if (wi.is_empty()) {
    return wo->forward(at::gelu(wi_0->forward(x), "tanh") * wi_1->forward(x));
  }
  return wo->forward(at::relu(wi->forward(x)));
}

T5Block::T5Block(const T5Args& args, bool has_relative_bias) {
  auto layers = register_module("layer", std::make_shared<torch::nn::Module>());
  auto self_attention = layers->register_module("0", std::make_shared<torch::nn::Module>());
  attention = self_attention->register_module(
      "SelfAttention", std::make_shared<T5Attention>(args, has_relative_bias));
  attention_norm = self_attention->register_module(
      "layer_norm", std::make_shared<T5LayerNorm>(args.d_model, args.layer_norm_epsilon));
  auto feed_forward = layers->register_module("1", std::make_shared<torch::nn::Module>());
  ff = feed_forward->register_module("DenseReluDense", std::make_shared<T5FeedForward>(args));
  ff_norm = feed_forward->register_module(
      "layer_norm", std::make_shared<T5LayerNorm>(args.d_model, args.layer_norm_epsilon));
}

at::Tensor T5Block::forward(const at::Tensor& x, const at::Tensor& bias) {
  const at::Tensor h = x + attention->forward(attention_norm->forward(x), bias);
  return h + ff->forward(ff_norm->forward(h));
}

T5Encoder::T5Encoder(const T5Args& args) : args_(args) {
  shared = register_module("shared", torch::nn::Embedding(args.vocab_size, args.d_model));
  auto encoder = register_module("encoder", std::make_shared<torch::nn::Module>());
  auto block_list = encoder->register_module("block", std::make_shared<torch::nn::Module>());
  for (int64_t i = 0; i < args.num_layers; ++i) {
    blocks.push_back(
        block_list->register_module(std::to_string(i), std::make_shared<T5Block>(args, i == 0)));
  }
  final_layer_norm = encoder->register_module(
      "final_layer_norm", std::make_shared<T5LayerNorm>(args.d_model, args.layer_norm_epsilon));
}

at::Tensor T5Encoder::forward(const at::Tensor& ids) {
  TITAN_CHECK(ids.dim() == 2 && ids.scalar_type() == at::kLong, "t5: ids must be (bs, len) int64",
              ", got ", ids.sizes(), " ", ids.scalar_type());
  TITAN_CHECK(ids.numel() == 0 ||
                  (ids.min().item<int64_t>() >= 0 && ids.max().item<int64_t>() < args_.vocab_size),
              "t5: token ids must lie in [0, ", args_.vocab_size, ")");
  at::Tensor x = shared->forward(ids);
  const at::Tensor bias = blocks.front()->attention->position_bias(ids.size(1));
  for (const auto& block : blocks) x = block->forward(x, bias);
  return final_layer_norm->forward(x);
}

}  // namespace titan::encoders
