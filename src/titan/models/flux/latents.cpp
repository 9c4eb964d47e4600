// FLUX's latent layout and flow schedule (see latents.h).
#include "titan/models/flux/latents.h"

#include "titan/common/check.h"

#include <cmath>

namespace titan::flux {

at::Tensor pack_latents(const at::Tensor& latents) {
  const int64_t b = latents.size(0), c = latents.size(1), h = latents.size(2) / 2,
                w = latents.size(3) / 2;
  // (b, c, h, 2, w, 2) -> (b, h, w, c, 2, 2)
  return latents.reshape({b, c, h, 2, w, 2}).permute({0, 2, 4, 1, 3, 5}).reshape({b, h * w, c * 4});
}

at::Tensor unpack_latents(const at::Tensor& packed, int64_t height, int64_t width) {
  const int64_t b = packed.size(0), h = height / 2, w = width / 2, c = packed.size(2) / 4;
  // (b, h, w, c, 2, 2) -> (b, c, h, 2, w, 2)
  return packed.reshape({b, h, w, c, 2, 2})
      .permute({0, 3, 1, 4, 2, 5})
      .reshape({b, c, height, width});
}

at::Tensor latent_position_ids(int64_t height, int64_t width) {
  const int64_t h = height / 2, w = width / 2;
  const at::Tensor rows = at::arange(h, at::kFloat).view({h, 1}).expand({h, w});
  const at::Tensor cols = at::arange(w, at::kFloat).view({1, w}).expand({h, w});
  return at::stack({at::zeros_like(rows), rows, cols}, -1).reshape({h * w, 3});
}

std::vector<double> flow_schedule(int64_t num_steps, int64_t image_tokens, bool shift) {
  TITAN_CHECK(num_steps >= 1, "flux: the sampler needs at least one step, got ", num_steps);
  // mu on the line through (256, 0.5) and (4096, 1.15).
  const double slope = (1.15 - 0.5) / (4096.0 - 256.0);
  const double mu = 0.5 + slope * (static_cast<double>(image_tokens) - 256.0);
  std::vector<double> out;
  for (int64_t i = 0; i <= num_steps; ++i) {
    const double t = 1.0 - static_cast<double>(i) / static_cast<double>(num_steps);
    if (!shift || t <= 0.0) {
      out.push_back(t);
    } else {
      out.push_back(std::exp(mu) / (std::exp(mu) + (1.0 / t - 1.0)));
    }
  }
  return out;
}

at::Tensor euler_sample(const at::Tensor& noise, const std::vector<double>& timesteps,
                        const std::function<at::Tensor(const at::Tensor& x, double t)>& velocity) {
  at::Tensor x = noise;
  for (size_t i = 0; i + 1 < timesteps.size(); ++i) {
    x = x + (timesteps[i + 1] - timesteps[i]) * velocity(x, timesteps[i]);
  }
  return x;
}

}  // namespace titan::flux
