// The flight recorder: the ring keeps the last N ops, the JSON dump reads back field for field,
// the analyzer names the first collective where hand-made dumps disagree or stop, and over Gloo a
// rank that skips a collective leaves dumps on both ranks that name it and the collective.
#include "multirank.h"

#include "titan/common/check.h"
#include "titan/distributed/flight_recorder.h"
#include "titan/distributed/init.h"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <future>
#include <limits>
#include <unistd.h>

#include <functional>

namespace titan {
namespace test_flight_recorder {

using dist::FlightDump;
using dist::FlightEntry;
using dist::FlightRecorder;
using dist::OpState;

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

struct TempFolder {
  std::filesystem::path path;
  TempFolder() {
    path = std::filesystem::temp_directory_path() /
           ("titan_fr_" + std::to_string(::getpid()) + "_" + std::to_string(counter()++));
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempFolder() { std::filesystem::remove_all(path); }
  static int& counter() {
    static int n = 0;
    return n;
  }
};

const std::string kWorld = "world";
const std::vector<int> kRanks2 = {0, 1};

int64_t record(FlightRecorder& fr, int64_t seq, const char* op, int64_t numel,
               std::vector<int64_t> shape = {}, int group_rank = 0) {
  FlightRecorder::Op r;
  r.group = &kWorld;
  r.group_size = 2;
  r.group_rank = group_rank;
  r.group_ranks = &kRanks2;
  r.seq = seq;
  r.op = op;
  r.dtype = "Float";
  r.numel = numel;
  r.shape = shape.data();
  r.dims = shape.size();
  return fr.record(r);
}

TEST(FlightRecorder, RingKeepsTheLastEntriesInOrder) {
  FlightRecorder fr(3, "");
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < 5; ++i) ids.push_back(record(fr, i, "all_reduce", i + 1));
  fr.finish(ids[0], OpState::kCompleted);  // left the ring: ignored
  fr.finish(ids[3], OpState::kCompleted);
  std::vector<FlightEntry> e = fr.entries();
  ASSERT_EQ(e.size(), 3u);
  EXPECT_EQ(e[0].seq, 2);
  EXPECT_EQ(e[1].seq, 3);
  EXPECT_EQ(e[2].seq, 4);
  EXPECT_EQ(e[0].numel, 3);
  EXPECT_EQ(e[1].state, OpState::kCompleted);
  EXPECT_GT(e[1].completed_s, 0);
  EXPECT_EQ(e[2].state, OpState::kIssued);
  EXPECT_EQ(e[2].completed_s, 0);
  EXPECT_FALSE(fr.dump());  // no path: nothing written

  FlightRecorder off(0, "");
  EXPECT_EQ(record(off, 0, "all_reduce", 1), -1);
  EXPECT_TRUE(off.entries().empty());
}

TEST(FlightRecorder, JsonReadsBackFieldForField) {
  TempFolder dir;
  const std::string path = (dir.path / "sub" / "rank_1.json").string();
  FlightRecorder fr(8, path, /*rank=*/1, /*world_size=*/2);
  const int64_t a = record(fr, 0, "all_to_all_single", 12, {3, 4}, 1);
  record(fr, 1, "broadcast", 2 * 3 * 4 * 5 * 6, {2, 3, 4, 5, 6}, 1);  // beyond the inline dims
  fr.finish(a, OpState::kTimedOut);
  ASSERT_TRUE(fr.dump());
  ASSERT_TRUE(std::filesystem::exists(path));
  std::ifstream in(path);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const FlightDump d = dist::parse_flight_dump(text, path);
  EXPECT_EQ(d.rank, 1);
  EXPECT_EQ(d.world_size, 2);
  const std::vector<FlightEntry> want = fr.entries();
  ASSERT_EQ(d.entries.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    const FlightEntry& x = d.entries[i];
    const FlightEntry& y = want[i];
    EXPECT_EQ(x.id, y.id);
    EXPECT_EQ(x.group, y.group);
    EXPECT_EQ(x.group_ranks, y.group_ranks);
    EXPECT_EQ(x.seq, y.seq);
    EXPECT_EQ(x.op, y.op);
    EXPECT_EQ(x.dtype, y.dtype);
    EXPECT_EQ(x.numel, y.numel);
    EXPECT_EQ(x.shape, y.shape);
    EXPECT_DOUBLE_EQ(x.issued_s, y.issued_s);
    EXPECT_DOUBLE_EQ(x.completed_s, y.completed_s);
    EXPECT_EQ(x.state, y.state);
  }
  EXPECT_EQ(d.entries[1].shape, (std::vector<int64_t>{2, 3, 4, 5, 6}));
  EXPECT_EQ(d.entries[0].state, OpState::kTimedOut);

  // A file that is not a dump is named in the error.
  std::ofstream(dir.path / "sub" / "rank_0.json") << "{\"rank\": 0, \"entries\": [{}]}";
  try {
    dist::analyze_flight_records((dir.path / "sub").string());
    ADD_FAILURE() << "no error for a broken dump";
  } catch (const std::runtime_error& e) {
    EXPECT_TRUE(contains(e.what(), "rank_0.json")) << e.what();
  }
  EXPECT_THROW(dist::analyze_flight_records((dir.path / "nowhere").string()), std::runtime_error);
}

// A valid dump of `rank` of 2: an all_reduce (seq 0) and a barrier (seq 1) on "world", and a send
// to the other rank on "pp_down". Tests break one field and expect the file and entry named.
nlohmann::json good_dump(int rank) {
  auto entry = [&](int64_t id, const char* group, int64_t seq, const char* op, int peer) {
    return nlohmann::json{{"id", id},           {"group", group},        {"group_size", 2},
                          {"group_rank", rank}, {"group_ranks", {0, 1}}, {"seq", seq},
                          {"op", op},           {"peer", peer},          {"dtype", "Float"},
                          {"numel", 6},         {"shape", {2, 3}},       {"issued_s", 1.0},
                          {"completed_s", 2.0}, {"state", "completed"}};
  };
  return {{"version", 1},
          {"rank", rank},
          {"world_size", 2},
          {"capacity", 8},
          {"dropped", 0},
          {"entries",
           {entry(0, "world", 0, "all_reduce", -1), entry(1, "world", 1, "barrier", -1),
            entry(2, "pp_down", -1, "send", 1 - rank)}}};
}

// The analyzer's verdict on a folder holding `dumps` (file name -> document), or the DataError.
std::string analyze_folder(const std::vector<std::pair<std::string, nlohmann::json>>& dumps) {
  TempFolder dir;
  for (const auto& [name, doc] : dumps) std::ofstream(dir.path / name) << doc.dump();
  try {
    return "ok: " + dist::analyze_flight_records(dir.path.string()).report;
  } catch (const DataError& e) {
    return e.what();
  }
}

// What a crashed job may leave behind never crashes the analyzer: every field is checked, and
// the error names the file, the entry and the field.
TEST(FlightRecorder, AnalyzerChecksEveryFieldOfWhatACrashLeft) {
  const nlohmann::json good0 = good_dump(0), good1 = good_dump(1);
  EXPECT_TRUE(
      contains(analyze_folder({{"rank_0.json", good0}, {"rank_1.json", good1}}), "ok: 2 dumps"));
  struct Case {
    const char* what;
    std::function<void(nlohmann::json&)> edit;
    const char* expected;
  };
  const int64_t kMax = std::numeric_limits<int64_t>::max();
  const std::vector<Case> cases = {
      {"seq jump", [](auto& d) { d["entries"][1]["seq"] = 1000; },
       "rank_1.json: entry 1 (id 1): group 'world' jumps from sequence number 0 (entry 0) to 1000"},
      {"negative seq", [](auto& d) { d["entries"][0]["seq"] = -7; },
       "rank_1.json: entry 0 (id 0): collective all_reduce has sequence number -7"},
      {"seq past int64", [](auto& d) { d["entries"][0]["seq"] = uint64_t{1} << 63; },
       "rank_1.json: entry 0 (id 0): field 'seq' is out of range: 9223372036854775808"},
      {"empty group_ranks",
       [](auto& d) { d["entries"][0]["group_ranks"] = nlohmann::json::array(); },
       "entry 0 (id 0): group_ranks lists 0 ranks for group_size 2"},
      {"empty group name", [](auto& d) { d["entries"][1]["group"] = ""; },
       "entry 1 (id 1): the group name is empty"},
      {"rank out of range", [](auto& d) { d["rank"] = 5; },
       "rank_1.json: rank 5 is not in [0, world_size 2)"},
      {"world size 0", [](auto& d) { d["world_size"] = 0; },
       "rank_1.json: world_size 0 is not in [1, 1048576]"},
      {"unknown version", [](auto& d) { d["version"] = 7; },
       "rank_1.json: flight-recorder dump version 7 is unknown"},
      {"group size", [](auto& d) { d["entries"][0]["group_size"] = 3; },
       "entry 0 (id 0): group_size 3 is not in [1, world_size 2]"},
      {"group rank", [](auto& d) { d["entries"][0]["group_rank"] = 0; },
       "entry 0 (id 0): group_rank 0 is not this dump's rank 1 in group_ranks [0, 1]"},
      {"unsorted members",
       [](auto& d) {
         d["entries"][0]["group_ranks"] = {1, 1};
       },
       "entry 0 (id 0): group_ranks [1, 1] must be increasing world ranks in [0, 2)"},
      {"peer", [](auto& d) { d["entries"][2]["peer"] = 9; },
       "entry 2 (id 2): peer 9 of a send is not in [0, group_size 2)"},
      {"ids", [](auto& d) { d["entries"][1]["id"] = 0; }, "entry 1 (id 0): ids must increase"},
      {"numel", [](auto& d) { d["entries"][0]["numel"] = -1; }, "entry 0 (id 0): numel -1"},
      {"time", [](auto& d) { d["entries"][0]["issued_s"] = "soon"; },
       "entry 0 (id 0): field 'issued_s' must be a finite number"},
      {"state", [](auto& d) { d["entries"][0]["state"] = "lost"; },
       "entry 0 (id 0): unknown state 'lost'"},
      {"missing field", [](auto& d) { d["entries"][0].erase("op"); },
       "entry 0 (id 0): field 'op' is missing"},
  };
  for (const Case& c : cases) {
    nlohmann::json bad = good1;
    c.edit(bad);
    const std::string got = analyze_folder({{"rank_0.json", good0}, {"rank_1.json", bad}});
    EXPECT_TRUE(contains(got, c.expected)) << c.what << ": " << got;
  }
  // A lone collective at INT64_MAX is well formed: analyzed, no overflow past it.
  nlohmann::json far0 = good0, far1 = good1;
  for (nlohmann::json* d : {&far0, &far1}) {
    (*d)["entries"][0]["seq"] = kMax - 1;
    (*d)["entries"][1]["seq"] = kMax;
  }
  far1["entries"][1]["state"] = "timed out";
  const std::string far = analyze_folder({{"rank_0.json", far0}, {"rank_1.json", far1}});
  EXPECT_TRUE(contains(far,
                       "barrier #9223372036854775807 (Float, numel 6) was issued by every "
                       "rank that left a dump but not completed on ranks [1]"))
      << far;
  // Two files of one rank, and dumps of different worlds.
  EXPECT_TRUE(contains(analyze_folder({{"a.json", good0}, {"b.json", good0}}),
                       "b.json: rank 0 already has a dump, "))
      << analyze_folder({{"a.json", good0}, {"b.json", good0}});
  nlohmann::json other_world = good1;
  other_world["world_size"] = 4;
  EXPECT_TRUE(contains(analyze_folder({{"rank_0.json", good0}, {"rank_1.json", other_world}}),
                       "rank_1.json: world_size 4 differs from"));
}

// (issue 37) comm.save_traces_folder joins the dump folder as TorchTitan's os.path.join does: a
// relative folder lands inside it, an absolute one is used as given (it was nested as
// "<dump>//abs/x").
TEST(FlightRecorder, TracesFolderJoinsTheDumpFolderAsOsPathJoin) {
  CommSection comm;
  comm.trace_buf_size = 8;
  const auto relative = start_flight_recorder(comm, "/runs/a", 3, 4);
  ASSERT_NE(relative, nullptr);
  EXPECT_EQ(relative->dump_path(), "/runs/a/comm_traces/rank_3.json");
  comm.save_traces_folder = "/abs/x";
  EXPECT_EQ(start_flight_recorder(comm, "/runs/a", 3, 4)->dump_path(), "/abs/x/rank_3.json");
  dist::install_dump_on_sigusr1(nullptr);
}

// A dump of `rank` in a world group of `world` ranks with the given (op, numel, state) in order.
FlightDump make_dump(int rank, int world,
                     const std::vector<std::tuple<std::string, int64_t, OpState>>& ops) {
  FlightDump d;
  d.rank = rank;
  d.world_size = world;
  for (size_t i = 0; i < ops.size(); ++i) {
    FlightEntry e;
    e.id = static_cast<int64_t>(i);
    e.group = "world";
    e.group_size = world;
    e.group_rank = rank;
    for (int r = 0; r < world; ++r) e.group_ranks.push_back(r);
    e.seq = static_cast<int64_t>(i);
    e.op = std::get<0>(ops[i]);
    e.dtype = "Float";
    e.numel = std::get<1>(ops[i]);
    e.state = std::get<2>(ops[i]);
    d.entries.push_back(e);
  }
  return d;
}

constexpr OpState kDone = OpState::kCompleted;

TEST(FlightRecorder, AnalyzerFindsAgreementMismatchMissingAndLaggingRanks) {
  const auto agree = dist::analyze_flight_dumps(
      {make_dump(0, 2, {{"all_reduce", 4, kDone}, {"barrier", 0, kDone}}),
       make_dump(1, 2, {{"all_reduce", 4, kDone}, {"barrier", 0, kDone}})});
  EXPECT_FALSE(agree.problem) << agree.report;
  EXPECT_TRUE(contains(agree.report, "every rank issued and completed")) << agree.report;

  const auto mismatch = dist::analyze_flight_dumps(
      {make_dump(0, 2, {{"all_reduce", 4, kDone}, {"all_reduce", 8, OpState::kFailed}}),
       make_dump(1, 2,
                 {{"all_reduce", 4, kDone}, {"all_gather_into_tensor", 8, OpState::kFailed}})});
  EXPECT_TRUE(mismatch.problem);
  EXPECT_TRUE(contains(mismatch.report, "collective #1 differs between ranks")) << mismatch.report;
  EXPECT_TRUE(contains(mismatch.report, "ranks [0]: all_reduce (Float, numel 8)"));
  EXPECT_TRUE(contains(mismatch.report, "ranks [1]: all_gather_into_tensor (Float, numel 8)"));

  const auto numel = dist::analyze_flight_dumps(
      {make_dump(0, 2, {{"all_reduce", 4, kDone}}), make_dump(1, 2, {{"all_reduce", 5, kDone}})});
  EXPECT_TRUE(numel.problem);
  EXPECT_TRUE(contains(numel.report, "collective #0 differs")) << numel.report;

  // Rank 2 left no dump (stopped): the first collective the others did not complete names it.
  const auto missing = dist::analyze_flight_dumps(
      {make_dump(0, 3, {{"all_reduce", 4, kDone}, {"all_reduce", 4, OpState::kTimedOut}}),
       make_dump(1, 3, {{"all_reduce", 4, kDone}, {"all_reduce", 4, OpState::kTimedOut}})});
  EXPECT_TRUE(missing.problem);
  EXPECT_TRUE(contains(missing.report, "no dump from ranks [2]")) << missing.report;
  EXPECT_TRUE(contains(missing.report,
                       "all_reduce #1 (Float, numel 4) was issued by every rank "
                       "that left a dump but not completed on ranks [0, 1]"))
      << missing.report;
  EXPECT_TRUE(contains(missing.report, "ranks [2] left no dump"));
  EXPECT_TRUE(contains(missing.report, "lagging ranks: [2]"));

  // Rank 1 stopped after collective #1; rank 0 timed out in #2.
  const auto lagging = dist::analyze_flight_dumps(
      {make_dump(0, 2,
                 {{"all_reduce", 4, kDone},
                  {"barrier", 0, kDone},
                  {"all_reduce", 4, OpState::kTimedOut}}),
       make_dump(1, 2, {{"all_reduce", 4, kDone}, {"barrier", 0, kDone}})});
  EXPECT_TRUE(lagging.problem);
  EXPECT_TRUE(contains(lagging.report,
                       "all_reduce #2 (Float, numel 4) was issued by ranks [0] but "
                       "not by ranks [1]"))
      << lagging.report;
  EXPECT_TRUE(contains(lagging.report, "rank 1 last issued barrier #1"));
  EXPECT_TRUE(contains(lagging.report, "lagging ranks: [1]"));

  // Everyone issued it; one rank never saw it complete.
  const auto stuck =
      dist::analyze_flight_dumps({make_dump(0, 2, {{"all_reduce", 4, OpState::kTimedOut}}),
                                  make_dump(1, 2, {{"all_reduce", 4, kDone}})});
  EXPECT_TRUE(stuck.problem);
  EXPECT_TRUE(contains(stuck.report, "not completed on ranks [0] (rank 0 timed out)"))
      << stuck.report;
}

// Two ranks over Gloo, one recorder each; rank 1 skips the second all_reduce, so rank 0's wait
// times out, throws CommError and dumps. Rank 1 dumps as SIGUSR1 (sent by `titan run` to the
// surviving ranks) would make it. The analyzer names rank 1 and all_reduce #1.
TEST(FlightRecorder, SkippedCollectiveTimesOutAndBothDumpsNameIt) {
  TempFolder dir;
  auto store = c10::make_intrusive<c10d::HashStore>();
  dist::GroupOptions options = test::loopback_options(std::chrono::milliseconds(1500));
  options.check_agreement = false;  // the skip must reach the backend, not the agreement check
  std::promise<void> rank0_failed;
  std::shared_future<void> failed = rank0_failed.get_future().share();
  std::vector<std::string> errors(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      try {
        dist::GroupOptions o = options;
        o.recorder = std::make_shared<FlightRecorder>(
            16, (dir.path / ("rank_" + std::to_string(r) + ".json")).string(), r, 2);
        auto g = dist::Group::create(store, r, 2, o);
        at::Tensor t = at::ones({2, 3});
        g->all_reduce(t).wait();
        if (r == 0) {
          try {
            g->all_reduce(t).wait();
          } catch (...) {
            rank0_failed.set_value();
            throw;
          }
        } else {
          failed.wait();
          o.recorder->dump();
        }
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_TRUE(contains(errors[0], "all_reduce #1")) << errors[0];
  EXPECT_EQ(errors[1], "");
  ASSERT_TRUE(std::filesystem::exists(dir.path / "rank_0.json"));
  ASSERT_TRUE(std::filesystem::exists(dir.path / "rank_1.json"));
  const dist::FlightAnalysis a = dist::analyze_flight_records(dir.path.string());
  EXPECT_TRUE(a.problem);
  EXPECT_TRUE(contains(a.report,
                       "all_reduce #1 (Float, numel 6) was issued by ranks [0] but not "
                       "by ranks [1]"))
      << a.report;
  EXPECT_TRUE(contains(a.report, "rank 1 last issued all_reduce #0 (Float, numel 6), completed"))
      << a.report;
  EXPECT_TRUE(contains(a.report, "lagging ranks: [1]")) << a.report;
}

}  // namespace test_flight_recorder
}  // namespace titan
