// NF4 storage of frozen weights (QLoRA): 4-bit NormalFloat codes in blocks with an absmax scale
// each, and double quantization of those scales to 8 bits. The layout and arithmetic are those of
// bitsandbytes' `quantize_4bit(..., quant_type="nf4", compress_statistics=True)`, so a weight
// quantized here holds the codes and scales that bitsandbytes gives the same weight:
//
//   - the weight, flattened, falls into blocks of `blocksize` (64) elements; each block's scale is
//     its largest magnitude (float32), and each element is the index of the NF4 value nearest to
//     clamp(x * (1 / scale), -1, 1) (the first of two equally near ones);
//   - two codes per byte, element 2i in the high nibble; an odd count pads with the code of 0;
//   - double quantization: the mean of the scales is subtracted and the centred scales are
//     quantized the same way, in blocks of 256, to 8-bit indices into the signed dynamic map,
//     with a float32 scale per block of 256.
//
// Dequantization multiplies each code's value by its block's (reconstructed) scale in float32 and
// rounds the product to the weight's dtype once. A block of zeros keeps the code of 0 (any code
// gives 0 there; bitsandbytes' codes for it are arbitrary).
#pragma once

#include <ATen/ATen.h>

#include <array>
#include <cstdint>
#include <vector>

namespace titan::kernels {

// The 16 NF4 values (the QLoRA paper's quantiles of N(0, 1), scaled to [-1, 1]), ascending; the
// value 0 is index 7.
const std::array<float, 16>& nf4_code();
constexpr uint8_t kNf4ZeroCode = 7;

// The 256 values of the signed dynamic 8-bit map (a decimal exponent from 1e-6 to 1 and a linear
// fraction whose resolution grows with the exponent, plus 0 and 1), ascending, in float32 as
// bitsandbytes' `create_dynamic_map(signed=True)` computes them (to within one float32 step:
// torch.linspace's vectorized loop rounds a few of its inputs differently on some CPUs).
const std::array<float, 256>& dynamic_map_signed();

struct Nf4Options {
  int64_t blocksize = 64;         // elements per NF4 scale (even)
  bool double_quant = true;       // store the scales as 8-bit indices (QLoRA's double quantization)
  int64_t scale_blocksize = 256;  // scales per float32 scale of the double quantization
};

// A weight in NF4. Sizes and dtype are the original weight's.
struct Nf4Weight {
  at::Tensor packed;        // uint8 (ceil(numel / 2)): element 2i high nibble, 2i + 1 low nibble
  at::Tensor absmax;        // float32 (blocks): the scales, without double quantization
  at::Tensor absmax_code;   // uint8 (blocks): the scales' indices into dynamic_map_signed()
  at::Tensor absmax_scale;  // float32 (ceil(blocks / scale_blocksize)): per block of scales
  float absmax_offset = 0;  // the scales' mean, subtracted before their quantization
  std::vector<int64_t> sizes;
  at::ScalarType dtype = at::kFloat;
  int64_t blocksize = 64;
  int64_t scale_blocksize = 256;

  bool double_quant() const { return absmax_code.defined(); }
  int64_t numel() const;
  int64_t blocks() const;
  // Bytes held: codes, scales and the scales' scales (4.13 bits per element at the defaults).
  int64_t nbytes() const;
};

// Bytes per element of a large weight in NF4 under `options` (codes and scales, without a
// tensor's few fixed bytes): 0.516, 4.13 bits, at the defaults. For memory estimates.
double nf4_bytes_per_weight(const Nf4Options& options = {});

// Quantizes a float32, bfloat16 or float16 CPU tensor of any shape and finite values.
Nf4Weight nf4_quantize(const at::Tensor& weight, const Nf4Options& options = {});

// The float32 scale of every block: absmax, or with double quantization
// dynamic_map_signed()[absmax_code] * absmax_scale[block / scale_blocksize] + absmax_offset.
at::Tensor nf4_block_scales(const Nf4Weight& weight);

// The weight back, in DTYPE (float32, bfloat16 or float16), on the weight's device:
// value(code) * scale per element in float32, rounded to DTYPE once. On the CPU one pass through a
// per-block table of the 16 products; elsewhere (CUDA) the same arithmetic as ATen ops
// (nf4_dequantize_aten), which give the same bits.
at::Tensor nf4_dequantize(const Nf4Weight& weight, at::ScalarType dtype);
at::Tensor nf4_dequantize_aten(const Nf4Weight& weight, at::ScalarType dtype);

// The weight's tensors moved to DEVICE (quantization runs on the CPU; training may not).
Nf4Weight nf4_to(const Nf4Weight& weight, const at::Device& device);

}  // namespace titan::kernels
