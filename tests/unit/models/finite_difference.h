// Central differences for gradient checks in float64 tests.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>

namespace titan::test {

// d loss / d p[j] by (loss(p[j] + h) - loss(p[j] - h)) / 2h, for a float64 tensor `p` (any
// shape, contiguous; entry j of its flat view); p is restored afterwards.
inline double central_difference(const at::Tensor& p, int64_t j,
                                 const std::function<double()>& loss, double h = 1e-6) {
  at::NoGradGuard no_grad;
  at::Tensor flat = p.view({-1});
  const double keep = flat[j].item<double>();
  flat[j] = keep + h;
  const double up = loss();
  flat[j] = keep - h;
  const double down = loss();
  flat[j] = keep;
  return (up - down) / (2 * h);
}

}  // namespace titan::test
