// The MoE experts' grouped GEMMs in float8 rowwise and MXFP8 (moe.h's ExpertQuantization, the
// quantize.grouped_mm.* converters): against torchao (a fixture written by
// tests/e2e/mx_reference.py, run by test_mx.sh): its emulated MXFP8 grouped GEMM and its float8
// rowwise casts per expert group, forward and both gradients, for the per-expert loop and for
// float8's one-launch form (float8_grouped.h); on their own, close to the high precision experts,
// the converter's selection and refusals, the layer's paths; on a GPU, the kernels against their
// emulation.
#include "titan/checkpoint/safetensors.h"
#include "titan/common/check.h"
#include "titan/common/device.h"
#include "titan/models/common/float8_grouped.h"
#include "titan/models/common/moe.h"
#include "titan/models/common/mx.h"
#include "titan/models/converters.h"
#include "titan/models/registry.h"

#include "../test_util.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace titan {
namespace test_moe_quant {

double rel_error(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).norm().item<double>() /
         b.to(at::kDouble).norm().item<double>();
}

std::vector<int64_t> counts_of(const at::Tensor& t) {
  const at::Tensor c = t.to(at::kLong).contiguous();
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

struct Result {
  at::Tensor out, grad_x, grad_w;
};

Result run_grouped(const at::Tensor& x0, const at::Tensor& w0, const at::Tensor& g,
                   const std::vector<int64_t>& counts, const ExpertQuantization& q) {
  const at::Tensor x = x0.clone().requires_grad_(true);
  const at::Tensor w = w0.clone().requires_grad_(true);
  const at::Tensor out = quantized_grouped_linear(x, w, counts, q);
  out.backward(g);
  return {out.detach(), x.grad(), w.grad()};
}

// |a - b| within one rounding of b's dtype (bf16: 2^-8 relative) for every element, and the
// share of elements equal.
double share_equal_within_one_rounding(const at::Tensor& a, const at::Tensor& b, double ulp) {
  const at::Tensor af = a.to(at::kFloat), bf = b.to(at::kFloat);
  const at::Tensor diff = (af - bf).abs();
  const at::Tensor bound = bf.abs() * ulp + 1e-30;
  EXPECT_TRUE(diff.le(bound).all().item<bool>())
      << "max |diff| " << diff.max().item<float>() << " at a value of "
      << bf.abs().flatten().index({diff.flatten().argmax()}).item<float>();
  return af.eq(bf).to(at::kDouble).mean().item<double>();
}

TEST(MoeQuant, MxGroupedMatchesTorchao) {
  const char* path = std::getenv("TITAN_MX_FIXTURE");
  if (path == nullptr) GTEST_SKIP() << "run by tests/e2e/test_mx.sh";
  const ckpt::SafetensorsReader file(path);
  const std::vector<int64_t> counts = counts_of(file.read("grouped.counts"));
  ExpertQuantization q;
  q.gemm = ExpertGemm::kMxfp8;
  const Result r = run_grouped(file.read("grouped_mx.x"), file.read("grouped_mx.w"),
                               file.read("grouped_mx.g"), counts, q);
  // The same MXFP8 operands; torchao multiplies them as bf16 through torch._grouped_mm, titan
  // in float32, each rounding its product to bf16 once: equal within one bf16 rounding.
  const double kBf16 = std::ldexp(1.0, -8);
  const double out = share_equal_within_one_rounding(r.out, file.read("grouped_mx.out"), kBf16);
  const double gx =
      share_equal_within_one_rounding(r.grad_x, file.read("grouped_mx.grad_x"), kBf16);
  const double gw =
      share_equal_within_one_rounding(r.grad_w, file.read("grouped_mx.grad_w"), kBf16);
  EXPECT_GT(out, 0.9);
  EXPECT_GT(gx, 0.9);
  EXPECT_GT(gw, 0.9);
  std::printf(
      "MXFP8 grouped GEMM vs torchao's (emulated, RCEIL, groups padded to 32): within one bf16 "
      "rounding; equal: output %.1f%%, grad_input %.1f%%, grad_weight %.1f%%\n",
      100 * out, 100 * gx, 100 * gw);
}

TEST(MoeQuant, Float8GroupedMatchesTorchaoCasts) {
  const char* path = std::getenv("TITAN_MX_FIXTURE");
  if (path == nullptr) GTEST_SKIP() << "run by tests/e2e/test_mx.sh";
  const ckpt::SafetensorsReader file(path);
  const std::vector<int64_t> counts = counts_of(file.read("grouped.counts"));
  ExpertQuantization q;
  q.gemm = ExpertGemm::kFloat8Rowwise;
  const Result r = run_grouped(file.read("grouped_f8.x"), file.read("grouped_f8.w"),
                               file.read("grouped_f8.g"), counts, q);
  // The same float8 operands multiplied in float32: equal up to the products' summation order.
  const double out = rel_error(r.out, file.read("grouped_f8.out"));
  const double gx = rel_error(r.grad_x, file.read("grouped_f8.grad_x"));
  const double gw = rel_error(r.grad_w, file.read("grouped_f8.grad_w"));
  EXPECT_LT(out, 1e-6);
  EXPECT_LT(gx, 1e-6);
  EXPECT_LT(gw, 1e-6);
  std::printf(
      "float8 rowwise grouped GEMM vs torchao's casts per expert group: relative error output "
      "%.1e, grad_input %.1e, grad_weight %.1e\n",
      out, gx, gw);
}

// x's groups (counts) each zero-padded to a multiple of 16 rows: the padded rows, the group ends
// (int32) and where each row of x went.
struct Padded {
  at::Tensor x, offs, rows;
};
Padded pad_groups(const at::Tensor& x, const std::vector<int64_t>& counts) {
  std::vector<int64_t> rows, ends;
  int64_t start = 0, padded_start = 0;
  for (int64_t c : counts) {
    for (int64_t i = 0; i < c; ++i) rows.push_back(padded_start + i);
    padded_start += (c + 15) / 16 * 16;
    ends.push_back(padded_start);
    start += c;
  }
  const at::Tensor index = at::tensor(rows, at::kLong);
  at::Tensor xp = at::zeros({padded_start, x.size(1)}, x.options());
  xp = xp.index_copy(0, index, x);
  return {xp, at::tensor(ends, at::kLong).to(at::kInt), index};
}

// The one-launch form (float8_grouped.h, here with its emulated kernel): the same products as
// torchao's float8 grouped GEMM on groups padded to 16 rows.
TEST(MoeQuant, Float8GroupedKernelFormMatchesTorchaoCasts) {
  const char* path = std::getenv("TITAN_MX_FIXTURE");
  if (path == nullptr) GTEST_SKIP() << "run by tests/e2e/test_mx.sh";
  const ckpt::SafetensorsReader file(path);
  const std::vector<int64_t> counts = counts_of(file.read("grouped.counts"));
  const Padded p = pad_groups(file.read("grouped_f8.x"), counts);
  const at::Tensor xp = p.x.clone().requires_grad_(true);
  const at::Tensor w = file.read("grouped_f8.w").requires_grad_(true);
  const at::Tensor out = float8_grouped_mm(xp, w, p.offs, /*emulate=*/true);
  const at::Tensor g = file.read("grouped_f8.g");
  out.backward(at::zeros_like(out).index_copy(0, p.rows, g));
  const double o = rel_error(out.index_select(0, p.rows), file.read("grouped_f8.out"));
  const double gx = rel_error(xp.grad().index_select(0, p.rows), file.read("grouped_f8.grad_x"));
  const double gw = rel_error(w.grad(), file.read("grouped_f8.grad_w"));
  EXPECT_LT(o, 1e-6);
  EXPECT_LT(gx, 1e-6);
  EXPECT_LT(gw, 1e-6);
  std::printf(
      "float8 grouped GEMM, one-launch form (emulated kernel) vs torchao's casts: relative error "
      "output %.1e, grad_input %.1e, grad_weight %.1e\n",
      o, gx, gw);
}

// The layer with float8 experts through the one-launch form equals its per-expert loop: the same
// casts and products (float32: up to summation order; bf16: the same plus one rounding).
TEST(MoeQuant, Float8GroupedFormMatchesTheLoop) {
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    SCOPED_TRACE(c10::toString(dtype));
    at::manual_seed(16);
    GroupedExperts experts(4, 64, 32, dtype, /*use_grouped_mm=*/true);
    for (auto& p : experts.parameters()) {
      at::NoGradGuard no_grad;
      p.set_data(at::randn(p.sizes()) * 0.1);
    }
    experts.quantization.gemm = ExpertGemm::kFloat8Rowwise;
    const std::vector<int64_t> counts = {21, 0, 40, 3};
    const at::Tensor x0 = at::randn({64, 64}).to(dtype);
    std::vector<at::Tensor> results;
    for (bool grouped : {false, true}) {
      experts.quantization.grouped = grouped;
      EXPECT_EQ(experts.groups_on_device(), grouped);
      experts.zero_grad();
      const at::Tensor x = x0.clone().requires_grad_(true);
      const at::Tensor y = experts.forward(x, counts);
      y.to(at::kFloat).square().sum().backward();
      results.insert(results.end(), {y.detach(), x.grad(), experts.w1->weight.grad().clone(),
                                     experts.w2->weight.grad().clone()});
    }
    const double tol = dtype == at::kFloat ? 1e-5 : 2e-2;
    for (int i = 0; i < 4; ++i) EXPECT_LT(rel_error(results[4 + i], results[i]), tol) << i;
  }
}

// Quantized, the grouped GEMM stays close to the float32 one (float8: 3 bits of mantissa, a few
// percent per element) but is not it; an expert without tokens gets a zero gradient.
TEST(MoeQuant, GroupedGemmsAreCloseToHighPrecision) {
  at::manual_seed(11);
  const std::vector<int64_t> counts = {19, 0, 40, 3};
  const at::Tensor x = at::randn({62, 64});
  const at::Tensor w = at::randn({4, 32, 64}) * 0.1;
  const at::Tensor g = at::randn({62, 32});
  const Result exact = run_grouped(x, w, g, counts, {});
  for (ExpertGemm gemm : {ExpertGemm::kFloat8Rowwise, ExpertGemm::kMxfp8}) {
    SCOPED_TRACE(expert_gemm_name(gemm));
    ExpertQuantization q;
    q.gemm = gemm;
    const Result r = run_grouped(x, w, g, counts, q);
    for (const auto& [got, want] : {std::pair{r.out, exact.out}, std::pair{r.grad_x, exact.grad_x},
                                    std::pair{r.grad_w, exact.grad_w}}) {
      EXPECT_LT(rel_error(got, want), 0.06);
      EXPECT_GT(rel_error(got, want), 1e-4);  // the operands were quantized
    }
    EXPECT_TRUE(at::equal(r.grad_w[1], at::zeros_like(r.grad_w[1])));
  }
}

// Both formats scale by powers of two into e4m3's top binade (float8 rowwise: 2^floor(log2(448 /
// amax)); MXFP8 RCEIL: 2^-ceil(log2(amax / 448))), so where a row's blocks of 32 share the row's
// binade they quantize alike. MXFP8's scales are per block: a row whose halves are 2^20 apart
// keeps the small half on its own scale, while under one scale per row it falls below e4m3's
// smallest subnormal (2^-9) and is lost.
TEST(MoeQuant, MxScalesPerBlockFloat8PerRow) {
  at::manual_seed(14);
  at::Tensor x = at::randn({8, 64});
  x.narrow(1, 0, 32).mul_(1 << 20);
  // The weight reads the small half only.
  const at::Tensor w = at::cat({at::zeros({32, 32}), at::randn({32, 32}) * 0.1}, 1);
  const at::Tensor exact = at::linear(x, w);
  ExpertQuantization f8, mx;
  f8.gemm = ExpertGemm::kFloat8Rowwise;
  mx.gemm = ExpertGemm::kMxfp8;
  EXPECT_LT(rel_error(quantized_expert_linear(x, w, mx), exact), 0.05);
  EXPECT_GT(rel_error(quantized_expert_linear(x, w, f8), exact), 0.9);
}

// MXFP8 pads each expert's tokens to 32 with zero rows: the result equals the same expert run on
// the padded rows by hand, and the padding changes no block along the tokens.
TEST(MoeQuant, MxPadsEachExpertToTheBlock) {
  at::manual_seed(12);
  const at::Tensor x = at::randn({5, 64});
  const at::Tensor w = at::randn({32, 64}) * 0.1;
  ExpertQuantization q;
  q.gemm = ExpertGemm::kMxfp8;
  const at::Tensor got = quantized_expert_linear(x, w, q);
  const at::Tensor padded = at::cat({x, at::zeros({27, 64})});
  const at::Tensor want = mx_linear(padded, w, MxScaleRule::kRceil).narrow(0, 0, 5);
  EXPECT_TRUE(at::equal(got, want));
}

// The layer: converted experts take the per-expert loop (even in bf16, where the grouped kernel
// would run), and the gradients reach every weight.
TEST(MoeQuant, GroupedExpertsRunTheirQuantizedGemms) {
  at::manual_seed(13);
  GroupedExperts experts(3, 64, 32, at::kBFloat16, /*use_grouped_mm=*/true);
  for (auto& p : experts.parameters()) {
    at::NoGradGuard no_grad;
    p.set_data(at::randn(p.sizes()) * 0.1);
  }
  EXPECT_TRUE(experts.groups_on_device());
  const std::vector<int64_t> counts = {7, 33, 0};
  const at::Tensor x = at::randn({40, 64}).to(at::kBFloat16);
  const at::Tensor plain = experts.forward(x, counts);
  experts.quantization.gemm = ExpertGemm::kFloat8Rowwise;
  EXPECT_FALSE(experts.groups_on_device());
  const at::Tensor y = experts.forward(x, counts);
  EXPECT_EQ(y.scalar_type(), at::kBFloat16);
  EXPECT_LT(rel_error(y, plain), 0.1);
  EXPECT_GT(rel_error(y, plain), 1e-3);
  // By hand: expert 0's rows through its three quantized GEMMs.
  const at::Tensor xe = x.narrow(0, 0, 7);
  const auto gemm = [&](const at::Tensor& in, const std::shared_ptr<ExpertWeight>& w) {
    return quantized_expert_linear(in, w->weight[0].to(at::kBFloat16), experts.quantization);
  };
  const at::Tensor want = gemm(at::silu(gemm(xe, experts.w1)) * gemm(xe, experts.w3), experts.w2);
  EXPECT_TRUE(at::equal(y.narrow(0, 0, 7), want));
  y.to(at::kFloat).square().sum().backward();
  for (const auto& w : {experts.w1, experts.w2, experts.w3}) {
    ASSERT_TRUE(w->weight.grad().defined());
    EXPECT_GT(w->weight.grad()[0].abs().sum().item<double>(), 0);
    EXPECT_EQ(w->weight.grad()[2].abs().sum().item<double>(), 0);  // no tokens
  }
}

std::shared_ptr<Model> tiny_moe() {
  ModelBuildOptions options;
  options.meta = true;  // the converter reads shapes only
  return get_model_spec("qwen3").build("tiny_moe", options);
}

TEST(MoeQuantConverter, SelectsExpertsBySubstring) {
  const DeviceInfo cpu = device_info(at::kCPU);
  auto model = tiny_moe();
  ExpertConversion c = convert_grouped_experts(*model, ExpertGemm::kFloat8Rowwise, {"experts"}, cpu,
                                               "quantize.grouped_mm.float8");
  ASSERT_EQ(c.converted.size(), 2u);
  EXPECT_EQ(c.converted[0], "layers.0.moe.experts");
  EXPECT_TRUE(c.quantization.emulate);  // the CPU has no float8 GEMMs
  int64_t quantized = 0;
  for (const auto& [name, moe] : moe_layers(*model)) {
    quantized += moe->experts->quantization.gemm == ExpertGemm::kFloat8Rowwise;
    EXPECT_FALSE(moe->gate->float8.has_value()) << name;  // the router stays as it is
  }
  EXPECT_EQ(quantized, 2);

  model = tiny_moe();
  c = convert_grouped_experts(*model, ExpertGemm::kMxfp8, {"layers.1"}, cpu,
                              "quantize.grouped_mm.mx");
  ASSERT_EQ(c.converted.size(), 1u);
  EXPECT_EQ(c.converted[0], "layers.1.moe.experts");
}

TEST(MoeQuantConverter, RefusesWhatItCannotConvert) {
  const DeviceInfo cpu = device_info(at::kCPU);
  auto model = tiny_moe();
  try {
    convert_grouped_experts(*model, ExpertGemm::kMxfp8, {"attention"}, cpu,
                            "quantize.grouped_mm.mx");
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    const std::string m = e.what();
    EXPECT_TRUE(test::contains(m, "quantize.grouped_mm.mx.fqns [\"attention\"] selects none")) << m;
    EXPECT_TRUE(test::contains(m, "layers.0.moe.experts, layers.1.moe.experts")) << m;
  }
  ModelBuildOptions options;
  options.meta = true;
  auto dense = get_model_spec("qwen3").build("tiny", options);
  try {
    convert_grouped_experts(*dense, ExpertGemm::kFloat8Rowwise, {"experts"}, cpu,
                            "quantize.grouped_mm.float8");
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_TRUE(test::contains(e.what(), "the model has no MoE experts")) << e.what();
  }
  DeviceInfo ampere;
  ampere.device = at::Device(at::kCUDA, 0);
  ampere.name = "NVIDIA A100";
  ampere.compute_major = 8;
  try {
    convert_grouped_experts(*model, ExpertGemm::kFloat8Rowwise, {"experts"}, ampere,
                            "quantize.grouped_mm.float8");
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_TRUE(test::contains(e.what(), "compute capability 8.0) has no float8 matmuls"))
        << e.what();
  }
  DeviceInfo hopper = ampere;
  hopper.compute_major = 9;
  const ExpertConversion c = convert_grouped_experts(
      *model, ExpertGemm::kFloat8Rowwise, {"experts"}, hopper, "quantize.grouped_mm.float8");
  EXPECT_FALSE(c.quantization.emulate);
  EXPECT_TRUE(c.quantization.grouped);  // at::_scaled_grouped_mm
  DeviceInfo ada = ampere;
  ada.compute_minor = 9;
  const ExpertConversion per_expert = convert_grouped_experts(
      *model, ExpertGemm::kFloat8Rowwise, {"experts"}, ada, "quantize.grouped_mm.float8");
  EXPECT_FALSE(per_expert.quantization.emulate);
  EXPECT_FALSE(per_expert.quantization.grouped);  // at::_scaled_mm per expert
}

// On a GPU (skipped elsewhere): float8 experts through at::_scaled_mm per expert (compute
// capability >= 8.9) against their emulation, and MXFP8's emulation on the GPU against the CPU's,
// output and both gradients, in bf16 as training runs them. The same float8 values multiplied
// by other kernels: they differ by accumulation order and the bf16 rounding of the results.
TEST(MoeQuantCuda, ExpertGemmsOnTheGpuMatchTheirEmulation) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  at::manual_seed(15);
  const std::vector<int64_t> counts = {37, 0, 64, 5};
  const at::Tensor x = at::randn({106, 64}).to(at::kBFloat16);
  const at::Tensor w = (at::randn({4, 96, 64}) * 0.1).to(at::kBFloat16);
  const at::Tensor g = at::randn({106, 96}).to(at::kBFloat16);
  const at::Device gpu(at::kCUDA, 0);
  const auto on_gpu = [&](const ExpertQuantization& q) {
    const Result r = run_grouped(x.to(gpu), w.to(gpu), g.to(gpu), counts, q);
    return Result{r.out.cpu(), r.grad_x.cpu(), r.grad_w.cpu()};
  };
  const auto expect_close = [](const Result& a, const Result& b, double tol, const char* what) {
    EXPECT_LT(rel_error(a.out, b.out), tol) << what << " output";
    EXPECT_LT(rel_error(a.grad_x, b.grad_x), tol) << what << " grad_input";
    EXPECT_LT(rel_error(a.grad_w, b.grad_w), tol) << what << " grad_weight";
  };
  ExpertQuantization mx;
  mx.gemm = ExpertGemm::kMxfp8;
  expect_close(on_gpu(mx), run_grouped(x, w, g, counts, mx), 1e-2, "MXFP8 GPU vs CPU");
  if (!supports_float8(device_info(gpu))) {
    GTEST_SKIP() << "no float8 matmuls (compute capability < 8.9): MXFP8 checked only";
  }
  ExpertQuantization scaled, emulated;
  scaled.gemm = emulated.gemm = ExpertGemm::kFloat8Rowwise;
  scaled.emulate = false;
  const Result kernel = on_gpu(scaled);
  EXPECT_EQ(kernel.out.scalar_type(), at::kBFloat16);
  const Result reference = on_gpu(emulated);
  expect_close(kernel, reference, 1e-2, "float8 _scaled_mm vs emulation");
  if (device_info(gpu).compute_major != 9) {
    GTEST_SKIP() << "ATen's float8 grouped kernel is built for compute capability 9.x only";
  }
  // The one-launch form through at::_scaled_grouped_mm, groups padded to 16.
  const Padded p = pad_groups(x, counts);
  const at::Tensor xp = p.x.to(gpu).requires_grad_(true);
  const at::Tensor w_gpu = w.to(gpu).requires_grad_(true);
  const at::Tensor out = float8_grouped_mm(xp, w_gpu, p.offs.to(gpu), /*emulate=*/false);
  out.backward(at::zeros_like(out).index_copy(0, p.rows.to(gpu), g.to(gpu)));
  const Result grouped{out.detach().cpu().index_select(0, p.rows),
                       xp.grad().cpu().index_select(0, p.rows), w_gpu.grad().cpu()};
  expect_close(grouped, reference, 1e-2, "float8 _scaled_grouped_mm vs emulation");
}

}  // namespace test_moe_quant
}  // namespace titan
