// The vision-language model (see model.h).
#include "titan/models/vlm/model.h"

#include "titan/common/check.h"
#include "titan/models/common/init.h"

#include <algorithm>
#include <sstream>

namespace titan::vlm {
namespace {

VlmArgs debug_args() {
  VlmArgs a;
  a.decoder = llama3::args_for_flavor("debugmodel");
  // Room for the four image tokens after a 2,048-token tokenizer (the default sotu_2k), rounded
  // to a multiple of 8.
  a.decoder.vocab_size = 2056;
  a.encoder.hidden_size = 128;
  a.encoder.intermediate_size = 256;
  a.encoder.num_hidden_layers = 4;
  a.encoder.num_attention_heads = 2;
  a.encoder.patch_size = 16;
  a.encoder.num_patches = 256;  // a 16 x 16 position grid
  a.encoder.vision_use_head = false;
  return a;
}

// The encoder's args as transformers' vision_config keys (siglip2_args_from_hf reads them).
nlohmann::json encoder_json(const Siglip2Args& a) {
  return {{"hidden_size", a.hidden_size},
          {"intermediate_size", a.intermediate_size},
          {"num_hidden_layers", a.num_hidden_layers},
          {"num_attention_heads", a.num_attention_heads},
          {"num_channels", a.num_channels},
          {"patch_size", a.patch_size},
          {"num_patches", a.num_patches},
          {"layer_norm_eps", a.layer_norm_eps}};
}

const std::vector<std::string>& encoder_keys() {
  static const std::vector<std::string> keys = [] {
    std::vector<std::string> out;
    const nlohmann::json defaults = encoder_json(Siglip2Args{});
    for (const auto& item : defaults.items()) out.push_back(item.key());
    out.push_back("hidden_act");
    return out;
  }();
  return keys;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Parameters of `module` under `prefix` ("encoder.embeddings."), in registration order.
std::vector<std::string> param_names(const torch::nn::Module& module, const std::string& prefix) {
  std::vector<std::string> out;
  for (const auto& item : module.named_parameters()) out.push_back(prefix + item.key());
  return out;
}

// conditioning[key], checked to be defined with `dims` dimensions.
at::Tensor image_entry(const ForwardInputs& inputs, const std::string& key, int64_t dims) {
  const auto it = inputs.conditioning.find(key);
  TITAN_CHECK(it != inputs.conditioning.end() && it->second.defined(),
              "vlm: a forward with pixel_values needs conditioning '", key,
              "' (model.h lists the entries)");
  TITAN_CHECK(it->second.dim() == dims, "vlm: conditioning '", key, "' must have ", dims,
              " dimensions, got ", it->second.sizes());
  return it->second;
}

}  // namespace

const std::vector<std::pair<std::string, VlmArgs>>& flavors() {
  static const std::vector<std::pair<std::string, VlmArgs>> table = {
      {"debugmodel", debug_args()},
  };
  return table;
}

std::vector<std::string> flavor_names() {
  std::vector<std::string> out;
  for (const auto& [name, args] : flavors()) out.push_back(name);
  return out;
}

VlmArgs args_for_flavor(const std::string& flavor) {
  for (const auto& [name, args] : flavors()) {
    if (name == flavor) return args;
  }
  check_flavor("vlm", flavor_names(), flavor);  // throws, naming the nearest
  return {};
}

VlmArgs args_from_description(const nlohmann::json& model) {
  const std::string flavor = model.value("flavor", std::string());
  const std::vector<std::string> names = flavor_names();
  const bool known = std::find(names.begin(), names.end(), flavor) != names.end();
  if (!model.contains("args")) return args_for_flavor(flavor);
  VlmArgs a = known ? args_for_flavor(flavor) : debug_args();
  const nlohmann::json& args = model.at("args");
  for (const auto& item : args.items()) {
    if (item.key() != "decoder" && item.key() != "encoder") {
      throw ConfigError(message("vlm: unknown args key '", item.key(), "'",
                                suggestion(item.key(), {"decoder", "encoder"}, "keys")));
    }
  }
  if (args.contains("decoder")) {
    nlohmann::json decoder = llama3::args_to_json(a.decoder);
    decoder.update(args.at("decoder"));
    a.decoder = llama3::args_from_description(
        {{"name", "llama3"}, {"flavor", "custom"}, {"args", decoder}});
  }
  if (args.contains("encoder")) {
    nlohmann::json enc = encoder_json(a.encoder);
    for (const auto& item : args.at("encoder").items()) {
      const auto& keys = encoder_keys();
      if (std::find(keys.begin(), keys.end(), item.key()) == keys.end()) {
        throw ConfigError(message("vlm: unknown encoder key '", item.key(), "'",
                                  suggestion(item.key(), keys, "keys")));
      }
      enc[item.key()] = item.value();
    }
    a.encoder = siglip2_args_from_hf(enc);
    a.encoder.vision_use_head = false;
  }
  return a;
}

nlohmann::json resolved_args(const VlmArgs& args) {
  return {{"decoder", llama3::resolved_args(args.decoder)},
          {"encoder", encoder_json(args.encoder)}};
}

std::string describe(const VlmArgs& args) {
  std::ostringstream os;
  os << "decoder: " << llama3::describe(args.decoder) << "; encoder: hidden "
     << args.encoder.hidden_size << ", " << args.encoder.num_hidden_layers << " layers, "
     << args.encoder.num_attention_heads << " heads, ffn " << args.encoder.intermediate_size
     << ", patch " << args.encoder.patch_size;
  return os.str();
}

int64_t vision_param_count(const VlmArgs& args) {
  const Siglip2Args& e = args.encoder;
  const int64_t h = e.hidden_size, f = e.intermediate_size;
  const int64_t patch_in = e.num_channels * e.patch_size * e.patch_size;
  const int64_t embeddings = patch_in * h + h + e.num_patches * h;
  const int64_t layer = 2 * 2 * h + 4 * (h * h + h) + (h * f + f) + (f * h + h);
  const int64_t projector = (h * h + h) + (h * args.decoder.dim + args.decoder.dim);
  return embeddings + e.num_hidden_layers * layer + 2 * h + projector;
}

ModelStats compute_stats(const VlmArgs& args, int64_t batch, int64_t seq_len,
                         at::ScalarType compute_dtype) {
  ModelStats s = llama3::compute_stats(args.decoder, batch, seq_len, compute_dtype);
  s.n_active_params = s.active_params();  // FLOPs per token: the decoder's
  s.n_params += vision_param_count(args);
  return s;
}

Projector::Projector(int64_t in_dim, int64_t out_dim, at::ScalarType compute_dtype) {
  w1 = register_module("w1", std::make_shared<BiasedLinear>(in_dim, in_dim, compute_dtype));
  w2 = register_module("w2", std::make_shared<BiasedLinear>(in_dim, out_dim, compute_dtype));
}

at::Tensor Projector::forward(const at::Tensor& x) { return w2->forward(at::silu(w1->forward(x))); }

at::Tensor scatter_image_features(const at::Tensor& h, const at::Tensor& image_mask,
                                  const at::Tensor& features, const at::Tensor& patch_mask) {
  TITAN_CHECK(h.dim() == 3 && image_mask.dim() == 2 && image_mask.size(0) == h.size(0) &&
                  image_mask.size(1) == h.size(1),
              "vlm: image_mask must be (bs, seqlen) = (", h.size(0), ", ", h.size(1), "), got ",
              image_mask.sizes());
  TITAN_CHECK(features.dim() == 3 && features.size(2) == h.size(2) &&
                  patch_mask.sizes() == features.sizes().slice(0, 2),
              "vlm: image features ", features.sizes(), " and patch_mask ", patch_mask.sizes(),
              " do not fit embeddings of width ", h.size(2));
  const at::Tensor real = features.index({patch_mask != 0});  // (n_real, dim)
  const at::Tensor slots = image_mask != 0;
  const int64_t n_slots = slots.sum().item<int64_t>();
  TITAN_CONFIG_CHECK(n_slots == real.size(0), "vlm: ", n_slots, " image placeholder tokens for ",
                     real.size(0),
                     " image patches; each real patch takes one placeholder. HINT: build the "
                     "tokens with one placeholder per patch of each image's grid");
  return h.masked_scatter(slots.unsqueeze(-1), real.to(h.scalar_type()));
}

at::Tensor ImageMerge::forward(const at::Tensor& h, const at::Tensor& image_mask,
                               const at::Tensor& features, const at::Tensor& patch_mask) {
  return hooked(h, [&](const at::Tensor& x) {
    return scatter_image_features(x, image_mask, features, patch_mask);
  });
}

VlmTransformer::VlmTransformer(const VlmArgs& args, at::ScalarType compute_dtype)
    : llama3::Transformer(args.decoder, compute_dtype), args_(args) {
  args_.encoder.vision_use_head = false;
  TITAN_CONFIG_CHECK(args_.decoder.num_mtp_layers == 0,
                     "vlm: the decoder has multi-token prediction layers, which the "
                     "vision-language model does not run");
  encoder = register_module("encoder",
                            std::make_shared<Siglip2VisionEncoder>(args_.encoder, compute_dtype));
  projector = register_module(
      "projector",
      std::make_shared<Projector>(args_.encoder.hidden_size, args_.decoder.dim, compute_dtype));
  image_merge = register_module("image_merge", std::make_shared<ImageMerge>());
}

ParamInit VlmTransformer::param_init(const std::string& name) const {
  const bool vision = name.rfind("encoder.", 0) == 0 || name.rfind("projector.", 0) == 0;
  if (!vision) return llama3::Transformer::param_init(name);
  if (ends_with(name, ".bias.weight")) return ParamInit::zeros();
  if (name.find("layer_norm") != std::string::npos || name == "encoder.post_layernorm.weight") {
    return ParamInit::ones();
  }
  if (name == "encoder.embeddings.position_embedding.weight") {
    return ParamInit::normal(/*mean=*/0.0, /*std=*/0.02);
  }
  return ParamInit::trunc_normal(/*mean=*/0.0, /*std=*/0.02);
}

ModelStats VlmTransformer::stats(int64_t batch, int64_t seq_len) const {
  return compute_stats(args_, batch, seq_len, compute_dtype());
}

std::vector<ModelUnit> VlmTransformer::units() const {
  std::vector<ModelUnit> out;
  out.push_back({"encoder.embeddings",
                 param_names(*encoder->patch_embedding, "encoder.embeddings.patch_embedding.")});
  for (const auto& name :
       param_names(*encoder->position_embedding, "encoder.embeddings.position_embedding.")) {
    out.back().params.push_back(name);
  }
  for (size_t i = 0; i < encoder->layers.size(); ++i) {
    const std::string name = "encoder.encoder.layers." + std::to_string(i);
    ModelUnit unit{name, param_names(*encoder->layers[i], name + ".")};
    unit.block = static_cast<int64_t>(i);
    out.push_back(std::move(unit));
  }
  ModelUnit last{"encoder.post_layernorm, projector",
                 param_names(*encoder->post_layernorm, "encoder.post_layernorm.")};
  for (const auto& name : param_names(*projector, "projector.")) last.params.push_back(name);
  out.push_back(std::move(last));
  for (ModelUnit& unit : llama3::Transformer::units()) out.push_back(std::move(unit));
  return out;
}

std::string VlmTransformer::refuses(const std::string& parallelism) const {
  if (parallelism == "pipeline") {
    return "the vision-language model cannot be split into pipeline stages yet: its images "
           "enter at the first stage's embedding (TorchTitan's VLM has no pipeline split "
           "either). HINT: use FSDP, HSDP, DDP or TP";
  }
  if (parallelism == "context") {
    return "context parallelism of the vision-language model is not built yet: an image's "
           "placeholder tokens may cross sequence shards. HINT: use FSDP, HSDP, DDP or TP";
  }
  return llama3::Transformer::refuses(parallelism);
}

std::vector<TpRule> VlmTransformer::tensor_parallel_plan() const {
  std::vector<TpRule> plan = llama3::Transformer::tensor_parallel_plan();
  plan.push_back({"image_merge", TpStyle::kReplicated});
  return plan;
}

int64_t VlmTransformer::embedding_unit() const { return encoder_units(); }

at::Tensor VlmTransformer::embed_units(const at::Tensor& tokens, const ForwardInputs& inputs,
                                       int64_t& unit) {
  const auto pixels = inputs.conditioning.find("pixel_values");
  if (pixels == inputs.conditioning.end()) {  // text only: the encoder's units do not run
    const auto mask = inputs.conditioning.find("image_mask");
    TITAN_CHECK(mask == inputs.conditioning.end() || !mask->second.any().item<bool>(),
                "vlm: image_mask marks placeholder tokens but no pixel_values were given");
    unit = embedding_unit();
    return llama3::Transformer::embed_units(tokens, inputs, unit);
  }
  const at::Tensor pixel_values = image_entry(inputs, "pixel_values", 3);
  const at::Tensor patch_mask = image_entry(inputs, "patch_mask", 2);
  const at::Tensor spatial_shapes = image_entry(inputs, "spatial_shapes", 2);
  const at::Tensor image_mask = image_entry(inputs, "image_mask", 2);
  // Unit functions capture by value: a runner may call them again during backward.
  Siglip2VisionEncoder* enc = encoder.get();
  at::Tensor x =
      run_unit(unit++, pixel_values, [enc, patch_mask, spatial_shapes](const at::Tensor& p) {
        return enc->embed(p, patch_mask, spatial_shapes);
      });
  const at::Tensor key_mask = Siglip2VisionEncoder::key_mask(patch_mask);
  for (const auto& layer : encoder->layers) {
    Siglip2Layer* block = layer.get();
    x = run_unit(unit++, x,
                 [block, key_mask](const at::Tensor& in) { return block->forward(in, key_mask); });
  }
  Projector* proj = projector.get();
  const at::Tensor features = run_unit(unit++, x, [enc, proj](const at::Tensor& in) {
    return proj->forward(enc->post_layernorm->forward(in));
  });
  ImageMerge* merge = image_merge.get();
  return run_unit(unit++, tokens,
                  [this, merge, image_mask, features, patch_mask](const at::Tensor& ids) {
                    return merge->forward(embed(ids), image_mask, features, patch_mask);
                  });
}

at::Tensor VlmTransformer::prefill_cached(const at::Tensor& tokens,
                                          const std::map<std::string, at::Tensor>& conditioning,
                                          KVCache& cache) {
  at::NoGradGuard no_grad;
  ForwardInputs inputs;
  inputs.conditioning = conditioning;
  int64_t unit = 0;
  // No runners during generation: the units run as plain calls.
  const at::Tensor h = embed_units(tokens, inputs, unit);
  return forward_cached_embedded(h, cache, /*start_pos=*/0);
}

}  // namespace titan::vlm

namespace titan {

ModelSpec make_vlm_spec() {
  ModelSpec spec;
  spec.name = "vlm";
  spec.objective = ModelObjective::kVisionLanguage;
  spec.flavors = vlm::flavor_names();
  spec.describe = [](const std::string& flavor, int64_t batch, int64_t seq_len,
                     at::ScalarType compute_dtype) {
    return vlm::compute_stats(vlm::args_for_flavor(flavor), batch, seq_len, compute_dtype);
  };
  spec.build = [](const std::string& flavor,
                  const ModelBuildOptions& options) -> std::shared_ptr<Model> {
    vlm::VlmArgs args = vlm::args_for_flavor(flavor);
    args.decoder.max_seq_len = options.max_seq_len;
    ParamDeviceGuard device(options.meta ? at::Device(at::kMeta) : at::Device(at::kCPU));
    auto model = std::make_shared<vlm::VlmTransformer>(args, options.compute_dtype);
    if (!options.meta) model->init_weights(options.seed);
    return model;
  };
  spec.describe_flavor = [](const std::string& flavor) {
    return vlm::describe(vlm::args_for_flavor(flavor));
  };
  spec.resolve_args = [](const nlohmann::json& model) {
    return vlm::resolved_args(vlm::args_from_description(model));
  };
  spec.build_uninitialized = [](const nlohmann::json& model,
                                const ModelBuildOptions& options) -> std::shared_ptr<Model> {
    vlm::VlmArgs args = vlm::args_from_description(model);
    args.decoder.max_seq_len = options.max_seq_len;
    ParamDeviceGuard device(options.meta ? at::Device(at::kMeta) : at::Device(at::kCPU));
    return std::make_shared<vlm::VlmTransformer>(args, options.compute_dtype);
  };
  return spec;
}

}  // namespace titan
