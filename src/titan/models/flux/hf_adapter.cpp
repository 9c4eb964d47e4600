// FLUX.1 <-> diffusers' FluxTransformer2DModel (see hf_adapter.h).
#include "titan/models/flux/hf_adapter.h"

#include "titan/common/check.h"

#include <set>
#include <string>
#include <vector>

namespace titan::flux {
namespace {

// One of our biased linear layers and the diffusers layers it holds: one (renamed), or several
// stacked along the output features in this order (split back by `rows`). `swap_halves`: the
// two halves of the output are stored the other way round (the final adaptive norm).
struct LayerPair {
  std::string ours;
  std::vector<std::string> hf;
  std::vector<int64_t> rows;
  bool swap_halves = false;
};

// A norm's scale: one tensor renamed.
struct NormPair {
  std::string ours, hf;
};

struct Layout {
  std::vector<LayerPair> layers;
  std::vector<NormPair> norms;
};

Layout layout(const FluxArgs& a) {
  const int64_t h = a.hidden_size;
  Layout out;
  auto& l = out.layers;
  auto& n = out.norms;
  l.push_back({"img_in", {"x_embedder"}, {}});
  l.push_back({"txt_in", {"context_embedder"}, {}});
  const std::string tte = "time_text_embed.";
  l.push_back({"time_in.in_layer", {tte + "timestep_embedder.linear_1"}, {}});
  l.push_back({"time_in.out_layer", {tte + "timestep_embedder.linear_2"}, {}});
  l.push_back({"vector_in.in_layer", {tte + "text_embedder.linear_1"}, {}});
  l.push_back({"vector_in.out_layer", {tte + "text_embedder.linear_2"}, {}});
  if (a.guidance_embed) {
    l.push_back({"guidance_in.in_layer", {tte + "guidance_embedder.linear_1"}, {}});
    l.push_back({"guidance_in.out_layer", {tte + "guidance_embedder.linear_2"}, {}});
  }
  for (int64_t i = 0; i < a.depth; ++i) {
    const std::string o = "double_blocks." + std::to_string(i) + ".";
    const std::string t = "transformer_blocks." + std::to_string(i) + ".";
    l.push_back({o + "img_mod.lin", {t + "norm1.linear"}, {}});
    l.push_back({o + "txt_mod.lin", {t + "norm1_context.linear"}, {}});
    l.push_back(
        {o + "img_attn.qkv", {t + "attn.to_q", t + "attn.to_k", t + "attn.to_v"}, {h, h, h}});
    l.push_back({o + "txt_attn.qkv",
                 {t + "attn.add_q_proj", t + "attn.add_k_proj", t + "attn.add_v_proj"},
                 {h, h, h}});
    l.push_back({o + "img_attn.proj", {t + "attn.to_out.0"}, {}});
    l.push_back({o + "txt_attn.proj", {t + "attn.to_add_out"}, {}});
    l.push_back({o + "img_mlp.0", {t + "ff.net.0.proj"}, {}});
    l.push_back({o + "img_mlp.2", {t + "ff.net.2"}, {}});
    l.push_back({o + "txt_mlp.0", {t + "ff_context.net.0.proj"}, {}});
    l.push_back({o + "txt_mlp.2", {t + "ff_context.net.2"}, {}});
    n.push_back({o + "img_attn.norm.query_norm", t + "attn.norm_q"});
    n.push_back({o + "img_attn.norm.key_norm", t + "attn.norm_k"});
    n.push_back({o + "txt_attn.norm.query_norm", t + "attn.norm_added_q"});
    n.push_back({o + "txt_attn.norm.key_norm", t + "attn.norm_added_k"});
  }
  for (int64_t i = 0; i < a.depth_single_blocks; ++i) {
    const std::string o = "single_blocks." + std::to_string(i) + ".";
    const std::string t = "single_transformer_blocks." + std::to_string(i) + ".";
    l.push_back({o + "linear1",
                 {t + "attn.to_q", t + "attn.to_k", t + "attn.to_v", t + "proj_mlp"},
                 {h, h, h, a.mlp_hidden_dim()}});
    l.push_back({o + "linear2", {t + "proj_out"}, {}});
    l.push_back({o + "modulation.lin", {t + "norm.linear"}, {}});
    n.push_back({o + "norm.query_norm", t + "attn.norm_q"});
    n.push_back({o + "norm.key_norm", t + "attn.norm_k"});
  }
  l.push_back({"final_layer.adaLN_modulation.1", {"norm_out.linear"}, {}, /*swap_halves=*/true});
  l.push_back({"final_layer.linear", {"proj_out"}, {}});
  return out;
}

// (shift, scale) <-> (scale, shift): the halves of dim 0 exchanged (its own inverse).
at::Tensor swap_halves(const at::Tensor& t) {
  const std::vector<at::Tensor> halves = t.chunk(2, 0);
  return at::cat({halves[1], halves[0]}, 0);
}

// map[name], marked used; DataError if absent.
at::Tensor take(const TensorMap& map, const std::string& name, std::set<std::string>& used,
                const char* side) {
  const auto it = map.find(name);
  if (it == map.end()) {
    throw DataError(message("flux: the ", side, " tensors lack '", name, "'"));
  }
  used.insert(name);
  return it->second;
}

void reject_unused(const TensorMap& map, const std::set<std::string>& used, const char* side) {
  for (const auto& [name, tensor] : map) {
    if (used.count(name) == 0) {
      throw DataError(message("flux: unknown ", side, " tensor '", name,
                              "' (not a parameter of this FLUX transformer configuration)"));
    }
  }
}

int64_t int_key(const nlohmann::json& config, const char* key) {
  if (!config.contains(key) || !config.at(key).is_number_integer()) {
    throw ConfigError(message("flux: diffusers config.json needs an integer '", key, "'"));
  }
  return config.at(key).get<int64_t>();
}

}  // namespace

nlohmann::json to_diffusers_config(const FluxArgs& a) {
  TITAN_CHECK(a.mlp_ratio == 4.0, "flux: diffusers' FluxTransformer2DModel has mlp_ratio 4, ",
              "these args have ", a.mlp_ratio);
  return {{"_class_name", "FluxTransformer2DModel"},
          {"patch_size", 1},
          {"in_channels", a.in_channels},
          {"out_channels", a.out_channels},
          {"num_layers", a.depth},
          {"num_single_layers", a.depth_single_blocks},
          {"attention_head_dim", a.head_dim()},
          {"num_attention_heads", a.num_heads},
          {"joint_attention_dim", a.context_in_dim},
          {"pooled_projection_dim", a.vec_in_dim},
          {"guidance_embeds", a.guidance_embed},
          {"axes_dims_rope", a.axes_dim}};
}

FluxArgs from_diffusers_config(const nlohmann::json& config) {
  static const std::set<std::string> kKnown = {
      "patch_size",          "in_channels",         "out_channels",
      "num_layers",          "num_single_layers",   "attention_head_dim",
      "num_attention_heads", "joint_attention_dim", "pooled_projection_dim",
      "guidance_embeds",     "axes_dims_rope"};
  for (const auto& [key, value] : config.items()) {
    if (!key.empty() && key[0] == '_') continue;
    if (kKnown.count(key) == 0) {
      throw ConfigError(message("flux: diffusers config.json key '", key,
                                "' is not one FluxTransformer2DModel's layout takes here"));
    }
  }
  if (config.contains("patch_size") && int_key(config, "patch_size") != 1) {
    throw ConfigError(message("flux: patch_size ", config.at("patch_size").dump(),
                              " is not supported (FLUX.1 packs 2x2 latent patches before the "
                              "transformer and has patch_size 1)"));
  }
  FluxArgs a;
  a.in_channels = int_key(config, "in_channels");
  a.out_channels = config.contains("out_channels") && !config.at("out_channels").is_null()
                       ? int_key(config, "out_channels")
                       : a.in_channels;
  a.depth = int_key(config, "num_layers");
  a.depth_single_blocks = int_key(config, "num_single_layers");
  a.num_heads = int_key(config, "num_attention_heads");
  a.hidden_size = a.num_heads * int_key(config, "attention_head_dim");
  a.context_in_dim = int_key(config, "joint_attention_dim");
  a.vec_in_dim = int_key(config, "pooled_projection_dim");
  a.guidance_embed = config.value("guidance_embeds", false);
  if (config.contains("axes_dims_rope")) {
    a.axes_dim = config.at("axes_dims_rope").get<std::vector<int64_t>>();
  }
  a.mlp_ratio = 4.0;
  a.validate();
  return a;
}

TensorMap to_diffusers(const TensorMap& ours, const FluxArgs& args) {
  TensorMap hf;
  std::set<std::string> used;
  const Layout map = layout(args);
  for (const LayerPair& pair : map.layers) {
    at::Tensor weight = take(ours, pair.ours + ".weight", used, "titan");
    at::Tensor bias = take(ours, pair.ours + ".bias.weight", used, "titan");
    if (pair.swap_halves) {
      weight = swap_halves(weight);
      bias = swap_halves(bias);
    }
    if (pair.hf.size() == 1) {
      hf[pair.hf[0] + ".weight"] = weight;
      hf[pair.hf[0] + ".bias"] = bias;
      continue;
    }
    const std::vector<at::Tensor> weights = weight.split_with_sizes(pair.rows, 0);
    const std::vector<at::Tensor> biases = bias.split_with_sizes(pair.rows, 0);
    for (size_t i = 0; i < pair.hf.size(); ++i) {
      hf[pair.hf[i] + ".weight"] = weights[i].contiguous();
      hf[pair.hf[i] + ".bias"] = biases[i].contiguous();
    }
  }
  for (const NormPair& pair : map.norms) {
    hf[pair.hf + ".weight"] = take(ours, pair.ours + ".weight", used, "titan");
  }
  reject_unused(ours, used, "titan");
  return hf;
}

TensorMap from_diffusers(const TensorMap& hf, const FluxArgs& args) {
  TensorMap ours;
  std::set<std::string> used;
  const Layout map = layout(args);
  for (const LayerPair& pair : map.layers) {
    std::vector<at::Tensor> weights, biases;
    for (size_t i = 0; i < pair.hf.size(); ++i) {
      const at::Tensor w = take(hf, pair.hf[i] + ".weight", used, "diffusers");
      const at::Tensor b = take(hf, pair.hf[i] + ".bias", used, "diffusers");
      if (!pair.rows.empty() && (w.dim() != 2 || w.size(0) != pair.rows[i] || b.dim() != 1 ||
                                 b.size(0) != pair.rows[i])) {
        throw DataError(message("flux: diffusers tensor '", pair.hf[i], ".weight' is ", w.sizes(),
                                " with bias ", b.sizes(), "; this configuration has ", pair.rows[i],
                                " output features there"));
      }
      weights.push_back(w);
      biases.push_back(b);
    }
    at::Tensor weight = weights.size() == 1 ? weights[0] : at::cat(weights, 0);
    at::Tensor bias = biases.size() == 1 ? biases[0] : at::cat(biases, 0);
    if (pair.swap_halves) {
      weight = swap_halves(weight);
      bias = swap_halves(bias);
    }
    ours[pair.ours + ".weight"] = weight;
    ours[pair.ours + ".bias.weight"] = bias;
  }
  for (const NormPair& pair : map.norms) {
    ours[pair.ours + ".weight"] = take(hf, pair.hf + ".weight", used, "diffusers");
  }
  reject_unused(hf, used, "diffusers");
  return ours;
}

}  // namespace titan::flux
