// Fused RMSNorm, SwiGLU and RoPE on the CPU (see fused_layers.h). Each *_rows / *_range function
// is cloned per instruction set (TITAN_CPU_CLONES) and holds the loops; the entry points check
// shapes, make inputs contiguous and split the work over threads.
#include "titan/kernels/fused_layers.h"

#include "titan/common/check.h"
#include "titan/kernels/cpu_simd.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace titan::kernels {

namespace {

using c10::BFloat16;

// --- RMSNorm ----------------------------------------------------------------------------------

template <class T>
inline __attribute__((always_inline)) void rms_norm_rows(const T* x, const float* w, T* y,
                                                         float* rstd, int64_t begin, int64_t end,
                                                         int64_t dim, float eps) {
  for (int64_t r = begin; r < end; ++r) {
    const T* xr = x + r * dim;
    float sum = 0.0f;
    for (int64_t i = 0; i < dim; ++i) {
      const float v = load(xr, i);
      sum += v * v;
    }
    const float s = 1.0f / std::sqrt(sum / static_cast<float>(dim) + eps);
    rstd[r] = s;
    T* yr = y + r * dim;
    for (int64_t i = 0; i < dim; ++i) store(yr, i, load(xr, i) * s * w[i]);
  }
}

// grad_w accumulates sum(g * x * rstd) over the rows; `add` (nullable) is added to gx.
template <class T>
inline __attribute__((always_inline)) void rms_norm_backward_rows(const T* g, const T* x,
                                                                  const float* w, const float* rstd,
                                                                  const T* add, T* gx,
                                                                  float* grad_w, int64_t begin,
                                                                  int64_t end, int64_t dim) {
  const float inv_dim = 1.0f / static_cast<float>(dim);
  for (int64_t r = begin; r < end; ++r) {
    const T* gr = g + r * dim;
    const T* xr = x + r * dim;
    const float s = rstd[r];
    float dot = 0.0f;  // sum(g w x_hat)
    for (int64_t i = 0; i < dim; ++i) dot += load(gr, i) * w[i] * load(xr, i);
    const float c = dot * s * inv_dim;
    T* gxr = gx + r * dim;
    const T* ar = add == nullptr ? nullptr : add + r * dim;
    for (int64_t i = 0; i < dim; ++i) {
      const float xh = load(xr, i) * s;
      const float gv = load(gr, i);
      store(gxr, i, s * (gv * w[i] - xh * c) + (ar == nullptr ? 0.0f : load(ar, i)));
      grad_w[i] += gv * xh;
    }
  }
}

// h = x + d rounded to T, then rms_norm_rows over h (the row is still in L1).
template <class T>
inline __attribute__((always_inline)) void add_rms_norm_rows(const T* x, const T* d, const float* w,
                                                             T* h, T* y, float* rstd, int64_t begin,
                                                             int64_t end, int64_t dim, float eps) {
  for (int64_t r = begin; r < end; ++r) {
    const T* xr = x + r * dim;
    const T* dr = d + r * dim;
    T* hr = h + r * dim;
    for (int64_t i = 0; i < dim; ++i) store(hr, i, load(xr, i) + load(dr, i));
    rms_norm_rows(h, w, y, rstd, r, r + 1, dim, eps);
  }
}

TITAN_CPU_CLONES void rms_norm_rows_f32(const float* x, const float* w, float* y, float* rstd,
                                        int64_t begin, int64_t end, int64_t dim, float eps) {
  rms_norm_rows(x, w, y, rstd, begin, end, dim, eps);
}
TITAN_CPU_CLONES void rms_norm_rows_bf16(const BFloat16* x, const float* w, BFloat16* y,
                                         float* rstd, int64_t begin, int64_t end, int64_t dim,
                                         float eps) {
  rms_norm_rows(x, w, y, rstd, begin, end, dim, eps);
}
TITAN_CPU_CLONES void rms_norm_backward_rows_f32(const float* g, const float* x, const float* w,
                                                 const float* rstd, const float* add, float* gx,
                                                 float* grad_w, int64_t begin, int64_t end,
                                                 int64_t dim) {
  rms_norm_backward_rows(g, x, w, rstd, add, gx, grad_w, begin, end, dim);
}
TITAN_CPU_CLONES void rms_norm_backward_rows_bf16(const BFloat16* g, const BFloat16* x,
                                                  const float* w, const float* rstd,
                                                  const BFloat16* add, BFloat16* gx, float* grad_w,
                                                  int64_t begin, int64_t end, int64_t dim) {
  rms_norm_backward_rows(g, x, w, rstd, add, gx, grad_w, begin, end, dim);
}
TITAN_CPU_CLONES void add_rms_norm_rows_f32(const float* x, const float* d, const float* w,
                                            float* h, float* y, float* rstd, int64_t begin,
                                            int64_t end, int64_t dim, float eps) {
  add_rms_norm_rows(x, d, w, h, y, rstd, begin, end, dim, eps);
}
TITAN_CPU_CLONES void add_rms_norm_rows_bf16(const BFloat16* x, const BFloat16* d, const float* w,
                                             BFloat16* h, BFloat16* y, float* rstd, int64_t begin,
                                             int64_t end, int64_t dim, float eps) {
  add_rms_norm_rows(x, d, w, h, y, rstd, begin, end, dim, eps);
}

// --- SwiGLU -----------------------------------------------------------------------------------

template <class T>
inline __attribute__((always_inline)) void swiglu_range(const T* a, const T* b, T* h, int64_t begin,
                                                        int64_t end) {
  for (int64_t i = begin; i < end; ++i) {
    const float av = load(a, i);
    store(h, i, av * sigmoid_approx(av) * load(b, i));
  }
}

// d/da silu(a) = sig(a) (1 + a (1 - sig(a))).
template <class T>
inline __attribute__((always_inline)) void swiglu_backward_range(const T* g, const T* a, const T* b,
                                                                 T* ga, T* gb, int64_t begin,
                                                                 int64_t end) {
  for (int64_t i = begin; i < end; ++i) {
    const float av = load(a, i), bv = load(b, i), gv = load(g, i);
    const float sig = sigmoid_approx(av);
    const float silu = av * sig;
    store(ga, i, gv * bv * sig * (1.0f + av * (1.0f - sig)));
    store(gb, i, gv * silu);
  }
}

TITAN_CPU_CLONES void swiglu_range_f32(const float* a, const float* b, float* h, int64_t begin,
                                       int64_t end) {
  swiglu_range(a, b, h, begin, end);
}
// bf16 goes through float blocks: mixing 16- and 32-bit lanes in one loop makes GCC pick
// 256-bit vectors (half the lanes for the float math); widening, computing and narrowing in
// separate loops over a block in L1 keeps each loop at full width (1.6x on AVX-512).
constexpr int64_t kBlock = 512;

inline __attribute__((always_inline)) void widen(const BFloat16* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_float(src[i]);
}
inline __attribute__((always_inline)) void narrow(const float* src, BFloat16* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = float_to_bf16(src[i]);
}

TITAN_CPU_CLONES void swiglu_range_bf16(const BFloat16* a, const BFloat16* b, BFloat16* h,
                                        int64_t begin, int64_t end) {
  alignas(64) float fa[kBlock], fb[kBlock], fh[kBlock];
  for (int64_t start = begin; start < end; start += kBlock) {
    const int64_t n = std::min(kBlock, end - start);
    widen(a + start, fa, n);
    widen(b + start, fb, n);
    swiglu_range(fa, fb, fh, 0, n);
    narrow(fh, h + start, n);
  }
}
TITAN_CPU_CLONES void swiglu_backward_range_f32(const float* g, const float* a, const float* b,
                                                float* ga, float* gb, int64_t begin, int64_t end) {
  swiglu_backward_range(g, a, b, ga, gb, begin, end);
}
TITAN_CPU_CLONES void swiglu_backward_range_bf16(const BFloat16* g, const BFloat16* a,
                                                 const BFloat16* b, BFloat16* ga, BFloat16* gb,
                                                 int64_t begin, int64_t end) {
  alignas(64) float fg[kBlock], fa[kBlock], fb[kBlock], fga[kBlock], fgb[kBlock];
  for (int64_t start = begin; start < end; start += kBlock) {
    const int64_t n = std::min(kBlock, end - start);
    widen(g + start, fg, n);
    widen(a + start, fa, n);
    widen(b + start, fb, n);
    swiglu_backward_range(fg, fa, fb, fga, fgb, 0, n);
    narrow(fga, ga + start, n);
    narrow(fgb, gb + start, n);
  }
}

// --- Rounding to bf16 ----------------------------------------------------------------------

TITAN_CPU_CLONES void round_to_bf16_range(const float* x, float* y, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) y[i] = round_bf16(x[i]);
}

// --- SwiGLU between widened matmuls --------------------------------------------------------

TITAN_CPU_CLONES void widened_swiglu_range(const float* gate, const float* up, float* h,
                                           BFloat16* a_out, BFloat16* b_out, int64_t begin,
                                           int64_t end) {
  alignas(64) float fa[kBlock], fb[kBlock];
  for (int64_t start = begin; start < end; start += kBlock) {
    const int64_t n = std::min(kBlock, end - start);
    for (int64_t i = 0; i < n; ++i) {
      const float a = round_bf16(gate[start + i]), b = round_bf16(up[start + i]);
      fa[i] = a;
      fb[i] = b;
      h[start + i] = round_bf16(round_bf16(a * sigmoid_approx(a)) * b);
    }
    narrow(fa, a_out + start, n);
    narrow(fb, b_out + start, n);
  }
}

// ATen's bf16 backward of silu(a) * b: grad_b = bf16(g s), grad_s = bf16(g b), grad_a =
// bf16(grad_s sig (1 + a (1 - sig))), with g = bf16(grad) and s = bf16(silu(a)).
TITAN_CPU_CLONES void widened_swiglu_backward_range(const float* grad, const BFloat16* a_in,
                                                    const BFloat16* b_in, float* ga, float* gb,
                                                    int64_t begin, int64_t end) {
  alignas(64) float fa[kBlock], fb[kBlock];
  for (int64_t start = begin; start < end; start += kBlock) {
    const int64_t n = std::min(kBlock, end - start);
    widen(a_in + start, fa, n);
    widen(b_in + start, fb, n);
    for (int64_t i = 0; i < n; ++i) {
      const float g = round_bf16(grad[start + i]), a = fa[i], b = fb[i];
      const float sig = sigmoid_approx(a);
      gb[start + i] = round_bf16(g * round_bf16(a * sig));
      ga[start + i] = round_bf16(round_bf16(g * b) * sig * (1.0f + a * (1.0f - sig)));
    }
  }
}

// --- RoPE -------------------------------------------------------------------------------------

// Rows are (b, s, h) triples in order; row r is at position (r / n_heads) % seqlen.
template <class T>
inline __attribute__((always_inline)) void rope_rows(const T* x, const float* cos, const float* sin,
                                                     T* out, int64_t begin, int64_t end,
                                                     int64_t seqlen, int64_t n_heads, int64_t half,
                                                     float sign) {
  for (int64_t r = begin; r < end; ++r) {
    const int64_t pos = (r / n_heads) % seqlen;
    const float* c = cos + pos * half;
    const float* s = sin + pos * half;
    const T* xr = x + r * 2 * half;
    T* o = out + r * 2 * half;
    for (int64_t i = 0; i < half; ++i) {
      const float x0 = load(xr, 2 * i), x1 = load(xr, 2 * i + 1);
      const float si = sign * s[i];
      store(o, 2 * i, x0 * c[i] - x1 * si);
      store(o, 2 * i + 1, x0 * si + x1 * c[i]);
    }
  }
}

TITAN_CPU_CLONES void rope_rows_f32(const float* x, const float* cos, const float* sin, float* out,
                                    int64_t begin, int64_t end, int64_t seqlen, int64_t n_heads,
                                    int64_t half, float sign) {
  rope_rows(x, cos, sin, out, begin, end, seqlen, n_heads, half, sign);
}
TITAN_CPU_CLONES void rope_rows_bf16(const BFloat16* x, const float* cos, const float* sin,
                                     BFloat16* out, int64_t begin, int64_t end, int64_t seqlen,
                                     int64_t n_heads, int64_t half, float sign) {
  rope_rows(x, cos, sin, out, begin, end, seqlen, n_heads, half, sign);
}

// Rows per task so that a task touches about 64 KiB: small rows go many to a task.
int64_t row_grain(int64_t row_elements) {
  return std::max<int64_t>(1, 16384 / std::max<int64_t>(1, row_elements));
}

constexpr int64_t kElementGrain = 32768;

void check_fusable(const char* op, std::initializer_list<at::Tensor> tensors) {
  TITAN_CHECK(cpu_fusable(tensors), op,
              ": the fused CPU kernels take float32 or bfloat16 CPU tensors");
}

// RMSNorm of x, or of h = x + delta when delta is defined -> {h (undefined without delta), y,
// rstd}. The callers have checked the tensors.
std::tuple<at::Tensor, at::Tensor, at::Tensor> norm_forward(const at::Tensor& x_in,
                                                            const at::Tensor& delta_in,
                                                            const at::Tensor& weight, double eps) {
  const int64_t dim = x_in.size(-1);
  TITAN_CHECK(weight.dim() == 1 && weight.size(0) == dim, "rms_norm: weight ", weight.sizes(),
              " does not match the last dim of x ", x_in.sizes());
  const bool add = delta_in.defined();
  const at::Tensor x = x_in.contiguous();
  const at::Tensor d = add ? delta_in.contiguous() : at::Tensor();
  const at::Tensor w = weight.to(at::kFloat).contiguous();
  const int64_t rows = dim == 0 ? 0 : x.numel() / dim;
  at::Tensor h = add ? at::empty_like(x) : at::Tensor(), y = at::empty_like(x);
  at::Tensor rstd = at::empty({rows}, x.options().dtype(at::kFloat));
  const float e = static_cast<float>(eps);
  const float* wp = w.const_data_ptr<float>();
  float* rp = rstd.data_ptr<float>();
  at::parallel_for(0, rows, row_grain(dim), [&](int64_t b, int64_t e_) {
    if (x.scalar_type() == at::kFloat) {
      if (add) {
        add_rms_norm_rows_f32(x.const_data_ptr<float>(), d.const_data_ptr<float>(), wp,
                              h.data_ptr<float>(), y.data_ptr<float>(), rp, b, e_, dim, e);
      } else {
        rms_norm_rows_f32(x.const_data_ptr<float>(), wp, y.data_ptr<float>(), rp, b, e_, dim, e);
      }
    } else if (add) {
      add_rms_norm_rows_bf16(x.const_data_ptr<BFloat16>(), d.const_data_ptr<BFloat16>(), wp,
                             h.data_ptr<BFloat16>(), y.data_ptr<BFloat16>(), rp, b, e_, dim, e);
    } else {
      rms_norm_rows_bf16(x.const_data_ptr<BFloat16>(), wp, y.data_ptr<BFloat16>(), rp, b, e_, dim,
                         e);
    }
  });
  return {h, y, rstd};
}

}  // namespace

bool fused_is_faster(FusedOp op, at::ScalarType dtype) {
  return op == FusedOp::kRope || dtype == at::kFloat;
}

bool cpu_fusable(std::initializer_list<at::Tensor> tensors) {
  for (const at::Tensor& t : tensors) {
    if (!t.defined() || !t.device().is_cpu()) return false;
    if (t.scalar_type() != at::kFloat && t.scalar_type() != at::kBFloat16) return false;
  }
  return true;
}

std::pair<at::Tensor, at::Tensor> rms_norm_forward(const at::Tensor& x_in, const at::Tensor& weight,
                                                   double eps) {
  check_fusable("rms_norm_forward", {x_in, weight});
  auto out = norm_forward(x_in, at::Tensor(), weight, eps);
  return {std::get<1>(out), std::get<2>(out)};
}

std::pair<at::Tensor, at::Tensor> rms_norm_backward(const at::Tensor& grad_in,
                                                    const at::Tensor& x_in,
                                                    const at::Tensor& weight,
                                                    const at::Tensor& rstd,
                                                    const at::Tensor& residual_grad) {
  check_fusable("rms_norm_backward", {grad_in, x_in, weight, rstd});
  TITAN_CHECK(grad_in.sizes() == x_in.sizes() && grad_in.scalar_type() == x_in.scalar_type(),
              "rms_norm_backward: grad ", grad_in.sizes(), " ", grad_in.scalar_type(),
              " does not match x ", x_in.sizes(), " ", x_in.scalar_type());
  TITAN_CHECK(!residual_grad.defined() || (residual_grad.sizes() == x_in.sizes() &&
                                           residual_grad.scalar_type() == x_in.scalar_type() &&
                                           residual_grad.device().is_cpu()),
              "rms_norm_backward: residual grad ",
              residual_grad.defined() ? residual_grad.sizes() : at::IntArrayRef{},
              " does not match x ", x_in.sizes(), " ", x_in.scalar_type());
  const at::Tensor add = residual_grad.defined() ? residual_grad.contiguous() : at::Tensor();
  const at::Tensor x = x_in.contiguous();
  const at::Tensor g = grad_in.contiguous();
  const at::Tensor w = weight.to(at::kFloat).contiguous();
  const at::Tensor s = rstd.contiguous();
  const int64_t dim = x.size(-1);
  const int64_t rows = dim == 0 ? 0 : x.numel() / dim;
  at::Tensor gx = at::empty_like(x);
  // The weight's gradient: one partial sum per block of rows (a fixed split, summed in order).
  const int64_t blocks = std::max<int64_t>(1, std::min<int64_t>(rows, 32));
  at::Tensor partial = at::zeros({blocks, dim}, x.options().dtype(at::kFloat));
  const float* wp = w.const_data_ptr<float>();
  const float* sp = s.const_data_ptr<float>();
  at::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t blk = b0; blk < b1; ++blk) {
      const int64_t begin = rows * blk / blocks, end = rows * (blk + 1) / blocks;
      float* pw = partial.data_ptr<float>() + blk * dim;
      if (x.scalar_type() == at::kFloat) {
        rms_norm_backward_rows_f32(g.const_data_ptr<float>(), x.const_data_ptr<float>(), wp, sp,
                                   add.defined() ? add.const_data_ptr<float>() : nullptr,
                                   gx.data_ptr<float>(), pw, begin, end, dim);
      } else {
        rms_norm_backward_rows_bf16(g.const_data_ptr<BFloat16>(), x.const_data_ptr<BFloat16>(), wp,
                                    sp, add.defined() ? add.const_data_ptr<BFloat16>() : nullptr,
                                    gx.data_ptr<BFloat16>(), pw, begin, end, dim);
      }
    }
  });
  return {gx, partial.sum(0).to(weight.scalar_type())};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> add_rms_norm_forward(const at::Tensor& x_in,
                                                                    const at::Tensor& delta_in,
                                                                    const at::Tensor& weight,
                                                                    double eps) {
  check_fusable("add_rms_norm_forward", {x_in, delta_in, weight});
  TITAN_CHECK(x_in.sizes() == delta_in.sizes() && x_in.scalar_type() == delta_in.scalar_type(),
              "add_rms_norm: x ", x_in.sizes(), " ", x_in.scalar_type(), " and delta ",
              delta_in.sizes(), " ", delta_in.scalar_type(), " must match in shape and dtype");
  return norm_forward(x_in, delta_in, weight, eps);
}

at::Tensor swiglu_forward(const at::Tensor& gate_in, const at::Tensor& up_in) {
  check_fusable("swiglu_forward", {gate_in, up_in});
  TITAN_CHECK(gate_in.sizes() == up_in.sizes() && gate_in.scalar_type() == up_in.scalar_type(),
              "swiglu: gate ", gate_in.sizes(), " and up ", up_in.sizes(),
              " must match in shape and dtype");
  const at::Tensor a = gate_in.contiguous(), b = up_in.contiguous();
  at::Tensor h = at::empty_like(a);
  at::parallel_for(0, a.numel(), kElementGrain, [&](int64_t begin, int64_t end) {
    if (a.scalar_type() == at::kFloat) {
      swiglu_range_f32(a.const_data_ptr<float>(), b.const_data_ptr<float>(), h.data_ptr<float>(),
                       begin, end);
    } else {
      swiglu_range_bf16(a.const_data_ptr<BFloat16>(), b.const_data_ptr<BFloat16>(),
                        h.data_ptr<BFloat16>(), begin, end);
    }
  });
  return h;
}

std::pair<at::Tensor, at::Tensor> swiglu_backward(const at::Tensor& grad_in,
                                                  const at::Tensor& gate_in,
                                                  const at::Tensor& up_in) {
  check_fusable("swiglu_backward", {grad_in, gate_in, up_in});
  TITAN_CHECK(grad_in.sizes() == gate_in.sizes() && grad_in.scalar_type() == gate_in.scalar_type(),
              "swiglu_backward: grad ", grad_in.sizes(), " does not match gate ", gate_in.sizes());
  const at::Tensor g = grad_in.contiguous(), a = gate_in.contiguous(), b = up_in.contiguous();
  at::Tensor ga = at::empty_like(a), gb = at::empty_like(b);
  at::parallel_for(0, a.numel(), kElementGrain, [&](int64_t begin, int64_t end) {
    if (a.scalar_type() == at::kFloat) {
      swiglu_backward_range_f32(g.const_data_ptr<float>(), a.const_data_ptr<float>(),
                                b.const_data_ptr<float>(), ga.data_ptr<float>(),
                                gb.data_ptr<float>(), begin, end);
    } else {
      swiglu_backward_range_bf16(g.const_data_ptr<BFloat16>(), a.const_data_ptr<BFloat16>(),
                                 b.const_data_ptr<BFloat16>(), ga.data_ptr<BFloat16>(),
                                 gb.data_ptr<BFloat16>(), begin, end);
    }
  });
  return {ga, gb};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> widened_swiglu_forward(const at::Tensor& gate_in,
                                                                      const at::Tensor& up_in) {
  TITAN_CHECK(gate_in.device().is_cpu() && gate_in.scalar_type() == at::kFloat &&
                  up_in.device().is_cpu() && up_in.scalar_type() == at::kFloat &&
                  gate_in.sizes() == up_in.sizes(),
              "widened_swiglu: gate and up must be float32 CPU tensors of one shape, got ",
              gate_in.scalar_type(), " ", gate_in.sizes(), " and ", up_in.scalar_type(), " ",
              up_in.sizes());
  const at::Tensor gate = gate_in.contiguous(), up = up_in.contiguous();
  at::Tensor h = at::empty_like(gate);
  at::Tensor a = at::empty_like(gate, gate.options().dtype(at::kBFloat16));
  at::Tensor b = at::empty_like(a);
  at::parallel_for(0, gate.numel(), kElementGrain, [&](int64_t begin, int64_t end) {
    widened_swiglu_range(gate.const_data_ptr<float>(), up.const_data_ptr<float>(),
                         h.data_ptr<float>(), a.data_ptr<BFloat16>(), b.data_ptr<BFloat16>(), begin,
                         end);
  });
  return {h, a, b};
}

std::pair<at::Tensor, at::Tensor> widened_swiglu_backward(const at::Tensor& grad_in,
                                                          const at::Tensor& a_in,
                                                          const at::Tensor& b_in) {
  TITAN_CHECK(grad_in.device().is_cpu() && grad_in.scalar_type() == at::kFloat &&
                  a_in.scalar_type() == at::kBFloat16 && b_in.scalar_type() == at::kBFloat16 &&
                  grad_in.sizes() == a_in.sizes() && a_in.sizes() == b_in.sizes(),
              "widened_swiglu_backward: a float32 grad and the forward's bf16 a and b of one ",
              "shape, got ", grad_in.scalar_type(), " ", grad_in.sizes(), ", ", a_in.scalar_type(),
              " ", a_in.sizes(), ", ", b_in.scalar_type(), " ", b_in.sizes());
  const at::Tensor g = grad_in.contiguous(), a = a_in.contiguous(), b = b_in.contiguous();
  at::Tensor ga = at::empty_like(g), gb = at::empty_like(g);
  at::parallel_for(0, g.numel(), kElementGrain, [&](int64_t begin, int64_t end) {
    widened_swiglu_backward_range(g.const_data_ptr<float>(), a.const_data_ptr<BFloat16>(),
                                  b.const_data_ptr<BFloat16>(), ga.data_ptr<float>(),
                                  gb.data_ptr<float>(), begin, end);
  });
  return {ga, gb};
}

at::Tensor round_to_bf16(const at::Tensor& x_in) {
  TITAN_CHECK(x_in.defined() && x_in.device().is_cpu() && x_in.scalar_type() == at::kFloat,
              "round_to_bf16: a float32 CPU tensor, got ",
              x_in.defined() ? c10::toString(x_in.scalar_type()) : "an undefined tensor");
  const at::Tensor x = x_in.contiguous();
  at::Tensor y = at::empty_like(x);
  const float* xp = x.const_data_ptr<float>();
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, x.numel(), kElementGrain,
                   [&](int64_t begin, int64_t end) { round_to_bf16_range(xp, yp, begin, end); });
  return y;
}

at::Tensor rope_rotate(const at::Tensor& x_in, const at::Tensor& cos_in, const at::Tensor& sin_in,
                       bool inverse) {
  check_fusable("rope_rotate", {x_in});
  TITAN_CHECK(x_in.dim() == 4 && x_in.size(3) % 2 == 0,
              "rope_rotate: x must be (bs, seqlen, n_heads, even head_dim), got ", x_in.sizes());
  const int64_t seqlen = x_in.size(1), n_heads = x_in.size(2), half = x_in.size(3) / 2;
  TITAN_CHECK(cos_in.dim() == 2 && cos_in.size(0) >= seqlen && cos_in.size(1) == half &&
                  sin_in.sizes() == cos_in.sizes(),
              "rope_rotate: tables ", cos_in.sizes(), " / ", sin_in.sizes(),
              " do not cover seqlen ", seqlen, " x head_dim / 2 ", half);
  const at::Tensor x = x_in.contiguous();
  const at::Tensor c = cos_in.to(at::kFloat).contiguous();
  const at::Tensor s = sin_in.to(at::kFloat).contiguous();
  at::Tensor out = at::empty_like(x);
  const int64_t rows = x.numel() / std::max<int64_t>(1, 2 * half);
  const float sign = inverse ? -1.0f : 1.0f;
  at::parallel_for(0, rows, row_grain(2 * half), [&](int64_t begin, int64_t end) {
    if (x.scalar_type() == at::kFloat) {
      rope_rows_f32(x.const_data_ptr<float>(), c.const_data_ptr<float>(), s.const_data_ptr<float>(),
                    out.data_ptr<float>(), begin, end, seqlen, n_heads, half, sign);
    } else {
      rope_rows_bf16(x.const_data_ptr<BFloat16>(), c.const_data_ptr<float>(),
                     s.const_data_ptr<float>(), out.data_ptr<BFloat16>(), begin, end, seqlen,
                     n_heads, half, sign);
    }
  });
  return out;
}

}  // namespace titan::kernels
