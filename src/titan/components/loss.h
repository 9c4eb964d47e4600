// The training loss: next-token cross-entropy over packed sequences. Labels equal to
// kernels::kIgnoreIndex (-100: padding, and the prompt tokens of chat fine-tuning) are not
// predicted. Logits are upcast to float32 before the log-softmax.
//
// Two normalizations: the mean over a batch's predicted tokens (pretraining, where every token is
// predicted and batches are equally weighted), and, for data where the predicted tokens differ
// between batches (chat SFT), TorchTitan's mean over the predicted tokens of the whole global
// batch: each piece of the batch contributes its loss sum divided by the global count
// (token_weighted_loss), so every predicted token weighs the same whatever piece it falls in.
#pragma once

#include <ATen/ATen.h>

namespace titan {

// logits (bs, seqlen, vocab), labels (bs, seqlen) int64 -> 0-d float32 mean over the predicted
// tokens (0 when there are none, with zero gradients).
at::Tensor lm_cross_entropy_loss(const at::Tensor& logits, const at::Tensor& labels);

// Number of predicted tokens (labels != -100), a 0-d int64 tensor on labels' device.
at::Tensor predicted_tokens(const at::Tensor& labels);

// `mean` (a 0-d loss that is a mean over the predicted tokens of `labels`) turned into their
// sum times `factor`: the share of a global-batch token mean when factor is 1 / (the global
// batch's predicted tokens), times the number of equal shares the caller averages over.
at::Tensor token_weighted_loss(const at::Tensor& mean, const at::Tensor& labels, double factor);

}  // namespace titan
