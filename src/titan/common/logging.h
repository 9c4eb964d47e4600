// Minimal logging: timestamped lines on stderr-free stdout, with a rank prefix once
// distributed runs exist. Colors are decided by the metrics config, not here.
#pragma once

#include <sstream>
#include <string>

namespace titan {

enum class LogLevel { kInfo, kWarning, kError };

void log_message(LogLevel level, const std::string& msg);

namespace detail {
template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail

template <typename... Args>
void log_info(const Args&... args) {
  log_message(LogLevel::kInfo, detail::concat(args...));
}
template <typename... Args>
void log_warning(const Args&... args) {
  log_message(LogLevel::kWarning, detail::concat(args...));
}
template <typename... Args>
void log_error(const Args&... args) {
  log_message(LogLevel::kError, detail::concat(args...));
}

}  // namespace titan
