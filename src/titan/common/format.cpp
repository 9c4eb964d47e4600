#include "titan/common/format.h"

#include "titan/common/check.h"

#include <cstdio>

namespace titan {

std::string with_commas(int64_t value) {
  // The magnitude as unsigned: -INT64_MIN does not fit an int64_t.
  const uint64_t magnitude =
      value < 0 ? uint64_t{0} - static_cast<uint64_t>(value) : static_cast<uint64_t>(value);
  const std::string digits = std::to_string(magnitude);
  std::string out = value < 0 ? "-" : "";
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

std::string human_bytes(uint64_t bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), u == 0 ? "%.0f %s" : "%.2f %s", v, kUnits[u]);
  return buf;
}

std::string gib_text(double bytes) {
  char buf[48];
  const double g = bytes / (1024.0 * 1024.0 * 1024.0);
  std::snprintf(buf, sizeof(buf), g < 1e5 ? "%.3f GiB" : "%.3g GiB", g);
  return buf;
}

std::string human_count(int64_t value) {
  char buf[32];
  const double v = static_cast<double>(value);
  if (value >= 1000000000) {
    std::snprintf(buf, sizeof(buf), "%.2fB", v / 1e9);
  } else if (value >= 1000000) {
    std::snprintf(buf, sizeof(buf), "%.2fM", v / 1e6);
  } else {
    std::snprintf(buf, sizeof(buf), "%.1fK", v / 1e3);
  }
  return buf;
}

c10::ScalarType dtype_from_name(const std::string& name) {
  if (name == "bfloat16") return c10::kBFloat16;
  if (name == "float32") return c10::kFloat;
  if (name == "float16") return c10::kHalf;
  throw ConfigError(message("unknown dtype '", name, "' (bfloat16, float32, float16)"));
}

std::string dtype_name(c10::ScalarType dtype) {
  switch (dtype) {
    case c10::kBFloat16: return "bfloat16";
    case c10::kFloat: return "float32";
    case c10::kHalf: return "float16";
    default: return c10::toString(dtype);
  }
}

}  // namespace titan
