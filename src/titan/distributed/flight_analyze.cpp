// `titan fr analyze`: lines up every rank's flight-recorder dump group by group, sequence number by
// sequence number, and reports the first collective of each group where the ranks disagree (op,
// dtype, element count) or where some ranks never issued or never completed it.
#include "titan/common/check.h"
#include "titan/common/file_io.h"
#include "titan/distributed/flight_recorder.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>

namespace titan::dist {

namespace {

std::string join_ranks(const std::vector<int>& v) {
  std::ostringstream os;
  for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
  return os.str();
}

std::string describe(const FlightEntry& e) {
  std::ostringstream os;
  os << e.op << " #" << e.seq << " (" << e.dtype << ", numel " << e.numel << ")";
  return os.str();
}

std::string no_dump_note(const std::vector<int>& no_dump) {
  if (no_dump.empty()) return "";
  return "\n  ranks [" + join_ranks(no_dump) +
         "] left no dump (stopped, killed or hung before their recorder was made?): they "
         "never reported this collective";
}

// One group's view from every member: group key "name [world ranks]".
struct GroupView {
  std::string name;
  std::vector<int> members;                                      // world ranks
  std::map<int, std::map<int64_t, const FlightEntry*>> by_rank;  // world rank -> seq -> entry
};

// The first problem in `g`, or "" when its ranks agree on everything they hold.
std::string check_group(const GroupView& g, const std::set<int>& dumped) {
  std::vector<int> no_dump;
  for (int r : g.members) {
    if (!dumped.count(r)) no_dump.push_back(r);
  }
  // Older entries may have left some ranks' rings: start where every rank still holds them.
  // Only the sequence numbers some rank holds are visited (a number no rank holds says nothing).
  int64_t start = 0, end = -1;
  std::set<int64_t> held;
  for (const auto& [rank, seqs] : g.by_rank) {
    if (seqs.empty()) continue;
    start = std::max(start, seqs.begin()->first);
    end = std::max(end, seqs.rbegin()->first);
    for (const auto& entry : seqs) held.insert(entry.first);
  }
  std::ostringstream os;
  const std::string where = "group '" + g.name + "' (world ranks [" + join_ranks(g.members) + "])";
  for (auto seq_it = held.lower_bound(start); seq_it != held.end(); ++seq_it) {
    const int64_t seq = *seq_it;
    std::vector<int> issued, not_issued;
    const FlightEntry* first = nullptr;
    std::map<std::string, std::vector<int>> kinds;  // description -> ranks
    for (int r : g.members) {
      auto it = g.by_rank.find(r);
      const FlightEntry* e = nullptr;
      if (it != g.by_rank.end()) {
        auto s = it->second.find(seq);
        if (s != it->second.end()) e = s->second;
      }
      if (e == nullptr) {
        if (dumped.count(r)) not_issued.push_back(r);
        continue;
      }
      issued.push_back(r);
      if (first == nullptr) first = e;
      kinds[e->op + " (" + e->dtype + ", numel " + std::to_string(e->numel) + ")"].push_back(r);
    }
    if (kinds.size() > 1) {
      os << where << ": collective #" << seq << " differs between ranks:";
      for (const auto& [k, ranks] : kinds) os << "\n  ranks [" << join_ranks(ranks) << "]: " << k;
      os << "\n  HINT: the ranks issued different collectives here; look for rank-dependent "
            "control flow before it.";
      return os.str();
    }
    if (!not_issued.empty()) {
      os << where << ": " << describe(*first) << " was issued by ranks [" << join_ranks(issued)
         << "] but not by ranks [" << join_ranks(not_issued) << "]";
      for (int r : not_issued) {
        auto it = g.by_rank.find(r);
        if (it == g.by_rank.end() || it->second.empty()) {
          os << "\n  rank " << r << " issued nothing on this group";
        } else {
          os << "\n  rank " << r << " last issued " << describe(*it->second.rbegin()->second)
             << ", " << to_string(it->second.rbegin()->second->state);
        }
      }
      os << no_dump_note(no_dump) << "\n  lagging ranks: [" << join_ranks(not_issued) << "]";
      return os.str();
    }
    std::vector<int> unfinished;
    std::string states;
    for (int r : issued) {
      const FlightEntry* e = g.by_rank.at(r).at(seq);
      if (e->state != OpState::kCompleted) {
        unfinished.push_back(r);
        states += std::string(states.empty() ? "" : ", ") + "rank " + std::to_string(r) + " " +
                  to_string(e->state);
      }
    }
    if (!unfinished.empty()) {
      os << where << ": " << describe(*first) << " was issued by every rank that left a dump but "
         << "not completed on ranks [" << join_ranks(unfinished) << "] (" << states << ")";
      os << no_dump_note(no_dump);
      if (!no_dump.empty()) os << "\n  lagging ranks: [" << join_ranks(no_dump) << "]";
      return os.str();
    }
  }
  if (!no_dump.empty()) {
    os << where << ": the ranks that left a dump completed every collective they hold"
       << (end >= 0 ? " (through #" + std::to_string(end) + ")" : "") << no_dump_note(no_dump);
    return os.str();
  }
  return "";
}

}  // namespace

FlightAnalysis analyze_flight_dumps(const std::vector<FlightDump>& dumps) {
  FlightAnalysis out;
  std::set<int> dumped;
  int world = 0;
  std::map<std::string, GroupView> groups;
  for (const FlightDump& d : dumps) {
    dumped.insert(d.rank);
    world = std::max(world, d.world_size);
    for (const FlightEntry& e : d.entries) {
      if (e.seq < 0) continue;  // send/recv: no sequence to line up
      GroupView& g = groups[e.group + " [" + join_ranks(e.group_ranks) + "]"];
      g.name = e.group;
      g.members = e.group_ranks;
      g.by_rank[d.rank][e.seq] = &e;
    }
  }
  std::ostringstream os;
  std::vector<int> missing;
  for (int r = 0; r < world; ++r) {
    if (!dumped.count(r)) missing.push_back(r);
  }
  os << dumps.size() << " dump" << (dumps.size() == 1 ? "" : "s") << " (ranks [";
  os << join_ranks(std::vector<int>(dumped.begin(), dumped.end())) << "]";
  if (!missing.empty()) os << "; no dump from ranks [" << join_ranks(missing) << "]";
  os << "), " << groups.size() << " group" << (groups.size() == 1 ? "" : "s") << "\n";
  if (!missing.empty()) out.problem = true;
  for (const auto& [key, g] : groups) {
    const std::string finding = check_group(g, dumped);
    if (finding.empty()) {
      os << "group '" << g.name << "' (world ranks [" << join_ranks(g.members)
         << "]): every rank issued and completed the same collectives\n";
    } else {
      out.problem = true;
      os << finding << "\n";
    }
  }
  out.report = os.str();
  return out;
}

FlightAnalysis analyze_flight_records(const std::string& folder) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(folder, ec)) {
    throw DataError("'" + folder + "' is not a folder of flight-recorder dumps");
  }
  std::vector<std::string> files;
  for (const auto& entry : fs::directory_iterator(folder)) {
    const std::string name = entry.path().filename().string();
    if (entry.path().extension() == ".json" && name.find(".tmp-") == std::string::npos) {
      files.push_back(entry.path().string());
    }
  }
  std::sort(files.begin(), files.end());
  if (files.empty()) throw DataError("no *.json flight-recorder dump in '" + folder + "'");
  std::vector<FlightDump> dumps;
  std::map<int, std::string> file_of_rank;
  for (const std::string& f : files) {
    dumps.push_back(parse_flight_dump(read_regular_file(f, "flight-recorder dump"), f));
    const FlightDump& d = dumps.back();
    auto [it, fresh] = file_of_rank.emplace(d.rank, f);
    if (!fresh) {
      throw DataError(f + ": rank " + std::to_string(d.rank) + " already has a dump, " +
                      it->second +
                      "; keep one file per rank (dumps of another job or run mixed in?)");
    }
    if (d.world_size != dumps.front().world_size) {
      throw DataError(f + ": world_size " + std::to_string(d.world_size) + " differs from " +
                      files.front() + "'s " + std::to_string(dumps.front().world_size) +
                      " (dumps of another job mixed in?)");
    }
  }
  // Group sizes need no cross-check: a group is keyed by its name and members, and each entry's
  // size matches its members (parse_flight_dump).
  return analyze_flight_dumps(dumps);
}

}  // namespace titan::dist
