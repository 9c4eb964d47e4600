// Whether bf16 matmuls run in bf16 or widened to float32 on a CPU is measured, not read from
// feature flags (titan/common/cpu.h): an AVX-512 BF16 CPU was measured multiplying bf16 at half
// float32's speed.
#include "../op_counter.h"
#include "titan/common/cpu.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

namespace titan {
namespace test_cpu_matmul {

TEST(Bf16MatmulChoice, WidensOnlyWhereFloat32IsClearlyFaster) {
  EXPECT_TRUE(bf16_gemm_is_fast(300e9, 190e9));   // bf16 faster (AVX-512 BF16, AMD EPYC)
  EXPECT_TRUE(bf16_gemm_is_fast(100e9, 120e9));   // within the margin: ATen's own path
  EXPECT_TRUE(bf16_gemm_is_fast(100e9, 130e9));   // exactly 1.3x
  EXPECT_FALSE(bf16_gemm_is_fast(100e9, 131e9));  // past it
  EXPECT_FALSE(bf16_gemm_is_fast(150e9, 265e9));  // the Intel Xeon's AVX-512 BF16
  EXPECT_FALSE(bf16_gemm_is_fast(1e9, 50e9));     // ATen's generic loop (AVX2)
}

TEST(Bf16MatmulChoice, MeasurementLeavesNoTrace) {
  // The first measurement may come while a model is built: the generator must stay as the seed
  // left it, and an op recorder (a profiler, bench --breakdown, a test's counter) must not see
  // the probe's products.
  at::manual_seed(7);
  const at::Tensor expected = at::randn({8});
  at::manual_seed(7);
  Bf16MatmulMeasurement m;
  {
    test::OpCounter mm("aten::mm");
    m = measure_bf16_matmul();
    EXPECT_EQ(mm.count(), 0);
  }
  EXPECT_TRUE(at::equal(at::randn({8}), expected)) << "the measurement drew random numbers";
  EXPECT_GT(m.bf16_flops, 0);
  EXPECT_GT(m.float_flops, 0);
  EXPECT_EQ(m.fast, bf16_gemm_is_fast(m.bf16_flops, m.float_flops));
}

// The products are timed by the measuring thread's CPU time, on one thread: time spent waiting
// (another process's turn on the core) does not count, and the intra-op threads are as before.
TEST(Bf16MatmulChoice, MeasuredByOneThreadsCpuTime) {
  const double wall0 =
      std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  const double cpu0 = thread_cpu_seconds();
  std::this_thread::sleep_for(std::chrono::milliseconds(40));
  const double slept =
      std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count() -
      wall0;
  EXPECT_GE(slept, 0.04);
  EXPECT_LT(thread_cpu_seconds() - cpu0, 0.01) << "a sleeping thread's CPU time grew";
  volatile double sink = 0;
  const double cpu1 = thread_cpu_seconds();
  for (int i = 0; i < 20000000; ++i) sink = sink + 1.0;
  EXPECT_GT(thread_cpu_seconds() - cpu1, 0.0) << "a busy thread's CPU time did not grow";
  const int threads = at::get_num_threads();
  at::set_num_threads(2);
  const Bf16MatmulMeasurement m = measure_bf16_matmul();
  EXPECT_EQ(at::get_num_threads(), 2) << "the measurement left the intra-op threads changed";
  at::set_num_threads(threads);
  EXPECT_GT(m.float_flops, 0);
}

TEST(Bf16MatmulChoice, TheChoiceSaysWhyAndCanBeSetForEveryRank) {
  const bool measured = cpu_has_fast_bf16_matmul();
  const std::string why = fast_bf16_matmul_reason();
  EXPECT_TRUE(why.rfind("bf16 GEMMs measured ", 0) == 0 ||
              why.rfind("TITAN_CPU_FAST_BF16_MATMUL=", 0) == 0)
      << why;
  // The trainer's agreement: another rank's slow measurement widens this one's matmuls too.
  set_fast_bf16_matmul(false, "another rank");
  EXPECT_FALSE(cpu_has_fast_bf16_matmul());
  EXPECT_TRUE(widens_reduced_matmul(at::kBFloat16, at::kCPU));
  EXPECT_FALSE(widens_reduced_matmul(at::kFloat, at::kCPU));
  EXPECT_EQ(fast_bf16_matmul_reason(), "another rank");
  // A test's override wins, and says so.
  override_fast_bf16_matmul_for_testing(true);
  EXPECT_TRUE(cpu_has_fast_bf16_matmul());
  EXPECT_EQ(fast_bf16_matmul_reason(), "a test's override");
  override_fast_bf16_matmul_for_testing(std::nullopt);
  EXPECT_FALSE(cpu_has_fast_bf16_matmul());
  set_fast_bf16_matmul(measured, why);
  EXPECT_EQ(cpu_has_fast_bf16_matmul(), measured);
}

}  // namespace test_cpu_matmul
}  // namespace titan
