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
  const int code = launch(opts, self_exe, log_rank != nullptr ? log_rank : "0");
  // Leave without static destructors: libtorch's deregister thousands of kernels, and after
  // fork() each page they write takes a copy-on-write fault (measured 0.3-0.5 s at exit). The
  // supervisor holds nothing that needs them.
  std::fflush(stdout);
  std::fflush(stderr);
  _exit(code);
}

}  // namespace titan
