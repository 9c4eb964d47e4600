// Qwen3 <-> Hugging Face transformers' Qwen3ForCausalLM (config model_type "qwen3") and
// Qwen3MoeForCausalLM ("qwen3_moe"): the Llama 3 adapter (llama3/hf_adapter.h: names, the q/k
// row permutation, RoPE and the shared config keys) plus what Qwen3 adds:
//
//   ours (TorchTitan FQN)                 Hugging Face
//   layers.N.attention.q_norm/k_norm      model.layers.N.self_attn.q_norm/k_norm
//   layers.N.moe.gate.weight              model.layers.N.mlp.gate.weight (router, (E, dim))
//   layers.N.moe.experts.w1 (E, h, dim)   model.layers.N.mlp.experts.E.gate_proj.weight (h, dim)
//   layers.N.moe.experts.w3 (E, h, dim)   model.layers.N.mlp.experts.E.up_proj.weight (h, dim)
//   layers.N.moe.experts.w2 (E, dim, h)   model.layers.N.mlp.experts.E.down_proj.weight (dim, h)
//
// q_norm and k_norm scale each head before RoPE, so their (head_dim) weights take the same
// per-head row permutation as the rows of wq and wk. Experts are written one 2-D tensor per
// expert, as released Qwen3-MoE checkpoints and transformers' save_pretrained store them; on
// reading, the fused layout some transformers versions hold in memory
// (mlp.experts.gate_up_proj (E, 2h, dim), mlp.experts.down_proj (E, dim, h)) is accepted too.
// The MoE's expert_bias buffer (auxiliary-loss-free balancing) has no HF counterpart: it is not
// exported and a converted model starts from zero biases.
#pragma once

#include "titan/models/llama3/args.h"
#include "titan/models/registry.h"

#include <nlohmann/json.hpp>

namespace titan::qwen3 {

// config.json of `args`: Qwen3Config, or Qwen3MoeConfig when args has an MoE (norm_topk_prob
// from route_norm; the first n_dense_layers as mlp_only_layers).
nlohmann::json hf_config(const llama3::Llama3Args& args);
// The arguments of a "qwen3" or "qwen3_moe" config.json; ConfigError naming any key we cannot
// represent (sliding windows, biases, other rope types, an MoE with decoder_sparse_step != 1 or
// mlp_only_layers other than a first run of layers).
llama3::Llama3Args args_from_hf_config(const nlohmann::json& config);

TensorMap to_hf_tensors(const TensorMap& ours, const llama3::Llama3Args& args);
TensorMap from_hf_tensors(const TensorMap& hf, const llama3::Llama3Args& args);

// The adapter registered in the qwen3 ModelSpec (model_type "qwen3"; from_hf_config also reads
// "qwen3_moe" configs).
HfAdapter make_hf_adapter();

}  // namespace titan::qwen3
