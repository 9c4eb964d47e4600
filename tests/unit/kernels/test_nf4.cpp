// NF4 storage (kernels/nf4.h): the two code tables against their closed forms (the QLoRA paper's
// normal quantiles, the dynamic map's decades), the codes and scales against a brute-force
// nearest-value search, dequantization against value(code) * scale written out, double
// quantization's error bound, the bytes held, and the errors for inputs it cannot store.
#include "titan/kernels/nf4.h"

#include <gtest/gtest.h>

#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

namespace titan {
namespace test_nf4 {

using kernels::dynamic_map_signed;
using kernels::nf4_code;
using kernels::nf4_dequantize;
using kernels::nf4_quantize;
using kernels::Nf4Options;

// The z with Phi(z) = p (standard normal), by Newton's method on erfc: the test's own quantile.
double normal_quantile(double p) {
  double z = 0;
  for (int i = 0; i < 100; ++i) {
    const double cdf = 0.5 * std::erfc(-z / std::sqrt(2.0));
    const double pdf = std::exp(-z * z / 2) / std::sqrt(2 * M_PI);
    z -= (cdf - p) / pdf;
  }
  return z;
}

// The first index of the smallest |x - code[i]| in float32 arithmetic (torch.argmin).
template <size_t N>
int argmin_distance(const std::array<float, N>& code, float x) {
  int best = 0;
  for (size_t i = 1; i < N; ++i) {
    if (std::abs(x - code[i]) < std::abs(x - code[best])) best = static_cast<int>(i);
  }
  return best;
}

std::vector<uint8_t> unpack(const kernels::Nf4Weight& w) {
  std::vector<uint8_t> codes;
  const uint8_t* p = w.packed.data_ptr<uint8_t>();
  for (int64_t i = 0; i < w.numel(); ++i) codes.push_back(i % 2 ? p[i / 2] & 0xF : p[i / 2] >> 4);
  return codes;
}

// QLoRA's construction: 8 positive and 7 negative quantiles of N(0, 1) between probability
// 0.9677083 and 1/2, and 0, scaled so that the largest is 1.
TEST(Nf4, CodeIsTheNormalQuantilesOfTheQloraPaper) {
  constexpr double kOffset = 0.9677083;
  const double top = normal_quantile(kOffset);
  std::vector<double> want;
  for (int k = 0; k < 7; ++k)
    want.push_back(-normal_quantile(kOffset - k * (kOffset - 0.5) / 7) / top);
  want.push_back(0);
  for (int k = 7; k >= 0; --k)
    want.push_back(normal_quantile(kOffset - k * (kOffset - 0.5) / 8) / top);
  const auto& code = nf4_code();
  ASSERT_EQ(want.size(), code.size());
  for (size_t i = 0; i < code.size(); ++i) EXPECT_NEAR(code[i], want[i], 2e-6) << "index " << i;
  EXPECT_EQ(code[kernels::kNf4ZeroCode], 0.0f);
}

// Decade i (1e-6 .. 1) holds the midpoints of 2^i equal steps of [0.1, 1], times 10^(i - 6), with
// both signs; then 0 and 1.
TEST(Nf4, DynamicMapIsSevenDecadesOfLinearFractions) {
  std::vector<double> want = {0.0, 1.0};
  for (int i = 0; i < 7; ++i) {
    const int steps = 1 << i;
    for (int k = 0; k < steps; ++k) {
      const double mid = 0.1 + 0.9 * (k + 0.5) / steps;
      want.push_back(std::pow(10.0, i - 6) * mid);
      want.push_back(-std::pow(10.0, i - 6) * mid);
    }
  }
  std::sort(want.begin(), want.end());
  const auto& map = dynamic_map_signed();
  ASSERT_EQ(want.size(), map.size());
  for (size_t i = 0; i < map.size(); ++i) {
    EXPECT_NEAR(map[i], want[i], 1e-6 * std::abs(want[i])) << "index " << i;
    if (i > 0) {
      EXPECT_LT(map[i - 1], map[i]) << "index " << i;
    }
  }
  EXPECT_EQ(map.back(), 1.0f);
  EXPECT_NEAR(map.front(), -0.99296875, 1e-7);
}

// Without double quantization: each block's scale is its largest magnitude, each code the nearest
// NF4 value of the scaled element (brute force), element 2i in the high nibble, an odd count
// padded with the code of 0; bfloat16 weights quantize as their float32 values.
TEST(Nf4, CodesAreTheNearestValuesOfTheScaledBlocks) {
  at::manual_seed(3);
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    SCOPED_TRACE(c10::toString(dtype));
    const at::Tensor weight = (at::randn({37, 51}) * 0.02).to(dtype);  // 1887: 29 blocks + 31
    const auto w = nf4_quantize(weight, Nf4Options{.blocksize = 64, .double_quant = false});
    ASSERT_FALSE(w.double_quant());
    EXPECT_EQ(w.sizes, weight.sizes().vec());
    EXPECT_EQ(w.dtype, dtype);
    ASSERT_EQ(w.blocks(), 30);
    ASSERT_EQ(w.packed.numel(), 944);
    EXPECT_EQ(w.packed.data_ptr<uint8_t>()[943] & 0xF, kernels::kNf4ZeroCode);
    const at::Tensor flat = weight.to(at::kFloat).reshape({-1});
    const float* x = flat.data_ptr<float>();
    const std::vector<uint8_t> codes = unpack(w);
    int mismatches = 0;
    for (int64_t b = 0; b < w.blocks(); ++b) {
      const int64_t lo = b * 64, hi = std::min<int64_t>(flat.numel(), lo + 64);
      float m = 0;
      for (int64_t i = lo; i < hi; ++i) m = std::max(m, std::abs(x[i]));
      EXPECT_EQ(w.absmax.data_ptr<float>()[b], m) << "block " << b;
      const float inv = 1.0f / m;
      for (int64_t i = lo; i < hi; ++i) {
        mismatches += codes[i] != argmin_distance(nf4_code(), std::clamp(x[i] * inv, -1.0f, 1.0f));
      }
    }
    EXPECT_EQ(mismatches, 0);
  }
}

// Dequantization is value(code) * scale in float32, rounded to the dtype once.
TEST(Nf4, DequantizeIsCodeValueTimesBlockScale) {
  at::manual_seed(4);
  const at::Tensor weight = at::randn({24, 40});
  for (bool double_quant : {false, true}) {
    SCOPED_TRACE(double_quant ? "double quantization" : "float32 scales");
    const auto w = nf4_quantize(weight, Nf4Options{.blocksize = 64, .double_quant = double_quant});
    const at::Tensor scales = kernels::nf4_block_scales(w);
    const std::vector<uint8_t> codes = unpack(w);
    at::Tensor want = at::empty({24 * 40});
    for (int64_t i = 0; i < want.numel(); ++i) {
      want.data_ptr<float>()[i] = nf4_code()[codes[i]] * scales.data_ptr<float>()[i / 64];
    }
    want = want.view({24, 40});
    EXPECT_TRUE(at::equal(nf4_dequantize(w, at::kFloat), want));
    EXPECT_TRUE(at::equal(nf4_dequantize(w, at::kBFloat16), want.to(at::kBFloat16)));
    EXPECT_TRUE(at::equal(nf4_dequantize(w, at::kHalf), want.to(at::kHalf)));
  }
}

// The device path (ATen ops: what CUDA runs) gives the CPU table's bits, for every dtype, an odd
// element count and both ways of keeping the scales.
TEST(Nf4, AtenPathEqualsTheCpuTable) {
  at::manual_seed(7);
  const at::Tensor weight = at::randn({7, 37}) * 0.1;  // 259: 4 blocks and 3 elements
  for (bool double_quant : {false, true}) {
    const auto w = nf4_quantize(weight, Nf4Options{.blocksize = 64, .double_quant = double_quant});
    for (auto dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
      SCOPED_TRACE(std::string(c10::toString(dtype)) + (double_quant ? ", double" : ""));
      const at::Tensor aten = kernels::nf4_dequantize_aten(w, dtype);
      EXPECT_EQ(aten.sizes(), weight.sizes());
      EXPECT_TRUE(at::equal(aten, nf4_dequantize(w, dtype)));
    }
  }
}

// Double quantization: the scales' mean is subtracted, the centred scales are coded blockwise
// (256 per float32 scale) as their nearest dynamic-map value; the reconstructed scale is within
// half the map's widest step (0.9 / 64, between 0.1 and 1) of the block's absmax.
TEST(Nf4, DoubleQuantizedScalesStayWithinHalfAMapStep) {
  at::manual_seed(5);
  const at::Tensor weight = at::randn({96, 700}) * at::rand({96, 1}) * 0.05;  // 1050 blocks
  const auto single = nf4_quantize(weight, Nf4Options{.double_quant = false});
  const auto w = nf4_quantize(weight);
  ASSERT_TRUE(w.double_quant());
  EXPECT_TRUE(
      at::equal(w.packed, single.packed));  // the codes do not depend on how scales are kept
  const at::Tensor absmax = single.absmax;
  EXPECT_EQ(w.absmax_offset, absmax.mean().item<float>());
  ASSERT_EQ(w.absmax_scale.numel(), 5);
  const at::Tensor centred = absmax - w.absmax_offset;
  const at::Tensor scales = kernels::nf4_block_scales(w);
  int mismatches = 0;
  for (int64_t b = 0; b < w.blocks(); ++b) {
    const int64_t s = b / 256;
    const float block_max = centred.slice(0, s * 256, std::min<int64_t>(w.blocks(), s * 256 + 256))
                                .abs()
                                .max()
                                .item<float>();
    EXPECT_EQ(w.absmax_scale.data_ptr<float>()[s], block_max);
    const float scaled = std::clamp(centred.data_ptr<float>()[b] * (1.0f / block_max), -1.0f, 1.0f);
    mismatches +=
        w.absmax_code.data_ptr<uint8_t>()[b] != argmin_distance(dynamic_map_signed(), scaled);
    EXPECT_NEAR(scales.data_ptr<float>()[b], absmax.data_ptr<float>()[b],
                0.5 * 0.9 / 64 * block_max + 1e-7)
        << "block " << b;
  }
  EXPECT_EQ(mismatches, 0);
}

// On normally distributed weights NF4 beats a uniform 4-bit absmax code (15 levels) of the same
// blocks, as the paper argues; the measured errors are printed.
TEST(Nf4, NormalWeightsRoundTripBetterThanUniformFourBits) {
  at::manual_seed(6);
  const at::Tensor weight = at::randn({256, 512});
  const at::Tensor back = nf4_dequantize(nf4_quantize(weight), at::kFloat);
  const double nf4_rms = (back - weight).pow(2).mean().sqrt().item<double>();
  const at::Tensor blocks = weight.reshape({-1, 64});
  const at::Tensor scale = blocks.abs().amax(1, /*keepdim=*/true) / 7;
  const at::Tensor uniform = (blocks / scale).round().clamp(-7, 7) * scale;
  const double int4_rms = (uniform - blocks).pow(2).mean().sqrt().item<double>();
  std::printf("round-trip RMS error on N(0, 1), blocks of 64: NF4 %.4f, uniform int4 %.4f\n",
              nf4_rms, int4_rms);
  EXPECT_LT(nf4_rms, int4_rms);
  EXPECT_LT(nf4_rms, 0.1);  // 0.0918 measured
}

TEST(Nf4, BytesHeldAreFourPointOneThreeBitsPerElement) {
  const auto w = nf4_quantize(at::randn({1024, 1024}));
  // 524,288 bytes of codes, 16,384 one-byte scales, 64 float32 scales of scales, the offset.
  EXPECT_EQ(w.nbytes(), 524288 + 16384 + 64 * 4 + 4);
  EXPECT_NEAR(8.0 * w.nbytes() / w.numel(), 4.127, 1e-3);
  const auto single = nf4_quantize(at::randn({1024, 1024}), Nf4Options{.double_quant = false});
  EXPECT_EQ(single.nbytes(), 524288 + 16384 * 4 + 4);
}

TEST(Nf4, InputsItCannotStoreAreRefused) {
  auto message = [](auto&& f) {
    try {
      f();
    } catch (const c10::Error& e) {
      return std::string(e.what_without_backtrace());
    }
    return std::string("no error");
  };
  EXPECT_NE(message([] {
              nf4_quantize(at::randn({4, 8}), Nf4Options{.blocksize = 63});
            }).find("blocksize 63 must be even"),
            std::string::npos);
  EXPECT_NE(message([] {
              nf4_quantize(at::ones({4, 8}, at::kInt));
            }).find("a float32, bfloat16 or float16 weight, not Int"),
            std::string::npos);
  at::Tensor nan = at::randn({4, 8});
  nan[1][2] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_NE(message([&] { nf4_quantize(nan); }).find("holds NaN or infinite values"),
            std::string::npos);
  // A block of zeros: scale 0, the code of 0, zeros back.
  const auto zeros = nf4_quantize(at::zeros({2, 64}));
  EXPECT_TRUE(at::equal(nf4_dequantize(zeros, at::kFloat), at::zeros({2, 64})));
}

}  // namespace test_nf4
}  // namespace titan
