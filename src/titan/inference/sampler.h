// Picking the next token from a row of logits: greedy (temperature 0) or sampling from the
// softmax at a temperature, optionally restricted to the top_k most likely tokens and to the
// nucleus (the most likely tokens whose probabilities sum to top_p). The sampler owns its random
// stream (std::mt19937_64 from a seed) so that a run is reproducible whatever else draws from
// libtorch's global generator, and the draw does not depend on a libtorch version's multinomial.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <random>

namespace titan {

struct SamplerOptions {
  double temperature = 1.0;  // softmax(logits / temperature); 0: greedy argmax
  int64_t top_k = 0;         // > 0: sample among the top_k most likely tokens only
  double top_p = 1.0;        // < 1: sample among the fewest most likely tokens with mass >= top_p
  uint64_t seed = 0;         // seeds the sampler's own random stream
};

class Sampler {
 public:
  // Throws ConfigError naming the option when temperature < 0, top_k < 0 or top_p not in (0, 1].
  explicit Sampler(const SamplerOptions& options);

  // logits (vocab) of one position, any float dtype and device -> the chosen token id.
  int64_t sample(const at::Tensor& logits);

  bool greedy() const { return options_.temperature == 0.0; }

 private:
  // A uniform double in [0, 1) from 53 random bits (the same on every standard library, unlike
  // std::uniform_real_distribution).
  double uniform();

  SamplerOptions options_;
  std::mt19937_64 rng_;
};

}  // namespace titan
