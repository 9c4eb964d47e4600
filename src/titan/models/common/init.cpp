// Truncated-normal init by inverse CDF (see init.h).
#include "titan/models/common/init.h"

#include "titan/common/check.h"

#include <ATen/core/grad_mode.h>

#include <cmath>

namespace titan {
namespace {

// Rejection sampling is used when at least this much of the normal's mass lies inside [a, b]
// (fewer than 1% of the draws are redrawn, in a round or two).
constexpr double kRejectionMinMass = 0.99;

double normal_cdf(double x) { return 0.5 * (1.0 + std::erf(x / std::sqrt(2.0))); }

}  // namespace

void trunc_normal_(at::Tensor& tensor, double mean, double std, double a, double b) {
  TITAN_CHECK(std > 0 && a < b, "trunc_normal_: need std > 0 and a < b, got std ", std, ", [", a,
              ", ", b, "]");
  at::NoGradGuard no_grad;
  const double lo = normal_cdf((a - mean) / std);
  const double hi = normal_cdf((b - mean) / std);
  // Sample in place when the tensor is float32 already; otherwise into a float32 scratch.
  const bool in_place = tensor.scalar_type() == at::kFloat;
  at::Tensor sample =
      in_place ? tensor : at::empty(tensor.sizes(), tensor.options().dtype(at::kFloat));
  if (hi - lo >= kRejectionMinMass) {
    // Most draws land inside [a, b]: draw normals and redraw the few outside. Several times
    // faster than erfinv, and the result has the same (exactly truncated) distribution.
    sample.normal_(mean, std);
    for (;;) {
      const at::Tensor outside = sample.lt(a).logical_or_(sample.gt(b));
      const int64_t n_outside = outside.count_nonzero().item<int64_t>();
      if (n_outside == 0) {
        break;
      }
      sample.masked_scatter_(outside, at::empty({n_outside}, sample.options()).normal_(mean, std));
    }
  } else {
    // Inverse CDF: uniform on [2 lo - 1, 2 hi - 1] maps through erfinv to a standard normal
    // truncated to the standardized bounds; then scale and shift, and clamp away rounding just
    // outside [a, b].
    sample.uniform_(2 * lo - 1, 2 * hi - 1);
    sample.erfinv_();
    sample.mul_(std * std::sqrt(2.0));
    sample.add_(mean);
    sample.clamp_(a, b);
  }
  if (!in_place) {
    tensor.copy_(sample);
  }
}

}  // namespace titan
