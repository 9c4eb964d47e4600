// The CLIP text encoder (see clip.h).
#include "titan/models/encoders/clip.h"

#include "titan/common/check.h"

namespace titan::encoders {
namespace {

torch::nn::LayerNorm layer_norm(int64_t dim, double eps) {
  return torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim}).eps(eps));
}

}  // namespace

ClipTextArgs clip_text_args_from_hf(const nlohmann::json& full) {
  const nlohmann::json& config = full.contains("text_config") ? full.at("text_config") : full;
  ClipTextArgs a;
  a.vocab_size = config.value("vocab_size", a.vocab_size);
  a.hidden_size = config.value("hidden_size", a.hidden_size);
  a.intermediate_size = config.value("intermediate_size", a.intermediate_size);
  a.num_hidden_layers = config.value("num_hidden_layers", a.num_hidden_layers);
  a.num_attention_heads = config.value("num_attention_heads", a.num_attention_heads);
  a.max_position_embeddings = config.value("max_position_embeddings", a.max_position_embeddings);
  a.layer_norm_eps = config.value("layer_norm_eps", a.layer_norm_eps);
  a.hidden_act = config.value("hidden_act", a.hidden_act);
  a.eos_token_id = config.value("eos_token_id", a.eos_token_id);
  if (a.hidden_act != "quick_gelu" && a.hidden_act != "gelu") {
    throw ConfigError(
        message("clip: hidden_act '", a.hidden_act, "' is not implemented (quick_gelu, gelu)"));
  }
  if (a.hidden_size <= 0 || a.num_attention_heads <= 0 ||
      a.hidden_size % a.num_attention_heads != 0) {
    throw ConfigError(message("clip: hidden_size ", a.hidden_size,
                              " must be a positive multiple of num_attention_heads ",
                              a.num_attention_heads));
  }
  return a;
}

ClipEncoderLayer::ClipEncoderLayer(const ClipTextArgs& args) : args(args) {
  const int64_t h = args.hidden_size;
  layer_norm1 = register_module("layer_norm1", layer_norm(h, args.layer_norm_eps));
  auto attn = register_module("self_attn", std::make_shared<torch::nn::Module>());
  q_proj = attn->register_module("q_proj", torch::nn::Linear(h, h));
  k_proj = attn->register_module("k_proj", torch::nn::Linear(h, h));
  v_proj = attn->register_module("v_proj", torch::nn::Linear(h, h));
  out_proj = attn->register_module("out_proj", torch::nn::Linear(h, h));
  layer_norm2 = register_module("layer_norm2", layer_norm(h, args.layer_norm_eps));
  auto mlp = register_module("mlp", std::make_shared<torch::nn::Module>());
  fc1 = mlp->register_module("fc1", torch::nn::Linear(h, args.intermediate_size));
  fc2 = mlp->register_module("fc2", torch::nn::Linear(args.intermediate_size, h));
}

at::Tensor ClipEncoderLayer::forward(const at::Tensor& x) {
  const int64_t bs = x.size(0), len = x.size(1), heads = args.num_attention_heads;
  const at::Tensor n = layer_norm1->forward(x);
  const auto split = [&](const at::Tensor& t) {  // (bs, len, hidden) -> (bs, heads, len, d)
    return t.view({bs, len, heads, -1}).transpose(1, 2);
  };
  const at::Tensor attended =
      at::scaled_dot_product_attention(split(q_proj->forward(n)), split(k_proj->forward(n)),
                                       split(v_proj->forward(n)), /*attn_mask=*/{},
                                       /*dropout_p=*/0.0, /*is_causal=*/true);
  const at::Tensor h = x + out_proj->forward(attended.transpose(1, 2).reshape({bs, len, -1}));
  at::Tensor mid = fc1->forward(layer_norm2->forward(h));
  mid = args.hidden_act == "quick_gelu" ? mid * at::sigmoid(1.702 * mid) : at::gelu(mid);
  return h + fc2->forward(mid);
}

ClipTextEncoder::ClipTextEncoder(const ClipTextArgs& args) : args_(args) {
  auto embeddings = register_module("embeddings", std::make_shared<torch::nn::Module>());
  token_embedding = embeddings->register_module(
      "token_embedding", torch::nn::Embedding(args.vocab_size, args.hidden_size));
  position_embedding = embeddings->register_module(
      "position_embedding", torch::nn::Embedding(args.max_position_embeddings, args.hidden_size));
  auto encoder = register_module("encoder", std::make_shared<torch::nn::Module>());
  auto list = encoder->register_module("layers", std::make_shared<torch::nn::Module>());
  for (int64_t i = 0; i < args.num_hidden_layers; ++i) {
    layers.push_back(
        list->register_module(std::to_string(i), std::make_shared<ClipEncoderLayer>(args)));
  }
  final_layer_norm =
      register_module("final_layer_norm", layer_norm(args.hidden_size, args.layer_norm_eps));
}

ClipTextOutput ClipTextEncoder::forward(const at::Tensor& ids) {
  TITAN_CHECK(ids.dim() == 2 && ids.scalar_type() == at::kLong &&
                  ids.size(1) <= args_.max_position_embeddings && ids.size(1) > 0,
              "clip: ids must be (bs, 1 .. ", args_.max_position_embeddings, ") int64, got ",
              ids.sizes(), " ", ids.scalar_type());
  TITAN_CHECK(ids.min().item<int64_t>() >= 0 && ids.max().item<int64_t>() < args_.vocab_size,
              "clip: token ids must lie in [0, ", args_.vocab_size, ")");
  const int64_t len = ids.size(1);
  const at::Tensor positions = at::arange(len, ids.options());
  at::Tensor x = token_embedding->forward(ids) + position_embedding->forward(positions);
  for (const auto& layer : layers) x = layer->forward(x);
  x = final_layer_norm->forward(x);
  // The end-of-text position: the largest id (legacy configs), else the first eos token.
  const at::Tensor eos = args_.eos_token_id == 2
                             ? ids.argmax(-1)
                             : (ids == args_.eos_token_id).to(at::kInt).argmax(-1);
  const at::Tensor at_eos = eos.view({-1, 1, 1}).expand({ids.size(0), 1, x.size(2)});
  const at::Tensor pooled = x.gather(1, at_eos).squeeze(1);
  return {x, pooled};
}

TensorMap clip_text_tensors_from_hf(const TensorMap& hf) {
  const std::string prefix = "text_model.";
  TensorMap out;
  for (const auto& [name, tensor] : hf) {
    std::string key =
        name.compare(0, prefix.size(), prefix) == 0 ? name.substr(prefix.size()) : name;
    if (key == "embeddings.position_ids") continue;  // a buffer older saves include
    out[key] = tensor;
  }
  return out;
}

}  // namespace titan::encoders
