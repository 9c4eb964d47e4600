// The flight recorder's ring buffer, its JSON dump, the SIGUSR1 dump thread and the analyzer of
// several ranks' dumps. See flight_recorder.h.
#include "titan/distributed/flight_recorder.h"

#include "titan/common/check.h"
#include "titan/common/file_io.h"

#include <nlohmann/json.hpp>

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <type_traits>

namespace titan::dist {

const char* to_string(OpState state) {
  switch (state) {
    case OpState::kIssued: return "issued";
    case OpState::kCompleted: return "completed";
    case OpState::kFailed: return "failed";
    case OpState::kTimedOut: return "timed out";
  }
  return "?";
}

namespace {

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

OpState parse_state(const std::string& s, const std::string& what) {
  for (OpState st : {OpState::kIssued, OpState::kCompleted, OpState::kFailed, OpState::kTimedOut}) {
    if (s == to_string(st)) return st;
  }
  throw DataError(what + ": unknown state '" + s + "'");
}

std::string join_ints(const std::vector<int>& v) {
  std::ostringstream os;
  for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
  return os.str();
}

}  // namespace

// ---- the ring ----

FlightRecorder::FlightRecorder(int64_t capacity, std::string dump_path, int rank, int world_size)
    : capacity_(std::max<int64_t>(0, capacity)),
      dump_path_(std::move(dump_path)),
      rank_(rank),
      world_size_(world_size),
      slots_(static_cast<size_t>(capacity_)) {}

const std::string* FlightRecorder::intern(const std::string& s) {
  for (const auto& n : names_) {
    if (*n == s) return n.get();
  }
  names_.push_back(std::make_unique<std::string>(s));
  return names_.back().get();
}

const std::vector<int>* FlightRecorder::intern(const std::vector<int>& ranks) {
  for (const auto& r : rank_lists_) {
    if (*r == ranks) return r.get();
  }
  rank_lists_.push_back(std::make_unique<std::vector<int>>(ranks));
  return rank_lists_.back().get();
}

int64_t FlightRecorder::recorded() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return next_id_;
}

int64_t FlightRecorder::record(const Op& op) {
  if (capacity_ == 0) return -1;
  const double now = unix_now();
  std::lock_guard<std::mutex> lock(mutex_);
  const int64_t id = next_id_++;
  Slot& s = slots_[static_cast<size_t>(id % capacity_)];
  s.id = id;
  // Interning compares with the slot's previous names first: a group passes the same ones.
  const std::string* group = s.op.group;
  const std::vector<int>* ranks = s.op.group_ranks;
  s.op = op;
  s.op.group = op.group == nullptr                       ? nullptr
               : group != nullptr && *group == *op.group ? group
                                                         : intern(*op.group);
  s.op.group_ranks = op.group_ranks == nullptr                       ? nullptr
                     : ranks != nullptr && *ranks == *op.group_ranks ? ranks
                                                                     : intern(*op.group_ranks);
  s.op.shape = nullptr;
  if (op.dims <= kInlineDims) {
    std::copy(op.shape, op.shape + op.dims, s.dims.begin());
    s.big_shape.clear();
  } else {
    s.big_shape.assign(op.shape, op.shape + op.dims);
  }
  s.issued_s = now;
  s.completed_s = 0;
  s.state = OpState::kIssued;
  return id;
}

void FlightRecorder::finish(int64_t id, OpState state) {
  if (capacity_ == 0 || id < 0) return;
  const double now = unix_now();
  std::lock_guard<std::mutex> lock(mutex_);
  Slot& s = slots_[static_cast<size_t>(id % capacity_)];
  if (s.id != id) return;
  s.state = state;
  s.completed_s = now;
}

FlightEntry FlightRecorder::entry(const Slot& s) const {
  const Op& op = s.op;
  FlightEntry e;
  e.id = s.id;
  if (op.group != nullptr) e.group = *op.group;
  e.group_size = op.group_size;
  e.group_rank = op.group_rank;
  if (op.group_ranks != nullptr) e.group_ranks = *op.group_ranks;
  e.seq = op.seq;
  e.op = op.op;
  e.peer = op.peer;
  e.dtype = op.dtype;
  e.numel = op.numel;
  if (op.dims <= kInlineDims) {
    e.shape.assign(s.dims.begin(), s.dims.begin() + static_cast<std::ptrdiff_t>(op.dims));
  } else {
    e.shape = s.big_shape;
  }
  e.issued_s = s.issued_s;
  e.completed_s = s.completed_s;
  e.state = s.state;
  return e;
}

std::vector<FlightEntry> FlightRecorder::entries() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<FlightEntry> out;
  const int64_t first = std::max<int64_t>(0, next_id_ - capacity_);
  for (int64_t id = first; id < next_id_; ++id) {
    out.push_back(entry(slots_[static_cast<size_t>(id % capacity_)]));
  }
  return out;
}

// ---- JSON ----

std::string FlightRecorder::to_json() const {
  nlohmann::json doc;
  doc["version"] = 1;
  doc["rank"] = rank_;
  doc["world_size"] = world_size_;
  doc["capacity"] = capacity_;
  int64_t total = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    total = next_id_;
  }
  const std::vector<FlightEntry> held = entries();
  doc["dropped"] = total - static_cast<int64_t>(held.size());
  nlohmann::json list = nlohmann::json::array();
  for (const FlightEntry& e : held) {
    list.push_back({{"id", e.id},
                    {"group", e.group},
                    {"group_size", e.group_size},
                    {"group_rank", e.group_rank},
                    {"group_ranks", e.group_ranks},
                    {"seq", e.seq},
                    {"op", e.op},
                    {"peer", e.peer},
                    {"dtype", e.dtype},
                    {"numel", e.numel},
                    {"shape", e.shape},
                    {"issued_s", e.issued_s},
                    {"completed_s", e.completed_s},
                    {"state", to_string(e.state)}});
  }
  doc["entries"] = std::move(list);
  return doc.dump(1) + "\n";
}

bool FlightRecorder::dump() const {
  if (dump_path_.empty()) return false;
  try {
    const std::filesystem::path path(dump_path_);
    if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path());
    replace_file(dump_path_, to_json());
    std::fprintf(stderr, "flight recorder: wrote %s\n", dump_path_.c_str());
    return true;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "flight recorder: cannot write %s: %s\n", dump_path_.c_str(), e.what());
    return false;
  }
}

namespace {

// The largest world a dump may name: far above any job, small enough that loops over ranks end.
constexpr int64_t kMaxWorldSize = int64_t{1} << 20;

// A field of `j` as T, or a DataError naming `where` and the field when missing or of another type
// or range.
template <typename T>
T field(const nlohmann::json& j, const char* key, const std::string& where) {
  if (!j.contains(key)) throw DataError(where + ": field '" + key + "' is missing");
  const nlohmann::json& v = j.at(key);
  if constexpr (std::is_same_v<T, std::string>) {
    if (!v.is_string()) throw DataError(where + ": field '" + key + "' must be a string");
    return v.get<std::string>();
  } else if constexpr (std::is_same_v<T, double>) {
    if (!v.is_number() || !std::isfinite(v.get<double>())) {
      throw DataError(where + ": field '" + key + "' must be a finite number, got " + v.dump());
    }
    return v.get<double>();
  } else {
    if (!v.is_number_integer()) {
      throw DataError(where + ": field '" + key + "' must be an integer, got " + v.dump());
    }
    // Unsigned values above INT64_MAX, and ints outside T, are out of range.
    if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
      throw DataError(where + ": field '" + key + "' is out of range: " + v.dump());
    }
    const int64_t x = v.get<int64_t>();
    if (x < std::numeric_limits<T>::min() || x > std::numeric_limits<T>::max()) {
      throw DataError(where + ": field '" + key + "' is out of range: " + v.dump());
    }
    return static_cast<T>(x);
  }
}

template <typename T>
std::vector<T> int_list(const nlohmann::json& j, const char* key, const std::string& where) {
  if (!j.contains(key) || !j.at(key).is_array()) {
    throw DataError(where + ": field '" + key + "' must be a list of integers");
  }
  std::vector<T> out;
  for (size_t i = 0; i < j.at(key).size(); ++i) {
    nlohmann::json one = {{"v", j.at(key)[i]}};
    out.push_back(field<T>(one, "v", where + ", " + key + "[" + std::to_string(i) + "]"));
  }
  return out;
}

bool is_p2p(const std::string& op) { return op == "send" || op == "recv"; }

}  // namespace

FlightDump parse_flight_dump(const std::string& json, const std::string& what) {
  FlightDump d;
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(json);
  } catch (const nlohmann::json::exception& e) {
    throw DataError(what + ": not a readable flight-recorder dump: " + e.what());
  }
  if (!doc.is_object() || !doc.contains("entries") || !doc.contains("rank")) {
    throw DataError(what + ": not a flight-recorder dump (no 'rank' or 'entries')");
  }
  const int64_t version = field<int64_t>(doc, "version", what);
  if (version != 1) {
    throw DataError(what + ": flight-recorder dump version " + std::to_string(version) +
                    " is unknown (this titan reads version 1)");
  }
  const int64_t world = field<int64_t>(doc, "world_size", what);
  if (world < 1 || world > kMaxWorldSize) {
    throw DataError(what + ": world_size " + std::to_string(world) + " is not in [1, " +
                    std::to_string(kMaxWorldSize) + "]");
  }
  const int64_t rank = field<int64_t>(doc, "rank", what);
  if (rank < 0 || rank >= world) {
    throw DataError(what + ": rank " + std::to_string(rank) + " is not in [0, world_size " +
                    std::to_string(world) + ")");
  }
  d.world_size = static_cast<int>(world);
  d.rank = static_cast<int>(rank);
  if (!doc.at("entries").is_array()) throw DataError(what + ": 'entries' must be a list");
  // Per group (name and members): the last collective's sequence number, to find gaps.
  std::map<std::string, std::pair<int64_t, size_t>> last_seq;
  int64_t last_id = -1;
  const nlohmann::json& entries = doc.at("entries");
  for (size_t i = 0; i < entries.size(); ++i) {
    const nlohmann::json& j = entries[i];
    std::string where = what + ": entry " + std::to_string(i);
    if (!j.is_object()) throw DataError(where + " is not an object");
    FlightEntry e;
    e.id = field<int64_t>(j, "id", where);
    where += " (id " + std::to_string(e.id) + ")";
    if (e.id <= last_id) {
      throw DataError(where + ": ids must increase from entry to entry (the previous is " +
                      std::to_string(last_id) + ")");
    }
    last_id = e.id;
    e.group = field<std::string>(j, "group", where);
    if (e.group.empty()) throw DataError(where + ": the group name is empty");
    e.group_size = field<int>(j, "group_size", where);
    e.group_rank = field<int>(j, "group_rank", where);
    e.group_ranks = int_list<int>(j, "group_ranks", where);
    if (e.group_size < 1 || e.group_size > world) {
      throw DataError(where + ": group_size " + std::to_string(e.group_size) +
                      " is not in [1, world_size " + std::to_string(world) + "]");
    }
    if (static_cast<int64_t>(e.group_ranks.size()) != e.group_size) {
      throw DataError(where + ": group_ranks lists " + std::to_string(e.group_ranks.size()) +
                      " ranks for group_size " + std::to_string(e.group_size));
    }
    for (size_t k = 0; k < e.group_ranks.size(); ++k) {
      const int r = e.group_ranks[k];
      if (r < 0 || r >= world || (k > 0 && r <= e.group_ranks[k - 1])) {
        throw DataError(where + ": group_ranks [" + join_ints(e.group_ranks) +
                        "] must be increasing world ranks in [0, " + std::to_string(world) + ")");
      }
    }
    if (e.group_rank < 0 || e.group_rank >= e.group_size ||
        e.group_ranks[static_cast<size_t>(e.group_rank)] != d.rank) {
      throw DataError(where + ": group_rank " + std::to_string(e.group_rank) +
                      " is not this dump's rank " + std::to_string(d.rank) + " in group_ranks [" +
                      join_ints(e.group_ranks) + "]");
    }
    e.op = field<std::string>(j, "op", where);
    if (e.op.empty()) throw DataError(where + ": the op name is empty");
    e.seq = field<int64_t>(j, "seq", where);
    e.peer = field<int>(j, "peer", where);
    if (is_p2p(e.op)) {
      if (e.seq != -1) {
        throw DataError(where + ": a " + e.op + " has seq -1, got " + std::to_string(e.seq));
      }
      if (e.peer < 0 || e.peer >= e.group_size) {
        throw DataError(where + ": peer " + std::to_string(e.peer) + " of a " + e.op +
                        " is not in [0, group_size " + std::to_string(e.group_size) + ")");
      }
    } else {
      if (e.seq < 0) {
        throw DataError(where + ": collective " + e.op + " has sequence number " +
                        std::to_string(e.seq) + " (must be >= 0)");
      }
      if (e.peer != -1) throw DataError(where + ": a collective has peer -1");
      // Each group's collectives are held in order, without gaps (the ring drops the oldest).
      const std::string key = e.group + " [" + join_ints(e.group_ranks) + "]";
      auto it = last_seq.find(key);
      if (it != last_seq.end() && e.seq != it->second.first + 1) {
        throw DataError(where + ": group '" + e.group + "' jumps from sequence number " +
                        std::to_string(it->second.first) + " (entry " +
                        std::to_string(it->second.second) + ") to " + std::to_string(e.seq) +
                        "; a dump holds each group's collectives in order without gaps");
      }
      last_seq[key] = {e.seq, i};
    }
    e.dtype = field<std::string>(j, "dtype", where);
    e.numel = field<int64_t>(j, "numel", where);
    if (e.numel < 0) throw DataError(where + ": numel " + std::to_string(e.numel) + " is negative");
    e.shape = int_list<int64_t>(j, "shape", where);
    for (int64_t dim : e.shape) {
      if (dim < 0) throw DataError(where + ": shape has a negative dimension");
    }
    e.issued_s = field<double>(j, "issued_s", where);
    e.completed_s = field<double>(j, "completed_s", where);
    if (e.issued_s < 0 || e.completed_s < 0) {
      throw DataError(where + ": issued_s and completed_s must be >= 0");
    }
    e.state = parse_state(field<std::string>(j, "state", where), where);
    d.entries.push_back(std::move(e));
  }
  return d;
}

// ---- SIGUSR1 ----

namespace {

// The installed recorder outlives static destruction on purpose: the dump thread is detached, and
// the launcher's SIGUSR1 may reach a rank that is already inside exit() (for example one that
// failed its config check at the same moment as a peer). A destroyed shared_ptr there would hand
// the thread a freed recorder, whose path would be freed bytes: it once made directories with
// such names in the current directory.
struct Installed {
  std::mutex mutex;
  std::shared_ptr<FlightRecorder> recorder;
};
Installed& installed() {
  static auto* state = new Installed;  // never destroyed (see above)
  return *state;
}
int g_wake_pipe[2] = {-1, -1};  // plain ints: the signal handler reads them

void on_sigusr1(int) {
  const int saved = errno;
  const char byte = 1;
  if (g_wake_pipe[1] >= 0) (void)!::write(g_wake_pipe[1], &byte, 1);
  errno = saved;
}

void dump_thread() {
  char byte = 0;
  for (;;) {
    const ssize_t n = ::read(g_wake_pipe[0], &byte, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    dump_installed_flight_recorder();
  }
}

}  // namespace

void install_dump_on_sigusr1(std::shared_ptr<FlightRecorder> recorder) {
  Installed& state = installed();
  std::lock_guard<std::mutex> lock(state.mutex);
  state.recorder = std::move(recorder);
  if (g_wake_pipe[0] >= 0) return;
  if (::pipe(g_wake_pipe) != 0) {
    std::fprintf(stderr, "flight recorder: no SIGUSR1 dump (pipe: %s)\n", std::strerror(errno));
    return;
  }
  std::thread(dump_thread).detach();
  struct sigaction sa {};
  sa.sa_handler = on_sigusr1;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGUSR1, &sa, nullptr);
}

void dump_installed_flight_recorder() {
  Installed& state = installed();
  std::shared_ptr<FlightRecorder> fr;
  {
    std::lock_guard<std::mutex> lock(state.mutex);
    fr = state.recorder;
  }
  if (fr) fr->dump();
}

}  // namespace titan::dist
