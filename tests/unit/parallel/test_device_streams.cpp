// SideStream and WaitClock (device_streams.h): inline and host-timed on the CPU; on a GPU a side
// stream's work starts after what the current stream queued before run(), join() orders later
// compute after it, and the compute stream's stall is measured on the device. The GPU cases skip,
// saying so, without a CUDA device.
#include "titan/common/device.h"
#include "titan/parallel/device_streams.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

namespace titan {
namespace test_device_streams {

TEST(DeviceStreams, OnTheCpuEverythingRunsInlineAndHostTimeIsTheWait) {
  SideStream side(at::kCPU);
  EXPECT_FALSE(side.active());
  int runs = 0;
  const auto done = side.run([&] { ++runs; });
  EXPECT_EQ(runs, 1);  // finished when run returns
  EXPECT_EQ(done, nullptr);
  WaitClock clock(at::kCPU);
  SideStream::join(done, &clock);  // nothing to wait for
  EXPECT_EQ(clock.seconds(), 0.0);
  clock.time([] { std::this_thread::sleep_for(std::chrono::milliseconds(30)); });
  EXPECT_GE(clock.seconds(), 0.025);
  EXPECT_LT(clock.seconds(), 5.0);
}

class DeviceStreamsCuda : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) {
      GTEST_SKIP() << "no CUDA device visible; runs in scripts/gpu_check.sh";
    }
  }
};

TEST_F(DeviceStreamsCuda, SideWorkFollowsQueuedComputeAndJoinOrdersWhatComesAfter) {
  const at::Device cuda(at::kCUDA, 0);
  SideStream side(cuda);
  ASSERT_TRUE(side.active());
  WaitClock clock(cuda);
  const int64_t n = 1 << 24;
  for (int round = 0; round < 3; ++round) {
    // Compute queues a long chain producing x; the side stream doubles x into y, then compute
    // adds to y after join. Without the ordering of run() or join() the result would be partial.
    at::Tensor x = at::zeros({n}, at::TensorOptions().device(cuda));
    for (int i = 0; i < 40; ++i) x.add_(1);
    at::Tensor y;
    const auto done = side.run([&] {
      y = x * 2;
      for (int i = 0; i < 40; ++i) y.add_(1);
    });
    ASSERT_NE(done, nullptr);
    side.record_on(x);  // x is read by the side stream, allocated on compute
    SideStream::record_on_current(y);
    SideStream::join(done, &clock);
    y.add_(1);
    EXPECT_TRUE(at::equal(y.cpu(), at::full({n}, 2.0 * 40 + 40 + 1))) << "round " << round;
  }
  // The compute stream waited for the side stream's chains: some time, and not absurdly much.
  const double waited = clock.seconds();
  EXPECT_GT(waited, 0.0);
  EXPECT_LT(waited, 10.0);
}

}  // namespace test_device_streams
}  // namespace titan
