// FLUX.1's transformer as a Model: forward's first argument is the packed noisy latents
// (bs, img_len, in_channels); the rest arrives in ForwardInputs::conditioning:
//   "txt"       (bs, txt_len, context_in_dim)  the text encoder's token features (T5)
//   "y"         (bs, vec_in_dim)               the pooled text vector (CLIP)
//   "timesteps" (bs)                           flow time in [0, 1] (1: pure noise)
//   "img_ids"   (bs or 1, img_len, 3)          positions (0, row, column) of the latent patches
//   "txt_ids"   (bs or 1, txt_len, 3)          positions of the text tokens (zeros in FLUX.1)
//   "guidance"  (bs)                           guidance strength (guidance_embed models only)
// and it returns the predicted velocity (bs, img_len, out_channels) in float32.
//
// Units (what FSDP gathers together, what activation checkpointing wraps): the conditioning
// embedders "time_in, vector_in[, guidance_in]"; "img_in, txt_in"; each double block; each
// single block; "final_layer". Between units the hidden state is the joint sequence
// [text, image] (bs, txt_len + img_len, hidden); the conditioning vector reaches the blocks as a
// captured tensor, so a unit's recomputation sees the same one.
#pragma once

#include "titan/models/flux/args.h"
#include "titan/models/flux/layers.h"
#include "titan/models/model.h"

#include <ATen/ATen.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace titan::flux {

class FluxTransformer : public Model {
 public:
  // Parameters allocated (see ParamDeviceGuard), not initialized: call init_weights(seed).
  explicit FluxTransformer(const FluxArgs& args, at::ScalarType compute_dtype = at::kFloat);

  at::Tensor run_forward(const at::Tensor& img, const ForwardInputs& inputs) override;
  using Model::forward;
  // TorchTitan's init (after DiT): img_in, txt_in and every block's linear layers
  // xavier-uniform; the time, guidance and pooled-text embedders normal(0.02); the modulations
  // and the final layer zero (each block starts as the identity); biases zero; q/k norms one.
  ParamInit param_init(const std::string& name) const override;
  // n_params and dims (model_stats); FLOPs per image token are flops_per_image_token's.
  ModelStats stats(int64_t batch, int64_t seq_len) const override;
  std::vector<ModelUnit> units() const override;
  std::string refuses(const std::string& parallelism) const override;
  // Tensor parallelism, Megatron-LM's split with whole activations between layers (the double
  // block cuts the joint sequence into its streams): each stream's fused qkv column-wise by q, k
  // and v parts (whole heads per rank), its proj row-wise, its MLP column- then row-wise; the
  // single block's linear1 column-wise by [q, k, v, MLP input] and linear2 row-wise by
  // [attention, MLP]; the q/k norms head-local; the modulations (a quarter of the weights)
  // column-wise with their small outputs all-gathered; the embedders and the final layer's
  // projection replicated (computed whole on every rank).
  std::vector<TpRule> tensor_parallel_plan() const override;
  TpActivations tensor_parallel_activations() const override { return TpActivations::kWhole; }
  std::vector<std::pair<std::string, int64_t>> tp_split_counts() const override;

  const FluxArgs& args() const { return args_; }

  std::shared_ptr<BiasedLinear> img_in, txt_in;
  std::shared_ptr<MLPEmbedder> time_in, vector_in;
  std::shared_ptr<MLPEmbedder> guidance_in;  // null without guidance_embed
  std::vector<std::shared_ptr<DoubleStreamBlock>> double_blocks;
  std::vector<std::shared_ptr<SingleStreamBlock>> single_blocks;
  std::shared_ptr<LastLayer> final_layer;

 private:
  FluxArgs args_;
  at::ScalarType compute_dtype_;
  std::map<std::string, ParamInit> inits_;  // every parameter's, from its shape at construction
};

// conditioning[key], checked against the sizes given (-1: any); ConfigError naming the entry.
at::Tensor conditioning_entry(const ForwardInputs& inputs, const std::string& key,
                              const std::vector<int64_t>& sizes);

}  // namespace titan::flux
