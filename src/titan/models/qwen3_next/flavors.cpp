// Qwen3-Next's flavors (see spec.h), apart from its registry entry (spec.cpp) so that the
// config readers and their fuzzers link without the model.
#include "titan/models/qwen3_next/spec.h"

namespace titan::qwen3_next {
namespace {

using llama3::Llama3Args;

// (dim, layers, heads, kv heads, head_dim, vocab), the linear attention's (key heads, value
// heads, key / value head dims), the MoE's (experts, top_k, expert hidden = shared hidden).
Llama3Args make(int64_t dim, int64_t n_layers, int64_t n_heads, int64_t n_kv_heads,
                int64_t head_dim, int64_t vocab, int64_t k_heads, int64_t v_heads, int64_t k_dim,
                int64_t v_dim, int64_t experts, int64_t top_k, int64_t expert_dim, int64_t ffn_dim,
                double rope_theta, int64_t max_seq_len) {
  Llama3Args a;
  a.dim = dim;
  a.n_layers = n_layers;
  a.n_heads = n_heads;
  a.n_kv_heads = n_kv_heads;
  a.head_dim_override = head_dim;
  a.vocab_size = vocab;
  a.ffn_dim = ffn_dim;
  a.norm_eps = 1e-6;
  a.rope_theta = rope_theta;
  a.use_rope_scaling = false;
  a.max_seq_len = max_seq_len;
  a.qk_norm = true;
  a.full_attention_interval = 4;
  a.linear.num_k_heads = k_heads;
  a.linear.num_v_heads = v_heads;
  a.linear.head_k_dim = k_dim;
  a.linear.head_v_dim = v_dim;
  a.linear.conv_kernel = 4;
  a.attention_output_gate = true;
  a.partial_rotary_factor = 0.25;
  a.zero_centered_norms = true;
  a.moe = MoEArgs{};
  a.moe.num_experts = experts;
  a.moe.top_k = top_k;
  a.moe.hidden_dim = expert_dim;
  a.moe.num_shared_experts = 1;
  a.moe.shared_expert_gate = true;
  a.moe.score_func = MoEArgs::Score::kSoftmax;
  a.moe.route_norm = true;
  a.moe.score_before_experts = false;
  // No expert bias: transformers' Qwen3-Next has no place for it (its exports would route
  // differently), and Qwen balances with an auxiliary loss instead, which titan does not have.
  a.moe.load_balance_coeff = 0;
  return a;
}

}  // namespace

const std::vector<std::pair<std::string, Llama3Args>>& flavors() {
  static const std::vector<std::pair<std::string, Llama3Args>> kFlavors = {
      {"tiny", make(64, 4, 4, 2, 32, 300, 2, 4, 16, 16, 8, 2, 32, 128, 10000.0, 256)},
      {"debugmodel", make(256, 8, 8, 2, 64, 2048, 4, 8, 32, 32, 16, 4, 128, 512, 10000.0, 4096)},
      {"80B-A3B", make(2048, 48, 16, 2, 256, 151936, 16, 32, 128, 128, 512, 10, 512, 5120,
                       10000000.0, 262144)},
  };
  return kFlavors;
}

const llama3::Family& family() {
  static const llama3::Family kFamily{"qwen3_next", &flavors()};
  return kFamily;
}

}  // namespace titan::qwen3_next
