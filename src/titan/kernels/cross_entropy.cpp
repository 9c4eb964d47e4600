// Cross-entropy row kernels (see cross_entropy.h). One cloned function per dtype holds the row
// loop; bfloat16 rows are widened into a float row buffer first, so every loop runs on one lane
// width (cpu_simd.h), and narrowed back once when the gradient is written.
#include "titan/kernels/cross_entropy.h"

#include "titan/common/check.h"
#include "titan/kernels/cpu_simd.h"

#include <ATen/Parallel.h>

#include <cmath>
#include <limits>
#include <vector>

namespace titan::kernels {

namespace {

using c10::BFloat16;

// Independent partial results per lane make the reductions plain vertical vector ops (a single
// float accumulator would need reassociation to vectorize).
constexpr int kLanes = 16;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

inline __attribute__((always_inline)) float row_max(const float* x, int64_t n) {
  float m[kLanes];
  for (int l = 0; l < kLanes; ++l) m[l] = kNegInf;
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) m[l] = x[i + l] > m[l] ? x[i + l] : m[l];
  }
  float out = kNegInf;
  for (; i < n; ++i) out = x[i] > out ? x[i] : out;
  for (int l = 0; l < kLanes; ++l) out = m[l] > out ? m[l] : out;
  return out;
}

inline __attribute__((always_inline)) float row_sum_exp(const float* x, int64_t n, float shift) {
  float s[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) s[l] += exp_approx(x[i + l] - shift);
  }
  float out = 0.0f;
  for (; i < n; ++i) out += exp_approx(x[i] - shift);
  for (int l = 0; l < kLanes; ++l) out += s[l];
  return out;
}

// What a row pass computes: statistics (lse_out, target_out), the gradient (scale, with lse_in
// or the statistics just computed), or both.
struct RowJob {
  int64_t n = 0;  // logits per row
  const int64_t* labels = nullptr;
  int64_t vocab_start = 0;
  const float* lse_in = nullptr;  // given log-sum-exp (gradient only)
  const float* scale = nullptr;   // null: no gradient
  float* lse_out = nullptr;       // null: no statistics
  float* target_out = nullptr;
};

// Row r of x (float32, n values) in place; returns nothing, writes per RowJob.
inline __attribute__((always_inline)) void row_pass(float* x, const RowJob& job, int64_t r) {
  const int64_t n = job.n;
  const int64_t t = job.labels[r] - job.vocab_start;
  const bool here = t >= 0 && t < n;
  float lse;
  if (job.lse_out != nullptr) {
    const float m = row_max(x, n);
    lse = m + std::log(row_sum_exp(x, n, m));
    job.lse_out[r] = lse;
    job.target_out[r] = here ? x[t] : 0.0f;
  } else {
    lse = job.lse_in[r];
  }
  if (job.scale == nullptr) return;
  const float s = job.scale[r];
  for (int64_t j = 0; j < n; ++j) x[j] = s * exp_approx(x[j] - lse);
  if (here) x[t] -= s;
}

TITAN_CPU_CLONES void rows_f32(float* logits, const RowJob& job, int64_t begin, int64_t end) {
  for (int64_t r = begin; r < end; ++r) row_pass(logits + r * job.n, job, r);
}

// `buf` holds job.n floats.
TITAN_CPU_CLONES void rows_bf16(BFloat16* logits, const RowJob& job, float* buf, int64_t begin,
                                int64_t end) {
  const int64_t n = job.n;
  for (int64_t r = begin; r < end; ++r) {
    BFloat16* x = logits + r * n;
    for (int64_t j = 0; j < n; ++j) buf[j] = bf16_to_float(x[j]);
    row_pass(buf, job, r);
    if (job.scale == nullptr) continue;
    for (int64_t j = 0; j < n; ++j) x[j] = float_to_bf16(buf[j]);
  }
}

void check_rows(const char* op, const at::Tensor& logits, const at::Tensor& labels,
                std::initializer_list<at::Tensor> per_row) {
  TITAN_CHECK(logits.device().is_cpu() && logits.dim() == 2 && logits.is_contiguous() &&
                  (logits.scalar_type() == at::kFloat || logits.scalar_type() == at::kBFloat16),
              op, ": logits must be a contiguous (rows, n) float32 or bfloat16 CPU tensor, got ",
              logits.sizes(), " ", logits.scalar_type(), " on ", logits.device());
  const int64_t rows = logits.size(0);
  TITAN_CHECK(labels.device().is_cpu() && labels.scalar_type() == at::kLong &&
                  labels.is_contiguous() && labels.numel() == rows,
              op, ": labels must be ", rows, " contiguous int64 values on the CPU, got ",
              labels.sizes(), " ", labels.scalar_type());
  for (const at::Tensor& t : per_row) {
    TITAN_CHECK(t.device().is_cpu() && t.scalar_type() == at::kFloat && t.is_contiguous() &&
                    t.numel() == rows,
                op, ": per-row values must be ", rows, " contiguous float32 values, got ",
                t.sizes(), " ", t.scalar_type());
  }
}

void run_rows(at::Tensor& logits, const RowJob& job) {
  const int64_t rows = logits.size(0);
  if (rows == 0 || job.n == 0) return;
  const int64_t grain = std::max<int64_t>(1, 16384 / job.n);
  if (logits.scalar_type() == at::kFloat) {
    float* data = logits.data_ptr<float>();
    at::parallel_for(0, rows, grain, [&](int64_t b, int64_t e) { rows_f32(data, job, b, e); });
    return;
  }
  BFloat16* data = logits.data_ptr<BFloat16>();
  at::parallel_for(0, rows, grain, [&](int64_t b, int64_t e) {
    std::vector<float> buf(static_cast<size_t>(job.n));
    rows_bf16(data, job, buf.data(), b, e);
  });
}

}  // namespace

// The job over `logits` and `labels`; the caller adds what to read and write.
static RowJob job_over(const at::Tensor& logits, const at::Tensor& labels, int64_t vocab_start) {
  RowJob job;
  job.n = logits.size(1);
  job.labels = labels.data_ptr<int64_t>();
  job.vocab_start = vocab_start;
  return job;
}

void cross_entropy_stats(const at::Tensor& logits, const at::Tensor& labels, int64_t vocab_start,
                         at::Tensor& lse, at::Tensor& target) {
  check_rows("cross_entropy_stats", logits, labels, {lse, target});
  RowJob job = job_over(logits, labels, vocab_start);
  job.lse_out = lse.data_ptr<float>();
  job.target_out = target.data_ptr<float>();
  at::Tensor in = logits;  // read only: the job writes no gradient
  run_rows(in, job);
}

void cross_entropy_grad_(at::Tensor& logits, const at::Tensor& labels, int64_t vocab_start,
                         const at::Tensor& lse, const at::Tensor& scale) {
  check_rows("cross_entropy_grad_", logits, labels, {lse, scale});
  RowJob job = job_over(logits, labels, vocab_start);
  job.lse_in = lse.data_ptr<float>();
  job.scale = scale.data_ptr<float>();
  run_rows(logits, job);
}

void cross_entropy_stats_grad_(at::Tensor& logits, const at::Tensor& labels,
                               const at::Tensor& scale, at::Tensor& lse, at::Tensor& target) {
  check_rows("cross_entropy_stats_grad_", logits, labels, {scale, lse, target});
  RowJob job = job_over(logits, labels, 0);
  job.scale = scale.data_ptr<float>();
  job.lse_out = lse.data_ptr<float>();
  job.target_out = target.data_ptr<float>();
  run_rows(logits, job);
}

}  // namespace titan::kernels
