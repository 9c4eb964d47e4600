#include "titan/distributed/liveness.h"

#include "titan/common/check.h"
#include "titan/common/format.h"

#include <c10/util/Exception.h>

#include <condition_variable>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

namespace titan::dist {
namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kMaxListed = 16;

std::string beat_key(int rank) { return "titan/liveness/beat/" + std::to_string(rank); }
std::string where_key(int rank) { return "titan/liveness/where/" + std::to_string(rank); }

std::string text(const std::vector<uint8_t>& b) { return {b.begin(), b.end()}; }

std::string seconds_text(std::chrono::milliseconds t) {
  std::ostringstream os;
  os.precision(2);
  os << t.count() / 1000.0 << " s";
  return os.str();
}

// "rank 2" / "ranks 2, 3 (and 5 more)"
std::string ranks_text(const std::vector<int>& ranks) {
  std::vector<int> shown(ranks.begin(), ranks.begin() + std::min(ranks.size(), kMaxListed));
  std::string s = (ranks.size() == 1 ? "rank " : "ranks ") + join(shown);
  if (ranks.size() > kMaxListed)
    s += " (and " + std::to_string(ranks.size() - kMaxListed) + " more)";
  return s;
}

}  // namespace

struct Liveness::State {
  c10::intrusive_ptr<c10d::Store> beat_store;
  c10::intrusive_ptr<c10d::Store> probe_store;
  int rank = 0;
  int world_size = 1;
  Options options;

  std::mutex mutex;
  std::condition_variable cv;
  bool stopping = false;
  bool finished = false;
  std::thread thread;

  // The heartbeat: one add per interval until stopped. A failing store is retried quietly: the
  // diagnosis, not the heartbeat, reports it.
  void run(const std::shared_ptr<State>& self) {
    (void)self;  // keeps the state alive while the thread runs
    std::unique_lock<std::mutex> lock(mutex);
    while (!stopping) {
      cv.wait_for(lock, options.interval, [&] { return stopping; });
      if (stopping) break;
      lock.unlock();
      std::string stopped_by;
      try {
        beat_store->add(beat_key(rank), 1);
        if (options.on_job_stopped && beat_store->check({kJobStoppedKey})) {
          stopped_by = text(beat_store->get(kJobStoppedKey));
        }
      } catch (const std::exception&) {
      }
      if (!stopped_by.empty()) {
        options.on_job_stopped(stopped_by);
        options.on_job_stopped = nullptr;
      }
      lock.lock();
    }
    finished = true;
    cv.notify_all();
  }

  // Counters of `ranks` (-1 where a rank never beat: it did not get as far as starting).
  std::vector<int64_t> counts(const std::vector<int>& ranks) {
    std::vector<int64_t> out;
    out.reserve(ranks.size());
    for (int r : ranks) {
      const std::string key = beat_key(r);
      out.push_back(probe_store->check({key}) ? std::stoll(text(probe_store->get(key))) : -1);
    }
    return out;
  }

  // The sentence for `silent` ranks, grouped by the host they registered.
  std::string describe_silent(const std::vector<int>& silent, std::chrono::milliseconds quiet) {
    std::map<std::string, std::vector<int>> by_host;
    for (int r : silent) {
      const std::string key = where_key(r);
      by_host[probe_store->check({key}) ? text(probe_store->get(key)) : "host unknown"].push_back(
          r);
    }
    std::string s = "no heartbeat for " + seconds_text(quiet) + " from ";
    bool first = true;
    for (const auto& [host, ranks] : by_host) {
      s += (first ? "" : "; ") + ranks_text(ranks) + " (" + host + ")";
      first = false;
    }
    return s +
           ": that host is unreachable from this rank's, or those processes died or were "
           "stopped";
  }
};

std::shared_ptr<Liveness> Liveness::start(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                          int world_size, const std::string& where,
                                          Options options) {
  TITAN_CHECK(store, "Liveness::start: store is null");
  TITAN_CHECK(options.interval.count() > 0, "Liveness::start: interval must be > 0");
  auto state = std::make_shared<State>();
  state->beat_store = store->clone();
  state->probe_store = store->clone();
  state->rank = rank;
  state->world_size = world_size;
  state->options = std::move(options);
  const std::string host = where;
  state->beat_store->set(where_key(rank), std::vector<uint8_t>(host.begin(), host.end()));
  state->beat_store->add(beat_key(rank), 1);
  state->thread = std::thread([state] { state->run(state); });
  return std::shared_ptr<Liveness>(new Liveness(std::move(state)));
}

Liveness::Liveness(std::shared_ptr<State> state) : state_(std::move(state)) {}

Liveness::~Liveness() { stop(); }

int Liveness::rank() const { return state_->rank; }

void Liveness::stop() {
  State& s = *state_;
  if (!s.thread.joinable()) return;
  std::unique_lock<std::mutex> lock(s.mutex);
  s.stopping = true;
  s.cv.notify_all();
  const bool done = s.cv.wait_for(lock, s.options.interval, [&] { return s.finished; });
  lock.unlock();
  if (done) {
    s.thread.join();
  } else {
    s.thread.detach();  // stuck in a store call; it holds the state and ends on its own
  }
}

namespace {

std::string diagnose_from(const std::shared_ptr<Liveness::State>& state,
                          const std::vector<int>& world_ranks, std::chrono::milliseconds budget) {
  std::vector<int> peers;
  for (int r : world_ranks) {
    if (r != state->rank) peers.push_back(r);
  }
  if (peers.empty()) return "";
  struct Probe {
    std::mutex mutex;
    std::condition_variable cv;
    bool done = false;
    std::string text;
  };
  auto probe = std::make_shared<Probe>();
  const auto quiet = state->options.interval * Liveness::kSilentBeats + state->options.interval / 2;
  // Detached: a store that does not answer keeps the probe blocked past the budget.
  std::thread([state, probe, peers, quiet] {
    std::string result;
    try {
      const std::vector<int64_t> before = state->counts(peers);
      std::this_thread::sleep_for(quiet);
      const std::vector<int64_t> after = state->counts(peers);
      std::vector<int> silent;
      for (size_t i = 0; i < peers.size(); ++i) {
        if (after[i] < 0 || after[i] == before[i]) silent.push_back(peers[i]);
      }
      result = silent.empty()
                   ? "every other rank of the group still beats (alive, and reachable through the "
                     "store): one of them is hung or issued a different collective"
                   : state->describe_silent(silent, quiet);
    } catch (const std::exception& e) {
      result = "the job's store at " + state->options.store_address +
               " failed when asked which ranks still beat (" + error_text(e) +
               "): this host may have lost its connection to rank 0's host";
    }
    std::lock_guard<std::mutex> lock(probe->mutex);
    probe->text = std::move(result);
    probe->done = true;
    probe->cv.notify_all();
  }).detach();
  std::unique_lock<std::mutex> lock(probe->mutex);
  if (probe->cv.wait_for(lock, budget, [&] { return probe->done; })) return probe->text;
  return "the job's store at " + state->options.store_address + " (on rank 0's host) " +
         "did not answer within " + seconds_text(budget) +
         " either: this host has lost its network connection to rank 0's host, or that host is "
         "down";
}

}  // namespace

std::string Liveness::diagnose(const std::vector<int>& world_ranks,
                               std::chrono::milliseconds budget) {
  return diagnose_from(state_, world_ranks, budget);
}

Diagnoser Liveness::diagnoser() {
  const auto budget = state_->options.interval * (kSilentBeats + 2);
  // Holds the state, not this object: a group may fail after the heartbeat stopped (other ranks'
  // counters still tell who is alive).
  return [state = state_, budget](const std::vector<int>& world_ranks) {
    return diagnose_from(state, world_ranks, budget);
  };
}

}  // namespace titan::dist
