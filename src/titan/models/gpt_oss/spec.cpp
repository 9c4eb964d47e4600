// gpt-oss's flavors and registry entry (see spec.h).
#include "titan/models/gpt_oss/spec.h"

#include "titan/models/gpt_oss/hf_adapter.h"
#include "titan/models/llama3/spec.h"

namespace titan::gpt_oss {
namespace {

// A gpt-oss model as its released configs give it: hidden_size `dim`, `n_layers` layers of
// `n_heads` query heads and `n_kv_heads` kv heads of `head_dim`, `experts` experts of hidden
// size `expert_ffn` (intermediate_size) with `top_k` per token, sliding windows of `window`
// positions in the even layers (0, 2, ...), vocabulary `vocab`. The rest is fixed by the
// architecture: rope_theta 150000 with YaRN x32 over 4096 original positions (beta_fast 32,
// beta_slow 1, not truncated), rms_norm_eps 1e-5, the clamped SwiGLU (limit 7, alpha 1.702),
// softmax over the chosen experts' logits, scores applied after the experts, untied embeddings.
llama3::Llama3Args make(int64_t dim, int64_t n_layers, int64_t n_heads, int64_t n_kv_heads,
                        int64_t head_dim, int64_t experts, int64_t top_k, int64_t expert_ffn,
                        int64_t window, int64_t vocab) {
  llama3::Llama3Args a;
  a.dim = dim;
  a.n_layers = n_layers;
  a.n_heads = n_heads;
  a.n_kv_heads = n_kv_heads;
  a.head_dim_override = head_dim;
  a.vocab_size = vocab;
  a.norm_eps = 1e-5;
  a.rope_theta = 150000.0;
  a.use_rope_scaling = false;
  a.yarn.factor = 32.0;
  a.yarn.beta_fast = 32.0;
  a.yarn.beta_slow = 1.0;
  a.yarn.original_seq_len = 4096;
  a.yarn.truncate = false;
  a.max_seq_len = 131072;
  a.attention_bias = true;
  a.attention_sinks = true;
  a.sliding_window = window;
  a.global_attention_every = 2;
  a.moe = MoEArgs{};
  a.moe.num_experts = experts;
  a.moe.top_k = top_k;
  a.moe.hidden_dim = expert_ffn;
  a.moe.score_func = MoEArgs::Score::kSoftmax;
  // Softmax over all logits renormalized over the top k = softmax over the top-k logits.
  a.moe.route_norm = true;
  a.moe.score_before_experts = false;
  a.moe.router_bias = true;
  a.moe.expert_biases = true;
  a.moe.swiglu_limit = 7.0;
  a.moe.swiglu_alpha = 1.702;
  // No auxiliary-loss-free balancing bias: the released models route by their learned router
  // bias alone, and a balancing bias would have no place in their Hugging Face form (debugmodel,
  // trained from scratch, has one: see flavors()).
  a.moe.load_balance_coeff = 0.0;
  a.n_dense_layers = 0;
  return a;
}

// A flavor trained from scratch: TorchTitan's auxiliary-loss-free balancing (load_balance_coeff
// 1e-3). Without it the debug model's routers settled on the same 4 of 8 experts within 20
// steps in 3 of its 4 layers (docs/models.md); exports warn that the bias is dropped.
llama3::Llama3Args balanced(llama3::Llama3Args a) {
  a.moe.load_balance_coeff = 1e-3;
  return a;
}

}  // namespace

const std::vector<std::pair<std::string, llama3::Llama3Args>>& flavors() {
  static const std::vector<std::pair<std::string, llama3::Llama3Args>> kFlavors = {
      // Unit and Hugging Face tests: windows of 8 positions, so short sequences slide.
      {"tiny", make(64, 2, 4, 2, 16, 4, 2, 64, 8, 300)},
      {"debugmodel", balanced(make(256, 4, 8, 4, 32, 8, 4, 256, 128, 2048))},
      {"20b", make(2880, 24, 64, 8, 64, 32, 4, 2880, 128, 201088)},
      {"120b", make(2880, 36, 64, 8, 64, 128, 4, 2880, 128, 201088)},
  };
  return kFlavors;
}

const llama3::Family& family() {
  static const llama3::Family kFamily{"gpt_oss", &flavors()};
  return kFamily;
}

}  // namespace titan::gpt_oss

namespace titan {

ModelSpec make_gpt_oss_spec() {
  ModelSpec spec = make_decoder_spec(gpt_oss::family());
  spec.hf = gpt_oss::make_hf_adapter();
  return spec;
}

}  // namespace titan
