// FLUX.1's transformer in diffusers' FluxTransformer2DModel layout (a "transformer" folder of
// config.json and diffusion_pytorch_model*.safetensors): the config both ways and the tensors
// both ways. Pure functions, no files.
//
// What differs from ours: diffusers splits the fused projections (a double block's qkv into
// to_q/to_k/to_v and add_q_proj/add_k_proj/add_v_proj; a single block's linear1 into to_q, to_k,
// to_v and proj_mlp), names biases "<layer>.bias" where ours are "<layer>.bias.weight", and
// orders the final adaptive norm's output as (scale, shift) where ours is (shift, scale).
#pragma once

#include "titan/models/flux/args.h"
#include "titan/models/registry.h"

#include <nlohmann/json.hpp>

namespace titan::flux {

// config.json of a FluxTransformer2DModel with these args (patch_size 1).
nlohmann::json to_diffusers_config(const FluxArgs& args);
// The args of a FluxTransformer2DModel config.json; ConfigError naming a key it cannot represent
// (patch_size other than 1) or a missing one. Keys starting with '_' (diffusers' bookkeeping)
// are ignored.
FluxArgs from_diffusers_config(const nlohmann::json& config);

// Our parameters (FQN -> tensor) in diffusers' names and layouts; DataError naming a tensor it
// does not know or one that is missing.
TensorMap to_diffusers(const TensorMap& ours, const FluxArgs& args);
// The inverse; DataError naming an unknown or missing diffusers tensor, or one of the wrong shape.
TensorMap from_diffusers(const TensorMap& hf, const FluxArgs& args);

}  // namespace titan::flux
