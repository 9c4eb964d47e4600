// Float8 linear layers (models/common/float8.h, models/converters.h): the scale math of each
// recipe, the saturating cast, the emulated GEMM against at::_scaled_mm's own kernel, the float8
// linear's output and both gradients against a float64 re-derivation of torchao's recipes, and
// which layers the converter converts.
#include "titan/common/check.h"
#include "titan/common/device.h"
#include "titan/models/common/float8.h"
#include "titan/models/common/linear.h"
#include "titan/models/converters.h"
#include "titan/models/registry.h"

#include "../test_util.h"

#include <gtest/gtest.h>

#include <cmath>

namespace titan {
namespace test_float8 {

constexpr at::ScalarType kE4M3 = at::kFloat8_e4m3fn;
constexpr at::ScalarType kE5M2 = at::kFloat8_e5m2;

double max_abs(const at::Tensor& t) { return t.abs().max().item<double>(); }

// ||a - b|| / ||b|| in float64.
double rel_error(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor bd = b.to(at::kDouble);
  return (a.to(at::kDouble) - bd).norm().item<double>() / bd.norm().item<double>();
}

TEST(Float8Scale, IsFp8MaxOverAmaxInFloat32OrItsPowerOf2Floor) {
  const at::Tensor amax = at::tensor({2.0f, 3.0f, 0.0f, 1e-30f});
  const at::Tensor s = float8_scale(amax, kE4M3, /*power_of_2=*/false);
  EXPECT_EQ(s.scalar_type(), at::kFloat);
  EXPECT_FLOAT_EQ(s[0].item<float>(), 224.0f);
  EXPECT_FLOAT_EQ(s[1].item<float>(), static_cast<float>(448.0 / 3.0));
  // amax 0 (and anything below 1e-12) divides by 1e-12: a large finite scale, never inf.
  EXPECT_FLOAT_EQ(s[2].item<float>(), static_cast<float>(448e12));
  EXPECT_FLOAT_EQ(s[3].item<float>(), static_cast<float>(448e12));
  const at::Tensor p = float8_scale(amax, kE4M3, /*power_of_2=*/true);
  EXPECT_EQ(p[0].item<float>(), 128.0f);  // 224 -> 2^7
  EXPECT_EQ(p[1].item<float>(), 128.0f);  // 149.3 -> 2^7
  EXPECT_EQ(float8_scale(at::tensor({1.0f}), kE5M2, false).item<float>(), 57344.0f);
  EXPECT_EQ(float8_scale(at::tensor({1.0f}), kE5M2, true).item<float>(), 32768.0f);
}

// e4m3 keeps 3 mantissa bits (rounding error <= 2^-4 relative), e5m2 keeps 2 (2^-3); below the
// normal range the spacing is fixed: 2^-9 (e4m3) and 2^-16 (e5m2) of the scaled value.
void expect_round_trip(const at::Tensor& x, at::ScalarType dtype, std::optional<int64_t> dim,
                       bool pow2) {
  const Float8Tensor q = to_float8(x, dtype, dim, pow2);
  EXPECT_EQ(q.data.scalar_type(), dtype);
  const at::Tensor back = from_float8(q, at::kDouble);
  const double rel = dtype == kE4M3 ? 0x1p-4 : 0x1p-3;
  const double sub = dtype == kE4M3 ? 0x1p-10 : 0x1p-17;
  const at::Tensor bound = rel * x.to(at::kDouble).abs() + sub / q.scale.to(at::kDouble);
  EXPECT_TRUE(((back - x.to(at::kDouble)).abs() <= bound).all().item<bool>());
  // The largest magnitude of each scaled group lands on fp8_max (or in [max/2, max] with
  // power-of-2 scales): the cast uses the whole range.
  const double fmax = float8_max(dtype);
  const at::Tensor scaled = q.data.to(at::kDouble).abs();
  const at::Tensor top = dim ? at::amax(scaled, {*dim}) : scaled.max();
  if (pow2) {
    EXPECT_TRUE(((top >= fmax / 2) & (top <= fmax)).all().item<bool>());
  } else {
    EXPECT_TRUE((top == fmax).all().item<bool>());
  }
}

TEST(Float8Cast, RoundTripsWithinTheFormatsPrecision) {
  at::manual_seed(0);
  const at::Tensor x = at::randn({24, 40}) * at::exp(at::randn({24, 40}) * 3);  // wide range
  for (auto dtype : {kE4M3, kE5M2}) {
    expect_round_trip(x, dtype, std::nullopt, false);
    expect_round_trip(x, dtype, std::nullopt, true);
    expect_round_trip(x, dtype, 1, true);
    expect_round_trip(x, dtype, 0, true);
  }
}

// to_float8 casts without saturated_cast's clamp (its scale comes from the operand's own
// maximum) and rounds the float32 product as it stores it: bit for bit the same float8 values and
// scales as the clamped cast, for every granularity, power-of-2 scales, float32 and bf16
// operands, e4m3 and e5m2, row- and column-major results, over a wide range and with the maximum
// itself among the values; on the CPU and, where there is one, on a GPU.
TEST(Float8Cast, DynamicCastEqualsTheSaturatedCast) {
  at::manual_seed(3);
  at::Tensor x = at::randn({32, 48}) * at::exp(at::randn({32, 48}) * 4);
  x[5][7] = 3.0e4f;  // one element far above the rest
  std::vector<at::Device> devices{at::kCPU};
  if (cuda_device_count() > 0) devices.emplace_back(at::kCUDA, 0);
  for (const at::Device& device : devices) {
    for (auto hp : {at::kFloat, at::kBFloat16}) {
      const at::Tensor xh = x.to(device, hp);
      for (auto dtype : {kE4M3, kE5M2}) {
        for (std::optional<int64_t> dim :
             {std::optional<int64_t>(), std::optional<int64_t>(0), std::optional<int64_t>(1)}) {
          for (bool pow2 : {false, true}) {
            const at::Tensor amax =
                dim ? at::amax(xh.abs(), {*dim}, /*keepdim=*/true) : xh.abs().max();
            const at::Tensor scale = float8_scale(amax.to(at::kFloat), dtype, pow2);
            const at::Tensor want = saturated_cast(xh, scale, dtype).cpu().view(at::kByte);
            for (bool column_major : {false, true}) {
              const Float8Tensor got =
                  to_float8(xh, dtype, dim, pow2, nullptr, std::nullopt, column_major);
              const std::string what =
                  device.str() + " " + c10::toString(hp) + " -> " + c10::toString(dtype) +
                  (dim ? " dim " + std::to_string(*dim) : std::string(" tensorwise")) +
                  (pow2 ? " pow2" : "") + (column_major ? " column-major" : "");
              EXPECT_TRUE(at::equal(got.scale, scale)) << what;
              EXPECT_EQ(got.data.stride(column_major ? 0 : 1), 1) << what;
              EXPECT_TRUE(at::equal(got.data.cpu().view(at::kByte), want)) << what;
            }
          }
        }
      }
    }
  }
}

TEST(Float8Cast, RowwiseScalesArePerRowOrColumn) {
  at::manual_seed(1);
  const at::Tensor x = at::randn({6, 32});
  const Float8Tensor rows = to_float8(x, kE4M3, 1, true);
  const Float8Tensor cols = to_float8(x, kE4M3, 0, true);
  EXPECT_EQ(rows.scale.sizes(), at::IntArrayRef({6, 1}));
  EXPECT_EQ(cols.scale.sizes(), at::IntArrayRef({1, 32}));
  EXPECT_EQ(rows.t().scale.sizes(), at::IntArrayRef({1, 6}));
  for (int64_t r = 0; r < 6; ++r) {
    const double amax = max_abs(x[r]);
    const double want = std::exp2(std::floor(std::log2(static_cast<float>(448.0 / amax))));
    EXPECT_EQ(rows.scale[r][0].item<double>(), want) << "row " << r;
  }
  // An all-zero row casts to zeros (its scale is large and finite).
  const Float8Tensor z = to_float8(at::zeros({2, 16}), kE4M3, 1, true);
  EXPECT_TRUE(std::isfinite(z.scale.max().item<float>()));
  EXPECT_EQ(max_abs(from_float8(z, at::kFloat)), 0.0);
}

// Under tensor parallelism an operand split along `split_dim` has its maximum taken over the
// group when the maximum covers that dimension (the whole tensor, or along it), and only then.
// The group here is a stand-in whose maximum is a fixed larger value from "another rank".
TEST(Float8Cast, ShardedOperandsTakeTheGroupsMaximum) {
  const at::Tensor x = at::tensor({1.0f, -2.0f, 0.5f, 4.0f}, at::kFloat).view({2, 2});
  int calls = 0;
  Float8TensorParallel tp;
  tp.all_reduce_max = [&](const at::Tensor& amax) {
    ++calls;
    amax.clamp_min_(8.0);  // another rank holds a value of magnitude 8
  };
  const double fp8_max = float8_max(at::kFloat8_e4m3fn);
  // One scale over a split tensor: reduced.
  Float8Tensor t = to_float8(x, at::kFloat8_e4m3fn, std::nullopt, false, &tp, 1);
  EXPECT_EQ(calls, 1);
  EXPECT_FLOAT_EQ(t.scale.item<float>(), static_cast<float>(fp8_max / 8.0));
  // Per row (maximum along dim 1) of a tensor split along dim 1: reduced.
  t = to_float8(x, at::kFloat8_e4m3fn, 1, false, &tp, 1);
  EXPECT_EQ(calls, 2);
  EXPECT_TRUE(at::allclose(t.scale, at::full({2, 1}, fp8_max / 8.0, at::kFloat)));
  // Per row of a tensor split along dim 0: each rank's rows are whole, nothing to reduce.
  t = to_float8(x, at::kFloat8_e4m3fn, 1, false, &tp, 0);
  EXPECT_EQ(calls, 2);
  EXPECT_TRUE(
      at::allclose(t.scale, at::tensor({fp8_max / 2.0, fp8_max / 4.0}, at::kFloat).view({2, 1})));
  // Not split: never reduced.
  t = to_float8(x, at::kFloat8_e4m3fn, std::nullopt, false, &tp, std::nullopt);
  EXPECT_EQ(calls, 2);
  EXPECT_FLOAT_EQ(t.scale.item<float>(), static_cast<float>(fp8_max / 4.0));
}

TEST(Float8Cast, SaturatesAtTheFormatsMax) {
  const at::Tensor x = at::tensor({1000.0f, -1e6f, 1.0f, INFINITY});
  const at::Tensor one = at::ones({}, at::kFloat);
  for (auto dtype : {kE4M3, kE5M2}) {
    const at::Tensor q = saturated_cast(x, one, dtype).to(at::kFloat);
    const float m = static_cast<float>(float8_max(dtype));
    EXPECT_EQ(q[0].item<float>(), dtype == kE4M3 ? m : 1024.0f) << dtype;  // e5m2 rounds
    EXPECT_EQ(q[1].item<float>(), -m) << dtype;
    EXPECT_EQ(q[2].item<float>(), 1.0f) << dtype;
    EXPECT_EQ(q[3].item<float>(), m) << dtype;  // inf saturates too, never inf or NaN
  }
}

// The emulated GEMM against ATen's _scaled_mm kernel (reciprocal scales, row-major x
// column-major operands) on this machine: both accumulate exactly-representable products in
// float32, so they agree to float32 rounding. K = 40 exercises the zero padding to 48.
TEST(Float8Mm, EmulationMatchesScaledMmKernel) {
  at::manual_seed(2);
  for (int64_t k : {32, 40}) {
    const at::Tensor a = at::randn({24, k});
    const at::Tensor b = at::randn({k, 48}) * 3;
    for (bool rowwise : {false, true}) {
      const Float8Tensor a8 =
          to_float8(a, kE4M3, rowwise ? std::optional<int64_t>(1) : std::nullopt, rowwise);
      const Float8Tensor b8 =
          to_float8(b, kE4M3, rowwise ? std::optional<int64_t>(0) : std::nullopt, rowwise);
      const at::Tensor emulated = float8_mm(a8, b8, at::kBFloat16, /*emulate=*/true, false);
      at::Tensor kernel;
      try {
        kernel = float8_mm(a8, b8, at::kBFloat16, /*emulate=*/false, false);
      } catch (const c10::Error& e) {
        GTEST_SKIP() << "this libtorch has no _scaled_mm kernel for the CPU: "
                     << e.what_without_backtrace();
      }
      EXPECT_EQ(kernel.scalar_type(), at::kBFloat16);
      EXPECT_LT(rel_error(kernel, emulated), 1e-2) << "k " << k << " rowwise " << rowwise;
      EXPECT_LT(rel_error(float8_mm(a8, b8, at::kFloat, true, false), a.mm(b)), 0.1);
    }
  }
}

// On a GPU with float8 matmuls (compute capability >= 8.9; skipped elsewhere): the float8 linear
// through at::_scaled_mm (cuBLAS tensorwise, CUTLASS rowwise) against its emulation, output and
// both gradients, in bf16 as training runs it. Both multiply the same float8 values; they differ
// by accumulation order and the bf16 rounding of the outputs (~2^-8 relative).
TEST(Float8Mm, ScaledMmOnAFloat8GpuMatchesEmulation) {
  if (cuda_device_count() == 0 || !supports_float8(device_info(at::Device(at::kCUDA, 0)))) {
    GTEST_SKIP() << "no CUDA device of compute capability >= 8.9";
  }
  at::manual_seed(5);
  const auto opts = at::TensorOptions(at::kBFloat16).device(at::kCUDA);
  for (auto recipe :
       {Float8Recipe::kTensorwise, Float8Recipe::kRowwise, Float8Recipe::kRowwiseWithGwHp}) {
    const char* name = float8_recipe_name(recipe);
    const at::Tensor x0 = at::randn({4, 37, 64}, opts);  // 148 rows: grad_weight pads K to 160
    const at::Tensor w0 = at::randn({96, 64}, opts) * 0.1;
    const at::Tensor g = at::randn({4, 37, 96}, opts);
    std::vector<at::Tensor> outs;
    for (bool emulate : {false, true}) {
      const at::Tensor x = x0.clone().requires_grad_(true);
      const at::Tensor w = w0.clone().requires_grad_(true);
      const at::Tensor y = float8_linear(x, w, {recipe, emulate});
      EXPECT_EQ(y.scalar_type(), at::kBFloat16) << name;
      y.backward(g);
      outs.insert(outs.end(), {y.detach(), x.grad(), w.grad()});
    }
    EXPECT_LT(rel_error(outs[0], outs[3]), 1e-2) << name << " output";
    EXPECT_LT(rel_error(outs[1], outs[4]), 1e-2) << name << " grad_input";
    EXPECT_LT(rel_error(outs[2], outs[5]), 1e-2) << name << " grad_weight";
  }
}

// A float64 re-derivation of a recipe's cast: the operand's dequantized float8 value.
at::Tensor dequant(const at::Tensor& x, at::ScalarType dtype, std::optional<int64_t> dim,
                   bool pow2) {
  const at::Tensor xd = x.to(at::kDouble);
  at::Tensor amax = dim ? at::amax(xd.abs(), {*dim}, true) : xd.abs().max();
  at::Tensor scale = (float8_max(dtype) / amax.clamp_min(1e-12)).to(at::kFloat).to(at::kDouble);
  if (pow2) scale = at::exp2(at::floor(at::log2(scale)));
  const at::Tensor q = (x.to(at::kFloat) * scale.to(at::kFloat)).to(dtype).to(at::kDouble);
  return q / scale;
}

// torchao's recipes written out GEMM by GEMM (Float8LinearConfig.from_recipe_name): output,
// grad_input and grad_weight of y = x W^T in float64 from dequantized operands.
struct Reference {
  at::Tensor y, grad_x, grad_w;
};
Reference reference(Float8Recipe recipe, const at::Tensor& x, const at::Tensor& w,
                    const at::Tensor& g) {
  const std::optional<int64_t> none;
  Reference r;
  switch (recipe) {
    case Float8Recipe::kTensorwise:
      r.y = dequant(x, kE4M3, none, false).mm(dequant(w, kE4M3, none, false).t());
      r.grad_x = dequant(g, kE5M2, none, false).mm(dequant(w, kE4M3, none, false));
      r.grad_w = dequant(g, kE5M2, none, false).t().mm(dequant(x, kE4M3, none, false));
      break;
    case Float8Recipe::kRowwise:
      r.y = dequant(x, kE4M3, 1, true).mm(dequant(w, kE4M3, 1, true).t());
      r.grad_x = dequant(g, kE4M3, 1, true).mm(dequant(w, kE4M3, 0, true));
      r.grad_w = dequant(g, kE4M3, 0, true).t().mm(dequant(x, kE4M3, 0, true));
      break;
    case Float8Recipe::kRowwiseWithGwHp:
      r.y = dequant(x, kE4M3, 1, true).mm(dequant(w, kE4M3, 1, true).t());
      r.grad_x = dequant(g, kE4M3, 1, true).mm(dequant(w, kE4M3, none, true));
      r.grad_w = g.to(at::kDouble).t().mm(x.to(at::kDouble));
      break;
  }
  return r;
}

TEST(Float8Linear, EmulatedMatchesFloat64RecipeReference) {
  at::manual_seed(3);
  for (auto recipe :
       {Float8Recipe::kTensorwise, Float8Recipe::kRowwise, Float8Recipe::kRowwiseWithGwHp}) {
    const at::Tensor x = at::randn({3, 5, 32}).requires_grad_(true);
    const at::Tensor w = (at::randn({48, 32}) * 0.2).requires_grad_(true);
    const at::Tensor g = at::randn({3, 5, 48});
    const at::Tensor y = float8_linear(x, w, {recipe, /*emulate=*/true});
    ASSERT_EQ(y.sizes(), at::IntArrayRef({3, 5, 48}));
    y.backward(g);
    const Reference r =
        reference(recipe, x.detach().reshape({15, 32}), w.detach(), g.reshape({15, 48}));
    const char* name = float8_recipe_name(recipe);
    // The same float8 values, multiplied in float32 instead of float64.
    EXPECT_LT(rel_error(y.reshape({15, 48}), r.y), 1e-6) << name;
    EXPECT_LT(rel_error(x.grad().reshape({15, 32}), r.grad_x), 1e-6) << name;
    EXPECT_LT(rel_error(w.grad(), r.grad_w), 1e-6) << name;
    // And within float8's precision of the exact linear (e4m3 ~3%, e5m2 gradients ~6%).
    const at::Tensor xd = x.detach().reshape({15, 32}).to(at::kDouble);
    const at::Tensor gd = g.reshape({15, 48}).to(at::kDouble);
    EXPECT_LT(rel_error(y.reshape({15, 48}), xd.mm(w.detach().to(at::kDouble).t())), 0.08);
    EXPECT_LT(rel_error(x.grad().reshape({15, 32}), gd.mm(w.detach().to(at::kDouble))), 0.15);
    EXPECT_LT(rel_error(w.grad(), gd.t().mm(xd)), 0.15);
  }
}

TEST(Float8Linear, LinearLayerRunsInItsComputeDtypeAndGradsReachTheMaster) {
  at::manual_seed(4);
  Linear layer(32, 16, at::kBFloat16);
  {
    at::NoGradGuard no_grad;
    layer.weight.normal_(0, 0.1);
  }
  const at::Tensor x = at::randn({2, 8, 32});
  const at::Tensor plain = layer.forward(x);
  layer.float8 = Float8LinearOptions{Float8Recipe::kTensorwise, /*emulate=*/true};
  const at::Tensor y = layer.forward(x);
  EXPECT_EQ(y.scalar_type(), at::kBFloat16);
  EXPECT_LT(rel_error(y, plain), 0.1);
  y.sum().backward();
  ASSERT_TRUE(layer.weight.grad().defined());
  EXPECT_EQ(layer.weight.grad().scalar_type(), at::kFloat);
}

std::shared_ptr<Model> tiny_model() {
  ModelBuildOptions options;
  options.meta = true;  // the converter reads shapes only
  return get_model_spec("llama3").build("tiny", options);
}

size_t float8_layers(Model& model) {
  size_t n = 0;
  for (const auto& item : model.named_modules()) {
    auto* linear = dynamic_cast<Linear*>(item.value().get());
    n += linear != nullptr && linear->float8.has_value();
  }
  return n;
}

TEST(Float8Converter, ConvertsAlignedLinearsOutsideFilterFqns) {
  Float8LinearSection config;
  config.emulate = true;
  const DeviceInfo cpu = device_info(at::kCPU);
  // tiny: dim 64, 2 layers of 7 linears, output 300 x 64 (vocab 300 is no multiple of 16).
  auto model = tiny_model();
  Float8Conversion c = convert_to_float8(*model, config, cpu);
  EXPECT_EQ(c.converted.size(), 14u);
  EXPECT_EQ(float8_layers(*model), 14u);
  ASSERT_EQ(c.unaligned.size(), 1u);
  EXPECT_EQ(c.unaligned[0], "output (300x64)");
  EXPECT_EQ(c.converted[0], "layers.0.attention.wq");

  config.filter_fqns = {"w2", "attention.wo"};
  config.recipe_name = "rowwise";
  model = tiny_model();
  c = convert_to_float8(*model, config, cpu);
  EXPECT_EQ(c.converted.size(), 10u);
  EXPECT_EQ(c.filtered.size(), 4u);
  EXPECT_EQ(c.options.recipe, Float8Recipe::kRowwise);

  // torchao's size filter: nothing in the tiny model is large enough to gain.
  config.filter_fqns = {kAutoFilterSmallKn};
  model = tiny_model();
  c = convert_to_float8(*model, config, cpu);
  EXPECT_EQ(c.converted.size(), 0u);
  EXPECT_EQ(c.small.size(), 14u);
}

TEST(Float8Converter, DeviceWithoutFloat8NeedsEmulate) {
  Float8LinearSection config;  // emulate = false
  auto model = tiny_model();
  try {
    convert_to_float8(*model, config, device_info(at::kCPU));
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    const std::string m = e.what();
    EXPECT_TRUE(test::contains(m, "has no float8 matmuls")) << m;
    EXPECT_TRUE(test::contains(m, "compute capability >= 8.9")) << m;
    EXPECT_TRUE(test::contains(m, "cpu (")) << m;  // names the device found
    EXPECT_TRUE(test::contains(m, "HINT: set quantize.linear.float8.emulate = true")) << m;
  }
  DeviceInfo ampere;
  ampere.device = at::Device(at::kCUDA, 0);
  ampere.name = "NVIDIA A100";
  ampere.compute_major = 8;
  try {
    check_float8_device(config, ampere);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_TRUE(test::contains(e.what(), "compute capability 8.0")) << e.what();
  }
  DeviceInfo hopper = ampere;
  hopper.compute_major = 9;
  EXPECT_NO_THROW(check_float8_device(config, hopper));
  EXPECT_EQ(float8_layers(*model), 0u);
}

}  // namespace test_float8
}  // namespace titan
