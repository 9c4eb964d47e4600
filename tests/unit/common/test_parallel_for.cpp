// at::parallel_for is inline: code built into titan (the fused CPU kernels, parameter init) runs
// it on several threads only when compiled with OpenMP as libtorch is (CMakeLists.txt). Built
// without, every titan loop ran on one thread (measured: parameter init of Llama 3 8B cut to 8
// layers took 116 s on 16 cores).
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <mutex>
#include <set>

namespace titan {
namespace test_parallel_for {

TEST(ParallelFor, TitanCodeSplitsWorkOverTheIntraOpThreads) {
  const int before = at::get_num_threads();
  at::set_num_threads(2);
  std::mutex mutex;
  std::set<int> threads;
  at::parallel_for(0, 64, 1, [&](int64_t, int64_t) {
    std::lock_guard<std::mutex> lock(mutex);
    threads.insert(at::get_thread_num());
  });
  at::set_num_threads(before);
  EXPECT_EQ(threads.size(), 2u) << "at::parallel_for ran on one thread: is titan built with "
                                   "OpenMP (-fopenmp) as libtorch is (AT_PARALLEL_OPENMP)?";
}

}  // namespace test_parallel_for
}  // namespace titan
