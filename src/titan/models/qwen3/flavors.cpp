// Qwen3's flavors (see spec.h), apart from its registry entry (spec.cpp) so that the config
// readers and their fuzzers link without the model.
#include "titan/models/qwen3/spec.h"

namespace titan::qwen3 {
namespace {

// Dims as Qwen3's released configs give them (hidden_size, num_hidden_layers,
// num_attention_heads, num_key_value_heads, head_dim, intermediate_size, vocab_size,
// tie_word_embeddings).
llama3::Llama3Args dense(int64_t dim, int64_t n_layers, int64_t n_heads, int64_t n_kv_heads,
                         int64_t head_dim, int64_t ffn_dim, int64_t vocab_size, bool tied) {
  llama3::Llama3Args a;
  a.dim = dim;
  a.n_layers = n_layers;
  a.n_heads = n_heads;
  a.n_kv_heads = n_kv_heads;
  a.head_dim_override = head_dim;
  a.ffn_dim = ffn_dim;
  a.vocab_size = vocab_size;
  a.tie_embeddings = tied;
  a.qk_norm = true;
  a.norm_eps = 1e-6;
  a.rope_theta = 1e6;
  a.use_rope_scaling = false;
  a.max_seq_len = 40960;
  return a;
}

// An MoE flavor: every layer routes each token to top_k of `experts` experts of hidden size
// `expert_ffn` (moe_intermediate_size), as Qwen3-MoE does (norm_topk_prob: weights sum to 1).
llama3::Llama3Args moe(llama3::Llama3Args a, int64_t experts, int64_t top_k, int64_t expert_ffn) {
  a.moe = MoEArgs{};
  a.moe.num_experts = experts;
  a.moe.top_k = top_k;
  a.moe.hidden_dim = expert_ffn;
  a.moe.score_func = MoEArgs::Score::kSoftmax;
  a.moe.route_norm = true;
  a.moe.score_before_experts = false;
  a.n_dense_layers = 0;
  return a;
}

}  // namespace

const std::vector<std::pair<std::string, llama3::Llama3Args>>& flavors() {
  static const std::vector<std::pair<std::string, llama3::Llama3Args>> kFlavors = {
      {"tiny", dense(64, 2, 4, 2, 32, 128, 300, false)},
      {"tiny_moe", moe(dense(64, 2, 4, 2, 32, 128, 300, false), 4, 2, 64)},
      {"debugmodel", dense(256, 8, 16, 8, 128, 3072, 2048, false)},
      {"debugmodel_moe", moe(dense(256, 8, 16, 8, 128, 3072, 2048, false), 64, 8, 768)},
      {"0.6B", dense(1024, 28, 16, 8, 128, 3072, 151936, true)},
      {"1.7B", dense(2048, 28, 16, 8, 128, 6144, 151936, true)},
      {"4B", dense(2560, 36, 32, 8, 128, 9728, 151936, true)},
      {"8B", dense(4096, 36, 32, 8, 128, 12288, 151936, false)},
      {"14B", dense(5120, 40, 40, 8, 128, 17408, 151936, false)},
      {"32B", dense(5120, 64, 64, 8, 128, 25600, 151936, false)},
      {"30B-A3B", moe(dense(2048, 48, 32, 4, 128, 6144, 151936, false), 128, 8, 768)},
      {"235B-A22B", moe(dense(4096, 94, 64, 4, 128, 12288, 151936, false), 128, 8, 1536)},
  };
  return kFlavors;
}

const llama3::Family& family() {
  static const llama3::Family kFamily{"qwen3", &flavors()};
  return kFamily;
}

}  // namespace titan::qwen3
