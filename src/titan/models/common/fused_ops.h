// The fused CPU kernels (titan/kernels/fused_layers.h) as autograd ops, for the layers to call
// when their `fused` switch is on (compile.enable; see titan/models/converters.h) and the tensors
// are float32 or bfloat16 on the CPU. Each keeps less for the backward than the composition it
// replaces: RMSNorm its input and 1/rms, SwiGLU its two inputs (not silu(gate)), RoPE nothing but
// the tables.
#pragma once

#include <ATen/ATen.h>

#include <utility>

namespace titan {

// x (..., dim), weight (dim) -> x's dtype.
at::Tensor fused_rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);
// The residual add and the RMSNorm after it, one pass: h = x + delta, y = RMSNorm(h); x and delta
// of one shape and dtype. Returns {h, y}; keeps h and 1/rms for the backward, which adds the two
// gradients reaching h (through the residual stream and through the norm) in the same pass.
std::pair<at::Tensor, at::Tensor> fused_add_rms_norm(const at::Tensor& x, const at::Tensor& delta,
                                                     const at::Tensor& weight, double eps);
// silu(gate) * up.
at::Tensor fused_swiglu(const at::Tensor& gate, const at::Tensor& up);
// silu(gate) * up of a bf16 model whose matmuls run in float32 on the rounded operands, on the
// float32 products (kernels::widened_swiglu_forward): -> float32 holding bf16 values, what
// at::silu(gate.to(bf16)) * up.to(bf16) and a cast back to float32 compute, in one pass each way.
// Keeps the two inputs rounded to bf16 for the backward.
at::Tensor widened_swiglu(const at::Tensor& gate, const at::Tensor& up);
// RoPE of x (bs, seqlen, n_heads, head_dim) with tables cos, sin (>= seqlen, head_dim / 2).
at::Tensor fused_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

}  // namespace titan
