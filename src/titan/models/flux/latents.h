// FLUX's latent layout and flow schedule: latents (bs, c, h, w) as the transformer's image tokens
// (2x2 patches), their positions, and the Euler sampler of the rectified flow.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <vector>

namespace titan::flux {

// Latents (bs, c, h, w) as the transformer's image tokens (bs, h/2 * w/2, c * 4): each 2x2
// patch's channels c-major ("b c (h ph) (w pw) -> b (h w) (c ph pw)"), and back.
at::Tensor pack_latents(const at::Tensor& latents);
at::Tensor unpack_latents(const at::Tensor& packed, int64_t height, int64_t width);
// The packed patches' positions (h/2 * w/2, 3): (0, row, column), row-major.
at::Tensor latent_position_ids(int64_t height, int64_t width);

// The sampling times from 1 (noise) to 0 (image), num_steps + 1 of them: linear, or with
// `shift` moved toward 1 by black-forest-labs' time shift exp(mu) / (exp(mu) + (1 / t - 1)),
// mu growing linearly from 0.5 at 256 image tokens to 1.15 at 4096 (FLUX.1-dev's schedule;
// schnell samples unshifted).
std::vector<double> flow_schedule(int64_t num_steps, int64_t image_tokens, bool shift);

// Euler steps of the flow from `noise` along `timesteps` (flow_schedule's): x <- x + (t_next -
// t) * velocity(x, t). Returns the final x.
at::Tensor euler_sample(const at::Tensor& noise, const std::vector<double>& timesteps,
                        const std::function<at::Tensor(const at::Tensor& x, double t)>& velocity);

}  // namespace titan::flux
