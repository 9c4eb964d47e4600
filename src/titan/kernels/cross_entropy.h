// Row kernels of the fused linear + cross-entropy (models/common/fused_loss.h): the statistics of
// a block of logits and their gradient, computed in place, so that the loss only ever holds one
// block of (tokens, vocab) logits. Each row is read from cache three times (max, sum of exp, then
// the gradient written over it) where log_softmax, nll_loss and their backward take six passes
// and two full-size temporaries. float32 or bfloat16 logits on the CPU, arithmetic in float32;
// rows split over ATen's thread pool, vectorized per instruction set (cpu_simd.h).
#pragma once

#include <ATen/ATen.h>

namespace titan::kernels {

// Labels equal to this are not predicted (PyTorch's cross-entropy default).
constexpr int64_t kIgnoreIndex = -100;

// For each row r of `logits` (rows, n), which holds the logits of vocabulary ids
// [vocab_start, vocab_start + n) (a tensor-parallel shard, or the whole vocabulary at 0):
//   lse[r]    = log(sum_j exp(logits[r][j]))
//   target[r] = logits[r][labels[r] - vocab_start] if labels[r] falls in the shard, else 0.
// labels (rows) int64; lse and target (rows) float32 are written.
void cross_entropy_stats(const at::Tensor& logits, const at::Tensor& labels, int64_t vocab_start,
                         at::Tensor& lse, at::Tensor& target);

// Overwrites `logits` with the gradient of sum_r scale[r] * (lse[r] - target[r]):
//   logits[r][j] = scale[r] * (exp(logits[r][j] - lse[r]) - [j == labels[r] - vocab_start]).
// `lse` (rows) float32 is the log-sum-exp over the whole vocabulary (all shards); scale (rows)
// float32 (0 for ignored rows).
void cross_entropy_grad_(at::Tensor& logits, const at::Tensor& labels, int64_t vocab_start,
                         const at::Tensor& lse, const at::Tensor& scale);

// Both at once for logits that hold the whole vocabulary: writes lse and target as
// cross_entropy_stats, then the gradient as cross_entropy_grad_, each row while it is in cache.
void cross_entropy_stats_grad_(at::Tensor& logits, const at::Tensor& labels,
                               const at::Tensor& scale, at::Tensor& lse, at::Tensor& target);

}  // namespace titan::kernels
