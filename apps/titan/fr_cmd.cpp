// `titan fr analyze DIR`: reads every rank's flight-recorder dump in DIR (written on a collective
// failure, a timeout, SIGUSR1 or a fatal error; see src/titan/distributed/flight_recorder.h) and
// names, per process group, the first collective where the ranks disagree or stop.
#include "commands.h"
#include "flags.h"

#include "titan/common/check.h"
#include "titan/distributed/flight_recorder.h"

#include <cstdio>
#include <exception>

namespace titan {

namespace {

FlagTable analyze_flags() {
  return FlagTable(
             "titan fr analyze DIR",
             "Compares the flight-recorder dumps of every rank in DIR. For each process group it\n"
             "reports the first collective where the ranks issued different ops, dtypes or sizes,\n"
             "or where some ranks did not issue or did not complete it, naming the lagging ranks.\n"
             "Exit codes: 0 every rank agrees, 1 a problem was found, 2 unreadable input.")
      .positional("DIR",
                  "the dumps: <comm.save_traces_folder> (default <job.dump_folder>/comm_traces),\n"
                  "files <comm.save_traces_file_prefix><rank>.json");
}

}  // namespace

int run_fr(const std::vector<std::string>& args) {
  const FlagTable flags = analyze_flags();
  if (FlagTable::wants_help(args)) {
    std::fputs(flags.usage().c_str(), stdout);
    return 0;
  }
  choose_action(args, {flags});
  const std::string dir =
      flags.parse_exact(std::vector<std::string>(args.begin() + 1, args.end()))[0];
  dist::FlightAnalysis analysis;
  try {
    analysis = dist::analyze_flight_records(dir);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "titan fr analyze: %s\n", e.what());
    return 2;
  }
  std::fputs(analysis.report.c_str(), stdout);
  return analysis.problem ? 1 : 0;
}

}  // namespace titan
