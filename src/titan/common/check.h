// Error reporting. TITAN_CHECK wraps TORCH_CHECK: the message says what failed, the values
// involved, and what to do about it. Errors a user causes at the boundaries (config, files,
// command line) are exceptions of the types below so the app can map them to exit codes.
#pragma once

#include <c10/util/Exception.h>

#include <stdexcept>
#include <string>

namespace titan {

// Bad configuration or command line: the app exits with code 2.
struct ConfigError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Unreadable, missing or corrupt input files (data, checkpoints): exit code 1 with the message.
struct DataError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Training diverged (NaN/Inf loss): exit code 1.
struct TrainingError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A user error's message from its parts, streamed in order as TITAN_CHECK builds its own:
//   throw ConfigError(message("n_heads ", n, " is not divisible by tensor_parallel_degree ", t));
template <typename... Args>
std::string message(const Args&... parts) {
  return c10::str(parts...);
}

}  // namespace titan

// TITAN_CHECK(cond, "what failed: ", value, ". HINT: what to do")
#define TITAN_CHECK(cond, ...) TORCH_CHECK(cond, __VA_ARGS__)

// TITAN_CONFIG_CHECK(cond, "key ", value, " must ...", ". HINT: ...") throws ConfigError (exit
// code 2, no stack trace) with the parts streamed in order when cond is false.
#define TITAN_CONFIG_CHECK(cond, ...)                                 \
  do {                                                                \
    if (!(cond)) throw ::titan::ConfigError(::c10::str(__VA_ARGS__)); \
  } while (0)
