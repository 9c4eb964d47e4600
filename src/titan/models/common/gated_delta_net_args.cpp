// GatedDeltaNetArgs (see gated_delta_net.h): the arguments alone, without the layer, so that the
// config readers (and their fuzzers) link without the model's modules.
#include "titan/common/check.h"
#include "titan/models/common/gated_delta_net.h"

namespace titan {

int64_t GatedDeltaNetArgs::params(int64_t dim) const {
  return dim * (2 * key_dim() + 2 * value_dim()) + dim * 2 * num_v_heads +
         conv_dim() * conv_kernel + 2 * num_v_heads + head_v_dim + value_dim() * dim;
}

void GatedDeltaNetArgs::validate() const {
  // Far above real models (Qwen3-Next: 16 key / 32 value heads of 128), low enough that the
  // parameter counts (dim x heads x head dims) cannot overflow int64.
  constexpr int64_t kMax = int64_t{1} << 16;
  if (num_k_heads <= 0 || num_v_heads <= 0 || head_k_dim <= 0 || head_v_dim <= 0 ||
      conv_kernel <= 0 || chunk <= 0 || num_k_heads > kMax || num_v_heads > kMax ||
      head_k_dim > kMax || head_v_dim > kMax || conv_kernel > 64 || chunk > 4096) {
    throw ConfigError(message("linear attention: num_k_heads ", num_k_heads, ", num_v_heads ",
                              num_v_heads, ", head_k_dim ", head_k_dim, ", head_v_dim ", head_v_dim,
                              ", conv_kernel ", conv_kernel, " (at most 64) and chunk ", chunk,
                              " (at most 4096) must be > 0"));
  }
  if (num_v_heads % num_k_heads != 0) {
    throw ConfigError(message("linear attention: num_v_heads ", num_v_heads,
                              " must be a multiple of num_k_heads ", num_k_heads, " (", num_v_heads,
                              " % ", num_k_heads, " = ", num_v_heads % num_k_heads,
                              "): each key head serves whole value heads"));
  }
  if (!(norm_eps > 0 && norm_eps < 1)) {
    throw ConfigError(message("linear attention: norm_eps ", norm_eps, " must be in (0, 1)"));
  }
}

}  // namespace titan
