// FLUX.1's transformer arguments (black-forest-labs' MMDiT as TorchTitan's flux model builds it),
// the named flavors and the analytic sizes of a configuration (no weights allocated).
//
// The transformer maps packed noisy latents (bs, img_len, in_channels) - the autoencoder's
// latents cut into 2x2 patches - to the velocity of the same shape, conditioned on the text
// encoder's token features (bs, txt_len, context_in_dim), a pooled text vector (bs, vec_in_dim),
// the timestep and, in guidance-distilled models (FLUX.1-dev), a guidance strength.
#pragma once

#include "titan/models/model.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace titan::flux {

struct FluxArgs {
  int64_t in_channels = 64;       // packed latent features per image token (16 channels x 2 x 2)
  int64_t out_channels = 64;      // predicted velocity features per image token
  int64_t vec_in_dim = 768;       // the pooled text embedding (CLIP's pooled output)
  int64_t context_in_dim = 4096;  // the text token features (T5's d_model)
  int64_t hidden_size = 3072;
  double mlp_ratio = 4.0;  // MLP hidden size = int(hidden_size * mlp_ratio)
  int64_t num_heads = 24;
  int64_t depth = 19;                // double-stream blocks (separate text and image weights)
  int64_t depth_single_blocks = 38;  // single-stream blocks over the joint sequence
  // Rotary dimensions per position axis (index, row, column); they sum to the head size.
  std::vector<int64_t> axes_dim = {16, 56, 56};
  double theta = 10000.0;
  // A guidance embedding added to the conditioning vector (FLUX.1-dev's guidance distillation;
  // forward then needs the "guidance" conditioning). q/k/v always carry biases, as in every
  // released FLUX.1 model.
  bool guidance_embed = false;

  int64_t head_dim() const { return hidden_size / num_heads; }
  int64_t mlp_hidden_dim() const { return static_cast<int64_t>(hidden_size * mlp_ratio); }
  // ConfigError naming the failed rule with its arithmetic (hidden_size % num_heads, the sum of
  // axes_dim against the head size, even axes, positive sizes).
  void validate() const;
};

// Flavors: "flux-dev", "flux-schnell" (the released 12B models), "flux-debug" (TorchTitan's
// debug dims), "debugmodel" (a small CPU model for our tests and debug runs).
const std::vector<std::pair<std::string, FluxArgs>>& flavors();
std::vector<std::string> flavor_names();
// ConfigError naming the nearest flavor if unknown.
FluxArgs args_for_flavor(const std::string& flavor);

// Every parameter (weights and biases) of the transformer.
int64_t count_params(const FluxArgs& args);
// Training FLOPs per image token with `txt_len` text tokens per image and `img_len` image tokens
// (TorchTitan's count): 6 per parameter a token passes through (one stream of the double
// blocks; the text tokens' work amortized over the image tokens; the per-sample modulation
// amortized likewise) plus attention's 12 * hidden * joint length per block.
double flops_per_image_token(const FluxArgs& args, int64_t txt_len, int64_t img_len);

// The sizes the trainer and the registry report (parameters, blocks, heads, hidden).
ModelStats model_stats(const FluxArgs& args);

// "hidden 3072, 19 double + 38 single blocks, 24 heads, guidance"
std::string describe(const FluxArgs& args);

// As JSON (the model description's "args", keys as the fields above) and back; from_json starts
// from `base` and refuses unknown keys naming the nearest.
nlohmann::json args_to_json(const FluxArgs& args);
FluxArgs args_from_json(const nlohmann::json& json, FluxArgs base);

}  // namespace titan::flux
