// Llama 4 <-> Hugging Face transformers' Llama4ForCausalLM (config model_type "llama4_text"),
// and the text model of Llama4ForConditionalGeneration folders (model_type "llama4": its
// text_config and its language_model.* tensors; the vision tower's tensors are not read, and the
// import says how many it leaves). Hugging Face's Llama 4 rotates interleaved pairs as we do, so
// no tensor is permuted:
//
//   ours (TorchTitan-style FQN)            Hugging Face (model.layers.N.)
//   layers.N.attention.wq / wk / wv / wo   self_attn.q_proj / k_proj / v_proj / o_proj.weight
//   layers.N.attention_norm / ffn_norm     input_layernorm / post_attention_layernorm.weight
//   layers.N.feed_forward.w1 / w3 / w2     feed_forward.gate_proj / up_proj / down_proj.weight
//                                          (dense layers: intermediate_size_mlp)
//   layers.N.moe.gate                      feed_forward.router.weight
//   layers.N.moe.experts.w1, w3 (E, h, d)  feed_forward.experts.gate_up_proj (E, d, 2h):
//                                          transposed, gate then up along the last dimension
//   layers.N.moe.experts.w2 (E, d, h)      feed_forward.experts.down_proj (E, h, d), transposed
//   layers.N.moe.shared_experts.w1/w3/w2   feed_forward.shared_expert.gate_proj/up_proj/down_proj
//   tok_embeddings, norm, output           model.embed_tokens, model.norm, lm_head
//
// config.json: moe_layers, no_rope_layers and layer_types as lists (what the model does per
// layer), rope_parameters (llama3 scaling or default), attention_chunk_size, use_qk_norm,
// attn_temperature_tuning with floor_scale and attn_scale. The load-balancing expert_bias has no
// Hugging Face counterpart (an export warns when it drops a nonzero one).
#pragma once

#include "titan/models/llama3/args.h"
#include "titan/models/registry.h"

#include <nlohmann/json.hpp>

namespace titan::llama4 {

// config.json of `args`; ConfigError for what Llama4TextConfig cannot express.
nlohmann::json hf_config(const llama3::Llama3Args& args);
// The arguments of a "llama4_text" config.json, or of a "llama4" one's text_config
// (Llama4TextConfig's defaults for absent keys); ConfigError naming a key we cannot represent.
llama3::Llama3Args args_from_hf_config(const nlohmann::json& config);
TensorMap to_hf_tensors(const TensorMap& ours, const llama3::Llama3Args& args);
// Also reads Llama4ForConditionalGeneration's language_model.* names.
TensorMap from_hf_tensors(const TensorMap& hf, const llama3::Llama3Args& args);
HfAdapter make_hf_adapter();

}  // namespace titan::llama4
