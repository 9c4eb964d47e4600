// Every collective of dist::Group against a locally computed reference, on 2, 3 and 4 ranks
// (threads over one HashStore, Gloo on loopback): fp32, bf16 (within bf16 rounding), int64 and
// bool where they make sense; SUM / AVG / MAX / MIN; uneven all-to-all splits.
#include "multirank.h"

#include <ATen/ATen.h>

#include <cstdlib>
#include <tuple>

namespace titan {
namespace test_comm {

using dist::ReduceOp;
using test::run_ranks;

// Rank r's input: distinct per rank and per element, exactly representable where it matters.
at::Tensor input_for(int rank, at::IntArrayRef shape, at::ScalarType dtype) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  at::Tensor x = at::arange(n, at::kDouble);
  at::Tensor v;
  if (dtype == at::kBool) {
    v = at::remainder(x + rank, 3).eq(0);
  } else if (at::isFloatingType(dtype)) {
    v = at::sin(x * 0.37 + rank * 1.3) * (rank + 1);
  } else {
    v = at::remainder(x * (rank + 1) + rank * 7, 101) - 30;
  }
  return v.reshape(shape).to(dtype);
}

// The reduction over ranks of their inputs, computed in fp64 from the inputs as sent.
at::Tensor reference_reduce(int size, at::IntArrayRef shape, at::ScalarType dtype, ReduceOp op) {
  std::vector<at::Tensor> all;
  for (int r = 0; r < size; ++r) all.push_back(input_for(r, shape, dtype).to(at::kDouble));
  at::Tensor stacked = at::stack(all);
  switch (op) {
    case ReduceOp::kSum: return stacked.sum(0);
    case ReduceOp::kAvg: return stacked.mean(0);
    case ReduceOp::kMax: return stacked.amax(0);
    case ReduceOp::kMin: return stacked.amin(0);
  }
  return {};
}

// Built ops round 16-bit results once from an fp32 accumulation: within one ulp (bf16: 2^-8
// relative). Gloo's native 16-bit reductions round at each of the size - 1 hops: `roundings`.
void expect_close(const at::Tensor& actual, const at::Tensor& expected, const std::string& what,
                  int roundings = 1) {
  at::ScalarType dt = actual.scalar_type();
  double rtol = roundings * (dt == at::kBFloat16 ? 8e-3 : dt == at::kHalf ? 1e-3 : 1e-5);
  double atol = roundings * (dt == at::kBFloat16 ? 8e-3 : dt == at::kHalf ? 1e-3 : 1e-5);
  at::Tensor a = actual.to(at::kDouble);
  at::Tensor e = expected.to(at::kDouble);
  ASSERT_EQ(a.sizes(), e.sizes()) << what;
  if (!at::isFloatingType(dt)) {
    EXPECT_TRUE(at::equal(a, e)) << what;
    return;
  }
  EXPECT_TRUE(at::allclose(a, e, rtol, atol))
      << what << ": max |diff| " << (a - e).abs().max().item<double>();
}

// Parameters: world size; whether the cross-rank agreement check runs before each op (the ops
// must give the same results either way; off is the production default); and whether Gloo's
// native reduce-scatter / all-gather / AVG / 16-bit all-reduce run, or the ones built here
// (dist::GlooOps), which must agree.
class CommTest : public ::testing::TestWithParam<std::tuple<int, bool, bool>> {
 protected:
  int world_size() const { return std::get<0>(GetParam()); }
  bool native() const { return std::get<2>(GetParam()); }
  // 16-bit roundings a reduction may accumulate.
  int roundings() const { return native() ? world_size() - 1 : 1; }
  dist::GroupOptions options() const {
    dist::GroupOptions o = test::loopback_options();
    o.check_agreement = std::get<1>(GetParam());
    o.gloo_ops = native() ? dist::GlooOps::all_native() : dist::GlooOps::all_built();
    return o;
  }
};

TEST_P(CommTest, AllReduceEveryOpAndDtype) {
  const int size = world_size();
  run_ranks(
      size,
      [&](int rank, std::shared_ptr<dist::Group> g) {
        EXPECT_EQ(g->rank(), rank);
        EXPECT_EQ(g->size(), size);
        // Built ops: {5, 7} takes the small all-reduce (one all-to-all); {70, 80} in 32 and 64
        // bits is over GlooOps::small_all_reduce_bytes and takes Gloo's (in 16 bits it is not).
        for (const std::vector<int64_t>& shape : {std::vector<int64_t>{5, 7}, {70, 80}})
          for (auto dtype : {at::kFloat, at::kBFloat16, at::kHalf, at::kLong, at::kInt}) {
            for (auto op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin}) {
              if (op == ReduceOp::kAvg && !at::isFloatingType(dtype)) continue;
              at::Tensor t = input_for(rank, shape, dtype);
              g->all_reduce(t, op).wait();
              at::Tensor expected = reference_reduce(size, shape, dtype, op);
              if (!at::isFloatingType(dtype)) expected = expected.to(dtype);
              expect_close(
                  t, expected,
                  std::string("all_reduce ") + c10::toString(dtype) + " " + dist::to_string(op),
                  roundings());
              EXPECT_EQ(t.scalar_type(), dtype);
            }
          }
      },
      options());
}

TEST_P(CommTest, AllGatherIntoTensorFlatAndStacked) {
  const int size = world_size();
  run_ranks(
      size,
      [&](int rank, std::shared_ptr<dist::Group> g) {
        for (auto dtype : {at::kFloat, at::kBFloat16, at::kLong, at::kBool}) {
          at::Tensor in = input_for(rank, {3, 4}, dtype);
          std::vector<at::Tensor> parts;
          for (int r = 0; r < size; ++r) parts.push_back(input_for(r, {3, 4}, dtype));

          at::Tensor flat = at::empty({size * 3, 4}, in.options());
          g->all_gather_into_tensor(flat, in).wait();
          EXPECT_TRUE(at::equal(flat, at::cat(parts))) << "flat " << dtype;  // bit-exact, even bf16

          at::Tensor stacked = at::empty({size, 3, 4}, in.options());
          dist::Work w = g->all_gather_into_tensor(stacked, in);
          EXPECT_FALSE(w.done());
          w.wait();
          EXPECT_TRUE(w.done());
          w.wait();  // idempotent
          EXPECT_TRUE(at::equal(stacked, at::stack(parts))) << "stacked " << dtype;
        }
        // The input may be this rank's slice of the output (FSDP gathers in place).
        at::Tensor out = at::zeros({size * 6}, at::kFloat);
        out.narrow(0, rank * 6, 6).copy_(input_for(rank, {6}, at::kFloat));
        g->all_gather_into_tensor(out, out.narrow(0, rank * 6, 6)).wait();
        std::vector<at::Tensor> parts;
        for (int r = 0; r < size; ++r) parts.push_back(input_for(r, {6}, at::kFloat));
        EXPECT_TRUE(at::equal(out, at::cat(parts)));
      },
      options());
}

TEST_P(CommTest, ReduceScatterTensorEveryOpAndDtype) {
  const int size = world_size();
  run_ranks(
      size,
      [&](int rank, std::shared_ptr<dist::Group> g) {
        for (auto dtype : {at::kFloat, at::kBFloat16, at::kLong}) {
          for (auto op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin}) {
            if (op == ReduceOp::kAvg && dtype == at::kLong) continue;
            at::Tensor in = input_for(rank, {size * 3, 4}, dtype);
            at::Tensor out = at::empty({3, 4}, in.options());
            g->reduce_scatter_tensor(out, in, op).wait();
            at::Tensor expected =
                reference_reduce(size, {size * 3, 4}, dtype, op).narrow(0, rank * 3, 3);
            if (dtype == at::kLong) expected = expected.to(dtype);
            expect_close(
                out, expected,
                std::string("reduce_scatter ") + c10::toString(dtype) + " " + dist::to_string(op),
                roundings());
          }
        }
        // The stacked form: input (size, n).
        at::Tensor in = input_for(rank, {size, 5}, at::kFloat);
        at::Tensor out = at::empty({5}, at::kFloat);
        g->reduce_scatter_tensor(out, in).wait();
        expect_close(out, reference_reduce(size, {size, 5}, at::kFloat, ReduceOp::kSum)[rank],
                     "reduce_scatter stacked");
      },
      options());
}

// Rows sent from rank i to rank j: uneven, sometimes zero.
int64_t rows_between(int i, int j) { return (i + 2 * j + 1) % 3; }

// A row of `cols` values that names its source, destination and index.
at::Tensor tagged_rows(int src, int dst, int64_t rows, int64_t cols, at::ScalarType dtype) {
  at::Tensor base = at::arange(rows * cols, at::kDouble).reshape({rows, cols});
  return (base + 100 * src + 10 * dst).to(dtype);
}

TEST_P(CommTest, AllToAllSingleUnevenAndEqualSplits) {
  const int size = world_size();
  run_ranks(
      size,
      [&](int rank, std::shared_ptr<dist::Group> g) {
        const int64_t cols = 3;
        for (auto dtype : {at::kFloat, at::kBFloat16, at::kLong}) {
          std::vector<int64_t> in_splits, out_splits;
          std::vector<at::Tensor> send_parts, expect_parts;
          for (int j = 0; j < size; ++j) {
            in_splits.push_back(rows_between(rank, j));
            out_splits.push_back(rows_between(j, rank));
            send_parts.push_back(tagged_rows(rank, j, rows_between(rank, j), cols, dtype));
            expect_parts.push_back(tagged_rows(j, rank, rows_between(j, rank), cols, dtype));
          }
          at::Tensor in = at::cat(send_parts);
          at::Tensor expected = at::cat(expect_parts);
          at::Tensor out = at::full(expected.sizes(), -1, in.options());
          g->all_to_all_single(out, in, out_splits, in_splits).wait();
          EXPECT_TRUE(at::equal(out, expected)) << "uneven " << dtype;

          // Equal splits: no split vectors, two rows per peer.
          std::vector<at::Tensor> eq_send, eq_expect;
          for (int j = 0; j < size; ++j) {
            eq_send.push_back(tagged_rows(rank, j, 2, cols, dtype));
            eq_expect.push_back(tagged_rows(j, rank, 2, cols, dtype));
          }
          at::Tensor eq_out = at::empty({2 * size, cols}, in.options());
          g->all_to_all_single(eq_out, at::cat(eq_send)).wait();
          EXPECT_TRUE(at::equal(eq_out, at::cat(eq_expect))) << "equal " << dtype;
        }
      },
      options());
}

TEST_P(CommTest, BroadcastSendRecvBarrier) {
  const int size = world_size();
  run_ranks(
      size,
      [&](int rank, std::shared_ptr<dist::Group> g) {
        const int root = size - 1;
        for (auto dtype : {at::kFloat, at::kBFloat16, at::kLong, at::kBool}) {
          at::Tensor t = rank == root ? input_for(root, {4, 3}, dtype) : at::zeros({4, 3}, dtype);
          g->broadcast(t, root).wait();
          EXPECT_TRUE(at::equal(t, input_for(root, {4, 3}, dtype))) << "broadcast " << dtype;
        }
        // A ring: send to the next rank, receive from the previous one; both issued before waiting.
        const int next = (rank + 1) % size;
        const int prev = (rank + size - 1) % size;
        for (auto dtype : {at::kFloat, at::kBFloat16}) {
          at::Tensor out = input_for(rank, {8}, dtype);
          at::Tensor in = at::empty({8}, dtype);
          dist::Work s = g->send(out, next, /*tag=*/3);
          dist::Work r = g->recv(in, prev, /*tag=*/3);
          s.wait();
          r.wait();
          EXPECT_TRUE(at::equal(in, input_for(prev, {8}, dtype))) << "recv " << dtype;
        }
        g->barrier().wait();
        // Several ops in flight at once, waited in issue order.
        at::Tensor a = at::full({16}, rank + 1.0);
        at::Tensor b = at::full({16}, 2.0 * (rank + 1));
        dist::Work wa = g->all_reduce(a);
        dist::Work wb = g->all_reduce(b, ReduceOp::kMax);
        wa.wait();
        wb.wait();
        EXPECT_TRUE(at::equal(a, at::full({16}, size * (size + 1) / 2.0)));
        EXPECT_TRUE(at::equal(b, at::full({16}, 2.0 * size)));
      },
      options());
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, CommTest,
                         ::testing::Combine(::testing::Values(2, 3, 4), ::testing::Bool(),
                                            ::testing::Bool()),
                         [](const auto& info) {
                           return "world" + std::to_string(std::get<0>(info.param)) +
                                  (std::get<1>(info.param) ? "_checked" : "_unchecked") +
                                  (std::get<2>(info.param) ? "_native" : "_built");
                         });

TEST(Comm, SubgroupsByRankList) {
  run_ranks(4, [&](int rank, std::shared_ptr<dist::Group> world) {
    // Pairs {0, 2} and {1, 3}; each rank creates only its own pair, and a non-member gets null.
    std::vector<int> mine = rank % 2 == 0 ? std::vector<int>{0, 2} : std::vector<int>{1, 3};
    std::vector<int> other = rank % 2 == 0 ? std::vector<int>{1, 3} : std::vector<int>{0, 2};
    EXPECT_EQ(world->new_subgroup("pairs", other), nullptr);
    auto pair = world->new_subgroup("pairs", mine);
    ASSERT_NE(pair, nullptr);
    EXPECT_EQ(pair->size(), 2);
    EXPECT_EQ(pair->rank(), rank / 2);
    EXPECT_EQ(pair->ranks(), mine);
    at::Tensor t = at::full({3}, static_cast<double>(rank + 1), at::kFloat);
    pair->all_reduce(t).wait();
    EXPECT_TRUE(at::equal(t, at::full({3}, rank % 2 == 0 ? 4.0 : 6.0, at::kFloat)));
    // The same rank set again is a new, independent group; the world still works alongside.
    auto again = world->new_subgroup("pairs", mine);
    at::Tensor u = at::ones({2});
    again->all_reduce(u).wait();
    world->all_reduce(t).wait();
    EXPECT_TRUE(at::equal(u, at::full({2}, 2.0)));
    EXPECT_TRUE(at::equal(t, at::full({3}, 20.0, at::kFloat)));
  });
}

TEST(Comm, DeviceFromGlooSocketIfname) {
  // No hostname: the interfaces named in GLOO_SOCKET_IFNAME, as on a cluster.
  dist::GroupOptions options = test::loopback_options();
  options.gloo_hostname = "";
  ::setenv("GLOO_SOCKET_IFNAME", "lo", /*overwrite=*/1);
  run_ranks(
      2,
      [&](int rank, std::shared_ptr<dist::Group> g) {
        at::Tensor t = at::full({4}, rank + 1.0);
        g->all_reduce(t).wait();
        EXPECT_TRUE(at::equal(t, at::full({4}, 3.0)));
      },
      options);
  ::unsetenv("GLOO_SOCKET_IFNAME");
}

// Built against a CUDA libtorch (the default: the torch wheel), NCCL process groups are compiled
// in (USE_C10D_NCCL and <nccl.h> from the wheel's NVIDIA packages); running them needs a GPU.
TEST(Comm, NcclCompiledInWithCudaLibtorch) {
#ifdef TITAN_EXPECT_NCCL
  EXPECT_TRUE(dist::nccl_available());
#else
  GTEST_SKIP() << "libtorch without CUDA: no NCCL expected";
#endif
}

TEST(Comm, SingleRankGroupIsIdentity) {
  run_ranks(1, [&](int rank, std::shared_ptr<dist::Group> g) {
    at::Tensor t = at::arange(6, at::kFloat);
    g->all_reduce(t, ReduceOp::kAvg).wait();
    EXPECT_TRUE(at::equal(t, at::arange(6, at::kFloat)));
    at::Tensor out = at::empty({6}, at::kFloat);
    g->all_gather_into_tensor(out, t).wait();
    EXPECT_TRUE(at::equal(out, t));
    g->reduce_scatter_tensor(out, t).wait();
    EXPECT_TRUE(at::equal(out, t));
    g->barrier().wait();
  });
}

}  // namespace test_comm
}  // namespace titan
