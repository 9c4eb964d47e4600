// Just enough Unicode for the BPE pre-tokenizers: UTF-8 decoding that never fails (an invalid byte
// becomes a one-byte unit of its own) and the regex classes \p{L}, \p{N} and \s, looked up in
// tables generated from the regex engines of the pinned tokenizers and tiktoken (their Unicode
// version; \s is White_Space) by tests/e2e/tokenizer_reference.py unicode-tables.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace titan {

struct CodePointRange {
  uint32_t first;
  uint32_t last;  // inclusive
};

namespace unicode_tables {
extern const CodePointRange kLetterRanges[];
extern const size_t kLetterRanges_size;
extern const CodePointRange kNumberRanges[];
extern const size_t kNumberRanges_size;
extern const CodePointRange kSpaceRanges[];
extern const size_t kSpaceRanges_size;
}  // namespace unicode_tables

// Stands for a byte that does not start a valid UTF-8 sequence: in no class (like a symbol).
constexpr uint32_t kInvalidCodePoint = 0xFFFFFFFF;

// Decodes the code point starting at text[pos] and stores its length in bytes (1..4) in *len.
// Overlong forms, surrogates, values above U+10FFFF and truncated sequences yield
// kInvalidCodePoint with *len == 1, so every byte string splits into units.
uint32_t decode_utf8(std::string_view text, size_t pos, size_t* len);

// Byte offset of the first byte of `text` that is not part of a valid UTF-8 sequence (by
// decode_utf8's rules), or std::string_view::npos when all of `text` is valid UTF-8.
size_t find_invalid_utf8(std::string_view text);

// Class bits of a code point.
enum : uint8_t { kLetter = 1, kNumber = 2, kSpace = 4 };
uint8_t char_class(uint32_t cp);

}  // namespace titan
