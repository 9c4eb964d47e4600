// Minimal logging: timestamped lines on stderr-free stdout, with a rank prefix once
// distributed runs exist. Colors are decided by the metrics config, not here.
#pragma once

#include <sstream>
#include <string>

namespace titan {

enum class LogLevel { kInfo, kWarning, kError };

void log_message(LogLevel level, const std::string& msg);

// For ranks of a multi-process job whose launcher does not prefix their output (torchrun, srun,
// mpirun): every line starts with `prefix` (e.g. "[rank 3] "), and info lines print only when
// `print_info` (the rank is in LOG_RANK). Warnings and errors always print.
void set_log_rank_filter(const std::string& prefix, bool print_info);

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
