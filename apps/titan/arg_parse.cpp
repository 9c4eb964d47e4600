// Strict integer parsing for command-line arguments (see commands.h).
#include "commands.h"

#include <cctype>
#include <sstream>

namespace titan {

std::optional<int64_t> parse_int64(const std::string& text) {
  size_t used = 0;
  int64_t value = 0;
  try {
    value = std::stoll(text, &used);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  if (used == 0 || used != text.size() || std::isspace(static_cast<unsigned char>(text[0]))) {
    return std::nullopt;
  }
  return value;
}

std::optional<std::vector<int64_t>> parse_int_list(const std::string& text, std::string* bad) {
  std::vector<int64_t> values;
  std::istringstream fields(text);
  std::string field;
  while (fields >> field) {
    const std::optional<int64_t> v = parse_int64(field);
    if (!v) {
      if (bad != nullptr) *bad = field;
      return std::nullopt;
    }
    values.push_back(*v);
  }
  return values;
}

}  // namespace titan
