#include "titan/common/logging.h"

#include <chrono>
#include <cstdio>
#include <ctime>

namespace titan {

void log_message(LogLevel level, const std::string& msg) {
  auto now = std::chrono::system_clock::now();
  std::time_t t = std::chrono::system_clock::to_time_t(now);
  std::tm tm{};
  localtime_r(&t, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof(stamp), "%Y-%m-%d %H:%M:%S", &tm);
  const char* tag = level == LogLevel::kInfo ? "INFO" : level == LogLevel::kWarning ? "WARNING" : "ERROR";
  std::FILE* out = level == LogLevel::kError ? stderr : stdout;
  std::fprintf(out, "[titan] %s - %s - %s\n", stamp, tag, msg.c_str());
  std::fflush(out);
}

}  // namespace titan
