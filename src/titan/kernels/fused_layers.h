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

// SwiGLU of a bf16 model whose matmuls run in float32 on the rounded operands
// (widens_reduced_matmul), on the two float32 products: the roundings the bf16 ops between the
// casts make, in one pass. a = bf16(gate), b = bf16(up), h = bf16(bf16(silu(a)) * b), as
// at::silu(gate.to(bf16)) * up.to(bf16), then .to(kFloat), computes (up to titan's sigmoid, which
// can move a product across a bf16 rounding boundary). gate and up float32 of one shape ->
// {h float32, a and b in bf16 (what the backward reads)}.
std::tuple<at::Tensor, at::Tensor, at::Tensor> widened_swiglu_forward(const at::Tensor& gate,
                                                                      const at::Tensor& up);
// The gradients as the bf16 ops' backward gives them, with grad (float32, of the forward's h)
// rounded to bf16 first and each result rounded to bf16: -> grad_gate, grad_up in float32.
std::pair<at::Tensor, at::Tensor> widened_swiglu_backward(const at::Tensor& grad,
                                                          const at::Tensor& a, const at::Tensor& b);

// x (float32, any shape) rounded to the nearest bfloat16 (ties to even; NaN stays NaN) and kept
// in float32: x.to(kBFloat16).to(kFloat) bit for bit (NaN for NaN), in one pass and one float32
// allocation (the two casts take two passes and a bf16 tensor between them). For the weights of a
// matmul that runs in float32 on bf16-rounded operands (widens_reduced_matmul), and for their
// gradients.
at::Tensor round_to_bf16(const at::Tensor& x);

// RoPE on interleaved pairs (x[2i], x[2i+1]) of x (bs, seqlen, n_heads, head_dim), position s
// rotated by the angle whose cos and sin are cos[s][i], sin[s][i] (tables (>= seqlen, head_dim /
// 2), float32). inverse: rotate the other way (the backward: grad_x = rope(grad, -angle)).
at::Tensor rope_rotate(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                       bool inverse);

}  // namespace titan::kernels
