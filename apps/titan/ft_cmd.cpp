// `titan ft lighthouse`: the coordinator of fault-tolerant replica groups
// (titan/distributed/ft/lighthouse.h). It serves until SIGINT or SIGTERM; each replica group is a
// `titan train --fault_tolerance.enable ...` job with TITAN_FT_LIGHTHOUSE=<this host>:<port>.
#include "commands.h"
#include "flags.h"

#include "titan/common/check.h"
#include "titan/common/logging.h"
#include "titan/distributed/ft/lighthouse.h"

#include <pthread.h>
#include <signal.h>

#include <cstdio>

namespace titan {
namespace {

int64_t positive_flag(const std::string& flag, const std::string& value, int64_t min) {
  const std::optional<int64_t> n = parse_int64(value);
  TITAN_CONFIG_CHECK(n && *n >= min, flag, " must be an integer >= ", min, ", got '", value, "'");
  return *n;
}

FlagTable lighthouse_flags(ft::LighthouseOptions& o) {
  return FlagTable(
             "titan ft lighthouse [--port P] [--min_replicas N] [--join_timeout_ms MS]\n"
             "                             [--heartbeat_timeout_ms MS]",
             "Coordinates fault-tolerant replica groups: they register, beat and ask it\n"
             "for a quorum before every step (export TITAN_FT_LIGHTHOUSE=<host>:<port> for\n"
             "the replicas). Serves until SIGINT or SIGTERM.")
      .value("--port", "P", "the port of its store, on every interface (default 29510; 0: any)",
             [&o](const std::string& v) {
               o.port = static_cast<int>(positive_flag("--port", v, 0));
               TITAN_CONFIG_CHECK(o.port <= 65535, "--port must be <= 65535, got ", v);
             })
      .value("--min_replicas", "N", "replica groups needed for a quorum (default 1)",
             [&o](const std::string& v) { o.min_replicas = positive_flag("--min_replicas", v, 1); })
      .value("--join_timeout_ms", "MS",
             "how long a starting or returning replica group is waited for (default 1000)",
             [&o](const std::string& v) {
               o.join_timeout = std::chrono::milliseconds(positive_flag("--join_timeout_ms", v, 0));
             })
      .value("--heartbeat_timeout_ms", "MS",
             "a replica group silent this long leaves the quorum (default 5000)",
             [&o](const std::string& v) {
               o.heartbeat_timeout =
                   std::chrono::milliseconds(positive_flag("--heartbeat_timeout_ms", v, 1));
             });
}

int run_lighthouse(const std::vector<std::string>& args) {
  ft::LighthouseOptions o;
  FlagTable flags = lighthouse_flags(o);
  if (FlagTable::wants_help(args)) {
    std::fputs(flags.usage().c_str(), stdout);
    return 0;
  }
  flags.parse_exact(args);
  // SIGINT/SIGTERM are waited for below; blocked before the store's threads start, so that
  // none of them takes the signal.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  const std::unique_ptr<ft::Lighthouse> lighthouse = ft::Lighthouse::start(o);
  log_info("lighthouse: listening on port ", lighthouse->port(), "; min_replicas ", o.min_replicas,
           ", join_timeout_ms ", o.join_timeout.count(), ", heartbeat_timeout_ms ",
           o.heartbeat_timeout.count());
  std::fflush(stdout);
  int signal = 0;
  sigwait(&stop, &signal);
  log_info("lighthouse: stopping (", signal == SIGINT ? "SIGINT" : "SIGTERM", ") after ",
           lighthouse->quorum_changes(), " quorum changes");
  lighthouse->stop();
  return 0;
}

}  // namespace

int run_ft(const std::vector<std::string>& args) {
  ft::LighthouseOptions o;
  const std::vector<FlagTable> actions = {lighthouse_flags(o)};
  if (args.empty() || args[0] == "--help" || args[0] == "-h") {
    std::fputs(actions_usage(actions).c_str(), args.empty() ? stderr : stdout);
    return args.empty() ? 2 : 0;
  }
  choose_action(args, actions);
  return run_lighthouse(std::vector<std::string>(args.begin() + 1, args.end()));
}

}  // namespace titan
