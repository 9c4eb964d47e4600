// Small helpers shared by everything that prints numbers or lists, or reads dtype names.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>

namespace titan {

// 8030261248 -> "8,030,261,248".
std::string with_commas(int64_t value);

// 8030261248 -> "8.03B", 6163712 -> "6.16M", 2048 -> "2.0K".
std::string human_count(int64_t value);

// 1536 -> "1.5 KiB", 3.2e9 -> "2.98 GiB".
std::string human_bytes(uint64_t bytes);

// "0.019 GiB", "9.31e+06 GiB": memory estimates, whatever their size.
std::string gib_text(double bytes);

// "bfloat16" -> kBFloat16, "float32" -> kFloat (the values training.mixed_precision_param takes;
// the config layer has already rejected anything else).
c10::ScalarType dtype_from_name(const std::string& name);
// The inverse for those three ("bfloat16", "float32", "float16"); c10's name for the others.
std::string dtype_name(c10::ScalarType dtype);

// {"a", "b", "c"} -> "a, b, c"; {1, 3} with sep " " -> "1 3". Items are strings or integers.
template <typename Range>
std::string join(const Range& items, std::string_view sep = ", ") {
  std::string out;
  bool first = true;
  for (const auto& item : items) {
    if (!first) out += sep;
    first = false;
    if constexpr (std::is_integral_v<std::decay_t<decltype(item)>>) {
      out += std::to_string(item);
    } else {
      out += item;
    }
  }
  return out;
}

}  // namespace titan
