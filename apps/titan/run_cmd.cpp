// `titan run`: the launcher (see src/titan/distributed/launcher.h). Titan subcommands run in the
// children through /proc/self/exe, so the ranks are exactly this binary.
#include "commands.h"

#include "titan/distributed/launcher.h"

#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstdlib>

namespace titan {

int run_launch(const std::vector<std::string>& args) {
  const LaunchOptions opts = parse_launch_args(args);
  if (opts.help) {
    std::fputs(launch_usage().c_str(), stdout);
    return 0;
  }
  char self[PATH_MAX] = {0};
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  const std::string self_exe = n > 0 ? std::string(self, static_cast<size_t>(n)) : "/proc/self/exe";
  const char* log_rank = std::getenv("LOG_RANK");
  return launch(opts, self_exe, log_rank != nullptr ? log_rank : "0");
}

}  // namespace titan
