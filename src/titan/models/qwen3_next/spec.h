// Qwen3-Next (model "qwen3_next"; Qwen's Qwen3-Next-80B-A3B and debug flavors): the Llama 3
// decoder with three of every four layers attending through Gated DeltaNet linear attention
// (common/gated_delta_net.h) and the fourth through gated full attention (an output gate, RoPE on
// a quarter of each head, zero-centred q/k norms), zero-centred RMSNorms, and in every layer an
// MoE of many small experts, softmax top-k with normalised weights, plus one shared expert scaled
// by a sigmoid gate (see llama3/args.h). transformers' Qwen3NextForCausalLM both ways
// (hf_adapter.h).
#pragma once

#include "titan/models/llama3/args.h"
#include "titan/models/registry.h"

#include <string>
#include <utility>
#include <vector>

namespace titan::qwen3_next {

// tiny (tests: 4 layers, 3 linear then 1 full), debugmodel (8 layers of dim 256) and 80B-A3B
// (Qwen3-Next-80B-A3B's config: 48 layers of dim 2048, 512 experts top-10 of 512 + a shared one).
const std::vector<std::pair<std::string, llama3::Llama3Args>>& flavors();
const llama3::Family& family();

}  // namespace titan::qwen3_next

namespace titan {

ModelSpec make_qwen3_next_spec();

}  // namespace titan
