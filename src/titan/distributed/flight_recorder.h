// The flight recorder: every rank keeps its last N collectives (and point-to-point ops) in a ring
// buffer, so that when a job hangs or a collective fails, the ranks' buffers side by side show
// which collective they stopped agreeing on and which ranks never got there.
//
//   auto fr = std::make_shared<dist::FlightRecorder>(20000, "out/comm_traces/rank_3.json");
//   options.recorder = fr;                 // every group made with these options records into it
//   ... a collective times out -> Work::wait dumps fr before throwing CommError ...
//   install_dump_on_sigusr1(fr);           // `kill -USR1` (and the launcher) dumps it too
//
// One entry per op, written by the issuing thread at issue and updated by the waiting thread at
// completion: a mutex and a slot copy, nothing allocated for shapes of up to 4 dims, so recording
// costs well under a microsecond against tens of microseconds for the smallest collective
// (docs/observability.md, "Flight recorder"). The dump is JSON, one file per rank (format below),
// written atomically; analyze_flight_records() compares the ranks' files (`titan fr analyze DIR`).
//
// Dump format: {"version": 1, "rank": R, "world_size": W, "capacity": N, "dropped": D,
//   "entries": [{"id", "group", "group_size", "group_rank", "group_ranks": [world ranks],
//   "seq" (-1 for send/recv), "op", "peer" (-1 unless send/recv), "dtype", "numel", "shape",
//   "issued_s", "completed_s" (unix seconds; 0 until completed), "state"}, ...]} oldest first.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace titan::dist {

enum class OpState { kIssued, kCompleted, kFailed, kTimedOut };
const char* to_string(OpState state);

struct FlightEntry {
  int64_t id = 0;  // position in this rank's record, counting every op ever recorded
  std::string group;
  int group_size = 0;
  int group_rank = 0;
  std::vector<int> group_ranks;  // world rank of each member
  int64_t seq = -1;              // the group's collective sequence number; -1 for send/recv
  std::string op;                // all_reduce, all_to_all_single, send, recv, ...
  int peer = -1;                 // group rank of the other side of a send/recv
  std::string dtype;
  int64_t numel = 0;
  std::vector<int64_t> shape;
  double issued_s = 0;     // unix time
  double completed_s = 0;  // 0 until completed (or failed)
  OpState state = OpState::kIssued;
};

// A fixed-capacity ring of FlightEntry; thread-safe. Capacity 0 makes record() return -1 and
// every other call a no-op.
class FlightRecorder {
 public:
  // `dump_path`: where dump() writes; empty: dump() writes nothing (tests read entries()).
  FlightRecorder(int64_t capacity, std::string dump_path, int rank = 0, int world_size = 1);

  // Records an issued op; returns its id for finish(). Fields the caller leaves out stay default.
  // `shape` of up to kInlineDims dims is kept without allocating.
  static constexpr size_t kInlineDims = 4;
  struct Op {
    const std::string* group = nullptr;
    int group_size = 0;
    int group_rank = 0;
    const std::vector<int>* group_ranks = nullptr;
    int64_t seq = -1;
    const char* op = "";
    int peer = -1;
    const char* dtype = "";
    int64_t numel = 0;
    const int64_t* shape = nullptr;
    size_t dims = 0;
  };
  int64_t record(const Op& op);
  // Marks op `id` completed / failed / timed out, now. Ignored when it has left the ring.
  void finish(int64_t id, OpState state);

  // The entries still held, oldest first.
  std::vector<FlightEntry> entries() const;
  int64_t capacity() const { return capacity_; }
  // Ops recorded so far, including those that have left the ring. Every op is at least one
  // network round trip among its ranks, so the count per training step (metrics.jsonl's
  // `comm_ops`) bounds how a step's time grows with a link's latency.
  int64_t recorded() const;
  const std::string& dump_path() const { return dump_path_; }
  // The entries as the JSON document above.
  std::string to_json() const;
  // Writes to_json() to dump_path() atomically (temporary file, then rename), creating its
  // folder. Returns false (and says why on stderr) when it could not; never throws, as it runs
  // on failure paths. A no-op returning false when dump_path() is empty.
  bool dump() const;

 private:
  struct Slot {
    int64_t id = -1;
    Op op;  // group and group_ranks interned (they live as long as the recorder); shape unused
    std::array<int64_t, kInlineDims> dims{};
    std::vector<int64_t> big_shape;  // more than kInlineDims dims
    double issued_s = 0;
    double completed_s = 0;
    OpState state = OpState::kIssued;
  };
  const std::string* intern(const std::string& s);
  const std::vector<int>* intern(const std::vector<int>& ranks);
  FlightEntry entry(const Slot& s) const;

  int64_t capacity_;
  std::string dump_path_;
  int rank_;
  int world_size_;
  mutable std::mutex mutex_;
  std::vector<Slot> slots_;
  int64_t next_id_ = 0;
  std::vector<std::unique_ptr<std::string>> names_;
  std::vector<std::unique_ptr<std::vector<int>>> rank_lists_;
};

// Parses a dump written by FlightRecorder::to_json(), which may be anything a crashed job left
// behind: every field is checked (version 1; world_size in [1, 2^20]; rank in range; per entry:
// ids increasing, a group name, group_size matching group_ranks, increasing world ranks that hold
// this rank at group_rank, collectives with seq >= 0 and no peer, each group's sequence numbers
// consecutive, send/recv with seq -1 and a peer in the group, numel and shape >= 0, times finite
// and >= 0, a known state). Throws DataError naming `what` (the file), the entry and the field.
struct FlightDump {
  int rank = 0;
  int world_size = 0;
  std::vector<FlightEntry> entries;
};
FlightDump parse_flight_dump(const std::string& json, const std::string& what);

// Makes SIGUSR1 dump `recorder` (the latest one installed; null uninstalls). The handler only
// wakes a background thread, which writes the file.
void install_dump_on_sigusr1(std::shared_ptr<FlightRecorder> recorder);
// Dumps the recorder installed above, if any (fatal error paths of a job).
void dump_installed_flight_recorder();

// What `titan fr analyze` finds in a folder of dumps.
struct FlightAnalysis {
  bool problem = false;
  std::string report;  // human-readable, one finding per paragraph
};
// Compares the dumps of every rank (all *.json in `folder`); throws DataError naming the file
// when one cannot be read or parsed, when two hold the same rank or name different world sizes,
// or when there is none.
FlightAnalysis analyze_flight_records(const std::string& folder);
// The same on dumps already parsed (tests).
FlightAnalysis analyze_flight_dumps(const std::vector<FlightDump>& dumps);

}  // namespace titan::dist
