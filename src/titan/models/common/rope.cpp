// RoPE tables and rotation (see rope.h).
#include "titan/models/common/rope.h"

#include "titan/common/check.h"
#include "titan/common/cpu.h"
#include "titan/common/format.h"
#include "titan/common/phase.h"
#include "titan/kernels/fused_layers.h"
#include "titan/models/common/fused_ops.h"
#include "titan/models/common/linear.h"

#include <algorithm>
#include <cmath>

namespace titan {

at::Tensor rope_frequencies(int64_t head_dim, double theta, const RopeScaling* scaling) {
  TITAN_CHECK(head_dim > 0 && head_dim % 2 == 0, "RoPE needs an even head_dim, got ", head_dim);
  const at::Tensor exponent =
      at::arange(0, head_dim, 2, at::kFloat) / static_cast<double>(head_dim);
  // `scalar / tensor` in Python is reciprocal(tensor) * scalar; written the same way here so the
  // float32 tables match TorchTitan's bit for bit.
  at::Tensor freqs = at::pow(theta, exponent).reciprocal();  // (head_dim / 2)
  if (scaling == nullptr) {
    return freqs;
  }
  const double orig = static_cast<double>(scaling->original_max_position_embeddings);
  const double low = scaling->low_freq_factor;
  const double high = scaling->high_freq_factor;
  const double factor = scaling->scaling_factor;
  const at::Tensor wavelen = freqs.reciprocal() * (2 * M_PI);
  const double high_freq_wavelen = orig / high;
  const double low_freq_wavelen = orig / low;
  // Long wavelengths (low frequencies) are slowed down by the scaling factor.
  freqs = at::where(wavelen > low_freq_wavelen, freqs / factor, freqs);
  // The band between the two wavelengths blends the slowed and the original frequency. Equal
  // factors (Llama 4) leave no band: nothing to blend (and no division by zero).
  if (high == low) return freqs;
  const at::Tensor smooth = (wavelen.reciprocal() * orig - low) / (high - low);
  const at::Tensor smoothed = (1 - smooth) * freqs / factor + smooth * freqs;
  const at::Tensor is_medium =
      (wavelen >= high_freq_wavelen).logical_and(wavelen <= low_freq_wavelen);
  return at::where(is_medium, smoothed, freqs);
}

at::Tensor yarn_frequencies(int64_t dim, double theta, const YarnScaling& yarn) {
  const at::Tensor freqs = rope_frequencies(dim, theta, /*scaling=*/nullptr);  // (dim / 2)
  if (!yarn.enabled()) return freqs;
  TITAN_CHECK(yarn.beta_fast > 0 && yarn.beta_slow > 0 && yarn.original_seq_len > 0,
              "YaRN needs beta_fast, beta_slow and original_seq_len > 0, got ", yarn.beta_fast,
              ", ", yarn.beta_slow, ", ", yarn.original_seq_len);
  // The dimension index whose frequency turns `rotations` times over original_seq_len positions.
  const auto correction_dim = [&](double rotations) {
    return static_cast<double>(dim) *
           std::log(static_cast<double>(yarn.original_seq_len) / (rotations * 2 * M_PI)) /
           (2 * std::log(theta));
  };
  const double fast = correction_dim(yarn.beta_fast), slow = correction_dim(yarn.beta_slow);
  const double low = std::max(yarn.truncate ? std::floor(fast) : fast, 0.0);
  double high = std::min(yarn.truncate ? std::ceil(slow) : slow, static_cast<double>(dim - 1));
  if (low == high) high += 0.001;  // no division by zero
  // 0 below `low` (keep the frequency), 1 above `high` (divide it by the factor).
  const at::Tensor ramp = ((at::arange(dim / 2, at::kFloat) - low) / (high - low)).clamp(0, 1);
  return freqs / yarn.factor * ramp + freqs * (1 - ramp);
}

double yarn_mscale(double factor, double mscale) {
  return factor > 1.0 ? 0.1 * mscale * std::log(factor) + 1.0 : 1.0;
}

at::Tensor apply_rotary_emb(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t bs = x.size(0);
  const int64_t seqlen = x.size(1);
  const int64_t n_heads = x.size(2);
  const int64_t half = x.size(3) / 2;
  const bool per_row = cos.dim() == 3;  // (bs, seqlen, head_dim / 2)
  TITAN_CHECK(per_row || seqlen <= cos.size(0), "sequence length ", seqlen,
              " exceeds the RoPE table (", cos.size(0),
              " positions). HINT: build the model with max_seq_len >= seq_len");
  TITAN_CHECK(half == cos.size(-1), "RoPE table is for head_dim ", 2 * cos.size(-1),
              ", input has head_dim ", x.size(3));
  // (seqlen, 1, head_dim / 2), or (bs, seqlen, 1, head_dim / 2) per row
  const at::Tensor c = per_row ? cos.unsqueeze(2) : cos.narrow(0, 0, seqlen).unsqueeze(1);
  const at::Tensor s = per_row ? sin.unsqueeze(2) : sin.narrow(0, 0, seqlen).unsqueeze(1);
  const at::Tensor pairs =
      x.to(upcast_dtype(x.scalar_type())).reshape({bs, seqlen, n_heads, half, 2});
  const at::Tensor x0 = pairs.select(-1, 0);  // (bs, seqlen, n_heads, head_dim / 2)
  const at::Tensor x1 = pairs.select(-1, 1);
  // (x0 + i x1) * (c + i s): the complex rotation of each pair.
  const at::Tensor out = at::stack({x0 * c - x1 * s, x0 * s + x1 * c}, -1);
  return out.view({bs, seqlen, n_heads, 2 * half}).to(x.scalar_type());
}

double rope_table_bytes(int64_t head_dim, int64_t max_seq_len) {
  return static_cast<double>(max_seq_len) * (6.0 * static_cast<double>(head_dim) + 4.0);
}

RotaryEmbedding::RotaryEmbedding(int64_t head_dim, int64_t max_seq_len, double theta,
                                 const RopeScaling* scaling) {
  build_tables(head_dim, max_seq_len, [&] { return rope_frequencies(head_dim, theta, scaling); });
}

RotaryEmbedding::RotaryEmbedding(int64_t head_dim, int64_t max_seq_len, double theta,
                                 const YarnScaling& yarn) {
  build_tables(head_dim, max_seq_len, [&] { return yarn_frequencies(head_dim, theta, yarn); });
}

void RotaryEmbedding::build_tables(int64_t head_dim, int64_t max_seq_len,
                                   const std::function<at::Tensor()>& freqs) {
  // The one buffer that grows with the sequence length alone: every path that builds a model
  // (train, generate from a flavor, a checkpoint or a Hugging Face folder) passes here.
  const double need = rope_table_bytes(head_dim, max_seq_len);
  const double memory = machine_memory_bytes();
  if (memory > 0 && need > memory) {
    throw ConfigError(
        message("the RoPE tables for max_seq_len ", max_seq_len, " positions (head_dim ", head_dim,
                ") need about ", gib_text(need), ", more than this machine's ", gib_text(memory),
                ". HINT: lower the sequence length: --max_seq_len for `titan generate`, "
                "training.seq_len for `titan train`"));
  }
  // float32 angles, like TorchTitan's torch.outer(t, freqs).
  const at::Tensor angles = at::outer(at::arange(max_seq_len, at::kFloat), freqs());
  cos = register_buffer("cos", angles.cos());
  sin = register_buffer("sin", angles.sin());
}

at::Tensor RotaryEmbedding::forward(const at::Tensor& x, const at::Tensor& positions) const {
  if (!positions.defined()) return forward_from(x, 0);
  const TraceSpan span("rope");
  const bool per_row = positions.dim() == 2;  // packed samples: each row its own positions
  TITAN_CHECK((positions.dim() == 1 && positions.size(0) == x.size(1)) ||
                  (per_row && positions.size(0) == x.size(0) && positions.size(1) == x.size(1)),
              "RoPE positions must be (", x.size(1), ") or (", x.size(0), ", ", x.size(1),
              "), got ", positions.sizes());
  // Positions in host memory are checked here; on a GPU that would wait for the device in every
  // layer, so there the caller vouches for them (context parallelism's layout holds positions
  // below the sequence length the model was built for).
  if (positions.device().is_cpu() && positions.numel() > 0) {
    const int64_t last = positions.max().item<int64_t>();
    TITAN_CHECK(last < cos.size(0), "position ", last, " is past the RoPE table (", cos.size(0),
                " positions). HINT: build the model with a larger max_seq_len");
  }
  if (per_row) {
    const at::Tensor flat = positions.reshape({-1});
    const std::vector<int64_t> shape{x.size(0), x.size(1), cos.size(1)};
    return apply_rotary_emb(x, cos.index_select(0, flat).view(shape),
                            sin.index_select(0, flat).view(shape));
  }
  return apply_rotary_emb(x, cos.index_select(0, positions), sin.index_select(0, positions));
}

at::Tensor RotaryEmbedding::forward_from(const at::Tensor& x, int64_t start_pos) const {
  const TraceSpan span("rope");
  const int64_t n = x.size(1);
  TITAN_CHECK(start_pos >= 0 && start_pos + n <= cos.size(0), "positions [", start_pos, ", ",
              start_pos + n, ") are past the RoPE table (", cos.size(0),
              " positions). HINT: build the model with a larger max_seq_len");
  const at::Tensor c = cos.narrow(0, start_pos, n), s = sin.narrow(0, start_pos, n);
  if (fused && kernels::cpu_fusable({x}) && x.dim() == 4) return fused_rope(x, c, s);
  return apply_rotary_emb(x, c, s);
}

}  // namespace titan
