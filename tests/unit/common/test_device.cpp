// Device selection (training.device) against any number of visible CUDA devices, with and without
// the shared-device test mode, and the device facts on the CPU. The CUDA cases run where a GPU is
// visible (scripts/gpu_check.sh) and are skipped, saying so, elsewhere.
#include "../scoped_env.h"
#include "titan/common/check.h"
#include "titan/common/device.h"

#include <gtest/gtest.h>

#include <string>

namespace titan {
namespace test_device {

std::string selection_error(const std::string& setting, int64_t local_rank, int64_t local_world,
                            int64_t devices) {
  try {
    resolve_device(setting, local_rank, local_world, devices);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(Device, AutoPicksTheLocalRanksGpuOrTheCpu) {
  EXPECT_EQ(resolve_device("auto", 0, 1, 0), at::Device(at::kCPU));
  EXPECT_EQ(resolve_device("auto", 3, 4, 0), at::Device(at::kCPU));
  EXPECT_EQ(resolve_device("auto", 0, 1, 1), at::Device(at::kCUDA, 0));
  EXPECT_EQ(resolve_device("auto", 5, 8, 8), at::Device(at::kCUDA, 5));
  EXPECT_EQ(resolve_device("cuda", 1, 2, 2), at::Device(at::kCUDA, 1));
  // Fewer ranks than GPUs is fine: rank r takes GPU r.
  EXPECT_EQ(resolve_device("cuda", 1, 2, 8), at::Device(at::kCUDA, 1));
}

TEST(Device, CpuIsForcedEvenWithGpus) {
  EXPECT_EQ(resolve_device("cpu", 0, 1, 8), at::Device(at::kCPU));
  EXPECT_EQ(resolve_device("cpu", 7, 8, 8), at::Device(at::kCPU));
}

TEST(Device, CudaWithoutAGpuIsAnError) {
  const std::string e = selection_error("cuda", 0, 1, 0);
  EXPECT_NE(e.find("training.device = \"cuda\""), std::string::npos) << e;
  EXPECT_NE(e.find(cuda_build() ? "no CUDA device is visible" : "without CUDA"), std::string::npos)
      << e;
  EXPECT_NE(e.find("HINT"), std::string::npos) << e;
}

TEST(Device, MoreRanksThanGpusShowsTheArithmetic) {
  for (const char* setting : {"auto", "cuda"}) {
    const std::string e = selection_error(setting, 3, 4, 2);
    EXPECT_NE(e.find("4 ranks on this node need one CUDA device each, but 2 are visible"),
              std::string::npos)
        << e;
    EXPECT_NE(e.find("at most 2 ranks per node"), std::string::npos) << e;
  }
  // Rank 0 of the same job fails too: every rank stops, not only the ones without a GPU.
  EXPECT_FALSE(selection_error("auto", 0, 4, 2).empty());
}

// The shared-device test mode (TITAN_SHARED_DEVICE=1): ranks beyond the visible GPUs share them.
TEST(SharedDevice, RanksShareTheGpusOnlyInTheTestMode) {
  const std::string key = "training.device";
  EXPECT_EQ(resolve_device("auto", 3, 4, 2, key, /*shared_device=*/true), at::Device(at::kCUDA, 1));
  EXPECT_EQ(resolve_device("cuda", 2, 4, 2, key, true), at::Device(at::kCUDA, 0));
  EXPECT_EQ(resolve_device("cuda", 1, 2, 1, key, true), at::Device(at::kCUDA, 0));
  // Enough GPUs: the same device as without the mode; no GPU or "cpu": the mode changes nothing.
  EXPECT_EQ(resolve_device("auto", 1, 2, 8, key, true), at::Device(at::kCUDA, 1));
  EXPECT_EQ(resolve_device("auto", 1, 2, 0, key, true), at::Device(at::kCPU));
  EXPECT_EQ(resolve_device("cpu", 1, 2, 1, key, true), at::Device(at::kCPU));
  EXPECT_THROW(resolve_device("cuda", 0, 2, 0, key, true), ConfigError);
  // Outside the mode the arithmetic error stays, and does not advertise the test mode.
  const std::string e = selection_error("cuda", 1, 2, 1);
  EXPECT_NE(e.find("2 ranks on this node need one CUDA device each, but 1 are visible"),
            std::string::npos)
      << e;
  EXPECT_EQ(e.find("TITAN_SHARED_DEVICE"), std::string::npos) << e;
}

TEST(SharedDevice, RanksPerDeviceCountsTheRanksOfEachGpu) {
  EXPECT_EQ(ranks_per_device(0, 1, 1), 1);
  EXPECT_EQ(ranks_per_device(3, 4, 8), 1);
  EXPECT_EQ(ranks_per_device(0, 4, 0), 1);
  EXPECT_EQ(ranks_per_device(1, 2, 1), 2);
  EXPECT_EQ(ranks_per_device(0, 4, 2), 2);
  // 5 ranks on 2 GPUs: ranks 0, 2, 4 on cuda:0, ranks 1, 3 on cuda:1.
  EXPECT_EQ(ranks_per_device(4, 5, 2), 3);
  EXPECT_EQ(ranks_per_device(3, 5, 2), 2);
}

using test::ScopedEnv;

TEST(SharedDevice, TheVariableIsOneOrZero) {
  {
    ScopedEnv unset("TITAN_SHARED_DEVICE", nullptr);
    EXPECT_FALSE(shared_device_mode());
  }
  {
    ScopedEnv off("TITAN_SHARED_DEVICE", "0");
    EXPECT_FALSE(shared_device_mode());
  }
  {
    ScopedEnv on("TITAN_SHARED_DEVICE", "1");
    EXPECT_TRUE(shared_device_mode());
    EXPECT_EQ(select_device("cpu", 1, 2), at::Device(at::kCPU));
  }
  ScopedEnv bad("TITAN_SHARED_DEVICE", "yes");
  try {
    (void)shared_device_mode();
    ADD_FAILURE() << "TITAN_SHARED_DEVICE=yes was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("TITAN_SHARED_DEVICE='yes' must be 1"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(select_device("cpu", 0, 1), ConfigError);
}

TEST(Device, UnknownSettingNamesTheChoices) {
  const std::string e = selection_error("gpu", 0, 1, 1);
  EXPECT_NE(e.find("'gpu' is not one of auto, cpu, cuda"), std::string::npos) << e;
}

TEST(Device, CpuFacts) {
  const DeviceInfo info = device_info(at::kCPU);
  EXPECT_FALSE(info.name.empty());
  EXPECT_GT(info.total_memory, 0);
  EXPECT_FALSE(supports_float8(info));
  EXPECT_EQ(info.describe().rfind("cpu (", 0), 0u) << info.describe();
  const DeviceMemoryStats mem = device_memory_stats(at::kCPU);
  EXPECT_EQ(mem.max_reserved_bytes, 0);
  EXPECT_EQ(mem.ooms, 0);
}

TEST(Device, Float8NeedsComputeCapability89) {
  DeviceInfo info;
  info.device = at::Device(at::kCUDA, 0);
  info.compute_major = 8;
  info.compute_minor = 0;  // A100
  EXPECT_FALSE(supports_float8(info));
  info.compute_minor = 9;  // L40S, RTX 4090
  EXPECT_TRUE(supports_float8(info));
  info.compute_major = 9;  // H100, H200
  info.compute_minor = 0;
  EXPECT_TRUE(supports_float8(info));
  info.compute_major = 10;  // B200
  EXPECT_TRUE(supports_float8(info));
}

TEST(Device, CpuBatchesStayWhereTheyAre) {
  const at::Tensor host = at::arange(12, at::kLong).view({3, 4});
  const at::Tensor same = to_device_async(host, at::kCPU);
  EXPECT_EQ(same.data_ptr(), host.data_ptr());
  const at::Tensor staging = empty_staging({4, 5}, at::kFloat, at::kCPU);
  EXPECT_FALSE(staging.is_pinned());
  EXPECT_EQ(staging.sizes(), at::IntArrayRef({4, 5}));
  EXPECT_EQ(select_device("cpu", 0, 1), at::Device(at::kCPU));
}

// The rest needs a GPU.
class CudaDevice : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) {
      GTEST_SKIP() << "no CUDA device visible (" << (cuda_build() ? "CUDA build" : "CPU build")
                   << "); runs in scripts/gpu_check.sh";
    }
  }
};

TEST_F(CudaDevice, SelectsAndDescribesTheGpu) {
  const at::Device d = select_device("auto", 0, 1);
  ASSERT_TRUE(d.is_cuda());
  const DeviceInfo info = device_info(d);
  EXPECT_FALSE(info.name.empty());
  EXPECT_GT(info.total_memory, 1LL << 30);
  EXPECT_GT(info.multiprocessors, 0);
  EXPECT_GE(info.compute_major, 7);
}

TEST_F(CudaDevice, SharedModeGivesEveryLocalRankAVisibleGpu) {
  ScopedEnv on("TITAN_SHARED_DEVICE", "1");
  const int64_t n = cuda_device_count();
  const at::Device d = select_device("cuda", /*local_rank=*/n, /*local_world_size=*/n + 1);
  EXPECT_EQ(d, at::Device(at::kCUDA, 0));
}

TEST_F(CudaDevice, PinnedCopiesArriveAndMemoryIsCounted) {
  const at::Device d(at::kCUDA, 0);
  reset_device_memory_stats(d);
  const at::Tensor host = at::arange(1 << 20, at::kLong);
  const at::Tensor on_gpu = to_device_async(host, d);
  EXPECT_TRUE(on_gpu.is_cuda());
  EXPECT_TRUE(at::equal(on_gpu.cpu(), host));
  EXPECT_TRUE(empty_staging({16}, at::kFloat, d).is_pinned());
  const DeviceMemoryStats mem = device_memory_stats(d);
  EXPECT_GE(mem.max_active_bytes, 8 << 20);
  EXPECT_GE(mem.max_reserved_bytes, mem.max_active_bytes);
  EXPECT_EQ(mem.ooms, 0);
}

}  // namespace test_device
}  // namespace titan
