// The one-pass AdamW / Adam kernel (see adamw.h): elements are split over ATen's thread pool, and
// each thread runs one loop over its range that GCC vectorizes per instruction set.
// (titan_kernels is built with -fno-math-errno, so std::sqrt becomes sqrtps: a sqrt that may
// write errno keeps the loop scalar, 2.4x slower on 6M floats.)
#include "titan/kernels/adamw.h"

#include "titan/common/check.h"
#include "titan/kernels/cpu_simd.h"

#include <ATen/Parallel.h>

#include <cmath>

namespace titan::kernels {
namespace {

// Elements per parallel_for task: enough to amortize waking a thread.
constexpr int64_t kGrain = 32768;

// The step's scalars, rounded to float once, as ATen rounds a double Scalar for float math.
struct Coefficients {
  float decay;         // 1 - lr * wd (AdamW)
  float l2;            // wd (Adam)
  float one_minus_b1;  // lerp weight of the first moment
  float beta2;
  float one_minus_b2;
  float bias2_sqrt;  // sqrt(1 - beta2^step)
  float eps;
  float neg_step_size;  // -lr / (1 - beta1^step)
  float grad_scale;     // times every gradient (1: none)
};

// Moments stay in float between their update and the parameter's: a bf16 moment is rounded once,
// on its store, and the parameter update uses the unrounded value.
template <class T, class S, bool kDecoupled>
__attribute__((always_inline)) inline void adam_loop(T* __restrict p, const T* __restrict g,
                                                     S* __restrict m, S* __restrict v,
                                                     int64_t begin, int64_t end,
                                                     const Coefficients& c) {
  for (int64_t i = begin; i < end; ++i) {
    float pi = load(p, i);
    float gi = load(g, i);
    if constexpr (kDecoupled) {
      gi = gi * c.grad_scale;
      pi = pi * c.decay;
    } else {  // no scale here: gi * scale + l2 * pi would contract unlike ATen's composition
      gi = gi + c.l2 * pi;
    }
    const float mi = load(m, i);
    const float m_new = mi + c.one_minus_b1 * (gi - mi);  // lerp_(g, 1 - beta1)
    const float v_new = load(v, i) * c.beta2 + c.one_minus_b2 * gi * gi;
    store(m, i, m_new);
    store(v, i, v_new);
    const float denom = sqrtf(v_new) / c.bias2_sqrt + c.eps;
    store(p, i, pi + c.neg_step_size * m_new / denom);
  }
}

template <class T, class S>
__attribute__((always_inline)) inline void adam_range(T* p, const T* g, S* m, S* v, int64_t begin,
                                                      int64_t end, const Coefficients& c,
                                                      bool decoupled) {
  if (decoupled) {
    adam_loop<T, S, true>(p, g, m, v, begin, end, c);
  } else {
    adam_loop<T, S, false>(p, g, m, v, begin, end, c);
  }
}

TITAN_CPU_CLONES void adam_range_float(float* p, const float* g, float* m, float* v, int64_t begin,
                                       int64_t end, const Coefficients& c, bool decoupled) {
  adam_range(p, g, m, v, begin, end, c, decoupled);
}

TITAN_CPU_CLONES void adam_range_bf16(c10::BFloat16* p, const c10::BFloat16* g, c10::BFloat16* m,
                                      c10::BFloat16* v, int64_t begin, int64_t end,
                                      const Coefficients& c, bool decoupled) {
  adam_range(p, g, m, v, begin, end, c, decoupled);
}

TITAN_CPU_CLONES void adam_range_float_bf16_states(float* p, const float* g, c10::BFloat16* m,
                                                   c10::BFloat16* v, int64_t begin, int64_t end,
                                                   const Coefficients& c, bool decoupled) {
  adam_range(p, g, m, v, begin, end, c, decoupled);
}

}  // namespace

bool adam_step_supported(const at::Tensor& param, const at::Tensor& grad, const at::Tensor& exp_avg,
                         const at::Tensor& exp_avg_sq) {
  const at::ScalarType dtype = param.scalar_type();
  if (dtype != at::kFloat && dtype != at::kBFloat16) return false;
  const at::ScalarType state = exp_avg.scalar_type();
  if (state != dtype && !(dtype == at::kFloat && state == at::kBFloat16)) return false;
  for (const at::Tensor* t : {&param, &grad, &exp_avg, &exp_avg_sq}) {
    const at::ScalarType want = t == &exp_avg || t == &exp_avg_sq ? state : dtype;
    if (!t->device().is_cpu() || t->scalar_type() != want || t->sizes() != param.sizes() ||
        t->strides() != param.strides()) {
      return false;
    }
  }
  // Same sizes and strides plus dense: every tensor is the same permutation of one flat range.
  return param.is_non_overlapping_and_dense();
}

void adam_step(const at::Tensor& param, const at::Tensor& grad, const at::Tensor& exp_avg,
               const at::Tensor& exp_avg_sq, const AdamStepOptions& o) {
  TITAN_CHECK(adam_step_supported(param, grad, exp_avg, exp_avg_sq),
              "adam_step: unsupported tensors (param ", param.scalar_type(), " ", param.sizes(),
              " strides ", param.strides(), " on ", param.device(), ", grad ", grad.scalar_type(),
              " strides ", grad.strides(), "). HINT: check adam_step_supported first");
  const double step = static_cast<double>(o.step);
  Coefficients c;
  c.decay = static_cast<float>(1.0 - o.lr * o.weight_decay);
  c.l2 = static_cast<float>(o.weight_decay);
  c.one_minus_b1 = static_cast<float>(1.0 - o.beta1);
  c.beta2 = static_cast<float>(o.beta2);
  c.one_minus_b2 = static_cast<float>(1.0 - o.beta2);
  c.bias2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(o.beta2, step)));
  c.eps = static_cast<float>(o.eps);
  c.neg_step_size = static_cast<float>(-o.lr / (1.0 - std::pow(o.beta1, step)));
  // No decay at all: AdamW's factor 1 is exact, Adam's term 0 * p would turn an inf p into NaN.
  const bool decoupled = o.decoupled || o.weight_decay == 0;
  c.grad_scale = 1.0f;
  if (o.grad_scale.defined()) {
    TITAN_CHECK(decoupled, "adam_step: grad_scale with Adam's L2 decay; scale the gradient first");
    TITAN_CHECK(o.grad_scale.device().is_cpu() && o.grad_scale.numel() == 1 &&
                    o.grad_scale.scalar_type() == at::kFloat,
                "adam_step: grad_scale must be one float32 on the CPU, got ",
                o.grad_scale.scalar_type(), " ", o.grad_scale.sizes(), " on ",
                o.grad_scale.device());
    c.grad_scale = *o.grad_scale.data_ptr<float>();  // host memory: no device read
  }

  const int64_t n = param.numel();
  if (param.scalar_type() == at::kFloat && exp_avg.scalar_type() == at::kBFloat16) {
    float* p = param.data_ptr<float>();
    const float* g = grad.data_ptr<float>();
    auto* m = exp_avg.data_ptr<c10::BFloat16>();
    auto* v = exp_avg_sq.data_ptr<c10::BFloat16>();
    at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
      adam_range_float_bf16_states(p, g, m, v, begin, end, c, decoupled);
    });
  } else if (param.scalar_type() == at::kFloat) {
    float* p = param.data_ptr<float>();
    const float* g = grad.data_ptr<float>();
    float* m = exp_avg.data_ptr<float>();
    float* v = exp_avg_sq.data_ptr<float>();
    at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
      adam_range_float(p, g, m, v, begin, end, c, decoupled);
    });
  } else {
    auto* p = param.data_ptr<c10::BFloat16>();
    const auto* g = grad.data_ptr<c10::BFloat16>();
    auto* m = exp_avg.data_ptr<c10::BFloat16>();
    auto* v = exp_avg_sq.data_ptr<c10::BFloat16>();
    at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
      adam_range_bf16(p, g, m, v, begin, end, c, decoupled);
    });
  }
}

}  // namespace titan::kernels
