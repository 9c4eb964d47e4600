#include "titan/common/logging.h"

#include <chrono>
#include <cstdio>
#include <ctime>

namespace titan {
namespace {
std::string g_rank_prefix;  // set once at start-up, before other threads exist
bool g_print_info = true;
}  // namespace

void set_log_rank_filter(const std::string& prefix, bool print_info) {
  g_rank_prefix = prefix;
  g_print_info = print_info;
}

void log_message(LogLevel level, const std::string& msg) {
  if (level == LogLevel::kInfo && !g_print_info) return;
  auto now = std::chrono::system_clock::now();
  std::time_t t = std::chrono::system_clock::to_time_t(now);
  std::tm tm{};
  localtime_r(&t, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof(stamp), "%Y-%m-%d %H:%M:%S", &tm);
  const char* tag = level == LogLevel::kInfo      ? "INFO"
                    : level == LogLevel::kWarning ? "WARNING"
                                                  : "ERROR";
  std::FILE* out = level == LogLevel::kError ? stderr : stdout;
  std::fprintf(out, "%s[titan] %s - %s - %s\n", g_rank_prefix.c_str(), stamp, tag, msg.c_str());
  std::fflush(out);
}

}  // namespace titan
