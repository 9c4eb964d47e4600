// Rotary position embeddings (RoPE) with Llama 3.1 frequency scaling, applied to interleaved
// pairs (x[..., 2i], x[..., 2i+1]) as a rotation by angle pos * freq_i. The rotation is done with
// real cos/sin tables rather than complex tensors, so it runs on any backend and dtype.
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <functional>

namespace titan {

// Llama 3.1 frequency scaling: wavelengths longer than original_max_position_embeddings /
// low_freq_factor are slowed by scaling_factor, those shorter than
// original_max_position_embeddings / high_freq_factor are kept, and the band in between is
// interpolated linearly (in 1/wavelength) between the two.
struct RopeScaling {
  double scaling_factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

// YaRN ("NTK-by-parts") scaling as DeepSeek-V3 and TorchTitan's deepseek_v3 use it: frequency i
// keeps its value when the dimension i rotates more than beta_fast times over original_seq_len
// positions, is divided by factor when it rotates fewer than beta_slow times, and blends linearly
// (in i) in between; the two boundary indices are floored / ceiled (DeepSeek's truncation) and
// clamped to [0, dim - 1]. Applied when factor > 1. The attention's matching softmax correction is
// yarn_mscale (the rotation itself is unscaled).
struct YarnScaling {
  double factor = 1.0;  // <= 1: no scaling
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  int64_t original_seq_len = 4096;
  // Whether the boundary indices are floored / ceiled (DeepSeek's YaRN; gpt-oss's config sets
  // Hugging Face's "truncate": false, which keeps them fractional).
  bool truncate = true;
  bool enabled() const { return factor > 1.0; }
};

// The dim / 2 YaRN frequencies (float32) for rotary dimension `dim` and base `theta`.
at::Tensor yarn_frequencies(int64_t dim, double theta, const YarnScaling& yarn);
// YaRN's attention temperature: 0.1 * mscale * ln(factor) + 1 when factor > 1, else 1.
double yarn_mscale(double factor, double mscale);

// The head_dim / 2 rotation frequencies theta^(-2i / head_dim), float32, scaled as above when
// `scaling` is non-null. Mirrors TorchTitan's precompute_freqs_cis (float32 arithmetic).
at::Tensor rope_frequencies(int64_t head_dim, double theta, const RopeScaling* scaling);

// Rotates x by the tables: x (bs, seqlen, n_heads, head_dim), cos/sin (>= seqlen, head_dim / 2),
// or (bs, seqlen, head_dim / 2) per row -> (bs, seqlen, n_heads, head_dim) in x's dtype; the math
// runs in float32 (or wider).
at::Tensor apply_rotary_emb(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

// Peak bytes of building the tables: cos and sin (max_seq_len, head_dim / 2) float32, plus the
// angles they come from and the positions.
double rope_table_bytes(int64_t head_dim, int64_t max_seq_len);

// Holds the cos/sin tables for positions [0, max_seq_len) as buffers `cos` and `sin`
// (max_seq_len, head_dim / 2), so they follow the module across devices. They are derived
// values, rebuilt at construction; checkpoints need not store them.
class RotaryEmbedding : public torch::nn::Module {
 public:
  // ConfigError, before allocating, when the tables alone exceed this machine's memory.
  RotaryEmbedding(int64_t head_dim, int64_t max_seq_len, double theta, const RopeScaling* scaling);
  // With YaRN frequencies (yarn_frequencies) instead, or plain ones when !yarn.enabled().
  RotaryEmbedding(int64_t head_dim, int64_t max_seq_len, double theta, const YarnScaling& yarn);

  // x (bs, seqlen, n_heads, head_dim) rotated for its tokens' absolute `positions` (seqlen), or
  // (bs, seqlen) per row (packed samples restarting at 0), int64, each < max_seq_len (checked when
  // they are in host memory; on a GPU the caller must ensure it); undefined: positions [0, seqlen).
  // Context parallelism passes the positions of its sequence chunks, incremental inference those
  // after the cached ones.
  at::Tensor forward(const at::Tensor& x, const at::Tensor& positions = {}) const;
  // x rotated for positions [start_pos, start_pos + seqlen) (incremental inference): the tables'
  // rows are views, with no index lookup and no read-back of the largest position per call.
  at::Tensor forward_from(const at::Tensor& x, int64_t start_pos) const;

  at::Tensor cos;
  at::Tensor sin;
  // Positions [0, seqlen) and forward_from's ranges of float32 / bfloat16 CPU inputs through the
  // fused CPU kernel (titan/models/common/fused_ops.h; compile.enable, and `titan generate`).
  bool fused = false;

 private:
  // Checks the tables fit this machine, then builds them from the frequencies `freqs()`.
  void build_tables(int64_t head_dim, int64_t max_seq_len,
                    const std::function<at::Tensor()>& freqs);
};

}  // namespace titan
