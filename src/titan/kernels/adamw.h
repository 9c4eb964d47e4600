// One-pass AdamW / Adam update on CPU: each element of the parameter, its gradient and its two
// moments is read once and written once, in float32 arithmetic, where ATen's composition of the
// same update (mul_, lerp_, mul_, addcmul_, sqrt, div, add_, addcdiv_) makes six passes over
// memory and, in bfloat16, rounds after every one of them.
//
// The math is torch.optim.AdamW's (and torch.optim.Adam's): bias-corrected moments, eps added
// after the bias-corrected square root, decoupled decay p *= 1 - lr * wd (AdamW) or L2 decay
// g += wd * p (Adam).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace titan::kernels {

struct AdamStepOptions {
  double lr = 0;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0;
  bool decoupled = true;  // AdamW (p *= 1 - lr * wd) vs Adam (g += wd * p)
  int64_t step = 1;       // 1-based count of this update, for the bias corrections
  // 0-d float32 CPU tensor multiplying every gradient as it is read (the clipping coefficient;
  // the gradient itself is left as it is). Undefined: 1. AdamW (or no decay) only: Adam's L2
  // term would round differently from ATen's ops, so Adam's callers scale the gradient first.
  at::Tensor grad_scale;
};

// Whether adam_step can update these tensors: all on CPU, all float32 or all bfloat16 (or float32
// parameter and gradient with bfloat16 moments: optimizer.state_dtype), the same sizes and
// strides, dense and non-overlapping (a transposed layout is fine, a slice is not). Anything else
// (CUDA, float64, other mixes or layouts) is the caller's to do with ATen.
bool adam_step_supported(const at::Tensor& param, const at::Tensor& grad, const at::Tensor& exp_avg,
                         const at::Tensor& exp_avg_sq);

// Updates param, exp_avg and exp_avg_sq in place; requires adam_step_supported.
void adam_step(const at::Tensor& param, const at::Tensor& grad, const at::Tensor& exp_avg,
               const at::Tensor& exp_avg_sq, const AdamStepOptions& options);

}  // namespace titan::kernels
