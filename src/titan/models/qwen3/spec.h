// Qwen3 (TorchTitan's qwen3): the Llama 3 decoder with an explicit head_dim, RMSNorm on each
// head of q and k before RoPE (qk_norm), RoPE theta 1e6 without scaling, norm eps 1e-6, tied
// embeddings in the small dense flavors, and in the MoE flavors every feed-forward replaced by a
// mixture of experts (softmax router, top-k weights normalized to 1 and applied after the
// experts, no shared experts, auxiliary-loss-free bias balancing).
#pragma once

#include "titan/models/llama3/args.h"
#include "titan/models/registry.h"

#include <string>
#include <utility>
#include <vector>

namespace titan::qwen3 {

// Small to large: tiny and tiny_moe (unit tests), debugmodel and debugmodel_moe (TorchTitan's
// debug sizes), then 0.6B, 1.7B, 4B, 8B, 14B, 32B and the MoE 30B-A3B and 235B-A22B.
const std::vector<std::pair<std::string, llama3::Llama3Args>>& flavors();
const llama3::Family& family();

}  // namespace titan::qwen3

namespace titan {

// Spec "qwen3".
ModelSpec make_qwen3_spec();

}  // namespace titan
