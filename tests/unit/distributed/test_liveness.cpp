// Heartbeats through the store (liveness.h): a diagnosis names the ranks that stopped beating
// and where they run, says when every peer beats, blames the store when it does not answer (within
// its budget), and a failed collective carries the diagnosis in its CommError.
#include "multirank.h"
#include "titan/distributed/liveness.h"

#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <future>
#include <mutex>

namespace titan::test_liveness {
namespace {

using namespace std::chrono_literals;
using titan::dist::Liveness;

Liveness::Options fast() {
  Liveness::Options o;
  o.interval = 100ms;
  o.store_address = "10.0.0.1:29500";
  return o;
}

std::shared_ptr<Liveness> start(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                const std::string& where) {
  return Liveness::start(store, rank, 4, where, fast());
}

TEST(Liveness, NamesTheRanksThatStoppedBeatingAndWhereTheyRun) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  auto r0 = start(store, 0, "node 0, host a, 10.0.0.1");
  auto r1 = start(store, 1, "node 0, host a, 10.0.0.1");
  auto r2 = start(store, 2, "node 1, host b, 10.0.0.2");
  auto r3 = start(store, 3, "node 1, host b, 10.0.0.2");
  std::this_thread::sleep_for(120ms);

  const std::string all = r0->diagnose({0, 1, 2, 3}, 2s);
  EXPECT_NE(all.find("every other rank of the group still beats"), std::string::npos) << all;

  r2->stop();
  r3->stop();
  const std::string cut = r0->diagnose({0, 1, 2, 3}, 2s);
  EXPECT_NE(cut.find("from ranks 2, 3 (node 1, host b, 10.0.0.2)"), std::string::npos) << cut;
  EXPECT_EQ(cut.find("rank 1"), std::string::npos) << cut;
  EXPECT_NE(cut.find("unreachable"), std::string::npos) << cut;
  // Only the group's ranks count: a group without the silent ones is healthy.
  const std::string pair = r0->diagnose({0, 1}, 2s);
  EXPECT_NE(pair.find("still beats"), std::string::npos) << pair;
  // A group of one has nobody to ask about.
  EXPECT_EQ(r0->diagnose({0}, 2s), "");

  // Ranks on several hosts are grouped by host; the diagnoser outlives the Liveness.
  auto diagnose = r1->diagnoser();
  r1.reset();
  const std::string hosts = diagnose({0, 1, 2, 3});
  EXPECT_NE(hosts.find("ranks 2, 3 (node 1, host b, 10.0.0.2)"), std::string::npos) << hosts;
  EXPECT_EQ(hosts.find("rank 0 ("), std::string::npos) << hosts;
}

// A store that stops answering (the network to its host is gone): every call blocks until released.
class LostStore : public c10d::HashStore {
 public:
  std::atomic<bool> lost{false};
  std::mutex mutex;
  std::condition_variable cv;
  bool released = false;

  c10::intrusive_ptr<c10d::Store> clone() override {
    return c10::intrusive_ptr<c10d::Store>::reclaim_copy(this);
  }
  void block() {
    if (!lost) return;
    std::unique_lock<std::mutex> lock(mutex);
    cv.wait(lock, [&] { return released; });
  }
  void release() {
    std::lock_guard<std::mutex> lock(mutex);
    released = true;
    cv.notify_all();
  }
  std::vector<uint8_t> get(const std::string& key) override {
    block();
    return HashStore::get(key);
  }
  int64_t add(const std::string& key, int64_t value) override {
    block();
    return HashStore::add(key, value);
  }
  bool check(const std::vector<std::string>& keys) override {
    block();
    return HashStore::check(keys);
  }
};

TEST(Liveness, BlamesTheStoreWhenItDoesNotAnswerWithinTheBudget) {
  auto store = c10::make_intrusive<LostStore>();
  auto r0 = start(store, 0, "node 0, host a, 10.0.0.1");
  auto r1 = start(store, 1, "node 1, host b, 10.0.0.2");
  store->lost = true;
  const auto begin = std::chrono::steady_clock::now();
  const std::string why = r1->diagnose({0, 1}, 300ms);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  EXPECT_NE(why.find("the job's store at 10.0.0.1:29500"), std::string::npos) << why;
  EXPECT_NE(why.find("did not answer within 0.3 s"), std::string::npos) << why;
  EXPECT_NE(why.find("lost its network connection"), std::string::npos) << why;
  EXPECT_GE(seconds, 0.29);
  EXPECT_LT(seconds, 2.0);
  // Stopping does not hang on a heartbeat stuck in the store.
  const auto stop_begin = std::chrono::steady_clock::now();
  r0->stop();
  r1->stop();
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - stop_begin).count(),
            1.0);
  store->release();
}

TEST(Liveness, AFailedCollectiveCarriesTheDiagnosis) {
  dist::GroupOptions options = test::loopback_options(2s);
  options.check_agreement = false;
  std::atomic<int> asked{0};
  std::vector<int> asked_about;
  options.diagnose = [&](const std::vector<int>& ranks) {
    ++asked;
    asked_about = ranks;
    return std::string("no heartbeat from rank 1 (node 1, host b)");
  };
  std::promise<void> rank0_done;
  std::shared_future<void> rank0_done_future = rank0_done.get_future().share();
  auto errors = test::run_ranks_collect(
      2,
      [&](int rank, std::shared_ptr<dist::Group> g) {
        at::Tensor t = at::ones({16});
        g->all_reduce(t).wait();
        if (rank == 1) {
          rank0_done_future.wait();
          return;
        }
        try {
          g->all_reduce(t).wait();
          ADD_FAILURE() << "all_reduce without its peer did not fail";
        } catch (const dist::CommError& e) {
          const std::string what = e.what();
          EXPECT_NE(what.find("Diagnosis: no heartbeat from rank 1 (node 1, host b). HINT"),
                    std::string::npos)
              << what;
        }
        rank0_done.set_value();
      },
      options);
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
  EXPECT_EQ(asked.load(), 1);
  EXPECT_EQ(asked_about, (std::vector<int>{0, 1}));
}

}  // namespace
}  // namespace titan::test_liveness
