// The lighthouse's store and its deciding thread (see lighthouse.h).
#include "titan/distributed/ft/lighthouse.h"

#include "titan/common/logging.h"

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <signal.h>

#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace titan::ft {

namespace ft_keys {
std::string beat(const std::string& replica) { return "titan/ft/beat/" + replica; }
std::string request(const std::string& replica) { return "titan/ft/request/" + replica; }
std::string answer(const std::string& replica, int64_t seq) {
  return "titan/ft/answer/" + replica + "/" + std::to_string(seq);
}
std::string left(const std::string& replica) { return "titan/ft/left/" + replica; }
std::string process_group(int64_t quorum_id, int64_t rank) {
  return "titan/ft/pg/" + std::to_string(quorum_id) + "/rank" + std::to_string(rank) + "/";
}
}  // namespace ft_keys

namespace {

std::string text_of(const std::vector<uint8_t>& bytes) { return {bytes.begin(), bytes.end()}; }

}  // namespace

struct Lighthouse::State {
  // What the lighthouse knows of one registered replica.
  struct Tracked {
    std::string key;  // "<id>:<incarnation>"
    Participant self;
    int64_t beats = -1;
    Clock::time_point beat_moved{};
    bool dead = false;
    // Dead because it stopped beating (a stopped process, a lost link): it comes back if it
    // beats again (it then asks as a newcomer, behind, and recovers from a peer). A replica that
    // left, or was replaced by a restart, does not.
    bool silent = false;
    int64_t answered = 0;  // the last request seq answered
    int64_t asking = 0;    // the request seq waiting (0: none)
    Clock::time_point asked_at{};
    bool new_group = false;  // with the request waiting
  };

  LighthouseOptions options;
  c10::intrusive_ptr<c10d::TCPStore> store;
  std::map<std::string, Tracked> replicas;  // by key
  std::optional<Quorum> previous;
  std::string last_wait;  // the last "waiting for" line logged
  std::atomic<int64_t> changes{0};
  std::atomic<bool> stopping{false};
  std::mutex mu;
  std::condition_variable wake;
  std::thread thread;

  void say(const std::string& line) const {
    if (options.log) {
      options.log(line);
    } else {
      log_info("lighthouse: ", line);
    }
  }

  void read_registrations(Clock::time_point now) {
    if (!store->check({ft_keys::kReplicas})) return;
    std::istringstream list(text_of(store->get(ft_keys::kReplicas)));
    std::string entry;
    while (std::getline(list, entry, ';')) {
      if (entry.empty() || replicas.count(entry)) continue;
      const size_t colon = entry.find(':');
      Tracked t;
      t.key = entry;
      try {
        t.self.replica_id = std::stoll(entry.substr(0, colon));
        t.self.incarnation = std::stoll(entry.substr(colon + 1));
      } catch (const std::exception&) {
        say("ignoring a malformed registration '" + entry + "'");
        replicas[entry].dead = true;
        continue;
      }
      t.beat_moved = now;
      for (auto& [key, other] : replicas) {
        if (other.self.replica_id == t.self.replica_id && (!other.dead || other.silent)) {
          other.dead = true;
          other.silent = false;
          say("replica " + std::to_string(t.self.replica_id) +
              " registered again (a restart): its earlier run leaves");
        }
      }
      say("replica " + std::to_string(t.self.replica_id) + " registered");
      replicas[entry] = t;
    }
  }

  void read_replica(Tracked& t, Clock::time_point now) {
    if (store->check({ft_keys::left(t.key)})) {
      t.dead = true;
      say("replica " + std::to_string(t.self.replica_id) + " left (it ended)");
      return;
    }
    read_beats(t, now);
    const auto silent = std::chrono::duration_cast<std::chrono::milliseconds>(now - t.beat_moved);
    if (silent > options.heartbeat_timeout) {
      t.dead = true;
      t.silent = true;
      say("replica " + std::to_string(t.self.replica_id) + " stopped beating (none for " +
          std::to_string(silent.count()) + " ms): it leaves the quorum");
      return;
    }
    if (!store->check({ft_keys::request(t.key)})) return;
    std::istringstream request(text_of(store->get(ft_keys::request(t.key))));
    int64_t seq = 0, step = 0, fresh = 0, new_group = 0;
    request >> seq >> step >> fresh >> new_group;
    if (seq > t.answered && seq != t.asking) {
      t.asking = seq;
      t.asked_at = now;
      t.self.step = step;
      t.self.fresh = fresh != 0;
      t.new_group = new_group != 0;
    }
  }

  // Whether the replica's beat counter moved since last read (then beat_moved is now).
  bool read_beats(Tracked& t, Clock::time_point now) {
    if (!store->check({ft_keys::beat(t.key)})) return false;
    const int64_t beats = std::stoll(text_of(store->get(ft_keys::beat(t.key))));
    if (beats == t.beats) return false;
    t.beats = beats;
    t.beat_moved = now;
    return true;
  }

  void revive_if_beating(Tracked& t, Clock::time_point now) {
    if (!read_beats(t, now)) return;
    t.dead = false;
    t.silent = false;
    say("replica " + std::to_string(t.self.replica_id) + " beats again: it may rejoin");
  }

  void tick() {
    const Clock::time_point now = Clock::now();
    read_registrations(now);
    std::vector<ReplicaView> views;
    for (auto& [key, t] : replicas) {
      if (t.dead && t.silent) revive_if_beating(t, now);
      if (t.dead) continue;
      read_replica(t, now);
      if (t.dead) continue;
      views.push_back(
          {t.self, /*alive=*/true, t.asking > 0, t.asked_at, t.asking > 0 && t.new_group});
    }
    std::string why;
    const QuorumRules rules(options.min_replicas, options.join_timeout);
    std::optional<Quorum> q = rules.decide(views, previous ? &*previous : nullptr, now, &why);
    if (!q) {
      bool anyone_asking = false;
      for (const ReplicaView& v : views) anyone_asking = anyone_asking || v.asking;
      if (anyone_asking && why != last_wait) say(why);
      last_wait = anyone_asking ? why : "";
      return;
    }
    last_wait.clear();
    const std::string text = q->to_json();
    for (const Participant& p : q->participants) {
      for (auto& [key, t] : replicas) {
        if (t.dead || t.self.replica_id != p.replica_id || t.self.incarnation != p.incarnation) {
          continue;
        }
        store->set(ft_keys::answer(key, t.asking), std::vector<uint8_t>(text.begin(), text.end()));
        t.answered = t.asking;
        t.asking = 0;
      }
    }
    if (!previous || previous->quorum_id != q->quorum_id) {
      ++changes;
      say("quorum " + std::to_string(q->quorum_id) + ": " + q->describe() +
          (q->max_step() >= 0 ? "; max step " + std::to_string(q->max_step()) : ""));
    }
    previous = std::move(q);
  }

  void run() {
    std::unique_lock<std::mutex> lock(mu);
    while (!stopping) {
      lock.unlock();
      try {
        tick();
      } catch (const std::exception& e) {
        say(std::string("error reading the store (retrying): ") + e.what());
      }
      lock.lock();
      wake.wait_for(lock, options.tick, [this] { return stopping.load(); });
    }
  }
};

std::unique_ptr<Lighthouse> Lighthouse::start(LighthouseOptions options) {
  if (options.min_replicas < 1) throw std::invalid_argument("min_replicas must be >= 1");
  signal(SIGPIPE, SIG_IGN);  // a replica that dies mid-reply is its problem, not the lighthouse's
  auto state = std::make_shared<State>();
  state->options = std::move(options);
  c10d::TCPStoreOptions opts;
  opts.port = static_cast<uint16_t>(state->options.port);
  opts.isServer = true;
  opts.waitWorkers = false;
  opts.timeout = std::chrono::seconds(30);
  try {
    state->store = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", opts);
  } catch (const std::exception& e) {
    throw std::runtime_error("the lighthouse cannot listen on port " +
                             std::to_string(state->options.port) + ": " + e.what() +
                             ". HINT: another process may hold the port; choose another --port");
  }
  state->thread = std::thread([state] { state->run(); });
  return std::unique_ptr<Lighthouse>(new Lighthouse(state));
}

Lighthouse::Lighthouse(std::shared_ptr<State> state) : state_(std::move(state)) {}

Lighthouse::~Lighthouse() { stop(); }

int Lighthouse::port() const { return state_->store->getPort(); }

void Lighthouse::stop() {
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->stopping = true;
  }
  state_->wake.notify_all();
  if (state_->thread.joinable()) state_->thread.join();
}

int64_t Lighthouse::quorum_changes() const { return state_->changes; }

}  // namespace titan::ft
