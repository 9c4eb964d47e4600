// Llama 3 <-> Hugging Face transformers' LlamaForCausalLM: tensor names, the q/k row layout and
// config.json (TorchTitan's llama3 state-dict adapter, in C++).
//
//   ours (TorchTitan FQN)                 Hugging Face
//   tok_embeddings.weight                 model.embed_tokens.weight
//   layers.N.attention.wq/wk/wv/wo        model.layers.N.self_attn.q_proj/k_proj/v_proj/o_proj
//   layers.N.feed_forward.w1/w3/w2        model.layers.N.mlp.gate_proj/up_proj/down_proj
//   layers.N.attention_norm               model.layers.N.input_layernorm
//   layers.N.ffn_norm                     model.layers.N.post_attention_layernorm
//   norm.weight, output.weight            model.norm.weight, lm_head.weight (absent when tied)
//
// RoPE layout: we rotate interleaved pairs (2i, 2i+1) of each head (Meta's layout); HF's
// rotate_half rotates (i, i + head_dim / 2). So the rows of wq and wk are permuted per head:
// HF row p * head_dim / 2 + i = our row 2i + p (p in {0, 1}). wv, wo and the rest are unchanged.
// The permutation only moves values, so ours -> HF -> ours is bit-identical.
#pragma once

#include "titan/models/llama3/args.h"
#include "titan/models/registry.h"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

namespace titan::llama3 {

// w (n_heads * head_dim, in) with interleaved rotary pairs -> the same rows in HF's half layout.
at::Tensor permute_to_hf(const at::Tensor& w, int64_t n_heads);
// The inverse of permute_to_hf.
at::Tensor permute_from_hf(const at::Tensor& w, int64_t n_heads);
// Partial RoPE (Qwen3-Next): w (n_heads * head_rows, ...) whose every head's first rope_dim rows
// are rotated (the rest, and any gate rows after them, pass through): those rows permuted as
// permute_to_hf / permute_from_hf permute a head.
at::Tensor permute_rotary_to_hf(const at::Tensor& w, int64_t n_heads, int64_t head_rows,
                                int64_t rope_dim);
at::Tensor permute_rotary_from_hf(const at::Tensor& w, int64_t n_heads, int64_t head_rows,
                                  int64_t rope_dim);

// config.json of `args` (LlamaForCausalLM; dims, norm eps, rope theta and llama3 rope scaling,
// tie_word_embeddings, max_position_embeddings = max_seq_len).
nlohmann::json hf_config(const Llama3Args& args);
// The arguments of a Hugging Face Llama config.json, RoPE from either "rope_parameters"
// (transformers >= 5) or "rope_theta" + "rope_scaling"; ConfigError naming any key we cannot
// represent (another hidden_act, biases, a head_dim other than hidden_size / heads, a rope type
// other than "llama3" or "default", a partial_rotary_factor).
Llama3Args args_from_hf_config(const nlohmann::json& config);

// Sets rope_theta, use_rope_scaling and rope_scaling from config.json's "rope_parameters"
// (transformers >= 5) or "rope_theta" + "rope_scaling": type "llama3" or "default"; ConfigError
// for others and for a partial_rotary_factor. Reads args.max_seq_len (the default
// original_max_position_embeddings). Llama 4's reader uses it too.
void set_rope_from_hf(const nlohmann::json& config, Llama3Args& args);

TensorMap to_hf_tensors(const TensorMap& ours, const Llama3Args& args);
TensorMap from_hf_tensors(const TensorMap& hf, const Llama3Args& args);

// The adapter registered in the llama3 ModelSpec.
HfAdapter make_hf_adapter();

// The HfAdapter of a model family on this decoder (Llama 3, Qwen3, DeepSeek-V3, gpt-oss) from its
// functions of arguments: the adapter's functions take model descriptions and resolve them
// through `family` (which must outlive the adapter: the families are static).
struct FamilyHfFunctions {
  nlohmann::json (*to_config)(const Llama3Args&);
  Llama3Args (*from_config)(const nlohmann::json&);
  TensorMap (*to_hf)(const TensorMap&, const Llama3Args&);
  TensorMap (*from_hf)(const TensorMap&, const Llama3Args&);
};
HfAdapter family_hf_adapter(const Family& family, const std::string& model_type,
                            const FamilyHfFunctions& functions);

// Helpers of the families' tensor conversions. "<prefix><N>.<rest>" -> (N, rest), false for any
// other form (N at most 9 digits).
bool parse_layer_name(const std::string& name, const std::string& prefix, int64_t& layer,
                      std::string& rest);
// Adds `value` to `map` as `name`; DataError naming the source tensor `original` when `name` is
// already there.
void put_tensor(TensorMap& map, const std::string& name, const at::Tensor& value,
                const std::string& original);
// Warns when an export drops the MoE load-balancing bias `name` (`bias`, a state buffer no
// Hugging Face model of `model` holds) while it is nonzero: the exported model routes without it.
void warn_dropped_expert_bias(const std::string& name, const at::Tensor& bias,
                              const std::string& model);

}  // namespace titan::llama3
