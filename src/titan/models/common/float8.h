// Float8 training of linear layers with dynamic scaling, as torchao's Float8Linear computes it
// (TorchTitan's model.converters = ["quantize.linear.float8"]): y = x W^T, grad_x = g W and
// grad_W = g^T x each cast their two operands to float8 with scales taken from the operands'
// current absolute maxima, multiply, and return the product in the input's dtype.
//
// A cast keeps `data` (float8) and `scale` (float32) with hp ~= data / scale: the operand is
// multiplied by scale = fp8_max / amax in float32, clamped to +-fp8_max (saturating, never inf or
// NaN), and rounded to float8. The recipes (torchao's Float8LinearRecipeName):
//   tensorwise          one scale per operand; input and weight e4m3, grad_output e5m2.
//   rowwise             one scale per row of each GEMM operand along the reduced dimension,
//                       e4m3 everywhere, scales rounded down to a power of 2.
//   rowwise_with_gw_hp  rowwise for the output; grad_input from a rowwise grad_output and a
//                       tensorwise weight (e4m3, power-of-2 scales); grad_weight in high precision.
// The GEMM runs as at::_scaled_mm (CUDA compute capability >= 8.9: first operand row-major,
// second column-major, reciprocal scales) or, emulated, as a float32 matmul of the dequantized
// operands (data / scale), the same numbers on any device.
#pragma once

#include "titan/models/common/deferred_grad.h"

#include <ATen/ATen.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>

namespace titan {

enum class Float8Recipe { kTensorwise, kRowwise, kRowwiseWithGwHp };

// "" (TorchTitan's None) and "tensorwise" -> kTensorwise, "rowwise", "rowwise_with_gw_hp"; throws
// ConfigError naming quantize.linear.float8.recipe_name for anything else.
Float8Recipe float8_recipe_from_name(const std::string& name);
const char* float8_recipe_name(Float8Recipe recipe);

// Under tensor parallelism a layer's GEMM operands may be shards of larger tensors, whose scales
// torchao (on DTensors) takes over the whole tensor. Set by tensor parallelism: the dimension
// along which each 2-d operand is split over the group (input (rows, in), weight (out, in),
// grad_output (rows, out)), and the in-place max over the group. An amax taken over the whole
// operand, or along its split dimension, is reduced before it becomes a scale; one taken along
// the other dimension is already complete for the rows or columns this rank holds.
struct Float8TensorParallel {
  std::optional<int64_t> input_dim, weight_dim, grad_output_dim;
  std::function<void(const at::Tensor&)> all_reduce_max;
};

// How a converted linear layer computes.
struct Float8LinearOptions {
  Float8Recipe recipe = Float8Recipe::kTensorwise;
  bool emulate = false;  // dequantize and multiply in float32 instead of at::_scaled_mm
  std::shared_ptr<const Float8TensorParallel> tp;  // null: operands are whole
};

// The largest finite value of a float8 dtype: 448 (e4m3fn), 57344 (e5m2).
double float8_max(at::ScalarType float8_dtype);

// The scale for a float32 absolute maximum `amax` (any shape): fp8_max / max(amax, 1e-12),
// computed in float64 and rounded to float32, then rounded down to a power of 2 if asked.
at::Tensor float8_scale(const at::Tensor& amax, at::ScalarType float8_dtype, bool power_of_2);

// (x * scale) in float32, clamped to +-fp8_max and rounded to `float8_dtype`: values past the
// format's range (inf included) saturate; an unclamped cast would give inf (e5m2).
at::Tensor saturated_cast(const at::Tensor& x, const at::Tensor& scale,
                          at::ScalarType float8_dtype);

// A tensor in float8 with its scale: data (rows, cols) float8, scale float32 of shape () for
// one scale, (rows, 1) for one per row, or (1, cols) for one per column.
struct Float8Tensor {
  at::Tensor data;
  at::Tensor scale;
  // The transposed matrix (data and scale both transposed; no copy).
  Float8Tensor t() const { return {data.t(), scale.t()}; }
};

// `x` (rows, cols) cast to `float8_dtype`, in one pass over x after its maximum (the product
// with the scale is taken in float32 and rounded on the store), laid out column-major when asked
// (the layout at::_scaled_mm takes for its second operand, so float8_mm copies nothing).
// reduce_dim: nullopt for one scale over the whole tensor, 1 for one per row (the absolute maximum
// over dim 1), 0 for one per column. With `tp` and x split along `split_dim` over its group, the
// maximum covers the whole tensor (see above).
Float8Tensor to_float8(const at::Tensor& x, at::ScalarType float8_dtype,
                       std::optional<int64_t> reduce_dim, bool power_of_2,
                       const Float8TensorParallel* tp = nullptr,
                       std::optional<int64_t> split_dim = std::nullopt, bool column_major = false);
// data / scale in `dtype`.
at::Tensor from_float8(const Float8Tensor& x, at::ScalarType dtype);

// a (M, K) @ b (K, N) -> (M, N) in `out_dtype`. emulate: float32 matmul of the dequantized
// operands; otherwise at::_scaled_mm (on any device that implements it; the inner dimension is
// zero-padded to a multiple of 16 when it is not one).
at::Tensor float8_mm(const Float8Tensor& a, const Float8Tensor& b, at::ScalarType out_dtype,
                     bool emulate, bool use_fast_accum);

// x (..., in) @ weight (out, in)^T -> (..., out) in x's dtype, with forward and both backward
// GEMMs in float8 per `options` (gradients flow to x and weight as for at::linear). Under per-op
// activation checkpointing (savable_ops.h) the output is a savable matmul like at::linear's.
// `weight8`: the weight already cast (tensorwise recipe only: FSDP's float8 all-gather gathers
// it in float8 with one scale over the whole weight); both GEMMs that read the weight use it
// instead of casting `weight`, which then only carries the gradient. `defer`: while it collects
// (deferred_grad.h), backward leaves the grad_weight GEMM (same casts, same numbers) for later.
at::Tensor float8_linear(const at::Tensor& x, const at::Tensor& weight,
                         const Float8LinearOptions& options, const Float8Tensor* weight8 = nullptr,
                         const DeferTarget& defer = {});

}  // namespace titan
