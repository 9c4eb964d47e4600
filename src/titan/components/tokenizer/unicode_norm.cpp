// Lowercase, NFC and grapheme clusters over the generated tables (see unicode_norm.h).
#include "titan/components/tokenizer/unicode_norm.h"

#include <algorithm>
#include <vector>

namespace titan {
namespace {

using namespace unicode_norm_tables;

// Hangul syllables decompose and compose by arithmetic (Unicode's chapter 3.12).
constexpr uint32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr uint32_t kLCount = 19, kVCount = 21, kTCount = 28;
constexpr uint32_t kNCount = kVCount * kTCount, kSCount = kLCount * kNCount;

uint8_t range_value(const CodePointValueRange* ranges, size_t n, uint32_t cp) {
  const CodePointValueRange* end = ranges + n;
  const CodePointValueRange* it = std::upper_bound(
      ranges, end, cp, [](uint32_t v, const CodePointValueRange& r) { return v < r.first; });
  return (it != ranges && cp <= (it - 1)->last) ? (it - 1)->value : 0;
}

uint8_t combining_class(uint32_t cp) {
  if (cp < 0x300 || cp == kInvalidCodePoint) return 0;
  return range_value(kCombiningClasses, kCombiningClasses_size, cp);
}

// Appends the full canonical decomposition of `cp` to *out.
void decompose(uint32_t cp, std::vector<uint32_t>* out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    const uint32_t s = cp - kSBase;
    out->push_back(kLBase + s / kNCount);
    out->push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount != 0) out->push_back(kTBase + s % kTCount);
    return;
  }
  if (cp >= 0xC0 && cp != kInvalidCodePoint) {
    const Decomposition* end = kDecompositions + kDecompositions_size;
    const Decomposition* it = std::lower_bound(
        kDecompositions, end, cp, [](const Decomposition& d, uint32_t v) { return d.cp < v; });
    if (it != end && it->cp == cp) {
      out->insert(out->end(), kDecompositionChars + it->offset,
                  kDecompositionChars + it->offset + it->length);
      return;
    }
  }
  out->push_back(cp);
}

// The primary composite of (first, second), or 0.
uint32_t compose(uint32_t first, uint32_t second) {
  if (first >= kLBase && first < kLBase + kLCount && second >= kVBase &&
      second < kVBase + kVCount) {
    return kSBase + ((first - kLBase) * kVCount + (second - kVBase)) * kTCount;
  }
  if (first >= kSBase && first < kSBase + kSCount && (first - kSBase) % kTCount == 0 &&
      second > kTBase && second < kTBase + kTCount) {
    return first + (second - kTBase);
  }
  const Composition* end = kCompositions + kCompositions_size;
  const Composition* it =
      std::lower_bound(kCompositions, end, std::make_pair(first, second),
                       [](const Composition& c, const std::pair<uint32_t, uint32_t>& v) {
                         return std::make_pair(c.first, c.second) < v;
                       });
  return (it != end && it->first == first && it->second == second) ? it->composite : 0;
}

// Units of `text`: a code point, or kInvalidCodePoint with the byte kept aside.
struct Units {
  std::vector<uint32_t> cps;
  std::vector<char> invalid_bytes;  // the byte of each kInvalidCodePoint, in order
};

void append_unit(uint32_t cp, const Units& units, size_t* invalid_index, std::string* out) {
  if (cp == kInvalidCodePoint) {
    out->push_back(units.invalid_bytes[(*invalid_index)++]);
  } else {
    append_utf8(cp, out);
  }
}

enum GraphemeClass : uint8_t {
  kGcbOther = 0,
  kGcbCR,
  kGcbLF,
  kGcbControl,
  kGcbExtend,
  kGcbZwj,
  kGcbRegionalIndicator,
  kGcbPrepend,
  kGcbSpacingMark,
  kGcbL,
  kGcbV,
  kGcbT,
  kGcbLV,
  kGcbLVT
};
constexpr uint8_t kExtPictBit = 16;
enum : uint8_t { kIncbNone = 0, kIncbLinker = 1, kIncbConsonant = 2, kIncbExtend = 3 };

uint8_t grapheme_bits(uint32_t cp) {
  if (cp == kInvalidCodePoint) return kGcbOther;
  if (cp >= 0x20 && cp < 0x7F) return kGcbOther;
  return range_value(kGraphemeClasses, kGraphemeClasses_size, cp);
}

}  // namespace

void append_utf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

void append_lowercase(std::string_view text, std::string* out) {
  out->reserve(out->size() + text.size());
  size_t pos = 0;
  while (pos < text.size()) {
    const unsigned char b = static_cast<unsigned char>(text[pos]);
    if (b < 0x80) {
      out->push_back(static_cast<char>(b >= 'A' && b <= 'Z' ? b + 32 : b));
      ++pos;
      continue;
    }
    size_t len;
    const uint32_t cp = decode_utf8(text, pos, &len);
    const LowercaseMapping* end = kLowercase + kLowercase_size;
    const LowercaseMapping* it =
        cp == kInvalidCodePoint
            ? end
            : std::lower_bound(kLowercase, end, cp,
                               [](const LowercaseMapping& m, uint32_t v) { return m.cp < v; });
    if (it != end && it->cp == cp) {
      append_utf8(it->lower[0], out);
      if (it->lower[1] != 0) append_utf8(it->lower[1], out);
    } else {
      out->append(text.substr(pos, len));
    }
    pos += len;
  }
}

void append_nfc(std::string_view text, std::string* out) {
  // An ASCII prefix is its own NFC, but for its last character, which may compose with what
  // follows.
  size_t pos = 0;
  while (pos < text.size() && static_cast<unsigned char>(text[pos]) < 0x80) ++pos;
  if (pos == text.size()) {
    out->append(text);
    return;
  }
  if (pos > 0) --pos;
  out->append(text.substr(0, pos));
  text = text.substr(pos);
  // Decompose, keeping invalid bytes as starters that never compose.
  Units units;
  for (size_t i = 0; i < text.size();) {
    size_t len;
    const uint32_t cp = decode_utf8(text, i, &len);
    if (cp == kInvalidCodePoint) units.invalid_bytes.push_back(text[i]);
    decompose(cp, &units.cps);
    i += len;
  }
  std::vector<uint32_t>& cps = units.cps;
  // Canonical ordering: stable sort of each run of non-starters by combining class.
  for (size_t i = 0; i < cps.size();) {
    if (combining_class(cps[i]) == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < cps.size() && combining_class(cps[j]) != 0) ++j;
    std::stable_sort(cps.begin() + i, cps.begin() + j, [](uint32_t a, uint32_t b) {
      return combining_class(a) < combining_class(b);
    });
    i = j;
  }
  // Canonical composition: each character joins the last starter unless a character of the same
  // or a higher class (or a starter) stands between them.
  if (cps.empty()) return;
  size_t starter = 0;
  int last_class = combining_class(cps[0]) != 0 ? 256 : 0;  // leading marks compose nothing
  size_t kept = 1;
  for (size_t i = 1; i < cps.size(); ++i) {
    const uint32_t cp = cps[i];
    const int cls = combining_class(cp);
    if (cps[starter] != kInvalidCodePoint && cp != kInvalidCodePoint &&
        (last_class < cls || last_class == 0)) {
      if (const uint32_t composite = compose(cps[starter], cp)) {
        cps[starter] = composite;
        continue;
      }
    }
    if (cls == 0) starter = kept;
    last_class = cls;
    cps[kept++] = cp;
  }
  cps.resize(kept);
  size_t invalid_index = 0;
  for (uint32_t cp : cps) append_unit(cp, units, &invalid_index, out);
}

size_t grapheme_end(std::string_view text, size_t pos) {
  size_t len;
  uint32_t cp = decode_utf8(text, pos, &len);
  uint8_t bits = grapheme_bits(cp);
  uint8_t prev = bits & 15;
  size_t end = pos + len;
  // State for GB11 (pictographic Extend* ZWJ x pictographic), GB12/13 (regional indicator
  // pairs) and GB9c (consonant [extend linker]* linker [extend linker]* x consonant).
  bool pict_seq = (bits & kExtPictBit) != 0;  // an Extended_Pictographic then Extend*
  bool pict_zwj = false;                      // ... then a ZWJ just before
  int regional = prev == kGcbRegionalIndicator ? 1 : 0;
  uint8_t incb = (bits >> 5) & 3;
  bool conjunct = incb == kIncbConsonant;  // consonant then [extend linker]*
  bool conjunct_linked = false;            // ... with a linker among them
  while (end < text.size()) {
    cp = decode_utf8(text, end, &len);
    bits = grapheme_bits(cp);
    const uint8_t cls = bits & 15;
    const uint8_t cur_incb = (bits >> 5) & 3;
    bool join;
    if (prev == kGcbCR && cls == kGcbLF) {
      join = true;  // GB3
    } else if (prev == kGcbCR || prev == kGcbLF || prev == kGcbControl || cls == kGcbCR ||
               cls == kGcbLF || cls == kGcbControl) {
      join = false;  // GB4, GB5
    } else if (prev == kGcbL && (cls == kGcbL || cls == kGcbV || cls == kGcbLV || cls == kGcbLVT)) {
      join = true;  // GB6
    } else if ((prev == kGcbLV || prev == kGcbV) && (cls == kGcbV || cls == kGcbT)) {
      join = true;  // GB7
    } else if ((prev == kGcbLVT || prev == kGcbT) && cls == kGcbT) {
      join = true;  // GB8
    } else if (cls == kGcbExtend || cls == kGcbZwj || cls == kGcbSpacingMark ||
               prev == kGcbPrepend) {
      join = true;  // GB9, GB9a, GB9b
    } else if (conjunct && conjunct_linked && cur_incb == kIncbConsonant) {
      join = true;  // GB9c
    } else if (pict_zwj && (bits & kExtPictBit)) {
      join = true;  // GB11
    } else if (prev == kGcbRegionalIndicator && cls == kGcbRegionalIndicator) {
      join = regional % 2 == 1;  // GB12, GB13
    } else {
      join = false;  // GB999
    }
    if (!join) break;
    // Update the sequence states with the joined character.
    pict_zwj = pict_seq && cls == kGcbZwj;
    if (bits & kExtPictBit) {
      pict_seq = true;
    } else if (cls != kGcbExtend) {
      pict_seq = false;
    }
    regional = cls == kGcbRegionalIndicator ? regional + 1 : 0;
    if (cur_incb == kIncbConsonant) {
      conjunct = true;
      conjunct_linked = false;
    } else if (conjunct && (cur_incb == kIncbExtend || cur_incb == kIncbLinker)) {
      conjunct_linked = conjunct_linked || cur_incb == kIncbLinker;
    } else {
      conjunct = false;
      conjunct_linked = false;
    }
    prev = cls;
    end += len;
  }
  return end;
}

}  // namespace titan
