// The vision-language model (TorchTitan's "vlm", Llama3Siglip2Transformer): a SigLIP2 vision
// encoder turns each image into one feature per patch, a projector (Linear, SiLU, Linear) maps
// them to the decoder's width, and they replace the embeddings of the image placeholder tokens
// of a Llama 3 decoder, which then runs as usual (causal attention over text and image tokens;
// the loss on text tokens only is the data's business: placeholder labels are -100).
//
// Parameters: the decoder's under its own names (tok_embeddings.weight, layers.N..., norm,
// output), the encoder's under "encoder." in transformers' Siglip2VisionModel names (without
// the pooling head, which the decoder does not read), the projector's as projector.w1 / w2.
//
// A forward's images arrive in ForwardInputs::conditioning:
//   pixel_values   (n_images, max_patches, channels * patch^2) float: each image's patches,
//                  row-major over its patch grid, flattened (patch row, patch column, channel)
//                  as transformers' Siglip2ImageProcessor and TorchTitan cut them; then padding
//   patch_mask     (n_images, max_patches): nonzero on an image's real patches
//   spatial_shapes (n_images, 2) int64: each image's patch grid (rows, columns)
//   image_mask     (bs, seqlen): nonzero at the placeholder tokens, which take the real patches'
//                  features in order (image by image, then row-major within an image), exactly
//                  as many as there are real patches
// Without pixel_values the model is the plain decoder (text-only prompts).
#pragma once

#include "titan/models/common/affine.h"
#include "titan/models/llama3/args.h"
#include "titan/models/llama3/model.h"
#include "titan/models/registry.h"
#include "titan/models/vlm/siglip2.h"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace titan::vlm {

struct VlmArgs {
  llama3::Llama3Args decoder;
  Siglip2Args encoder;  // vision_use_head is always false here
};

// Flavors in registration order: "debugmodel" (TorchTitan's: the llama3 debug decoder, its
// vocabulary widened to 2,056 for the image tokens after a 2,048-token tokenizer, and a 4-layer,
// 128-wide encoder with 16-pixel patches).
const std::vector<std::pair<std::string, VlmArgs>>& flavors();
std::vector<std::string> flavor_names();
// ConfigError naming the nearest flavor when unknown.
VlmArgs args_for_flavor(const std::string& flavor);
// A model description's args: the flavor's, overridden by "args": {"decoder": {llama3 args
// keys, see llama3/args.h}, "encoder": {transformers' vision_config keys}}. ConfigError for an
// unknown flavor without "args", an unknown key (with the nearest), inconsistent sizes.
VlmArgs args_from_description(const nlohmann::json& model);
// Every architecture argument, resolved (equal JSON <=> identical parameter layouts).
nlohmann::json resolved_args(const VlmArgs& args);
// "decoder: dim 256, ...; encoder: hidden 128, 4 layers, 2 heads, patch 16"
std::string describe(const VlmArgs& args);
// Trainable parameters of the encoder (without the pooling head) and the projector.
int64_t vision_param_count(const VlmArgs& args);
// The decoder's numbers (llama3::compute_stats) with the vision parameters added to n_params;
// FLOPs per token count the decoder only (the encoder's work is per image patch).
ModelStats compute_stats(const VlmArgs& args, int64_t batch, int64_t seq_len,
                         at::ScalarType compute_dtype);

// The encoder's features to the decoder's width: w2(silu(w1(x))), both with biases.
class Projector : public torch::nn::Module {
 public:
  Projector(int64_t in_dim, int64_t out_dim, at::ScalarType compute_dtype);
  at::Tensor forward(const at::Tensor& x);  // (..., in_dim) -> (..., out_dim)
  std::shared_ptr<BiasedLinear> w1, w2;
};

// The decoder's embeddings `h` (bs, seqlen, dim) with the positions where image_mask (bs, seqlen)
// is nonzero replaced by the features (n_images, max_patches, dim) of the patches where
// patch_mask (n_images, max_patches) is nonzero, in order. ConfigError when the counts differ
// (naming both). Differentiable in h and features.
at::Tensor scatter_image_features(const at::Tensor& h, const at::Tensor& image_mask,
                                  const at::Tensor& features, const at::Tensor& patch_mask);

// Where the image features replace the placeholders' embeddings (scatter_image_features), as a
// module of its own so that tensor parallelism can run it on whole sequences
// (TpStyle::kReplicated: the decoder's sequence-sharded embeddings gathered, this rank's share of
// the result kept) without the model knowing.
class ImageMerge : public HookedModule {
 public:
  at::Tensor forward(const at::Tensor& h, const at::Tensor& image_mask, const at::Tensor& features,
                     const at::Tensor& patch_mask);
};

class VlmTransformer : public llama3::Transformer {
 public:
  // Parameters allocated, not initialized (init_weights).
  VlmTransformer(const VlmArgs& args, at::ScalarType compute_dtype = at::kFloat);

  // Encoder and projector: linear weights trunc_normal(0.02), biases zeros, LayerNorm weights
  // ones, position embeddings normal(0.02); the decoder's as llama3's.
  ParamInit param_init(const std::string& name) const override;
  // compute_stats of its args.
  ModelStats stats(int64_t batch, int64_t seq_len) const override;
  // encoder.embeddings, encoder.encoder.layers.N (blocks for activation checkpointing),
  // "encoder.post_layernorm, projector", then the decoder's units (FSDP units as TorchTitan's).
  std::vector<ModelUnit> units() const override;
  // The decoder's plan (llama3's) and image_merge on whole sequences; the encoder and the
  // projector stay whole on every tp rank (their gradients, partial by sequence share, are summed
  // like the norms').
  std::vector<TpRule> tensor_parallel_plan() const override;
  // Pipeline and context parallelism are refused with the reason (TorchTitan's VLM has neither);
  // data parallelism (FSDP, HSDP, DDP), tensor parallelism and activation checkpointing apply.
  std::string refuses(const std::string& parallelism) const override;
  std::vector<std::string> stage_modules() const override { return {}; }
  // Generation with images: the prompt embedded with its images (conditioning as forward's),
  // then the decoder's cached layers; later steps are the decoder's forward_cached.
  at::Tensor prefill_cached(const at::Tensor& tokens,
                            const std::map<std::string, at::Tensor>& conditioning,
                            KVCache& cache) override;

  const VlmArgs& vlm_args() const { return args_; }

  std::shared_ptr<Siglip2VisionEncoder> encoder;
  std::shared_ptr<Projector> projector;
  std::shared_ptr<ImageMerge> image_merge;

 protected:
  at::Tensor embed_units(const at::Tensor& tokens, const ForwardInputs& inputs,
                         int64_t& unit) override;
  int64_t embedding_unit() const override;
  // The encoder's units (embeddings, layers, post_layernorm with the projector).
  int64_t encoder_units() const { return args_.encoder.num_hidden_layers + 2; }

 private:
  VlmArgs args_;
};

}  // namespace titan::vlm

namespace titan {

// The registry entry "vlm" (ModelObjective::kVisionLanguage).
ModelSpec make_vlm_spec();

}  // namespace titan
