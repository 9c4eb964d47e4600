// The training loss: next-token cross-entropy over packed sequences (every position counts; the
// packing has no padding). Logits are upcast to float32 before the log-softmax.
#pragma once

#include <ATen/ATen.h>

namespace titan {

// logits (bs, seqlen, vocab), labels (bs, seqlen) int64 -> 0-d float32 mean over tokens.
at::Tensor lm_cross_entropy_loss(const at::Tensor& logits, const at::Tensor& labels);

}  // namespace titan
