// MLA arguments: sizes and validation (see mla.h). Apart from the layer so that code that only
// reads model descriptions (config parsers, their fuzzers) links without the modules.
#include "titan/models/common/mla.h"

#include "titan/common/check.h"

#include <cmath>
#include <string>

namespace titan {

int64_t MlaArgs::params(int64_t dim, int64_t n_heads) const {
  const int64_t qk = qk_head_dim();
  const int64_t q = q_lora_rank > 0 ? dim * q_lora_rank + q_lora_rank + q_lora_rank * n_heads * qk
                                    : dim * n_heads * qk;
  const int64_t kv = dim * (kv_lora_rank + qk_rope_head_dim) + kv_lora_rank +
                     kv_lora_rank * n_heads * (qk_nope_head_dim + v_head_dim);
  return q + kv + n_heads * v_head_dim * dim;
}

void MlaArgs::validate() const {
  // Far above DeepSeek-V3 (q 1536, kv 512, heads of 128 + 64 and 128), low enough that the
  // parameter counts cannot overflow int64 (model descriptions come from files).
  constexpr int64_t kMax = int64_t{1} << 20;
  const std::string sizes = "q_lora_rank " + std::to_string(q_lora_rank) + ", kv_lora_rank " +
                            std::to_string(kv_lora_rank) + ", qk_nope_head_dim " +
                            std::to_string(qk_nope_head_dim) + ", qk_rope_head_dim " +
                            std::to_string(qk_rope_head_dim) + ", v_head_dim " +
                            std::to_string(v_head_dim);
  for (const int64_t v :
       {q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim}) {
    if (v < 0 || v > kMax) {
      throw ConfigError(message("MLA: ", sizes, ": each must be in [0, ", kMax, "]"));
    }
  }
  if (kv_lora_rank < 1 || v_head_dim < 1 || qk_rope_head_dim < 2 || qk_rope_head_dim % 2 != 0) {
    throw ConfigError(
        message("MLA: ", sizes,
                ": kv_lora_rank and v_head_dim must be >= 1 and qk_rope_head_dim even and "
                ">= 2 (RoPE rotates pairs)"));
  }
  if (!(norm_eps > 0) || !std::isfinite(norm_eps) || !std::isfinite(mscale) ||
      !std::isfinite(yarn.factor) || !(yarn.beta_fast > 0) || !(yarn.beta_slow > 0) ||
      yarn.original_seq_len < 1) {
    throw ConfigError(message(
        "MLA: latent_norm_eps ", norm_eps, ", mscale ", mscale, ", rope_factor ", yarn.factor,
        ", beta_fast ", yarn.beta_fast, ", beta_slow ", yarn.beta_slow, " and original_seq_len ",
        yarn.original_seq_len, " must be finite (eps, betas and original_seq_len > 0)"));
  }
}

}  // namespace titan
