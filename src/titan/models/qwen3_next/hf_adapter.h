// Qwen3-Next <-> Hugging Face transformers' Qwen3NextForCausalLM (config model_type
// "qwen3_next"). The Qwen3 adapter (qwen3/hf_adapter.h) carries the embeddings, the norms, the
// router and the routed experts; this file adds:
//
//   ours                                         Hugging Face (model.layers.N.)
//   attention.wq (heads * 2 head_dim, dim)       self_attn.q_proj (each head: q, then its gate)
//   attention.wk / wv / wo                       self_attn.k_proj / v_proj / o_proj
//   attention.q_norm / k_norm                    self_attn.q_norm / k_norm
//   linear_attention.in_proj_qkvz / in_proj_ba   linear_attn.in_proj_qkvz / in_proj_ba
//   linear_attention.conv1d / norm / out_proj    linear_attn.conv1d / norm / out_proj
//   linear_attention.dt_bias.weight / A_log.weight  linear_attn.dt_bias / A_log
//   moe.shared_experts.w1 / w3 / w2              mlp.shared_expert.gate_proj / up_proj / down_proj
//   moe.shared_gate                              mlp.shared_expert_gate
//
// RoPE rotates the first rope_dim rows of each q and k head: those rows (and those q/k norm
// entries) move between transformers' half layout and our interleaved pairs
// (llama3::permute_rotary_*). The zero-centred norms store the same weights on both sides.
#pragma once

#include "titan/models/llama3/args.h"
#include "titan/models/registry.h"

#include <nlohmann/json.hpp>

namespace titan::qwen3_next {

// config.json of `args` (layer_types from full_attention_interval); ConfigError for what
// Qwen3NextConfig cannot express.
nlohmann::json hf_config(const llama3::Llama3Args& args);
// The arguments of a "qwen3_next" config.json (transformers' defaults for absent keys);
// ConfigError naming a key we cannot represent (layer_types without a fixed interval, another
// rope type, biases, decoder_sparse_step != 1, ...).
llama3::Llama3Args args_from_hf_config(const nlohmann::json& config);

TensorMap to_hf_tensors(const TensorMap& ours, const llama3::Llama3Args& args);
TensorMap from_hf_tensors(const TensorMap& hf, const llama3::Llama3Args& args);

HfAdapter make_hf_adapter();

}  // namespace titan::qwen3_next
