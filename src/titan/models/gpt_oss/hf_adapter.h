// gpt-oss <-> Hugging Face transformers' GptOssForCausalLM (config model_type "gpt_oss"). What the
// Llama 3 adapter knows (embeddings, norms, wq/wk/wv/wo with their RoPE row permutation) goes
// through it; this file adds:
//
//   ours (TorchTitan-style FQN)            Hugging Face (model.layers.N.)
//   layers.N.attention.bq / bk             self_attn.q_proj.bias / k_proj.bias  (rows permuted
//                                          as wq's / wk's)
//   layers.N.attention.bv / bo             self_attn.v_proj.bias / o_proj.bias
//   layers.N.attention.sinks               self_attn.sinks
//   layers.N.moe.gate / gate_bias          mlp.router.weight / mlp.router.bias
//   layers.N.moe.experts.w1, w3 (E, h, d)  mlp.experts.gate_up_proj (E, d, 2h): transposed, gate
//                                          and up interleaved along the last dimension (gate in
//                                          the even columns)
//   layers.N.moe.experts.b1, b3 (E, h)     mlp.experts.gate_up_proj_bias (E, 2h), interleaved
//   layers.N.moe.experts.w2 (E, d, h)      mlp.experts.down_proj (E, h, d), transposed
//   layers.N.moe.experts.b2 (E, d)         mlp.experts.down_proj_bias
//
// The load-balancing expert_bias buffer has no Hugging Face counterpart (a warning says when an
// export drops a nonzero one). config.json: sliding layers as layer_types, YaRN as
// rope_parameters with "truncate": false.
#pragma once

#include "titan/models/llama3/args.h"
#include "titan/models/registry.h"

#include <nlohmann/json.hpp>

namespace titan::gpt_oss {

// config.json of `args`; ConfigError for what GptOssConfig cannot express.
nlohmann::json hf_config(const llama3::Llama3Args& args);
// The arguments of a "gpt_oss" config.json (GptOssConfig's defaults for absent keys); ConfigError
// naming a key we cannot represent.
llama3::Llama3Args args_from_hf_config(const nlohmann::json& config);
TensorMap to_hf_tensors(const TensorMap& ours, const llama3::Llama3Args& args);
TensorMap from_hf_tensors(const TensorMap& hf, const llama3::Llama3Args& args);
HfAdapter make_hf_adapter();

}  // namespace titan::gpt_oss
