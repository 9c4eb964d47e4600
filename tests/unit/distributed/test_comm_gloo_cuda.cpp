// Gloo groups over CUDA tensors (GroupOptions::stage_cuda_tensors, the shared-device test mode):
// two ranks (threads) share cuda:0, every collective's results equal the host's, for Gloo's own
// ops and ours (GlooOps), and the staging is ordered on the issuing and the waiting stream. The
// GPU cases skip, saying so, without a CUDA device; the refusals run everywhere.
#include "multirank.h"
#include "titan/common/device.h"

#include <ATen/ATen.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

namespace titan {
namespace test_comm_gloo_cuda {

using dist::ReduceOp;
using test::run_ranks;

dist::GroupOptions staging_options(const dist::GlooOps& ops) {
  dist::GroupOptions o = test::loopback_options();
  o.stage_cuda_tensors = true;
  o.gloo_ops = ops;
  return o;
}

// Without the option a CUDA tensor is an error naming the fix; with it only CUDA tensors are
// staged (other devices stay refused).
TEST(GlooOverCuda, OnlyCudaTensorsAreStagedAndOnlyWhenAsked) {
  run_ranks(
      2,
      [](int rank, std::shared_ptr<dist::Group> g) {
        try {
          g->all_reduce(at::empty({4}, at::TensorOptions().device(at::kMeta)));
          ADD_FAILURE() << "a meta tensor was accepted";
        } catch (const c10::Error& e) {
          EXPECT_NE(std::string(e.what_without_backtrace()).find("the gloo backend needs CPU"),
                    std::string::npos)
              << e.what_without_backtrace();
        }
        at::Tensor t = at::ones({3});
        g->all_reduce(t).wait();  // the group is still usable, and host tensors pass as they are
        EXPECT_TRUE(at::equal(t, at::full({3}, 2.0)));
      },
      staging_options({}));
  if (cuda_device_count() == 0) return;
  run_ranks(2, [](int rank, std::shared_ptr<dist::Group> g) {
    try {
      g->all_reduce(at::ones({4}, at::TensorOptions().device(at::kCUDA)));
      ADD_FAILURE() << "a CUDA tensor was accepted by a Gloo group without staging";
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what_without_backtrace()).find("needs CPU tensors"),
                std::string::npos);
    }
  });
}

class GlooOverCudaOps : public ::testing::TestWithParam<bool> {  // true: Gloo's own ops
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) {
      GTEST_SKIP() << "no CUDA device visible; runs in scripts/gpu_check.sh";
    }
  }
  dist::GroupOptions options() const {
    return staging_options(GetParam() ? dist::GlooOps::all_native() : dist::GlooOps::all_built());
  }
};

// Rank r's values: distinct per rank and element, exact in bf16 where summed.
at::Tensor values(int rank, int64_t n, at::ScalarType dtype) {
  return (at::arange(n, at::kDouble).remainder(7) + 10 * rank).to(dtype);
}

TEST_P(GlooOverCudaOps, EveryCollectiveMatchesTheHost) {
  const at::Device cuda(at::kCUDA, 0);
  run_ranks(
      2,
      [&](int rank, std::shared_ptr<dist::Group> g) {
        for (at::ScalarType dtype : {at::kFloat, at::kBFloat16, at::kLong}) {
          SCOPED_TRACE(std::string("dtype ") + c10::toString(dtype));
          const at::Tensor sum = values(0, 6, dtype) + values(1, 6, dtype);
          at::Tensor t = values(rank, 6, dtype).to(cuda);
          g->all_reduce(t).wait();
          ASSERT_TRUE(t.is_cuda());
          EXPECT_TRUE(at::equal(t.cpu(), sum));
          if (dtype != at::kLong) {
            at::Tensor avg = values(rank, 6, dtype).to(cuda);
            g->all_reduce(avg, ReduceOp::kAvg).wait();
            EXPECT_TRUE(at::allclose(avg.cpu().to(at::kDouble), sum.to(at::kDouble) / 2));
          }
          at::Tensor gathered = at::full({2, 6}, -1, at::TensorOptions(dtype).device(cuda));
          g->all_gather_into_tensor(gathered, values(rank, 6, dtype).to(cuda)).wait();
          EXPECT_TRUE(
              at::equal(gathered.cpu(), at::stack({values(0, 6, dtype), values(1, 6, dtype)})));
          at::Tensor mine = at::full({3}, -1, at::TensorOptions(dtype).device(cuda));
          g->reduce_scatter_tensor(mine, values(rank, 6, dtype).to(cuda)).wait();
          EXPECT_TRUE(at::equal(mine.cpu(), sum.narrow(0, 3 * rank, 3)));
        }
        // Uneven all-to-all: rank 0 sends 1 row to itself and 3 to rank 1; rank 1 sends 2 + 2.
        const std::vector<int64_t> in_splits =
            rank == 0 ? std::vector<int64_t>{1, 3} : std::vector<int64_t>{2, 2};
        const std::vector<int64_t> out_splits =
            rank == 0 ? std::vector<int64_t>{1, 2} : std::vector<int64_t>{3, 2};
        const at::Tensor rows = values(rank, 8, at::kFloat).view({4, 2});
        at::Tensor got = at::empty({rank == 0 ? 3 : 5, 2}, at::TensorOptions().device(cuda));
        g->all_to_all_single(got, rows.to(cuda), out_splits, in_splits).wait();
        const at::Tensor r0 = values(0, 8, at::kFloat).view({4, 2});
        const at::Tensor r1 = values(1, 8, at::kFloat).view({4, 2});
        const at::Tensor want = rank == 0 ? at::cat({r0.narrow(0, 0, 1), r1.narrow(0, 0, 2)})
                                          : at::cat({r0.narrow(0, 1, 3), r1.narrow(0, 2, 2)});
        EXPECT_TRUE(at::equal(got.cpu(), want));
        at::Tensor b = rank == 1 ? values(1, 5, at::kFloat).to(cuda)
                                 : at::zeros({5}, at::TensorOptions().device(cuda));
        g->broadcast(b, /*root=*/1).wait();
        EXPECT_TRUE(at::equal(b.cpu(), values(1, 5, at::kFloat)));
        // int16 moves as fp16 bits, also through the staging.
        at::Tensor p2p = rank == 0 ? values(0, 4, at::kShort).to(cuda)
                                   : at::zeros({4}, at::TensorOptions(at::kShort).device(cuda));
        dist::Work w = rank == 0 ? g->send(p2p, 1, /*tag=*/7) : g->recv(p2p, 0, /*tag=*/7);
        w.wait();
        EXPECT_TRUE(at::equal(p2p.cpu(), values(0, 4, at::kShort)));
      },
      options());
}

// The staging reads what the current stream has queued before the op, and the results are
// ordered before what the waiting stream queues after wait(): a side stream queues a long chain
// of kernels producing the input, and reads the result right after wait().
TEST_P(GlooOverCudaOps, OrderedOnTheIssuingAndTheWaitingStream) {
  const at::Device cuda(at::kCUDA, 0);
  run_ranks(
      2,
      [&](int rank, std::shared_ptr<dist::Group> g) {
        c10::impl::VirtualGuardImpl impl(at::kCUDA);
        const c10::Stream side = impl.getStreamFromGlobalPool(cuda, /*isHighPriority=*/false);
        c10::StreamGuard guard(side);
        const int64_t n = 1 << 22;
        at::Tensor x = at::zeros({n}, at::TensorOptions().device(cuda));
        for (int i = 0; i < 50; ++i) x.add_(rank + 1);  // queued, not yet run
        at::Tensor out = at::empty({2 * n}, x.options());
        dist::Work gather = g->all_gather_into_tensor(out, x);
        g->all_reduce(x).wait();
        gather.wait();
        x.mul_(2);  // after the copy back, on the same stream
        EXPECT_TRUE(at::equal(x.cpu(), at::full({n}, 2.0 * 150)));
        EXPECT_TRUE(at::equal(out.view({2, n}).select(1, n - 1).cpu(), at::tensor({50.f, 100.f})));
      },
      options());
}

INSTANTIATE_TEST_SUITE_P(NativeAndBuilt, GlooOverCudaOps, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return std::string(info.param ? "GlooOwn" : "Built");
                         });

}  // namespace test_comm_gloo_cuda
}  // namespace titan
