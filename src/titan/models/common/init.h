// Parameter initializers that draw from the global generator, so torch::manual_seed makes every
// model init reproducible.
#pragma once

#include <ATen/ATen.h>

namespace titan {

// Fills `tensor` in place from N(mean, std^2) truncated to the absolute interval [a, b]. When
// nearly all of the mass lies inside (the usual case) out-of-range draws are redrawn; otherwise
// the inverse-CDF method of torch.nn.init.trunc_normal_ is used (uniform in CDF space, then
// erfinv). Like TorchTitan's trunc_normal_, sampling runs in float32 and is cast to the tensor's
// dtype.
// Note a and b are absolute bounds, not multiples of std (the defaults barely truncate a small
// std).
void trunc_normal_(at::Tensor& tensor, double mean = 0.0, double std = 1.0, double a = -2.0,
                   double b = 2.0);

}  // namespace titan
