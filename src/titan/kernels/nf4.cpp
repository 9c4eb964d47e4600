// NF4 quantization and dequantization on the CPU (see nf4.h for the format).
#include "titan/kernels/nf4.h"

#include "titan/common/check.h"

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>

namespace titan::kernels {
namespace {

// torch.linspace(start, end, steps) in float32 as ATen's scalar CPU loop computes it: the first
// half counts up from start, the second half down from end.
std::vector<float> linspace_f32(float start, float end, int64_t steps) {
  std::vector<float> out(steps);
  const float step = (end - start) / static_cast<float>(steps - 1);
  const int64_t halfway = steps / 2;
  for (int64_t i = 0; i < steps; ++i) {
    out[i] = i < halfway ? start + step * static_cast<float>(i)
                         : end - step * static_cast<float>(steps - i - 1);
  }
  return out;
}

std::array<float, 256> make_dynamic_map_signed() {
  // 7 exponent steps (1e-6 .. 1) of 2^i linear fractions each, both signs: 254 values, with 0 and
  // 1 the 256 of an 8-bit code.
  constexpr int kExponents = 7;
  std::vector<float> data;
  for (int i = 0; i < kExponents; ++i) {
    const std::vector<float> bounds = linspace_f32(0.1f, 1.0f, (int64_t{1} << i) + 1);
    const float decade = static_cast<float>(std::pow(10.0, i - (kExponents - 1)));
    for (size_t k = 0; k + 1 < bounds.size(); ++k) {
      const float mean = (bounds[k] + bounds[k + 1]) / 2.0f;
      data.push_back(decade * mean);
      data.push_back(-(decade * mean));
    }
  }
  data.push_back(0.0f);
  data.push_back(1.0f);
  TITAN_CHECK(data.size() == 256, "dynamic map: ", data.size(), " values, not 256");
  std::sort(data.begin(), data.end());
  std::array<float, 256> out{};
  std::copy(data.begin(), data.end(), out.begin());
  return out;
}

// The index of the entry of the ascending table CODE nearest to X, the first of two equally near
// (torch.argmin(|x - code|)): a binary search, then the neighbours settle ties and rounding.
template <size_t N>
uint8_t nearest(const std::array<float, N>& code, float x) {
  int64_t j = std::lower_bound(code.begin(), code.end(), x) - code.begin();
  j = std::min<int64_t>(j, N - 1);
  while (j > 0 && std::abs(x - code[j - 1]) <= std::abs(x - code[j])) --j;
  while (j + 1 < static_cast<int64_t>(N) && std::abs(x - code[j + 1]) < std::abs(x - code[j])) ++j;
  return static_cast<uint8_t>(j);
}

// Blockwise absmax quantization of the float32 values X (n) against CODE: the block maxima go to
// ABSMAX (blocks), the code indices to CODES (n, one per byte).
template <size_t N>
void quantize_blocks(const float* x, int64_t n, int64_t blocksize, const std::array<float, N>& code,
                     float* absmax, uint8_t* codes) {
  const int64_t blocks = (n + blocksize - 1) / blocksize;
  at::parallel_for(0, blocks, 64, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t lo = b * blocksize, hi = std::min(n, lo + blocksize);
      float m = 0;
      for (int64_t i = lo; i < hi; ++i) m = std::max(m, std::abs(x[i]));
      absmax[b] = m;
      const float inv = 1.0f / m;
      for (int64_t i = lo; i < hi; ++i) {
        // A zero block: 0 * inf is NaN, and every code gives 0; keep the code of 0.
        codes[i] = m > 0 ? nearest(code, std::clamp(x[i] * inv, -1.0f, 1.0f)) : nearest(code, 0.0f);
      }
    }
  });
}

template <typename T>
void dequantize_into(const Nf4Weight& w, const float* scales, T* out) {
  const uint8_t* packed = w.packed.data_ptr<uint8_t>();
  const auto& code = nf4_code();
  const int64_t n = w.numel(), bs = w.blocksize;
  at::parallel_for(0, w.blocks(), 16, [&](int64_t b0, int64_t b1) {
    std::array<T, 16> lut;
    for (int64_t b = b0; b < b1; ++b) {
      for (int k = 0; k < 16; ++k) lut[k] = static_cast<T>(code[k] * scales[b]);
      const int64_t lo = b * bs, hi = std::min(n, lo + bs);  // lo is even: bs is
      int64_t i = lo;
      for (; i + 1 < hi; i += 2) {
        const uint8_t byte = packed[i / 2];
        out[i] = lut[byte >> 4];
        out[i + 1] = lut[byte & 0xF];
      }
      if (i < hi) out[i] = lut[packed[i / 2] >> 4];
    }
  });
}

}  // namespace

const std::array<float, 16>& nf4_code() {
  static const std::array<float, 16> kCode = {-1.0f,
                                              -0.6961928009986877f,
                                              -0.5250730514526367f,
                                              -0.39491748809814453f,
                                              -0.28444138169288635f,
                                              -0.18477343022823334f,
                                              -0.09105003625154495f,
                                              0.0f,
                                              0.07958029955625534f,
                                              0.16093020141124725f,
                                              0.24611230194568634f,
                                              0.33791524171829224f,
                                              0.44070982933044434f,
                                              0.5626170039176941f,
                                              0.7229568362236328f,
                                              1.0f};
  return kCode;
}

const std::array<float, 256>& dynamic_map_signed() {
  static const std::array<float, 256> kMap = make_dynamic_map_signed();
  return kMap;
}

int64_t Nf4Weight::numel() const {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  return n;
}

int64_t Nf4Weight::blocks() const { return (numel() + blocksize - 1) / blocksize; }

int64_t Nf4Weight::nbytes() const {
  int64_t total = packed.nbytes();
  for (const at::Tensor* t : {&absmax, &absmax_code, &absmax_scale}) {
    if (t->defined()) total += t->nbytes();
  }
  return total + static_cast<int64_t>(sizeof(float));  // the offset
}

double nf4_bytes_per_weight(const Nf4Options& options) {
  const double block = static_cast<double>(options.blocksize);
  const double scales =
      options.double_quant
          ? 1.0 / block + 4.0 / (block * static_cast<double>(options.scale_blocksize))
          : 4.0 / block;
  return 0.5 + scales;
}

Nf4Weight nf4_quantize(const at::Tensor& weight, const Nf4Options& options) {
  TITAN_CHECK(weight.device().is_cpu(), "nf4_quantize: the weight is on ", weight.device(),
              "; quantize it on the CPU");
  const auto dtype = weight.scalar_type();
  TITAN_CHECK(dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf,
              "nf4_quantize: a float32, bfloat16 or float16 weight, not ", dtype);
  TITAN_CHECK(options.blocksize >= 2 && options.blocksize % 2 == 0, "nf4_quantize: blocksize ",
              options.blocksize, " must be even (two codes per byte never straddle two blocks)");
  TITAN_CHECK(options.scale_blocksize >= 1, "nf4_quantize: scale_blocksize ",
              options.scale_blocksize, " must be positive");
  TITAN_CHECK(weight.numel() > 0, "nf4_quantize: an empty weight (sizes ", weight.sizes(), ")");

  Nf4Weight w;
  w.sizes = weight.sizes().vec();
  w.dtype = dtype;
  w.blocksize = options.blocksize;
  w.scale_blocksize = options.scale_blocksize;
  const at::Tensor flat = weight.detach().reshape({-1}).to(at::kFloat).contiguous();
  const int64_t n = flat.numel(), blocks = w.blocks();

  TITAN_CHECK(at::isfinite(flat).all().item<bool>(), "nf4_quantize: the weight (sizes ",
              weight.sizes(), ") holds NaN or infinite values");

  at::Tensor absmax = at::empty({blocks}, at::kFloat);
  at::Tensor codes = at::empty({n + (n % 2)}, at::kByte);
  quantize_blocks(flat.data_ptr<float>(), n, w.blocksize, nf4_code(), absmax.data_ptr<float>(),
                  codes.data_ptr<uint8_t>());
  if (n % 2) codes.data_ptr<uint8_t>()[n] = kNf4ZeroCode;  // the pad is a scaled 0
  w.packed = at::empty({(n + 1) / 2}, at::kByte);
  const uint8_t* c = codes.data_ptr<uint8_t>();
  uint8_t* p = w.packed.data_ptr<uint8_t>();
  for (int64_t i = 0; i < w.packed.numel(); ++i) {
    p[i] = static_cast<uint8_t>(c[2 * i] << 4 | c[2 * i + 1]);
  }

  if (!options.double_quant) {
    w.absmax = absmax;
    return w;
  }
  // Double quantization: the centred scales, blockwise against the dynamic map.
  w.absmax_offset = absmax.mean().item<float>();
  const at::Tensor centred = (absmax - w.absmax_offset).contiguous();
  const int64_t scale_blocks = (blocks + w.scale_blocksize - 1) / w.scale_blocksize;
  w.absmax_scale = at::empty({scale_blocks}, at::kFloat);
  w.absmax_code = at::empty({blocks}, at::kByte);
  quantize_blocks(centred.data_ptr<float>(), blocks, w.scale_blocksize, dynamic_map_signed(),
                  w.absmax_scale.data_ptr<float>(), w.absmax_code.data_ptr<uint8_t>());
  return w;
}

at::Tensor nf4_block_scales(const Nf4Weight& w) {
  if (!w.double_quant()) return w.absmax;
  const auto& map = dynamic_map_signed();
  const at::Tensor table =
      at::from_blob(const_cast<float*>(map.data()), {256}, at::kFloat).to(w.absmax_code.device());
  // (blocks): map value * the scale of its block of scales, + offset, in float32 as on the CPU.
  const at::Tensor per_block =
      w.absmax_scale.repeat_interleave(w.scale_blocksize).slice(0, 0, w.blocks());
  return table.index_select(0, w.absmax_code.to(at::kLong)).mul(per_block).add(w.absmax_offset);
}

at::Tensor nf4_dequantize_aten(const Nf4Weight& w, at::ScalarType dtype) {
  const int64_t n = w.numel(), padded = w.blocks() * w.blocksize;
  const at::Tensor code =
      at::from_blob(const_cast<float*>(nf4_code().data()), {16}, at::kFloat).to(w.packed.device());
  // (bytes, 2): high nibble first, then the values padded to whole blocks.
  const at::Tensor nibbles =
      at::stack({w.packed.bitwise_right_shift(4), w.packed.bitwise_and(15)}, 1);
  at::Tensor values = code.index_select(0, nibbles.reshape({-1}).to(at::kLong)).slice(0, 0, n);
  values = at::constant_pad_nd(values, {0, padded - n});
  const at::Tensor scaled = values.view({-1, w.blocksize}).mul(nf4_block_scales(w).unsqueeze(1));
  return scaled.reshape({-1}).slice(0, 0, n).to(dtype).view(w.sizes);
}

Nf4Weight nf4_to(const Nf4Weight& weight, const at::Device& device) {
  Nf4Weight out = weight;
  for (at::Tensor* t : {&out.packed, &out.absmax, &out.absmax_code, &out.absmax_scale}) {
    if (t->defined()) *t = t->to(device);
  }
  return out;
}

at::Tensor nf4_dequantize(const Nf4Weight& w, at::ScalarType dtype) {
  TITAN_CHECK(w.packed.defined() && w.packed.scalar_type() == at::kByte &&
                  w.packed.numel() == (w.numel() + 1) / 2,
              "nf4_dequantize: ", w.packed.defined() ? w.packed.numel() : 0, " packed bytes for ",
              w.numel(), " elements; expected ", (w.numel() + 1) / 2);
  TITAN_CHECK(dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf,
              "nf4_dequantize: to float32, bfloat16 or float16, not ", dtype);
  if (!w.packed.device().is_cpu()) return nf4_dequantize_aten(w, dtype);
  const at::Tensor scales = nf4_block_scales(w).contiguous();
  TITAN_CHECK(scales.numel() == w.blocks(), "nf4_dequantize: ", scales.numel(),
              " block scales for ", w.blocks(), " blocks of ", w.blocksize);
  at::Tensor out = at::empty(w.sizes, at::TensorOptions().dtype(dtype));
  const float* s = scales.data_ptr<float>();
  switch (dtype) {
    case at::kFloat: dequantize_into(w, s, out.data_ptr<float>()); break;
    case at::kBFloat16: dequantize_into(w, s, out.data_ptr<c10::BFloat16>()); break;
    case at::kHalf: dequantize_into(w, s, out.data_ptr<c10::Half>()); break;
    default: break;  // checked above
  }
  return out;
}

}  // namespace titan::kernels
