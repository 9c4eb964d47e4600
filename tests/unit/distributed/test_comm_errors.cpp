// Misuse is caught before a collective is issued (the group keeps working afterwards), ranks
// that disagree are told so, and a missing peer becomes an error within the timeout, not a hang.
#include "multirank.h"

#include <ATen/ATen.h>

#include <chrono>
#include <future>

namespace titan {
namespace test_comm_errors {

using dist::ReduceOp;
using test::loopback_options;
using test::run_ranks;
using test::run_ranks_collect;

// Runs `misuse` (which must throw c10::Error containing `expected`) and then a good all_reduce.
void expect_refused_then_usable(dist::Group& g, const std::function<void()>& misuse,
                                const std::string& expected) {
  try {
    misuse();
    ADD_FAILURE() << "no exception; expected one containing: " << expected;
  } catch (const c10::Error& e) {
    std::string what = e.what_without_backtrace();
    EXPECT_NE(what.find(expected), std::string::npos) << what;
  }
  EXPECT_TRUE(g.healthy());
  at::Tensor t = at::ones({4});
  g.all_reduce(t).wait();
  EXPECT_TRUE(at::equal(t, at::full({4}, static_cast<double>(g.size()))));
}

TEST(CommErrors, LocalMisuseIsRefusedBeforeIssue) {
  run_ranks(2, [&](int rank, std::shared_ptr<dist::Group> g) {
    dist::Group& G = *g;
    at::Tensor f = at::ones({4, 3});
    expect_refused_then_usable(
        G,
        [&] {
          G.all_gather_into_tensor(at::empty({8, 3}, at::kDouble), f);
        },
        "output dtype Double differs from input dtype Float");
    expect_refused_then_usable(
        G,
        [&] {
          G.all_gather_into_tensor(at::empty({7, 3}), f);
        },
        "must be the group size (2) times input [4, 3]");
    expect_refused_then_usable(
        G,
        [&] {
          G.reduce_scatter_tensor(at::empty({4, 3}), at::empty({4, 3}));
        },
        "input [4, 3] must be the group size (2) times output [4, 3]");
    expect_refused_then_usable(
        G, [&] { G.all_reduce(f.t()); }, "is not contiguous");
    expect_refused_then_usable(
        G, [&] { G.all_reduce(at::ones({3}, at::kBool)); }, "cannot reduce Bool");
    expect_refused_then_usable(
        G, [&] { G.all_reduce(at::ones({3}, at::kLong), ReduceOp::kAvg); },
        "AVG needs a floating dtype");
    expect_refused_then_usable(
        G, [&] { G.all_reduce(at::Tensor()); }, "undefined tensor");
    expect_refused_then_usable(
        G, [&] { G.broadcast(f, 2); }, "root 2 is not a rank");
    expect_refused_then_usable(
        G, [&] { G.send(f, rank); }, "is this rank itself");
    expect_refused_then_usable(
        G,
        [&] {
          G.all_to_all_single(at::empty({4, 3}), f, {2, 2}, {1, 2});
        },
        "input_splits [1, 2] sum to 3 but input has 4 rows");
    expect_refused_then_usable(
        G,
        [&] {
          G.all_to_all_single(at::empty({4, 2}), f);
        },
        "must have the same trailing dims");
    expect_refused_then_usable(
        G,
        [&] {
          G.all_to_all_single(at::empty({3, 3}), at::empty({3, 3}));
        },
        "must divide by the group size 2");
  });
}

TEST(CommErrors, DisagreementAcrossRanksIsCaughtAndGroupSurvives) {
  run_ranks(3, [&](int rank, std::shared_ptr<dist::Group> g) {
    dist::Group& G = *g;
    // Rank 2 reduces a longer tensor: locally fine, globally a hang or corruption.
    expect_refused_then_usable(
        G, [&] { G.all_reduce(at::ones({rank == 2 ? 8 : 4})); },
        "rank 0 calls all_reduce #0 (Float, 4 elements, SUM) but rank 2 calls all_reduce #0 "
        "(Float, 8 elements, SUM)");
    // Rank 1 calls a different collective.
    expect_refused_then_usable(
        G,
        [&] {
          at::Tensor t = at::ones({4});
          if (rank == 1) {
            G.broadcast(t, 0);
          } else {
            G.all_reduce(t);
          }
        },
        "but rank 1 calls broadcast #2");
    // All-to-all splits that do not pair up: rank 0 sends 2 rows to rank 1, which expects 1.
    expect_refused_then_usable(
        G,
        [&] {
          std::vector<int64_t> in{1, rank == 0 ? 2 : 1, 1};
          std::vector<int64_t> out{1, 1, 1};
          int64_t rows = in[0] + in[1] + in[2];
          G.all_to_all_single(at::empty({3, 2}), at::ones({rows, 2}), out, in);
        },
        "rank 0 sends 2 rows to rank 1, which expects 1");
    // Different reduce ops.
    expect_refused_then_usable(
        G, [&] { G.all_reduce(at::ones({4}), rank == 0 ? ReduceOp::kMax : ReduceOp::kSum); },
        "MAX");
  });
}

TEST(CommErrors, MissingPeerTimesOutWithAClearError) {
  dist::GroupOptions options = loopback_options(std::chrono::seconds(2));
  options.check_agreement = false;  // the plain collective itself must time out
  std::promise<void> rank0_done;
  std::shared_future<void> rank0_done_future = rank0_done.get_future().share();
  double seconds = 0;
  auto errors = run_ranks_collect(
      2,
      [&](int rank, std::shared_ptr<dist::Group> g) {
        at::Tensor t = at::ones({1024});
        g->all_reduce(t).wait();  // both ranks: the group works
        if (rank == 1) {
          // Skips the next collective but stays alive, so rank 0 sees a timeout, not a closed
          // socket.
          rank0_done_future.wait();
          return;
        }
        auto start = std::chrono::steady_clock::now();
        try {
          g->all_reduce(t).wait();
          ADD_FAILURE() << "rank 0: all_reduce without its peer did not fail";
        } catch (const dist::CommError& e) {
          seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
          std::string what = e.what();
          EXPECT_NE(what.find("all_reduce #1 on process group 'world' (rank 0 of 2"),
                    std::string::npos)
              << what;
          EXPECT_NE(what.find("timeout 2.0 s"), std::string::npos) << what;
          EXPECT_NE(what.find("HINT"), std::string::npos) << what;
        }
        EXPECT_FALSE(g->healthy());
        // Later ops fail at once, naming the first failure.
        try {
          g->barrier().wait();
          ADD_FAILURE() << "a broken group accepted a barrier";
        } catch (const dist::CommError& e) {
          EXPECT_NE(std::string(e.what()).find("unusable since an earlier collective failed"),
                    std::string::npos)
              << e.what();
        }
        rank0_done.set_value();
      },
      options);
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
  EXPECT_GE(seconds, 1.5);
  EXPECT_LT(seconds, 6.0);
}

TEST(CommErrors, SetTimeoutBoundsLaterWaits) {
  dist::GroupOptions options = loopback_options(std::chrono::seconds(20));
  options.check_agreement = false;
  std::promise<void> rank0_done;
  std::shared_future<void> done = rank0_done.get_future().share();
  double seconds = 0;
  auto errors = run_ranks_collect(
      2,
      [&](int rank, std::shared_ptr<dist::Group> g) {
        g->barrier().wait();
        if (rank == 1) {
          done.wait();
          return;
        }
        g->set_timeout(std::chrono::milliseconds(1500));
        EXPECT_EQ(g->timeout(), std::chrono::milliseconds(1500));
        auto start = std::chrono::steady_clock::now();
        EXPECT_THROW(g->barrier().wait(), dist::CommError);
        seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        rank0_done.set_value();
      },
      options);
  EXPECT_EQ(errors[0], "");
  EXPECT_LT(seconds, 5.0);
}

TEST(CommErrors, CreationNamesMissingRanksAndDisagreement) {
  // Rank 2 of 3 never starts.
  auto store = c10::make_intrusive<c10d::HashStore>();
  dist::GroupOptions options = loopback_options(std::chrono::seconds(1));
  std::vector<std::string> errors(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      try {
        dist::Group::create(store, r, 3, options);
      } catch (const dist::CommError& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(errors[r].find("waiting for group ranks [2] to join"), std::string::npos)
        << errors[r];
  }

  // Ranks started with different configurations.
  auto store2 = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::string> fp_errors(2);
  threads.clear();
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      dist::GroupOptions o = loopback_options(std::chrono::seconds(5));
      o.fingerprint = r == 0 ? "dp_shard=2" : "dp_shard=4";
      try {
        dist::Group::create(store2, r, 2, o);
      } catch (const c10::Error& e) {
        fp_errors[r] = e.what_without_backtrace();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(fp_errors[r].find("disagree"), std::string::npos) << fp_errors[r];
    EXPECT_NE(fp_errors[r].find("fingerprint=dp_shard=4"), std::string::npos) << fp_errors[r];
  }
}

// TITAN_GLOO_OPS takes only "native" or "built"; anything else is refused at group creation with
// the accepted values, never silently ignored.
TEST(CommErrors, UnknownGlooOpsValueIsRefused) {
  ::setenv("TITAN_GLOO_OPS", "fast", /*overwrite=*/1);
  std::vector<std::string> errors = run_ranks_collect(1, [](int, std::shared_ptr<dist::Group>) {});
  ::unsetenv("TITAN_GLOO_OPS");
  EXPECT_NE(errors[0].find("TITAN_GLOO_OPS='fast'"), std::string::npos) << errors[0];
  EXPECT_NE(errors[0].find("'native'"), std::string::npos) << errors[0];
}

}  // namespace test_comm_errors
}  // namespace titan
