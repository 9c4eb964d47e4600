// The flight recorder's ring buffer, its JSON dump, the SIGUSR1 dump thread and the analyzer of
// several ranks' dumps. See flight_recorder.h.
#include "titan/distributed/flight_recorder.h"

#include "titan/common/file_io.h"

#include <nlohmann/json.hpp>

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>
#include <thread>

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
  throw std::runtime_error(what + ": unknown state '" + s + "'");
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

FlightDump parse_flight_dump(const std::string& json, const std::string& what) {
  FlightDump d;
  try {
    const nlohmann::json doc = nlohmann::json::parse(json);
    if (!doc.is_object() || !doc.contains("entries") || !doc.contains("rank")) {
      throw std::runtime_error("not a flight-recorder dump (no 'rank' or 'entries')");
    }
    d.rank = doc.at("rank").get<int>();
    d.world_size = doc.value("world_size", 0);
    for (const auto& j : doc.at("entries")) {
      FlightEntry e;
      e.id = j.at("id").get<int64_t>();
      e.group = j.at("group").get<std::string>();
      e.group_size = j.at("group_size").get<int>();
      e.group_rank = j.at("group_rank").get<int>();
      e.group_ranks = j.at("group_ranks").get<std::vector<int>>();
      e.seq = j.at("seq").get<int64_t>();
      e.op = j.at("op").get<std::string>();
      e.peer = j.at("peer").get<int>();
      e.dtype = j.at("dtype").get<std::string>();
      e.numel = j.at("numel").get<int64_t>();
      e.shape = j.at("shape").get<std::vector<int64_t>>();
      e.issued_s = j.at("issued_s").get<double>();
      e.completed_s = j.at("completed_s").get<double>();
      e.state = parse_state(j.at("state").get<std::string>(), what);
      d.entries.push_back(std::move(e));
    }
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(what + ": not a readable flight-recorder dump: " + e.what());
  } catch (const std::runtime_error& e) {
    const std::string msg = e.what();
    if (msg.rfind(what, 0) == 0) throw;
    throw std::runtime_error(what + ": " + msg);
  }
  return d;
}

// ---- SIGUSR1 ----

namespace {

std::mutex g_installed_mutex;
std::shared_ptr<FlightRecorder> g_installed;
int g_wake_pipe[2] = {-1, -1};

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
  std::lock_guard<std::mutex> lock(g_installed_mutex);
  g_installed = std::move(recorder);
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
  std::shared_ptr<FlightRecorder> fr;
  {
    std::lock_guard<std::mutex> lock(g_installed_mutex);
    fr = g_installed;
  }
  if (fr) fr->dump();
}

}  // namespace titan::dist
