// DeepSeek-V3's flavors and registry entry (see spec.h).
#include "titan/models/deepseek_v3/spec.h"

#include "titan/common/check.h"
#include "titan/models/deepseek_v3/hf_adapter.h"
#include "titan/models/llama3/model.h"
#include "titan/models/llama3/spec.h"

namespace titan::deepseek_v3 {
namespace {

using llama3::Llama3Args;

// Model sizes as TorchTitan's deepseek_v3 flavors give them: (dim, n_layers, n_dense_layers,
// n_heads, inter_dim, vocab_size) and the attention latents (q_lora_rank, kv_lora_rank, mscale).
// Every flavor has heads of 128 + 64 rotary dims and values of 128, RoPE theta 1e4 with YaRN
// x40 over 4096 positions (beta_fast 32, beta_slow 1), norm eps 1e-5.
Llama3Args base(int64_t dim, int64_t n_layers, int64_t n_dense_layers, int64_t n_heads,
                int64_t inter_dim, int64_t vocab_size, int64_t q_lora_rank, int64_t kv_lora_rank,
                double mscale) {
  Llama3Args a;
  a.dim = dim;
  a.n_layers = n_layers;
  a.n_dense_layers = n_dense_layers;
  a.n_heads = n_heads;
  a.ffn_dim = inter_dim;
  a.vocab_size = vocab_size;
  a.norm_eps = 1e-5;
  a.rope_theta = 10000.0;
  a.use_rope_scaling = false;
  a.max_seq_len = 4096 * 4;
  a.mla.q_lora_rank = q_lora_rank;
  a.mla.kv_lora_rank = kv_lora_rank;
  a.mla.qk_nope_head_dim = 128;
  a.mla.qk_rope_head_dim = 64;
  a.mla.v_head_dim = 128;
  a.mla.norm_eps = 1e-5;
  a.mla.mscale = mscale;
  a.mla.yarn.factor = 40.0;
  a.mla.yarn.beta_fast = 32.0;
  a.mla.yarn.beta_slow = 1.0;
  a.mla.yarn.original_seq_len = 4096;
  return a;
}

// The MoE of every layer past the dense ones: `experts` routed experts of `moe_inter_dim`, top_k
// of them per token, `shared` shared experts, route scale; groups 0: no group limit.
Llama3Args moe(Llama3Args a, int64_t experts, int64_t top_k, int64_t moe_inter_dim, int64_t shared,
               MoEArgs::Score score, bool route_norm, double route_scale, int64_t groups,
               int64_t limited_groups) {
  a.moe = MoEArgs{};
  a.moe.num_experts = experts;
  a.moe.top_k = top_k;
  a.moe.hidden_dim = moe_inter_dim;
  a.moe.num_shared_experts = shared;
  a.moe.score_func = score;
  a.moe.route_norm = route_norm;
  a.moe.route_scale = route_scale;
  a.moe.score_before_experts = false;  // TorchTitan and DeepSeek weight the experts' outputs
  a.moe.num_expert_groups = groups;
  a.moe.num_limited_groups = limited_groups;
  a.moe.load_balance_coeff = 1e-3;
  return a;
}

Llama3Args tiny() {
  Llama3Args a = base(/*dim=*/64, /*n_layers=*/3, /*n_dense_layers=*/1, /*n_heads=*/4,
                      /*inter_dim=*/128, /*vocab_size=*/300, /*q_lora_rank=*/32,
                      /*kv_lora_rank=*/32, /*mscale=*/1.0);
  a.mla.qk_nope_head_dim = 16;
  a.mla.qk_rope_head_dim = 8;
  a.mla.v_head_dim = 16;
  a.norm_eps = 1e-6;
  a.mla.norm_eps = 1e-6;
  a.max_seq_len = 256;
  return moe(a, /*experts=*/8, /*top_k=*/2, /*moe_inter_dim=*/32, /*shared=*/1,
             MoEArgs::Score::kSigmoid, /*route_norm=*/true, /*route_scale=*/2.5, /*groups=*/4,
             /*limited_groups=*/2);
}

// `a` with multi-token prediction over `depths` depths.
Llama3Args with_mtp(Llama3Args a, int64_t depths) {
  a.num_mtp_layers = depths;
  return a;
}

}  // namespace

const std::vector<std::pair<std::string, Llama3Args>>& flavors() {
  using S = MoEArgs::Score;
  static const std::vector<std::pair<std::string, Llama3Args>> kFlavors = {
      {"tiny", tiny()},
      {"tiny_mtp", with_mtp(tiny(), 2)},
      {"debugmodel", moe(base(256, 6, 1, 16, 1024, 2048, 0, 512, 0.70), 8, 3, 256, 2, S::kSoftmax,
                         false, 1.0, 0, 0)},
      {"debugmodel_mtp", with_mtp(moe(base(256, 6, 1, 16, 1024, 2048, 0, 512, 0.70), 8, 3, 256, 2,
                                      S::kSoftmax, false, 1.0, 0, 0),
                                  1)},
      {"16B", moe(base(2048, 27, 1, 16, 10944, 102400, 0, 512, 0.70), 64, 6, 1408, 2, S::kSoftmax,
                  false, 1.0, 0, 0)},
      {"236B", moe(base(5120, 60, 1, 128, 12288, 102400, 1536, 512, 1.0), 160, 6, 1536, 2,
                   S::kSoftmax, false, 16.0, 8, 3)},
      {"671B", moe(base(7168, 61, 3, 128, 18432, 129280, 1536, 512, 1.0), 256, 8, 2048, 1,
                   S::kSigmoid, true, 2.5, 8, 4)},
  };
  return kFlavors;
}

const llama3::Family& family() {
  static const llama3::Family kFamily{"deepseek_v3", &flavors()};
  return kFamily;
}

}  // namespace titan::deepseek_v3

namespace titan {

ModelSpec make_deepseek_v3_spec() {
  ModelSpec spec = make_decoder_spec(deepseek_v3::family());
  spec.hf = deepseek_v3::make_hf_adapter();
  return spec;
}

}  // namespace titan
