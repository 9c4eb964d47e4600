// The key/value cache of incremental decoding. Each attention layer appends the keys and values
// of the positions it has seen, so a decode step runs the model on the new token only and
// attends over the cached history instead of recomputing the whole prefix. Buffers are allocated
// by the layers on first use from the shapes of their own keys (bs, heads, head_dim, dtype), so
// the cache knows nothing about the model and works with sharded heads.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

namespace titan {

// What generation carries between calls of one layer: the last conv_kernel - 1 inputs of the
// convolution (bs, conv_dim, conv_kernel - 1) and the recurrent state (bs, num_v_heads,
// head_k_dim, head_v_dim) float32. Undefined tensors: a sequence's start (zeros).
struct LinearAttentionState {
  at::Tensor conv;
  at::Tensor recurrent;
};

// One attention layer's history. Stored head-major, (bs, n_kv_heads, max_len, head_dim), so
// that positions [0, L) of a head are one strided (L, head_dim) block that the attention
// matmuls read in place (a position-major layout would need a copy per step).
struct LayerKVCache {
  at::Tensor k;  // (bs, n_kv_heads, max_len, head_dim) in the compute dtype; undefined until used
  at::Tensor v;  // same shape and dtype as k
  // A linear-attention layer's (Qwen3-Next): the convolution history and the recurrent state
  // after the cached positions (gated_delta_net.h), which cannot rewind.
  LinearAttentionState linear;
};

// The whole model's cache: one LayerKVCache per layer, `max_len` positions each.
struct KVCache {
  explicit KVCache(int64_t max_len) : max_len(max_len) {}

  // The layer's entry, growing the list as layers are first seen.
  LayerKVCache& layer(size_t index) {
    if (layers.size() <= index) {
      layers.resize(index + 1);
    }
    return layers[index];
  }

  // Forgets the history (keeps the buffers, so a new sequence of the same batch size reuses them).
  void reset() { length = 0; }

  int64_t max_len;                   // positions each buffer holds (at most the RoPE table length)
  int64_t length = 0;                // positions [0, length) hold valid keys and values
  std::vector<LayerKVCache> layers;  // by layer index
};

}  // namespace titan
