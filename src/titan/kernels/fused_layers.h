// Fused CPU kernels for the layers of a Llama-style block, each a forward and a backward that
// read and write every element once (the ATen compositions they replace take 4-8 passes and keep
// more tensors alive for the backward): RMSNorm, SwiGLU and RoPE. float32 and bfloat16 tensors
// on the CPU, any shape (made contiguous first), arithmetic in float32 with one rounding at the
// end; other dtypes and devices are the caller's to route elsewhere (cpu_fusable()).
// Vectorized per instruction set at run time (cpu_simd.h), rows or elements split over ATen's
// thread pool. Gradient reductions (RMSNorm's weight) sum fixed blocks of rows in a fixed order,
// so results do not depend on the number of threads.
#pragma once

#include <ATen/ATen.h>

#include <tuple>
#include <utility>

namespace titan::kernels {

// True when the fused CPU kernels take these tensors: all on the CPU, float32 or bfloat16.
bool cpu_fusable(std::initializer_list<at::Tensor> tensors);

// Whether the layers should use a fused kernel for `dtype`, by measurement (bench/kernel_bench,
// 2-core AVX-512 CPU): RoPE always (3.6-4.8x); RMSNorm and SwiGLU in float32 (1.0-1.2x) but not
// in bfloat16, where ATen's kernels (AVX-512 BF16 conversions, Sleef exp) still win (0.5-0.97x).
enum class FusedOp { kRmsNorm, kSwiGLU, kRope };
bool fused_is_faster(FusedOp op, at::ScalarType dtype);

// RMSNorm: y = x * rstd * weight, rstd = 1 / sqrt(mean(x^2 over the last dim) + eps).
// x (..., dim), weight (dim) -> y (x's dtype), rstd (x.numel() / dim rows) float32.
std::pair<at::Tensor, at::Tensor> rms_norm_forward(const at::Tensor& x, const at::Tensor& weight,
                                                   double eps);
// -> grad_x (x's dtype), grad_weight (weight's dtype). A defined `residual_grad` (x's shape and
// dtype) is added to grad_x in the same pass (the residual add + RMSNorm's backward).
std::pair<at::Tensor, at::Tensor> rms_norm_backward(const at::Tensor& grad, const at::Tensor& x,
                                                    const at::Tensor& weight,
                                                    const at::Tensor& rstd,
                                                    const at::Tensor& residual_grad = {});

// Residual add + RMSNorm, one pass over the rows: h = x + delta (rounded to the dtype, as ATen's
// add), y = RMSNorm(h). x and delta of one shape and dtype. -> h, y (x's dtype), rstd float32.
std::tuple<at::Tensor, at::Tensor, at::Tensor> add_rms_norm_forward(const at::Tensor& x,
                                                                    const at::Tensor& delta,
                                                                    const at::Tensor& weight,
                                                                    double eps);

// SwiGLU's product: h = silu(gate) * up, elementwise; gate and up of one shape and dtype.
at::Tensor swiglu_forward(const at::Tensor& gate, const at::Tensor& up);
// -> grad_gate, grad_up.
std::pair<at::Tensor, at::Tensor> swiglu_backward(const at::Tensor& grad, const at::Tensor& gate,
                                                  const at::Tensor& up);

// RoPE on interleaved pairs (x[2i], x[2i+1]) of x (bs, seqlen, n_heads, head_dim), position s
// rotated by the angle whose cos and sin are cos[s][i], sin[s][i] (tables (>= seqlen, head_dim /
// 2), float32). inverse: rotate the other way (the backward: grad_x = rope(grad, -angle)).
at::Tensor rope_rotate(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                       bool inverse);

}  // namespace titan::kernels
