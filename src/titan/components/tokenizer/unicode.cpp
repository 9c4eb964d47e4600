// UTF-8 decoding and class lookup for the pre-tokenizers: ASCII through a small table, the rest by
// binary search over the generated range tables.
#include "titan/components/tokenizer/unicode.h"

#include <algorithm>
#include <array>

namespace titan {
namespace {

bool in_ranges(const CodePointRange* ranges, size_t n, uint32_t cp) {
  const CodePointRange* end = ranges + n;
  const CodePointRange* it = std::upper_bound(
      ranges, end, cp, [](uint32_t v, const CodePointRange& r) { return v < r.first; });
  return it != ranges && cp <= (it - 1)->last;
}

uint8_t class_by_search(uint32_t cp) {
  using namespace unicode_tables;
  uint8_t bits = 0;
  if (in_ranges(kLetterRanges, kLetterRanges_size, cp)) bits |= kLetter;
  if (in_ranges(kNumberRanges, kNumberRanges_size, cp)) bits |= kNumber;
  if (in_ranges(kSpaceRanges, kSpaceRanges_size, cp)) bits |= kSpace;
  return bits;
}

// Classes of U+0000..U+00FF, the hot path for mostly-Latin text.
const std::array<uint8_t, 256>& latin1_classes() {
  static const std::array<uint8_t, 256> table = [] {
    std::array<uint8_t, 256> t{};
    for (uint32_t cp = 0; cp < 256; ++cp) t[cp] = class_by_search(cp);
    return t;
  }();
  return table;
}

}  // namespace

uint32_t decode_utf8(std::string_view text, size_t pos, size_t* len) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
  const unsigned char b0 = byte(pos);
  *len = 1;
  if (b0 < 0x80) return b0;
  size_t n;
  uint32_t cp;
  uint32_t min_cp;
  if ((b0 & 0xE0) == 0xC0) {
    n = 2, cp = b0 & 0x1F, min_cp = 0x80;
  } else if ((b0 & 0xF0) == 0xE0) {
    n = 3, cp = b0 & 0x0F, min_cp = 0x800;
  } else if ((b0 & 0xF8) == 0xF0) {
    n = 4, cp = b0 & 0x07, min_cp = 0x10000;
  } else {
    return kInvalidCodePoint;
  }
  if (pos + n > text.size()) return kInvalidCodePoint;
  for (size_t i = 1; i < n; ++i) {
    const unsigned char b = byte(pos + i);
    if ((b & 0xC0) != 0x80) return kInvalidCodePoint;
    cp = (cp << 6) | (b & 0x3F);
  }
  if (cp < min_cp || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return kInvalidCodePoint;
  *len = n;
  return cp;
}

size_t find_invalid_utf8(std::string_view text) {
  size_t pos = 0;
  while (pos < text.size()) {
    if (static_cast<unsigned char>(text[pos]) < 0x80) {  // ASCII, the common case
      ++pos;
      continue;
    }
    size_t len;
    if (decode_utf8(text, pos, &len) == kInvalidCodePoint) return pos;
    pos += len;
  }
  return std::string_view::npos;
}

uint8_t char_class(uint32_t cp) {
  if (cp < 256) return latin1_classes()[cp];
  if (cp == kInvalidCodePoint) return 0;
  return class_by_search(cp);
}

}  // namespace titan
