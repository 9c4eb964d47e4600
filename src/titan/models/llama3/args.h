// Llama 3 model arguments, the named flavors (TorchTitan's dims plus small CPU flavors for our
// tests and benchmarks), and the analytic sizes of a configuration (no weights allocated).
#pragma once

#include "titan/models/common/gated_delta_net.h"
#include "titan/models/common/mla.h"
#include "titan/models/common/moe.h"
#include "titan/models/common/rope.h"
#include "titan/models/model.h"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace titan::llama3 {

struct Llama3Args {
  int64_t dim = 4096;
  int64_t n_layers = 32;
  int64_t n_heads = 32;
  int64_t n_kv_heads = 0;  // 0: same as n_heads (plain multi-head attention)
  int64_t vocab_size = 128256;
  int64_t multiple_of = 256;        // the SwiGLU hidden size is rounded up to a multiple of this
  double ffn_dim_multiplier = 0.0;  // <= 0: none
  int64_t ffn_dim = 0;  // > 0: the SwiGLU hidden size as given (HF's intermediate_size), else
                        // derived from multiple_of and ffn_dim_multiplier
  double norm_eps = 1e-5;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;  // Llama 3.1 scaling, applied when use_rope_scaling
  bool use_rope_scaling = true;
  bool depth_init = true;        // per-layer init std from the layer id (else from n_layers)
  bool tie_embeddings = false;   // output projection shares tok_embeddings.weight
  int64_t max_seq_len = 131072;  // RoPE table length; build() takes it from ModelBuildOptions
  // Variations that Qwen3 (model "qwen3", models/qwen3) builds on this decoder:
  int64_t head_dim_override = 0;  // > 0: the head size, independent of dim / n_heads
  bool qk_norm = false;           // RMSNorm (eps norm_eps) over each head of q and k before RoPE
  // Mixture of experts: every block from layer n_dense_layers on has an MoE (moe.hidden_dim per
  // expert) instead of the SwiGLU feed-forward; moe.num_experts = 0 means a dense model.
  MoEArgs moe = dense_moe();
  int64_t n_dense_layers = 0;
  // Multi-head latent attention in every block instead of GQA (DeepSeek-V3, models/deepseek_v3),
  // when mla.kv_lora_rank > 0. RoPE then rotates mla.qk_rope_head_dim dimensions with mla.yarn
  // (rope_scaling and n_kv_heads / head_dim unused).
  MlaArgs mla;
  // gpt-oss (models/gpt_oss) on this decoder: biases on wq/wk/wv/wo, a learned sink logit per
  // head in every attention softmax, sliding-window attention over the last sliding_window
  // positions in every layer but each global_attention_every-th (layer i attends globally when
  // (i + 1) % global_attention_every == 0; 0: every layer slides), and YaRN frequencies for GQA's
  // RoPE (yarn.factor > 1) with the softmax scaled by yarn_mscale(factor, 1)^2, which is what
  // Hugging Face's cos/sin scaled by its attention_factor amount to.
  bool attention_bias = false;
  bool attention_sinks = false;
  int64_t sliding_window = 0;  // 0: every layer attends to all earlier positions
  int64_t global_attention_every = 0;
  YarnScaling yarn;  // GQA models only (MLA has its own: mla.yarn)
  // Llama 4 (models/llama4) on this decoder:
  // - MoE only in every interleave_moe_layer_step-th layer (layer i when (i + 1) % step == 0, as
  //   TorchTitan and Hugging Face place them; 1: every layer from n_dense_layers on), the others
  //   dense with the ffn_hidden_dim() SwiGLU;
  // - iRoPE: no rotary embedding in every nope_every-th layer (layer i when (i + 1) % nope_every
  //   == 0, where Meta's released models have them: 3, 7, ...; 0: RoPE everywhere), those layers
  //   attending globally with temperature-tuned queries (attn_temperature_floor > 0: queries at
  //   position p times 1 + attn_temperature_scale * log1p(floor((p + 1) / floor))), the RoPE
  //   layers attending within chunks of attention_chunk_size positions (0: globally);
  // - qk_l2_norm: in the RoPE layers, q and k of every head divided by their root mean square
  //   (eps norm_eps, no weight) after RoPE (Hugging Face's use_qk_norm).
  int64_t interleave_moe_layer_step = 1;
  int64_t nope_every = 0;
  int64_t attention_chunk_size = 0;
  bool qk_l2_norm = false;
  int64_t attn_temperature_floor = 0;
  double attn_temperature_scale = 0.1;
  // Multi-token prediction (DeepSeek-V3, models/deepseek_v3): num_mtp_layers modules after the
  // head, depth k (1-based) predicting token t + k + 1 at position t from depth k - 1's hidden
  // state and the embedding of token t + k, through one block of layer id n_layers + k - 1 (an
  // MoE block where layer n_layers is one), sharing the embedding and the output head. Training
  // only: generation and validation run the main model.
  int64_t num_mtp_layers = 0;
  // Qwen3-Next (models/qwen3_next) on this decoder:
  // - full_attention_interval > 0: layer i attends with Gated DeltaNet linear attention
  //   (`linear`, models/common/gated_delta_net.h) unless (i + 1) % full_attention_interval == 0
  //   (transformers' layer_types: 3 linear layers, then a full one, for 4);
  // - attention_output_gate: the full attention's gated output (AttentionExtras::output_gate);
  // - partial_rotary_factor: RoPE on that share of each head's dimensions;
  // - zero_centered_norms: every RMSNorm scales by 1 + weight (initialised at zero).
  int64_t full_attention_interval = 0;
  GatedDeltaNetArgs linear;
  bool attention_output_gate = false;
  double partial_rotary_factor = 1.0;
  bool zero_centered_norms = false;

  static MoEArgs dense_moe() {
    MoEArgs m;
    m.num_experts = 0;
    return m;
  }
  bool has_moe() const { return moe.num_experts > 0; }
  bool is_moe_layer(int64_t layer) const {
    return has_moe() && layer >= n_dense_layers &&
           (interleave_moe_layer_step <= 1 || (layer + 1) % interleave_moe_layer_step == 0);
  }
  int64_t n_moe_layers() const {
    int64_t n = 0;
    for (int64_t i = 0; i < n_layers; ++i) n += is_moe_layer(i);
    return n;
  }
  // Whether layer `layer` has no rotary embedding (Llama 4's NoPE layers).
  bool is_nope_layer(int64_t layer) const {
    return nope_every > 0 && (layer + 1) % nope_every == 0;
  }
  // The chunk size of layer `layer`'s chunked attention (0: none).
  int64_t layer_attention_chunk(int64_t layer) const {
    return is_nope_layer(layer) ? 0 : attention_chunk_size;
  }
  bool is_linear_attention_layer(int64_t layer) const {
    return full_attention_interval > 0 && (layer + 1) % full_attention_interval != 0;
  }
  int64_t n_linear_attention_layers() const {
    int64_t n = 0;
    for (int64_t i = 0; i < n_layers; ++i) n += is_linear_attention_layer(i);
    return n;
  }
  // The dimensions of each head RoPE rotates.
  int64_t rope_dim() const {
    return static_cast<int64_t>(static_cast<double>(head_dim()) * partial_rotary_factor);
  }
  // The layer id of multi-token prediction depth `depth` (1-based)'s block.
  int64_t mtp_layer_id(int64_t depth) const { return n_layers + depth - 1; }
  int64_t kv_heads() const { return n_kv_heads > 0 ? n_kv_heads : n_heads; }
  // Whether layer `layer` attends through a sliding window (sliding_window > 0).
  bool is_sliding_layer(int64_t layer) const {
    return sliding_window > 0 &&
           (global_attention_every <= 0 || (layer + 1) % global_attention_every != 0);
  }
  int64_t head_dim() const { return head_dim_override > 0 ? head_dim_override : dim / n_heads; }
  // ffn_dim if set; else TorchTitan's integer arithmetic: h = int(2 * 4 * dim / 3);
  // h = int(ffn_dim_multiplier * h) if set; then rounded up to a multiple of multiple_of.
  int64_t ffn_hidden_dim() const;
  // Checks that the heads divide evenly; throws ConfigError saying which.
  void validate() const;
};

// All flavors in registration order (small to large).
const std::vector<std::pair<std::string, Llama3Args>>& flavors();

// A model family built on this decoder: its registry name and flavors. Llama 3's, and Qwen3's
// (models/qwen3: the same decoder with head_dim, qk_norm and MoE set).
struct Family {
  std::string name;
  const std::vector<std::pair<std::string, Llama3Args>>* flavors;
  std::vector<std::string> flavor_names() const;  // in registration order
};
const Family& llama3_family();

// The arguments of `flavor`; throws ConfigError naming the nearest flavor if unknown.
Llama3Args args_for_flavor(const std::string& flavor, const Family& family = llama3_family());

// Analytic statistics for a micro-batch of (batch, seq_len) tokens with matmuls in
// `compute_dtype` (see args.cpp for the activation-memory formula).
ModelStats compute_stats(const Llama3Args& args, int64_t batch, int64_t seq_len,
                         at::ScalarType compute_dtype);

// "dim 4096, 32 layers, 32 heads, 8 kv heads, ffn 14336, vocab 128256"
std::string describe(const Llama3Args& args);

// Model descriptions (registry.h). The "args" keys are the fields above, by name, with
// rope_scaling as {"scaling_factor", "low_freq_factor", "high_freq_factor",
// "original_max_position_embeddings"} (null: use_rope_scaling = false).
//
// The arguments of a description: the flavor's (defaults when it is not registered, which needs
// "args"), overridden by "args". ConfigError for unknown flavors or keys, with the nearest name.
Llama3Args args_from_description(const nlohmann::json& model,
                                 const Family& family = llama3_family());
// Every field of `args` as "args" JSON (args_from_description inverts it exactly).
nlohmann::json args_to_json(const Llama3Args& args);
// The architecture of `args`, normalized (resolved ffn_dim and n_kv_heads, rope_scaling null
// when unused; no init or RoPE table length): equal JSON <=> identical parameter layouts and math.
nlohmann::json resolved_args(const Llama3Args& args);
// The shortest description of `args`: {"name": "llama3", "flavor": F} when a registered flavor
// has the same resolved_args (plus "args": {"max_seq_len": ..} if that differs), else
// {"name": "llama3", "flavor": "custom", "args": args_to_json(args)}.
nlohmann::json describe_args(const Llama3Args& args, const Family& family = llama3_family());

// ConfigError naming the config.json key of the first argument read from one that no model has
// (rms_norm_eps outside (0, 1], rope_theta outside (0, 1e12], the Llama 3 RoPE scaling factors,
// max_position_embeddings); the Hugging Face readers of llama3, qwen3 and deepseek_v3 call it
// (defined with the llama3 reader, hf_adapter.cpp).
void check_hf_ranges(const Llama3Args& args);

// The dtype of the residual stream between blocks when matmuls run in `compute_dtype`.
at::ScalarType residual_dtype(at::ScalarType compute_dtype);

}  // namespace titan::llama3
