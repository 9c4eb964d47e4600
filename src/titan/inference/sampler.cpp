// Token sampling (see sampler.h). Probabilities are computed in float64 on the CPU: one row of
// at most a few hundred thousand entries per token, cheap next to the forward pass, and the
// cumulative sums of the nucleus cut do not lose the tail to float32 rounding.
#include "titan/inference/sampler.h"

#include "titan/common/check.h"

#include <cmath>
#include <sstream>

namespace titan {

Sampler::Sampler(const SamplerOptions& options) : options_(options), rng_(options.seed) {
  std::ostringstream err;
  if (!(options.temperature >= 0.0) || !std::isfinite(options.temperature)) {
    err << "--temperature must be >= 0 (0 = greedy), got " << options.temperature;
  } else if (options.top_k < 0) {
    err << "--top_k must be >= 0 (0 = no top-k cut), got " << options.top_k;
  } else if (!(options.top_p > 0.0 && options.top_p <= 1.0)) {
    err << "--top_p must be in (0, 1] (1 = no nucleus cut), got " << options.top_p;
  }
  if (!err.str().empty()) {
    throw ConfigError(err.str());
  }
}

double Sampler::uniform() { return static_cast<double>(rng_() >> 11) * 0x1.0p-53; }

int64_t Sampler::sample(const at::Tensor& logits) {
  TITAN_CHECK(logits.dim() == 1 && logits.size(0) > 0, "sample expects one row of logits, got ",
              logits.sizes());
  const int64_t vocab = logits.size(0);
  // A NaN or inf logit (broken weights or model arguments) would pick an arbitrary token: refuse.
  const auto check_finite = [&](int64_t bad) {
    if (bad == 0) return;
    throw DataError("the model's logits hold " + std::to_string(bad) +
                    " non-finite values (NaN or "
                    "inf) among " +
                    std::to_string(vocab) +
                    ": its weights or its configuration (e.g. config.json values) are broken; "
                    "nothing was sampled");
  };
  if (greedy()) {
    // Ties go to the lowest id, so greedy output is a pure function of the logits. The choice
    // and the count of non-finite logits come back in one read.
    const at::Tensor both =
        at::stack({logits.argmax(), at::logical_not(at::isfinite(logits)).sum()}).to(at::kCPU);
    check_finite(both[1].item<int64_t>());
    return both[0].item<int64_t>();
  }
  const at::Tensor cpu_logits = logits.to(at::kCPU, at::kDouble);
  check_finite(at::logical_not(at::isfinite(cpu_logits)).sum().item<int64_t>());
  const at::Tensor probs = at::softmax(cpu_logits / options_.temperature, /*dim=*/0);
  // Candidates in decreasing probability when a cut needs the order; all tokens otherwise.
  at::Tensor values = probs;
  at::Tensor indices;  // undefined: values are indexed by token id
  if (options_.top_k > 0 && options_.top_k < vocab) {
    std::tie(values, indices) = at::topk(probs, options_.top_k);  // sorted, descending
  } else if (options_.top_p < 1.0) {
    std::tie(values, indices) = at::sort(probs, /*dim=*/0, /*descending=*/true);
  }
  values = values.contiguous();
  const double* p = values.data_ptr<double>();
  int64_t n = values.size(0);
  if (options_.top_p < 1.0) {
    // Keep the fewest leading tokens whose mass reaches top_p (at least one), as a fraction of
    // the mass left after top_k, the order of TorchTitan's and Hugging Face's samplers.
    double kept_total = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      kept_total += p[i];
    }
    double cumulative = 0.0;
    int64_t keep = 0;
    while (keep < n && cumulative < options_.top_p * kept_total) {
      cumulative += p[keep++];
    }
    n = std::max<int64_t>(keep, 1);
  }
  double total = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    total += p[i];
  }
  // Inverse CDF over the kept candidates; the last one catches rounding at the top end.
  const double target = uniform() * total;
  double cumulative = 0.0;
  int64_t chosen = n - 1;
  for (int64_t i = 0; i < n; ++i) {
    cumulative += p[i];
    if (target < cumulative) {
      chosen = i;
      break;
    }
  }
  return indices.defined() ? indices[chosen].item<int64_t>() : chosen;
}

}  // namespace titan
