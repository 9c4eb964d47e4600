// DeepSeek-V3 <-> Hugging Face transformers' DeepseekV3ForCausalLM (config model_type
// "deepseek_v3"). What the Llama 3 and Qwen3 adapters know (embeddings, norms, the dense SwiGLU,
// the router and per-expert weights) goes through them; this file adds latent attention, shared
// experts and the expert bias:
//
//   ours (TorchTitan FQN)                  Hugging Face
//   layers.N.attention.wq                  model.layers.N.self_attn.q_proj           (no q latent)
//   layers.N.attention.wq_a / q_norm / wq_b  self_attn.q_a_proj / q_a_layernorm / q_b_proj
//   layers.N.attention.wkv_a / kv_norm     self_attn.kv_a_proj_with_mqa / kv_a_layernorm
//   layers.N.attention.wkv_b / wo          self_attn.kv_b_proj / o_proj
//   layers.N.moe.gate.weight               mlp.gate.weight
//   layers.N.moe.expert_bias (buffer)      mlp.gate.e_score_correction_bias
//   layers.N.moe.experts.w1/w3/w2 (E,..)   mlp.experts.E.gate_proj/up_proj/down_proj (per expert)
//   layers.N.moe.shared_experts.w1/w3/w2   mlp.shared_experts.gate_proj/up_proj/down_proj
//
// Layouts are identical: transformers' rope_interleave = true (its default, and what we write)
// rotates the same interleaved pairs as we do, so no row moves. Exported configs say YaRN with
// mscale = mscale_all_dim = our mscale (the rotation unscaled, the softmax corrected as ours).
// Hugging Face's router is always sigmoid and group-limited (n_group 1: no limit) with scores
// applied after the experts; its latent norms use eps 1e-6.
//
// Multi-token prediction depth j (num_nextn_predict_layers <-> num_mtp_layers) is HF layer
// L + j (L = num_hidden_layers; 61 in the released model):
//   mtp.j.enorm / hnorm / eh_proj          model.layers.{L+j}.enorm / hnorm / eh_proj
//   mtp.j.norm                             model.layers.{L+j}.shared_head.norm
//   mtp.j.block.<as a layer>               model.layers.{L+j}.<as a layer>
//   (tok_embeddings, output: written again) model.layers.{L+j}.embed_tokens / shared_head.head
// Reading ignores the repeated embedding and head, and layers past the model's num_mtp_layers
// (with a warning).
#pragma once

#include "titan/models/llama3/args.h"
#include "titan/models/registry.h"

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace titan::deepseek_v3 {

// config.json of `args`; ConfigError for what DeepseekV3Config cannot express (softmax routing,
// scores before the experts, no MoE layer).
nlohmann::json hf_config(const llama3::Llama3Args& args);
// The arguments of a "deepseek_v3" config.json (transformers' defaults for absent keys);
// ConfigError naming a key we cannot represent (rope_interleave false, another rope type, a
// rotation scaled by attention_factor != 1, biases, tied embeddings, another activation, a
// quantization_config: the released fp8 weights must be dequantized first).
llama3::Llama3Args args_from_hf_config(const nlohmann::json& config);

// The description with num_mtp_layers lowered to the multi-token prediction layers `hf_names`
// holds (HfAdapter::fit_to_tensors).
nlohmann::json fit_to_tensors(const nlohmann::json& model,
                              const std::vector<std::string>& hf_names);

TensorMap to_hf_tensors(const TensorMap& ours, const llama3::Llama3Args& args);
TensorMap from_hf_tensors(const TensorMap& hf, const llama3::Llama3Args& args);

// The adapter registered in the deepseek_v3 ModelSpec.
HfAdapter make_hf_adapter();

}  // namespace titan::deepseek_v3
