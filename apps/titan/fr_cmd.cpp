// `titan fr analyze DIR`: reads every rank's flight-recorder dump in DIR (written on a collective
// failure, a timeout, SIGUSR1 or a fatal error; see src/titan/distributed/flight_recorder.h) and
// names, per process group, the first collective where the ranks disagree or stop.
#include "commands.h"

#include "titan/distributed/flight_recorder.h"

#include <cstdio>
#include <exception>

namespace titan {

namespace {

constexpr const char* kUsage =
    "usage: titan fr analyze DIR\n"
    "\n"
    "Compares the flight-recorder dumps of every rank in DIR (by default\n"
    "<job.dump_folder>/comm_traces: comm.save_traces_folder, files\n"
    "<comm.save_traces_file_prefix><rank>.json). For each process group it reports the first\n"
    "collective where the ranks issued different ops, dtypes or sizes, or where some ranks did\n"
    "not issue or did not complete it, naming the lagging ranks.\n"
    "Exit codes: 0 every rank agrees, 1 a problem was found, 2 unreadable input.\n";

}  // namespace

int run_fr(const std::vector<std::string>& args) {
  if (args.empty() || args[0] == "--help" || args[0] == "-h") {
    std::fputs(kUsage, args.empty() ? stderr : stdout);
    return args.empty() ? 2 : 0;
  }
  if (args[0] != "analyze" || args.size() != 2) {
    std::fprintf(stderr, "titan fr: expected `titan fr analyze DIR`\n\n%s", kUsage);
    return 2;
  }
  dist::FlightAnalysis analysis;
  try {
    analysis = dist::analyze_flight_records(args[1]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "titan fr analyze: %s\n", e.what());
    return 2;
  }
  std::fputs(analysis.report.c_str(), stdout);
  return analysis.problem ? 1 : 0;
}

}  // namespace titan
