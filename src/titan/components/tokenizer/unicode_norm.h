// The Unicode text transforms of Hugging Face normalizers that T5's and CLIP's tokenizers use:
// lowercase (each code point as Rust's char::to_lowercase maps it), NFC (canonical
// decomposition, reordering and composition), and extended grapheme clusters (UAX #29, which
// SentencePiece's precompiled normalizer walks). The data are generated from the pinned
// libraries by tests/e2e/tokenizer_reference.py normalizer-tables. Bytes that are not valid UTF-8
// pass through unchanged, each a unit of its own (see decode_utf8 in unicode.h).
#pragma once

#include "titan/components/tokenizer/unicode.h"

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace titan {

struct CodePointValueRange {
  uint32_t first;
  uint32_t last;  // inclusive
  uint8_t value;
};
struct LowercaseMapping {
  uint32_t cp;
  uint32_t lower[2];  // lower[1] == 0 when the mapping is one code point
};
struct Decomposition {
  uint32_t cp;
  uint16_t offset;  // into kDecompositionChars
  uint8_t length;
};
struct Composition {
  uint32_t first;
  uint32_t second;
  uint32_t composite;
};

namespace unicode_norm_tables {
extern const LowercaseMapping kLowercase[];
extern const size_t kLowercase_size;
extern const Decomposition kDecompositions[];  // full canonical decompositions, Hangul aside
extern const size_t kDecompositions_size;
extern const uint32_t kDecompositionChars[];
extern const size_t kDecompositionChars_size;
extern const CodePointValueRange kCombiningClasses[];  // non-zero classes only
extern const size_t kCombiningClasses_size;
extern const Composition kCompositions[];  // sorted by (first, second); exclusions left out
extern const size_t kCompositions_size;
// Bits 0-3: the Grapheme_Cluster_Break class (GraphemeClass); bit 4: Extended_Pictographic;
// bits 5-6: Indic_Conjunct_Break (1 Linker, 2 Consonant, 3 Extend).
extern const CodePointValueRange kGraphemeClasses[];
extern const size_t kGraphemeClasses_size;
}  // namespace unicode_norm_tables

// Appends `text` lowercased to *out.
void append_lowercase(std::string_view text, std::string* out);
// Appends `text` in Normalization Form C to *out.
void append_nfc(std::string_view text, std::string* out);
// The end (byte offset) of the extended grapheme cluster that starts at `pos` < text.size().
size_t grapheme_end(std::string_view text, size_t pos);

// Appends code point `cp` as UTF-8.
void append_utf8(uint32_t cp, std::string* out);

}  // namespace titan
