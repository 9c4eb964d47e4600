// Group creation (rendezvous check, backend construction, sub-groups) and waiting on Work.
// The collectives themselves are in comm_ops.cpp, the checks in comm_check.cpp.
#include "titan/common/check.h"
#include "titan/common/format.h"
#include "titan/common/phase.h"
#include "titan/distributed/comm_internal.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#if TITAN_HAS_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <sstream>

namespace titan::dist {

const char* to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "SUM";
    case ReduceOp::kAvg: return "AVG";
    case ReduceOp::kMax: return "MAX";
    case ReduceOp::kMin: return "MIN";
  }
  return "?";
}

const char* to_string(Backend backend) { return backend == Backend::kGloo ? "gloo" : "nccl"; }

bool nccl_available() {
#if TITAN_HAS_NCCL
  return true;
#else
  return false;
#endif
}

namespace {

std::string seconds_text(double seconds) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f s", seconds);
  return buf;
}

std::vector<uint8_t> to_bytes(const std::string& s) { return {s.begin(), s.end()}; }
std::string from_bytes(const std::vector<uint8_t>& b) { return {b.begin(), b.end()}; }

bool env_flag(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' && std::string(v) != "0";
}

std::vector<std::shared_ptr<::gloo::transport::Device>> make_gloo_devices(const GroupOptions& o) {
  using c10d::ProcessGroupGloo;
  if (!o.gloo_hostname.empty()) return {ProcessGroupGloo::createDeviceForHostname(o.gloo_hostname)};
  const char* ifnames = std::getenv("GLOO_SOCKET_IFNAME");
  if (ifnames != nullptr && *ifnames != '\0') {
    std::vector<std::shared_ptr<::gloo::transport::Device>> devices;
    std::stringstream ss(ifnames);
    std::string name;
    while (std::getline(ss, name, ',')) {
      if (!name.empty()) devices.push_back(ProcessGroupGloo::createDeviceForInterface(name));
    }
    if (!devices.empty()) return devices;
  }
  return {ProcessGroupGloo::createDefaultDevice()};
}

// Every member publishes what it believes the group is; all must agree before the backend is
// built, because a backend rendezvous among disagreeing ranks hangs instead of failing.
void check_members_agree(Group::State& s, c10d::Store& store) {
  std::ostringstream desc;
  desc << "name=" << s.options.name << " size=" << s.size
       << " backend=" << to_string(s.options.backend) << " world_ranks=[" << join(s.ranks)
       << "] fingerprint=" << s.options.fingerprint;
  const std::string mine = desc.str();
  store.set("titan_join/" + std::to_string(s.rank), to_bytes(mine));

  std::vector<std::string> keys;
  for (int r = 0; r < s.size; ++r) keys.push_back("titan_join/" + std::to_string(r));
  auto start = std::chrono::steady_clock::now();
  try {
    store.wait(keys, s.timeout());
  } catch (const std::exception& e) {
    std::vector<int> missing;
    for (int r = 0; r < s.size; ++r) {
      try {
        if (!store.check({keys[r]})) missing.push_back(r);
      } catch (const std::exception&) {
        missing.push_back(r);
      }
    }
    double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    throw CommError("creating process group " + s.describe() + ": timed out after " +
                    seconds_text(waited) + " waiting for group ranks [" + join(missing) +
                    "] to join (" + e.what() +
                    "). HINT: those ranks crashed, are slow to start, or were started with a "
                    "different world size or parallelism config; check their output, or raise "
                    "comm.init_timeout_seconds.");
  }
  std::ostringstream diff;
  for (int r = 0; r < s.size; ++r) {
    std::string theirs = r == s.rank ? mine : from_bytes(store.get(keys[r]));
    if (theirs != mine) diff << "\n  rank " << r << ": " << theirs;
  }
  TITAN_CHECK(diff.str().empty(), "process group ", s.describe(),
              ": the members disagree on what the group is. This rank (", s.rank, "): ", mine,
              diff.str(),
              "\nHINT: start every rank with the same configuration (world size, parallelism "
              "degrees, backend).");
}

std::shared_ptr<Group::State> make_state(const c10::intrusive_ptr<c10d::Store>& root_store,
                                         std::string prefix, int rank, int size,
                                         std::vector<int> world_ranks, GroupOptions options) {
  auto s = std::make_shared<Group::State>();
  s->root_store = root_store;
  s->prefix = std::move(prefix);
  s->rank = rank;
  s->size = size;
  s->ranks = std::move(world_ranks);
  if (env_flag("TITAN_COMM_CHECK")) options.check_agreement = true;
  if (const char* ops = std::getenv("TITAN_GLOO_OPS"); ops != nullptr && *ops != '\0') {
    const std::string v = ops;
    TITAN_CHECK(v == "native" || v == "built", "TITAN_GLOO_OPS='", v,
                "' must be 'native' (Gloo's own reduce-scatter, all-gather, AVG and 16-bit "
                "all-reduce) or 'built' (ours, on all-to-all and fp32 sums); unset: the default "
                "mix (comm.h)");
    options.gloo_ops = v == "native" ? GlooOps::all_native() : GlooOps::all_built();
  }
  s->timeout_ms = options.timeout.count();
  s->options = std::move(options);
  return s;
}

void build_backend(Group::State& s) {
  auto store = c10::make_intrusive<c10d::PrefixStore>(s.prefix, s.root_store);
  check_members_agree(s, *store);
  try {
    if (s.options.backend == Backend::kGloo) {
      if (s.gloo_devices.empty()) s.gloo_devices = make_gloo_devices(s.options);
      auto opts = c10d::ProcessGroupGloo::Options::create(s.options.timeout);
      opts->devices = s.gloo_devices;
      // A group of one never talks; more threads only cost memory.
      opts->threads = s.size == 1 ? 1 : std::max(1, s.options.gloo_threads);
      s.pg = c10::make_intrusive<c10d::ProcessGroupGloo>(store, s.rank, s.size, opts);
    } else {
#if TITAN_HAS_NCCL
      auto opts = c10d::ProcessGroupNCCL::Options::create();
      opts->timeout = s.options.timeout;
      s.pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, s.rank, s.size, opts);
#else
      TITAN_CHECK(false, "process group ", s.describe(),
                  ": this build has no NCCL (libtorch without USE_C10D_NCCL, or <nccl.h> not "
                  "found at build time). HINT: use the gloo backend (CPU tensors), or build "
                  "against a CUDA libtorch with NCCL's headers installed.");
#endif
    }
  } catch (const c10::Error&) {
    throw;
  } catch (const std::exception& e) {
    throw CommError("creating process group " + s.describe() + " failed: " + e.what() +
                    ". HINT: check that the ranks can reach each other (GLOO_SOCKET_IFNAME, "
                    "firewalls) and that every rank is alive.");
  }
}

}  // namespace

// ---- Group::State ----

std::string Group::State::describe() const {
  std::ostringstream os;
  os << "'" << options.name << "' (rank " << rank << " of " << size << ", world ranks ["
     << join(ranks) << "], " << to_string(options.backend) << ")";
  return os.str();
}

void Group::State::check_healthy(const std::string& op) const {
  std::lock_guard<std::mutex> lock(mutex);
  if (broken) {
    throw CommError(op + " on process group " + describe() +
                    ": the group is unusable since an earlier collective failed: " + broken_reason);
  }
}

void Group::State::mark_broken(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mutex);
  if (!broken) {
    broken = true;
    broken_reason = reason;
  }
}

void Group::State::fail(const std::string& op, const std::string& cause, double seconds) {
  if (options.recorder) {
    // Every rank that sees the failure dumps; the launcher asks the others (SIGUSR1).
    options.recorder->finish(fr_checking, OpState::kFailed);
    options.recorder->dump();
  }
  std::string what = op + " on process group " + describe() + " failed after " +
                     seconds_text(seconds) + " (timeout " +
                     seconds_text(static_cast<double>(timeout_ms.load()) / 1000.0) + "): " + cause;
  mark_broken(what);
  const bool stop = !cause.empty() && (cause.back() == '.' || cause.back() == '!');
  // Who is unreachable (heartbeats through the store): bounded, a few seconds at most.
  std::string diagnosis;
  if (options.diagnose) {
    try {
      diagnosis = options.diagnose(ranks);
    } catch (const std::exception& e) {
      diagnosis = std::string("(the diagnosis failed: ") + e.what() + ")";
    }
  }
  if (!diagnosis.empty()) diagnosis = " Diagnosis: " + diagnosis + ".";
  throw CommError(what + (stop ? "" : ".") + diagnosis +
                  " HINT: a peer rank crashed, hung, or issued different collectives; check "
                  "the other ranks' output first. If the peers are merely slow, raise "
                  "comm.train_timeout_seconds (comm.init_timeout_seconds at start-up).");
}

void Group::State::set_timeout(std::chrono::milliseconds timeout) {
  std::vector<State*> groups = {this};
  const std::vector<std::shared_ptr<State>> below = descendants();  // alive while we set them
  for (const auto& child : below) groups.push_back(child.get());
  for (State* g : groups) {
    g->timeout_ms = timeout.count();
    // NCCL's watchdog enforces the timeout of ops issued from now on.
    if (g->options.backend == Backend::kNccl && g->pg) g->pg->setTimeout(timeout);
  }
}

std::vector<std::shared_ptr<Group::State>> Group::State::descendants() const {
  std::vector<std::shared_ptr<State>> direct;
  {
    std::lock_guard<std::mutex> lock(mutex);
    for (const auto& weak : children) {
      if (auto child = weak.lock()) direct.push_back(std::move(child));
    }
  }
  std::vector<std::shared_ptr<State>> out;
  for (auto& child : direct) {
    std::vector<std::shared_ptr<State>> below = child->descendants();
    out.push_back(std::move(child));
    out.insert(out.end(), below.begin(), below.end());
  }
  return out;
}

Group::State::~State() {
  if (pg && (broken || abandoned_work.load())) {
    // Intentionally leaked: see the declaration. The process is failing; exit reclaims it.
    (void)pg.release();
  }
}

// ---- Group ----

Group::Group(std::shared_ptr<State> state) : state_(std::move(state)) {}
Group::~Group() = default;

std::shared_ptr<Group> Group::create(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                     int size, GroupOptions options) {
  TITAN_CHECK(store, "Group::create(", options.name, "): store is null");
  TITAN_CHECK(size >= 1 && rank >= 0 && rank < size, "Group::create(", options.name, "): rank ",
              rank, " is not in [0, size ", size, ")");
  TITAN_CHECK(options.timeout.count() > 0, "Group::create(", options.name,
              "): timeout must be > 0, got ", options.timeout.count(), " ms");
  std::vector<int> world_ranks(size);
  for (int r = 0; r < size; ++r) world_ranks[r] = r;
  std::string prefix = "titan/" + options.name;
  auto state =
      make_state(store, std::move(prefix), rank, size, std::move(world_ranks), std::move(options));
  build_backend(*state);
  return std::shared_ptr<Group>(new Group(std::move(state)));
}

std::shared_ptr<Group> Group::new_subgroup(const std::string& name, const std::vector<int>& ranks) {
  State& s = *state_;
  TITAN_CHECK(!ranks.empty(), "new_subgroup(", name, ") on ", s.describe(), ": empty rank list");
  int my_index = -1;
  for (size_t i = 0; i < ranks.size(); ++i) {
    TITAN_CHECK(ranks[i] >= 0 && ranks[i] < s.size, "new_subgroup(", name, ") on ", s.describe(),
                ": rank ", ranks[i], " is not in [0, ", s.size, ")");
    TITAN_CHECK(i == 0 || ranks[i] > ranks[i - 1], "new_subgroup(", name, ") on ", s.describe(),
                ": ranks must be strictly increasing, got [", join(ranks), "]");
    if (ranks[i] == s.rank) my_index = static_cast<int>(i);
  }
  if (my_index < 0) return nullptr;
  s.check_healthy("new_subgroup(" + name + ")");

  std::string key = name + "[" + join(ranks) + "]";
  int generation = s.subgroup_count[key]++;
  std::vector<int> world_ranks;
  for (int r : ranks) world_ranks.push_back(s.ranks[r]);
  GroupOptions options = s.options;
  options.name = name;
  options.timeout = s.timeout();
  auto sub =
      make_state(s.root_store, s.prefix + "/" + key + "#" + std::to_string(generation), my_index,
                 static_cast<int>(ranks.size()), std::move(world_ranks), std::move(options));
  sub->gloo_devices = s.gloo_devices;
  build_backend(*sub);
  {
    // Registered so that set_timeout on this group (the trainer's switch to
    // comm.train_timeout_seconds on the world group) reaches it; dead entries are dropped here.
    std::lock_guard<std::mutex> lock(s.mutex);
    auto& kids = s.children;
    kids.erase(std::remove_if(kids.begin(), kids.end(), [](const auto& w) { return w.expired(); }),
               kids.end());
    kids.push_back(sub);
  }
  return std::shared_ptr<Group>(new Group(std::move(sub)));
}

int Group::rank() const { return state_->rank; }
int Group::size() const { return state_->size; }
const std::string& Group::name() const { return state_->options.name; }
Backend Group::backend() const { return state_->options.backend; }
const std::vector<int>& Group::ranks() const { return state_->ranks; }
std::chrono::milliseconds Group::timeout() const { return state_->timeout(); }
std::string Group::describe() const { return state_->describe(); }

void Group::set_timeout(std::chrono::milliseconds timeout) {
  TITAN_CHECK(timeout.count() > 0, "set_timeout on ", state_->describe(), ": timeout must be > 0");
  state_->set_timeout(timeout);
}

std::vector<std::shared_ptr<Group>> Group::subgroups() const {
  std::vector<std::shared_ptr<Group>> out;
  for (auto& state : state_->descendants()) out.push_back(std::shared_ptr<Group>(new Group(state)));
  return out;
}

at::Device Group::device() const {
  if (state_->options.backend == Backend::kGloo) return at::Device(at::kCPU);
  return at::Device(at::kCUDA, c10::impl::getDeviceGuardImpl(at::kCUDA)->getDevice().index());
}

bool Group::healthy() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return !state_->broken;
}

// ---- Work ----

Work make_work(const std::shared_ptr<Group::State>& state, std::string op,
               c10::intrusive_ptr<c10d::Work> work, std::function<void()> finish) {
  auto impl = std::make_shared<Work::Impl>();
  impl->group = state;
  impl->op = std::move(op);
  impl->work = std::move(work);
  impl->finish = std::move(finish);
  impl->issued = std::chrono::steady_clock::now();
  impl->fr_id = state->fr_pending;
  state->fr_pending = -1;
  return Work(std::move(impl));
}

Work::Impl::~Impl() {
  if (done || !work || !group) return;
  bool finished = false;
  try {
    finished = work->isCompleted();
  } catch (const std::exception&) {
  }
  if (!finished) group->abandoned_work = true;
}

Work::Work() = default;
Work::Work(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

bool Work::done() const { return !impl_ || impl_->done; }

void Work::wait() {
  if (!impl_ || impl_->done) return;
  Impl& w = *impl_;
  Group::State& s = *w.group;
  const PhaseScope phase(Phase::kCollective, "wait", w.op, s.options.name);
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - w.issued).count();
  };
  if (w.work) {
    s.check_healthy(w.op);
    // The deadline counts from the issue, as the backend's own timeout does.
    auto left = s.timeout() - std::chrono::duration_cast<std::chrono::milliseconds>(
                                  std::chrono::steady_clock::now() - w.issued);
    if (left.count() < 1) left = std::chrono::milliseconds(1);
    bool ok = false;
    // Before fail() dumps the recorder: a wait that ran into the deadline is a timeout.
    auto note_failure = [&] {
      if (!s.options.recorder) return;
      const bool timed_out = std::chrono::steady_clock::now() - w.issued >=
                             s.timeout() - std::chrono::milliseconds(50);
      s.options.recorder->finish(w.fr_id, timed_out ? OpState::kTimedOut : OpState::kFailed);
    };
    try {
      // NCCL: wait() with a timeout would block this thread until the op is done; without one it
      // makes the current CUDA stream wait (the host runs on) and the watchdog enforces the
      // group's timeout, aborting the process on a hung or failed peer.
      ok = s.options.backend == Backend::kNccl ? w.work->wait() : w.work->wait(left);
    } catch (const c10::Error& e) {
      note_failure();
      s.fail(w.op, e.what_without_backtrace(), elapsed());
    } catch (const std::exception& e) {
      note_failure();
      s.fail(w.op, e.what(), elapsed());
    }
    if (!ok) {
      note_failure();
      s.fail(w.op, "the backend reported failure", elapsed());
    }
  }
  if (s.options.recorder) s.options.recorder->finish(w.fr_id, OpState::kCompleted);
  if (w.finish) w.finish();
  w.done = true;
  w.finish = nullptr;
  w.work.reset();
}

}  // namespace titan::dist
