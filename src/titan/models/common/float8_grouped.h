// Float8 rowwise grouped GEMMs for the MoE experts in one launch per GEMM (torchao's
// _Float8GroupedMM, the numbers of moe.h's kFloat8Rowwise): ATen's at::_scaled_grouped_mm on CUDA
// GPUs that have it (compute capability 9.x), or an emulation of that op, group by group in
// float32, anywhere (tests).
//
//   forward      x cast per row along K, w per (expert, output feature) along K
//   grad_input   grad_output per row along N, w per (expert, input feature) along N
//   grad_weight  grad_output and x per (expert, column) over that expert's rows only
// e4m3 everywhere, power-of-2 scales. The loop of moe.h (one float8_linear per expert) computes
// the same products; this form hands all experts to one kernel.
#pragma once

#include <ATen/ATen.h>

namespace titan {

// The scaled grouped GEMM, as at::_scaled_grouped_mm defines it (scales are the dequantization
// multipliers, float32; groups along the rows of `a` or along the reduced dim; `offs` (groups)
// int32, each group's end, the last one a's rows or the reduced dim):
//   2d x 3d  a (M, K) float8 row-major, b (G, K, N) float8 column-major per group, scale_a (M),
//            scale_b (G, N) -> (M, N): group g's rows of a times b[g]
//   2d x 2d  a (m, T) float8 row-major, b (T, n) float8 column-major, scale_a (G * m),
//            scale_b (G * n) -> (G, m, n): group g's slice of T in both
// emulate: dequantize and multiply each group in float32 (reads offs on the host), the product
// rounded to out_dtype; otherwise ATen's kernel.
at::Tensor scaled_grouped_mm(const at::Tensor& a, const at::Tensor& b, const at::Tensor& scale_a,
                             const at::Tensor& scale_b, const at::Tensor& offs,
                             at::ScalarType out_dtype, bool emulate);

// x (rows, K) grouped by expert, group e's rows ending at offs[e] (int32; rows past a group's
// tokens are zero padding, so that each group's size is a multiple of 16 as the kernels need)
// @ w (experts, N, K)^T per group -> (rows, N) in x's dtype, with float8 rowwise GEMMs forward
// and backward (gradients to x and w).
at::Tensor float8_grouped_mm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& offs,
                             bool emulate);

}  // namespace titan
