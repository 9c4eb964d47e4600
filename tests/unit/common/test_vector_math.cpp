// MKL's vector-math functions (VML), which ATen's float and double unary ops call, pick their
// kernel at their first call, and the pinned oneMKL races when that call runs on several threads
// at once: titan makes each first call serially at start-up (warm_up_vector_math,
// titan/common/cpu.h).
#include "../op_counter.h"
#include "titan/common/cpu.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <utility>
#include <vector>

namespace titan {
namespace test_vector_math {

TEST(VectorMath, WarmUpCallsEveryFunctionUnseen) {
  // One call per function and dtype, none of them seen by an op recorder (a profiler,
  // bench --breakdown), and none recorded by autograd.
  int64_t calls = 0;
  {
    test::OpCounter exp("aten::exp");
    calls = warm_up_vector_math();
    EXPECT_EQ(exp.count(), 0);
  }
  EXPECT_EQ(calls, at::hasMKL() ? 32 : 0);
}

TEST(VectorMath, ParallelCallsAreHighAccuracy) {
  // What the warm-up protects: every VML-backed op, split over two threads (2,048 elements per
  // chunk), agrees with the float64 result rounded to float within VML's high accuracy (< 1 ulp
  // each; 3 ulp allowed). The race's low-accuracy kernel was measured ~200 ulp off.
  warm_up_vector_math();
  const int threads = at::get_num_threads();
  at::set_num_threads(2);
  const at::Tensor x = at::linspace(0.05, 0.95, 8192, at::kFloat);
  const at::Tensor xd = x.to(at::kDouble);
  using Unary = at::Tensor (*)(const at::Tensor&);
  const std::vector<std::pair<std::string, Unary>> functions = {
      {"acos", &at::acos}, {"asin", &at::asin},   {"atan", &at::atan},     {"cos", &at::cos},
      {"erf", &at::erf},   {"erfc", &at::erfc},   {"erfinv", &at::erfinv}, {"exp", &at::exp},
      {"log", &at::log},   {"log10", &at::log10}, {"log2", &at::log2},     {"sin", &at::sin},
      {"sqrt", &at::sqrt}, {"tan", &at::tan},     {"tanh", &at::tanh}};
  for (const auto& [name, f] : functions) {
    const at::Tensor got = f(x).to(at::kDouble);
    const at::Tensor want = f(xd).to(at::kFloat).to(at::kDouble);
    const double ulp = std::ldexp(1.0, -23);  // float's epsilon: one ulp at [1, 2)
    const at::Tensor ulps = (got - want).abs() / (want.abs() * ulp);
    EXPECT_LE(ulps.max().item<double>(), 3.0) << name << " on two threads";
  }
  at::set_num_threads(threads);
}

}  // namespace test_vector_math
}  // namespace titan
