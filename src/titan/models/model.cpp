// ModelStats arithmetic shared by every model.
#include "titan/models/model.h"

namespace titan {

double ModelStats::flops_per_token(int64_t seq_len) const {
  // 6 FLOPs per parameter per token (forward 2, backward 4), embeddings excluded as lookups; plus
  // the attention matmuls (scores and weighted sum), 12 per head dimension per key position.
  return 6.0 * static_cast<double>(n_params - n_embedding_params) +
         12.0 * static_cast<double>(n_layers) * static_cast<double>(n_heads) *
             static_cast<double>(head_dim) * static_cast<double>(seq_len);
}

}  // namespace titan
