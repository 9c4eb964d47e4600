// Error reporting. TITAN_CHECK wraps TORCH_CHECK: the message says what failed, the values
// involved, and what to do about it. Errors a user causes at the boundaries (config, files,
// command line) are exceptions of the types below so the app can map them to exit codes.
#pragma once

#include <c10/util/Exception.h>

#include <stdexcept>
#include <string>
#include <type_traits>

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

namespace detail {
// int8_t / uint8_t print as numbers, not as characters (char stays a character).
template <typename T>
decltype(auto) printable(const T& part) {
  if constexpr (std::is_same_v<T, signed char> || std::is_same_v<T, unsigned char>) {
    return static_cast<int>(part);
  } else {
    return (part);
  }
}
}  // namespace detail

// A user error's message from its parts, streamed in order as TITAN_CHECK builds its own
// (numbers as `<<` writes them: 1e-05, 0.5):
//   throw ConfigError(message("n_heads ", n, " is not divisible by tensor_parallel_degree ", t));
template <typename... Args>
std::string message(const Args&... parts) {
  return c10::str(detail::printable(parts)...);
}

}  // namespace titan

// TITAN_CHECK(cond, "what failed: ", value, ". HINT: what to do")
#define TITAN_CHECK(cond, ...) TORCH_CHECK(cond, __VA_ARGS__)

// TITAN_CONFIG_CHECK(cond, "key ", value, " must ...", ". HINT: ...") throws ConfigError (exit
// code 2, no stack trace) with the parts streamed in order when cond is false.
#define TITAN_CONFIG_CHECK(cond, ...)                                       \
  do {                                                                      \
    if (!(cond)) throw ::titan::ConfigError(::titan::message(__VA_ARGS__)); \
  } while (0)

namespace titan {
// An exception's message for a user: c10::Error's without the C++ backtrace its what() carries.
inline std::string error_text(const std::exception& e) {
  const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
  return c10_error != nullptr ? c10_error->what_without_backtrace() : e.what();
}
}  // namespace titan
