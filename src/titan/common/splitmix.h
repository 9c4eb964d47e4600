// splitmix64: a small generator whose stream depends only on its seed (the same on every machine
// and library version), for data decisions that must not depend on the layout of ranks or on
// the order in which samples are read (a sample's crop, its caption drops, its noise seed).
#pragma once

#include <cstdint>

namespace titan {

class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, 1).
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  // Uniform in [0, n) for n > 0 (modulo: a bias below n / 2^64).
  int64_t below(int64_t n) { return static_cast<int64_t>(next() % static_cast<uint64_t>(n)); }

 private:
  uint64_t state_;
};

// The generator of item `serial` of the stream keyed `key` (a run's seed mixed with what the
// draws are for): neighbouring serials and keys give unrelated streams, and nothing else enters.
inline SplitMix64 keyed_stream(uint64_t key, int64_t serial) {
  SplitMix64 mix(key);
  return SplitMix64(mix.next() + static_cast<uint64_t>(serial) * 0x9E3779B97F4A7C15ull);
}

}  // namespace titan
