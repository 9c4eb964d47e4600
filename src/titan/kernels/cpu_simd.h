// Building blocks of titan's fused CPU kernels: plain C++ loops that the compiler vectorizes,
// compiled once per instruction set and picked at run time (TITAN_CPU_CLONES: GCC and Clang
// `target_clones`, dispatched through an ifunc on first call), bf16 <-> float conversions, and
// an exp accurate to about 2 ulp that vectorizes (libm's does not).
//
// A kernel is a TITAN_CPU_CLONES function over a range of rows that calls only inline helpers
// from this header (they are inlined into each clone and so vectorized for its instruction set);
// callers split rows over ATen's thread pool with at::parallel_for.
#pragma once

#include <c10/util/BFloat16.h>

#include <cstdint>
#include <cstring>

// The AVX2 clone is x86-64-v3 (AVX2 with FMA, which every AVX2 CPU of Intel since Haswell and of
// AMD since Zen has): "avx2" alone compiles without FMA, so a * b + c rounded twice where ATen's
// AVX2 kernels (built with -mfma) round once, and Adam's L2 term g + wd * p, which cancels, moved
// the update by 0.2% against ATen's on an AVX2-only CPU.
// Sanitized builds compile one version (the baseline, without FMA): the ifunc resolver that picks
// a clone runs while the program loads, and ThreadSanitizer's instrumented one crashed there,
// before its runtime had started.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define TITAN_CPU_ONE_CLONE 1
#endif
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(TITAN_CPU_ONE_CLONE)
#define TITAN_CPU_CLONES __attribute__((target_clones("avx512f", "arch=x86-64-v3", "default")))
#elif defined(__x86_64__) && defined(__clang__) && !defined(TITAN_CPU_ONE_CLONE)
#define TITAN_CPU_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define TITAN_CPU_CLONES
#endif

namespace titan::kernels {

// bf16 is the top half of a float: widening is a shift.
inline float bf16_to_float(c10::BFloat16 v) {
  const uint32_t bits = static_cast<uint32_t>(v.x) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// f rounded to the nearest bf16 value (ties to even, as c10::BFloat16's constructor; NaN stays
// NaN), kept a float: in 32-bit integer lanes only, which vectorize at full width.
inline float round_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) & 0xffff0000u;
  const uint32_t out = (bits & 0x7fffffffu) > 0x7f800000u ? 0x7fc00000u : rounded;
  float r;
  std::memcpy(&r, &out, sizeof(r));
  return r;
}

// f as bf16: the top half of round_bf16(f).
inline c10::BFloat16 float_to_bf16(float f) {
  const float r = round_bf16(f);
  uint32_t bits;
  std::memcpy(&bits, &r, sizeof(bits));
  c10::BFloat16 out;
  out.x = static_cast<uint16_t>(bits >> 16);
  return out;
}

inline float load(const float* p, int64_t i) { return p[i]; }
inline float load(const c10::BFloat16* p, int64_t i) { return bf16_to_float(p[i]); }
inline void store(float* p, int64_t i, float v) { p[i] = v; }
inline void store(c10::BFloat16* p, int64_t i, float v) { p[i] = float_to_bf16(v); }

// e^x for float x: 2^n * p(r) with x = n ln2 + r, |r| <= ln2 / 2, p a degree-6 polynomial
// (Cephes' coefficients); saturates to 0 below -87.3 and to +inf above 88.7.
inline float exp_approx(float x) {
  x = x < -87.33654f ? -87.33654f : (x > 88.72284f ? 88.72284f : x);
  const float n = __builtin_floorf(x * 1.44269504088896341f + 0.5f);
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

inline float sigmoid_approx(float x) { return 1.0f / (1.0f + exp_approx(-x)); }

}  // namespace titan::kernels
