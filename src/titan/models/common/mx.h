// The OCP microscaling (MX) format for MXFP8, as torchao's reference casts (to_mx, the FLOOR scale
// rule of the "mxfp8_cublas" recipe): along the last dimension, blocks of 32 values share one
// power-of-two scale stored as E8M0 (a biased exponent byte: 2^(byte - 127), 255 = NaN), and the
// values are float8 e4m3fn.
//
//   scale exponent = floor(log2(amax of the block)) - 8   (e4m3's largest power of two, 2^8),
//                    clamped to [-127, 128]; a NaN in the block gives the NaN scale
//   element        = value / 2^exponent (2^-126 for the smallest exponent), clamped to +-448 and
//                    rounded to e4m3fn
//
// so a block's largest value lands in [256, 512) before the clamp: up to 1.75 x 2^8 it is kept,
// above it saturates to 448. The RCEIL rule (torchao's ScaleCalculationMode.RCEIL, cuBLAS's and
// the default of torchao's MXFP8 grouped GEMMs) rounds the scale up instead, so nothing saturates:
//
//   scale exponent = ceil(log2(amax / 448)), clamped to [-127, 127]; a NaN amax gives the NaN
//                    scale, an infinite one byte 254
//   element        = value * 2^-exponent (times 1 for byte 0, times 2^-127 for byte 254, as
//                    torchao's reference computes it), clamped to +-448, rounded to e4m3fn
//
// The functions are ATen ops: the same numbers on every device (the emulated MX GEMM dequantizes
// and multiplies in float32).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace titan {

constexpr int64_t kMxBlock = 32;

// How a block's scale is chosen (above).
enum class MxScaleRule { kFloor, kRceil };

struct MxTensor {
  at::Tensor data;   // float8 e4m3fn, the input's shape
  at::Tensor scale;  // uint8 biased E8M0 exponents: the input's shape with the last dim / 32
};

// `x` (float32 or bfloat16; the last dimension a multiple of 32) in MXFP8. Throws naming the
// shape otherwise.
MxTensor to_mx(const at::Tensor& x, MxScaleRule rule = MxScaleRule::kFloor);

// The values an MX tensor stands for, in `dtype` (NaN where the scale is NaN).
at::Tensor from_mx(const MxTensor& t, at::ScalarType dtype = at::kFloat);

// The float32 powers of two of E8M0 bytes (byte 0: 2^-127, a subnormal; 255: NaN).
at::Tensor e8m0_to_float(const at::Tensor& scale);

// a (m, k) @ b (n, k)^T with both operands cast to MXFP8 along k (their last dim), emulated: the
// dequantized operands multiplied in float32, the product in `dtype`.
at::Tensor mx_mm_nt(const at::Tensor& a, const at::Tensor& b, at::ScalarType dtype,
                    MxScaleRule rule = MxScaleRule::kFloor);

// x (..., in) @ weight (out, in)^T -> (..., out) in x's dtype, with all three GEMMs in MXFP8
// (torchao's MXLinear with the mxfp8_cublas recipe, emulated): forward blocks x and the weight
// along in; grad_input blocks grad_output and the weight along out; grad_weight blocks
// grad_output and x along the tokens. in, out and the token count must be multiples of 32
// (a refusal names the operand otherwise).
at::Tensor mx_linear(const at::Tensor& x, const at::Tensor& weight,
                     MxScaleRule rule = MxScaleRule::kFloor);

}  // namespace titan
