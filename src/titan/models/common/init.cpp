// Layout-independent parameter initialization (see init.h).
#include "titan/models/common/init.h"

#include "titan/common/check.h"

#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <array>
#include <cmath>

namespace titan {
namespace {

// Attempts at one position before a truncated normal gives up and clamps. With at least 1% of
// the mass inside, all of them miss with probability 0.99^4096 < 1e-17.
constexpr uint32_t kMaxAttempts = 4096;

// The 64-bit finalizer of SplitMix64: spreads every input bit over the output.
uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// FNV-1a over the name's bytes.
uint64_t hash_name(const std::string& name) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (const unsigned char c : name) {
    h ^= c;
    h *= 0x100000001B3ull;
  }
  return h;
}

// Philox-4x32 with 10 rounds (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3").
std::array<uint32_t, 4> philox4x32(std::array<uint32_t, 4> c, uint64_t key) {
  uint32_t k0 = static_cast<uint32_t>(key);
  uint32_t k1 = static_cast<uint32_t>(key >> 32);
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = uint64_t{0xD2511F53u} * c[0];
    const uint64_t p1 = uint64_t{0xCD9E8D57u} * c[2];
    c = {static_cast<uint32_t>(p1 >> 32) ^ c[1] ^ k0, static_cast<uint32_t>(p1),
         static_cast<uint32_t>(p0 >> 32) ^ c[3] ^ k1, static_cast<uint32_t>(p0)};
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return c;
}

// 53 random bits as a double in (0, 1].
double unit_interval(uint32_t hi, uint32_t lo) {
  const uint64_t bits = (uint64_t{hi >> 5} << 26) | (lo >> 6);
  return (static_cast<double>(bits) + 1.0) * 0x1.0p-53;
}

// Two standard normals (Box-Muller's cosine and sine) from draw `attempt` of the pair of flat
// positions {2k, 2k + 1}: position i takes lane i % 2 of pair i / 2.
std::array<double, 2> normal_pair(uint64_t key, uint64_t pair, uint32_t attempt) {
  const std::array<uint32_t, 4> x = philox4x32(
      {static_cast<uint32_t>(pair), static_cast<uint32_t>(pair >> 32), attempt, 0u}, key);
  const double r = std::sqrt(-2.0 * std::log(unit_interval(x[0], x[1])));
  const double theta = 2.0 * M_PI * unit_interval(x[2], x[3]);
  return {r * std::cos(theta), r * std::sin(theta)};
}

double normal_cdf(double x) { return 0.5 * (1.0 + std::erf(x / std::sqrt(2.0))); }

// The values of consecutive positions, reusing each pair's first draw for both of its lanes.
class Sampler {
 public:
  Sampler(const ParamInit& init, uint64_t key) : init_(init), key_(key) {}

  float operator()(uint64_t index) {
    if (init_.kind == ParamInit::Kind::kUniform) {
      // One Philox draw per position: its first two words as 53 random bits.
      const std::array<uint32_t, 4> x = philox4x32(
          {static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32), 0u, 1u}, key_);
      const double u = unit_interval(x[0], x[1]) - 0x1.0p-53;  // [0, 1)
      return static_cast<float>(init_.a + (init_.b - init_.a) * u);
    }
    const uint64_t pair = index >> 1;
    const int lane = static_cast<int>(index & 1);
    if (pair != cached_pair_) {
      cached_ = normal_pair(key_, pair, 0);
      cached_pair_ = pair;
    }
    double v = init_.mean + init_.std * cached_[lane];
    if (init_.kind == ParamInit::Kind::kNormal) return static_cast<float>(v);
    // Truncated: redraw this position with the next attempts until it lands inside.
    for (uint32_t attempt = 1; !(v >= init_.a && v <= init_.b); ++attempt) {
      if (attempt == kMaxAttempts)
        return static_cast<float>(std::clamp(init_.mean, init_.a, init_.b));
      v = init_.mean + init_.std * normal_pair(key_, pair, attempt)[lane];
    }
    return static_cast<float>(v);
  }

 private:
  const ParamInit& init_;
  uint64_t key_;
  uint64_t cached_pair_ = ~uint64_t{0};
  std::array<double, 2> cached_{};
};

}  // namespace

void init_box(at::Tensor& dst, const ParamInit& init, uint64_t seed, const std::string& name,
              const ShardBox& box) {
  if (box.packed()) {
    for (const ShardPiece& piece : box.pieces()) {
      at::Tensor part = piece.of(dst);
      init_box(part, init, seed, name, piece.box);
    }
    return;
  }
  const int64_t n = dst.dim();
  TITAN_CHECK(static_cast<int64_t>(box.global_shape.size()) == n &&
                  static_cast<int64_t>(box.offsets.size()) == n,
              "init of ", name, ": a ", n, "-d tensor for a box of a ", box.global_shape.size(),
              "-d parameter");
  for (int64_t d = 0; d < n; ++d) {
    TITAN_CHECK(box.offsets[d] >= 0 && box.offsets[d] + dst.size(d) <= box.global_shape[d],
                "init of ", name, ": the box [", box.offsets[d], ", ", box.offsets[d] + dst.size(d),
                ") of dimension ", d, " leaves the parameter's ", box.global_shape[d]);
  }
  at::NoGradGuard no_grad;
  if (init.kind == ParamInit::Kind::kZeros || init.kind == ParamInit::Kind::kOnes) {
    dst.fill_(init.kind == ParamInit::Kind::kOnes ? 1.0 : 0.0);
    return;
  }
  if (init.kind == ParamInit::Kind::kUniform) {
    TITAN_CHECK(init.a < init.b, "init of ", name, ": uniform needs a < b, got [", init.a, ", ",
                init.b, ")");
  }
  TITAN_CHECK(init.std > 0, "init of ", name, ": std must be > 0, got ", init.std);
  if (init.kind == ParamInit::Kind::kTruncNormal) {
    const double mass =
        normal_cdf((init.b - init.mean) / init.std) - normal_cdf((init.a - init.mean) / init.std);
    TITAN_CHECK(init.a < init.b && mass >= 0.01, "init of ", name, ": trunc_normal(mean ",
                init.mean, ", std ", init.std, ") keeps ", mass, " of its mass in [", init.a, ", ",
                init.b, "]; at least 0.01 is needed");
  }
  if (dst.numel() == 0) return;
  const uint64_t key = mix64(mix64(seed) ^ hash_name(name));
  // Row-major strides of the whole tensor; the box is rows of its last dimension.
  std::vector<int64_t> stride(n, 1);
  for (int64_t d = n - 2; d >= 0; --d) stride[d] = stride[d + 1] * box.global_shape[d + 1];
  const int64_t row_len = n == 0 ? 1 : dst.size(n - 1);
  const int64_t rows = dst.numel() / row_len;
  at::Tensor values = at::empty({dst.numel()}, at::kFloat);
  float* out = values.data_ptr<float>();
  at::parallel_for(0, rows, std::max<int64_t>(1, 4096 / row_len), [&](int64_t r0, int64_t r1) {
    Sampler sample(init, key);
    for (int64_t r = r0; r < r1; ++r) {
      // The global flat position of the row's first element.
      int64_t rest = r;
      int64_t base = n == 0 ? 0 : box.offsets[n - 1];
      for (int64_t d = n - 2; d >= 0; --d) {
        base += (box.offsets[d] + rest % dst.size(d)) * stride[d];
        rest /= dst.size(d);
      }
      for (int64_t j = 0; j < row_len; ++j) {
        out[r * row_len + j] = sample(static_cast<uint64_t>(base + j));
      }
    }
  });
  dst.copy_(values.view(dst.sizes()));
}

void init_whole(at::Tensor& dst, const ParamInit& init, uint64_t seed, const std::string& name) {
  init_box(dst, init, seed, name, ShardBox::whole(dst.sizes()));
}

namespace {
thread_local at::Device t_param_device(at::kCPU);
}  // namespace

at::Tensor new_parameter(at::IntArrayRef sizes) {
  return at::empty(sizes, at::TensorOptions().dtype(at::kFloat).device(t_param_device));
}

ParamDeviceGuard::ParamDeviceGuard(at::Device device) : previous_(t_param_device) {
  t_param_device = device;
}

ParamDeviceGuard::~ParamDeviceGuard() { t_param_device = previous_; }

}  // namespace titan
