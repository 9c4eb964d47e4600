// Parameter initialization that does not depend on the layout: a parameter's initial value at a
// position of the whole tensor is a function of (seed, parameter name, position) only, so a rank
// can initialize just its box (a TP slice, an FSDP row block of it) and every layout starts from
// the weights one process would have. Random values come from a counter-based generator
// (Philox-4x32-10 keyed by the seed and the name, counted by the pair of flat positions
// {2k, 2k + 1}), turned into two normals by Box-Muller in double precision; a truncated normal
// redraws an out-of-range position with the next attempt counter.
//
//   model->param_init("layers.0.attention.wq.weight")   // ParamInit::trunc_normal(0, 0.02)
//   init_box(local, rule, seed, name, box);              // this rank's box of it
#pragma once

#include "titan/common/shard_box.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <string>

namespace titan {

// How a parameter starts out. trunc_normal's a and b are absolute bounds, not multiples of std
// (TorchTitan's convention: the defaults barely truncate a small std).
struct ParamInit {
  enum class Kind { kZeros, kOnes, kNormal, kTruncNormal, kUniform };
  Kind kind = Kind::kZeros;
  double mean = 0.0;
  double std = 1.0;
  double a = -2.0;
  double b = 2.0;

  static ParamInit zeros() { return {Kind::kZeros}; }
  static ParamInit ones() { return {Kind::kOnes}; }
  static ParamInit normal(double mean, double std) { return {Kind::kNormal, mean, std}; }
  // Uniform on [a, b) (e.g. kaiming_uniform's bounds, computed by the caller).
  static ParamInit uniform(double a, double b) { return {Kind::kUniform, 0.0, 1.0, a, b}; }
  // At least 1% of the normal's mass must lie in [a, b] (checked when used).
  static ParamInit trunc_normal(double mean, double std, double a = -2.0, double b = 2.0) {
    return {Kind::kTruncNormal, mean, std, a, b};
  }
};

// Fills `dst` (any dtype and device; its sizes are the box's lengths) with the values that the
// box `box` of parameter `name` holds when the whole parameter is initialized by `init` under
// `seed`. Values are computed in double, rounded to float32, then cast to dst's dtype.
void init_box(at::Tensor& dst, const ParamInit& init, uint64_t seed, const std::string& name,
              const ShardBox& box);

// The whole of `dst` as parameter `name` (init_box with the whole box).
void init_whole(at::Tensor& dst, const ParamInit& init, uint64_t seed, const std::string& name);

// Where layers create their parameters: an uninitialized float32 tensor on the current thread's
// parameter device (CPU unless a ParamDeviceGuard says otherwise). Under the meta device a model
// is shapes only: parallelize gives each rank storage for its pieces, then they are initialized.
at::Tensor new_parameter(at::IntArrayRef sizes);

// Sets the parameter device of this thread for its lifetime (nests).
class ParamDeviceGuard {
 public:
  explicit ParamDeviceGuard(at::Device device);
  ~ParamDeviceGuard();
  ParamDeviceGuard(const ParamDeviceGuard&) = delete;
  ParamDeviceGuard& operator=(const ParamDeviceGuard&) = delete;

 private:
  at::Device previous_;
};

}  // namespace titan
