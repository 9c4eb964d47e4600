// The SigLIP2 vision encoder (see siglip2.h).
#include "titan/models/vlm/siglip2.h"

#include "titan/common/check.h"

#include <cmath>

namespace titan::vlm {
namespace {

// (bs, len, heads * d) -> (bs, heads, len, d)
at::Tensor split_heads(const at::Tensor& x, int64_t heads) {
  return x.view({x.size(0), x.size(1), heads, -1}).transpose(1, 2);
}

// (bs, heads, len, d) -> (bs, len, heads * d)
at::Tensor merge_heads(const at::Tensor& x) { return x.transpose(1, 2).flatten(2); }

}  // namespace

int64_t Siglip2Args::grid() const {
  const auto side = static_cast<int64_t>(std::llround(std::sqrt(static_cast<double>(num_patches))));
  if (side * side != num_patches) {
    throw ConfigError(message("siglip2: num_patches ", num_patches,
                              " is not a square (the position embeddings form a square grid)"));
  }
  return side;
}

Siglip2Args siglip2_args_from_hf(const nlohmann::json& full) {
  const nlohmann::json& c = full.contains("vision_config") ? full.at("vision_config") : full;
  Siglip2Args a;
  a.hidden_size = c.value("hidden_size", a.hidden_size);
  a.intermediate_size = c.value("intermediate_size", a.intermediate_size);
  a.num_hidden_layers = c.value("num_hidden_layers", a.num_hidden_layers);
  a.num_attention_heads = c.value("num_attention_heads", a.num_attention_heads);
  a.num_channels = c.value("num_channels", a.num_channels);
  a.patch_size = c.value("patch_size", a.patch_size);
  a.num_patches = c.value("num_patches", a.num_patches);
  a.layer_norm_eps = c.value("layer_norm_eps", a.layer_norm_eps);
  a.vision_use_head = c.value("vision_use_head", a.vision_use_head);
  const std::string act = c.value("hidden_act", std::string("gelu_pytorch_tanh"));
  if (act != "gelu_pytorch_tanh") {
    throw ConfigError(message("siglip2: hidden_act '", act,
                              "' is not implemented (gelu_pytorch_tanh, SigLIP2's)"));
  }
  if (a.hidden_size % a.num_attention_heads != 0) {
    throw ConfigError(message("siglip2: hidden_size ", a.hidden_size,
                              " is not divisible by num_attention_heads ", a.num_attention_heads));
  }
  a.grid();  // a square
  return a;
}

Siglip2Mlp::Siglip2Mlp(const Siglip2Args& a, at::ScalarType dtype) {
  fc1 = register_module("fc1",
                        std::make_shared<BiasedLinear>(a.hidden_size, a.intermediate_size, dtype));
  fc2 = register_module("fc2",
                        std::make_shared<BiasedLinear>(a.intermediate_size, a.hidden_size, dtype));
}

at::Tensor Siglip2Mlp::forward(const at::Tensor& x) {
  return fc2->forward(at::gelu(fc1->forward(x), "tanh"));
}

Siglip2Layer::Siglip2Layer(const Siglip2Args& a, at::ScalarType dtype)
    : num_heads(a.num_attention_heads) {
  const int64_t h = a.hidden_size;
  layer_norm1 = register_module("layer_norm1", std::make_shared<LayerNorm>(h, a.layer_norm_eps));
  auto attn = register_module("self_attn", std::make_shared<torch::nn::Module>());
  q_proj = attn->register_module("q_proj", std::make_shared<BiasedLinear>(h, h, dtype));
  k_proj = attn->register_module("k_proj", std::make_shared<BiasedLinear>(h, h, dtype));
  v_proj = attn->register_module("v_proj", std::make_shared<BiasedLinear>(h, h, dtype));
  out_proj = attn->register_module("out_proj", std::make_shared<BiasedLinear>(h, h, dtype));
  layer_norm2 = register_module("layer_norm2", std::make_shared<LayerNorm>(h, a.layer_norm_eps));
  mlp = register_module("mlp", std::make_shared<Siglip2Mlp>(a, dtype));
}

at::Tensor Siglip2Layer::forward(const at::Tensor& x, const at::Tensor& key_mask) {
  const at::Tensor n = layer_norm1->forward(x);
  const at::Tensor attended = at::scaled_dot_product_attention(
      split_heads(q_proj->forward(n), num_heads), split_heads(k_proj->forward(n), num_heads),
      split_heads(v_proj->forward(n), num_heads), key_mask);
  const at::Tensor h = x + out_proj->forward(merge_heads(attended)).to(x.scalar_type());
  return h + mlp->forward(layer_norm2->forward(h)).to(h.scalar_type());
}

Siglip2Head::Siglip2Head(const Siglip2Args& a, at::ScalarType dtype)
    : num_heads(a.num_attention_heads) {
  const int64_t h = a.hidden_size;
  probe = register_module("probe", std::make_shared<Bias>(at::IntArrayRef{1, 1, h}));
  auto attention = register_module("attention", std::make_shared<torch::nn::Module>());
  in_proj = attention->register_module("in_proj", std::make_shared<BiasedLinear>(h, 3 * h, dtype));
  out_proj = attention->register_module("out_proj", std::make_shared<BiasedLinear>(h, h, dtype));
  layernorm = register_module("layernorm", std::make_shared<LayerNorm>(h, a.layer_norm_eps));
  mlp = register_module("mlp", std::make_shared<Siglip2Mlp>(a, dtype));
}

at::Tensor Siglip2Head::forward(const at::Tensor& x, const at::Tensor& key_mask) {
  const int64_t bs = x.size(0), h = x.size(2);
  const at::Tensor probes = probe->weight.expand({bs, 1, h}).to(x.scalar_type());
  // The packed projection's rows: q, then k, then v (torch.nn.MultiheadAttention's in_proj).
  const std::vector<at::Tensor> w = in_proj->weight.chunk(3, 0);
  const std::vector<at::Tensor> b = in_proj->bias->weight.chunk(3, 0);
  const auto project = [&](const at::Tensor& t, int i) {
    return split_heads(mixed_linear(t, w[i], in_proj->compute_dtype) +
                           to_compute(b[i], in_proj->compute_dtype).to(t.scalar_type()),
                       num_heads);
  };
  const at::Tensor pooled = merge_heads(
      at::scaled_dot_product_attention(project(probes, 0), project(x, 1), project(x, 2), key_mask));
  const at::Tensor attended = out_proj->forward(pooled).to(x.scalar_type());
  const at::Tensor out = attended + mlp->forward(layernorm->forward(attended)).to(x.scalar_type());
  return out.select(1, 0);
}

Siglip2VisionEncoder::Siglip2VisionEncoder(const Siglip2Args& args, at::ScalarType dtype)
    : args_(args) {
  args_.grid();
  const int64_t h = args_.hidden_size;
  auto embeddings = register_module("embeddings", std::make_shared<torch::nn::Module>());
  patch_embedding = embeddings->register_module(
      "patch_embedding", std::make_shared<BiasedLinear>(
                             args_.num_channels * args_.patch_size * args_.patch_size, h, dtype));
  position_embedding = embeddings->register_module(
      "position_embedding", std::make_shared<Embedding>(args_.num_patches, h));
  auto encoder = register_module("encoder", std::make_shared<torch::nn::Module>());
  auto list = encoder->register_module("layers", std::make_shared<torch::nn::Module>());
  for (int64_t i = 0; i < args_.num_hidden_layers; ++i) {
    layers.push_back(
        list->register_module(std::to_string(i), std::make_shared<Siglip2Layer>(args_, dtype)));
  }
  post_layernorm =
      register_module("post_layernorm", std::make_shared<LayerNorm>(h, args_.layer_norm_eps));
  if (args_.vision_use_head)
    head = register_module("head", std::make_shared<Siglip2Head>(args_, dtype));
}

at::Tensor Siglip2VisionEncoder::position_embeddings(const at::Tensor& spatial_shapes,
                                                     int64_t len) const {
  const int64_t side = args_.grid(), dim = args_.hidden_size;
  const at::Tensor table = position_embedding->weight;
  // (side * side, dim) -> (1, dim, side, side), float32 (antialiased resizing on the CPU).
  const at::Tensor grid = table.view({side, side, dim})
                              .permute({2, 0, 1})
                              .unsqueeze(0)
                              .to(table.is_cpu() ? at::kFloat : table.scalar_type());
  const at::Tensor shapes = spatial_shapes.to(at::kCPU);
  std::vector<at::Tensor> rows;
  for (int64_t b = 0; b < shapes.size(0); ++b) {
    const int64_t h = shapes[b][0].item<int64_t>(), w = shapes[b][1].item<int64_t>();
    TITAN_CHECK(h > 0 && w > 0 && h * w <= len, "siglip2: image ", b, "'s patch grid ", h, " x ", w,
                " does not fit its ", len, " patch slots");
    const at::Tensor resized = at::_upsample_bilinear2d_aa(grid, {h, w}, /*align_corners=*/false,
                                                           std::nullopt, std::nullopt);
    const at::Tensor cells = resized.reshape({dim, h * w}).transpose(0, 1).to(table.scalar_type());
    rows.push_back(at::cat({cells, cells.narrow(0, 0, 1).expand({len - h * w, dim})}, 0));
  }
  return at::stack(rows);
}

at::Tensor Siglip2VisionEncoder::embed(const at::Tensor& pixel_values, const at::Tensor& patch_mask,
                                       const at::Tensor& spatial_shapes) {
  const int64_t patch_dim = args_.num_channels * args_.patch_size * args_.patch_size;
  TITAN_CHECK(pixel_values.dim() == 3 && pixel_values.size(2) == patch_dim,
              "siglip2: pixel_values must be (bs, len, ", patch_dim, "), got ",
              pixel_values.sizes());
  const int64_t bs = pixel_values.size(0), len = pixel_values.size(1);
  TITAN_CHECK(patch_mask.sizes() == at::IntArrayRef({bs, len}) &&
                  spatial_shapes.sizes() == at::IntArrayRef({bs, 2}),
              "siglip2: patch_mask must be (", bs, ", ", len, ") and spatial_shapes (", bs,
              ", 2), got ", patch_mask.sizes(), " and ", spatial_shapes.sizes());
  const at::Tensor x = patch_embedding->forward(pixel_values);
  return x + position_embeddings(spatial_shapes, len).to(x.scalar_type());
}

at::Tensor Siglip2VisionEncoder::key_mask(const at::Tensor& patch_mask) {
  // Keys of padding patches are masked out for every query.
  return (patch_mask != 0).view({patch_mask.size(0), 1, 1, patch_mask.size(1)});
}

Siglip2Output Siglip2VisionEncoder::forward(const at::Tensor& pixel_values,
                                            const at::Tensor& patch_mask,
                                            const at::Tensor& spatial_shapes) {
  at::Tensor x = embed(pixel_values, patch_mask, spatial_shapes);
  const at::Tensor mask = key_mask(patch_mask);
  for (const auto& layer : layers) x = layer->forward(x, mask);
  x = post_layernorm->forward(x);
  Siglip2Output out{x, {}};
  if (head) out.pooled = head->forward(x, mask);
  return out;
}

TensorMap siglip2_from_hf(const TensorMap& hf) {
  TensorMap ours;
  const std::string prefix = "vision_model.";
  for (const auto& [full, tensor] : hf) {
    std::string name =
        full.compare(0, prefix.size(), prefix) == 0 ? full.substr(prefix.size()) : full;
    if (name == "head.probe") {
      name = "head.probe.weight";
    } else if (name == "head.attention.in_proj_weight") {
      name = "head.attention.in_proj.weight";
    } else if (name == "head.attention.in_proj_bias") {
      name = "head.attention.in_proj.bias.weight";
    } else if (name.size() > 5 && name.compare(name.size() - 5, 5, ".bias") == 0) {
      name += ".weight";
    } else if (name.size() <= 7 || name.compare(name.size() - 7, 7, ".weight") != 0) {
      throw DataError(message("siglip2: tensor '", full, "' is not a vision encoder parameter"));
    }
    ours[name] = tensor;
  }
  return ours;
}

}  // namespace titan::vlm
