// A rank whose peer froze (SIGSTOP: alive, sockets open, silent) must be able to fail and exit
// within comm.train_timeout_seconds. Ops issued while the group still had the (longer) init
// timeout keep that timeout inside Gloo; tearing the group down must not wait for them.
#include "multirank.h"

#include <ATen/ATen.h>

#include <chrono>
#include <future>

namespace titan {
namespace test_comm_teardown {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

TEST(CommTeardown, BrokenGroupIsDestroyedWithoutWaitingForTheBackendTimeout) {
  dist::GroupOptions options = test::loopback_options(std::chrono::seconds(12));
  options.check_agreement = false;
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::promise<void> rank0_gone;
  std::shared_future<void> rank0_gone_future = rank0_gone.get_future().share();
  std::string error0;
  double fail_seconds = 0, teardown_seconds = 0;

  std::thread rank1([&] {
    auto g = dist::Group::create(store, 1, 2, options);
    g->barrier().wait();
    rank0_gone_future.wait();  // frozen: the group stays open, nothing is issued
  });
  std::chrono::steady_clock::time_point t1;
  {
    auto g = dist::Group::create(store, 0, 2, options);
    g->barrier().wait();
    // Issued under the creation timeout (12 s), then bounded by the training timeout (1 s).
    at::Tensor t = at::ones({16});
    dist::Work w = g->all_reduce(t);
    g->set_timeout(std::chrono::milliseconds(1000));
    const auto t0 = std::chrono::steady_clock::now();
    try {
      w.wait();
    } catch (const dist::CommError& e) {
      error0 = e.what();
    }
    fail_seconds = seconds_since(t0);
    t1 = std::chrono::steady_clock::now();
  }  // the group and the work go here
  teardown_seconds = seconds_since(t1);
  rank0_gone.set_value();
  rank1.join();

  EXPECT_NE(error0.find("all_reduce #1 on process group 'world' (rank 0 of 2"), std::string::npos)
      << error0;
  EXPECT_NE(error0.find("timeout 1.0 s"), std::string::npos) << error0;
  EXPECT_LT(fail_seconds, 4.0);
  // Before: the destructor joined Gloo's worker, stuck in the all_reduce until its 12 s timeout.
  EXPECT_LT(teardown_seconds, 3.0);
}

}  // namespace test_comm_teardown
}  // namespace titan
