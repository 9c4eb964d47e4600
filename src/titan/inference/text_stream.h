// Streaming decoded text while tokens arrive. A byte-level token can end in the middle of a
// UTF-8 character (the byte tokenizer always splits multi-byte characters), and printing half a
// character garbles the terminal, so tokens are held back until their text ends on a character
// boundary.
#pragma once

#include "titan/components/tokenizer/tokenizer.h"

#include <cstdint>
#include <string>
#include <vector>

namespace titan {

// Length of the longest prefix of `text` that does not end inside a UTF-8 character: the whole
// text unless its last bytes are the start of a multi-byte character still missing bytes.
// Malformed bytes count as complete (they will never become valid by waiting).
size_t utf8_complete_prefix(const std::string& text);

class TextStream {
 public:
  explicit TextStream(const Tokenizer& tokenizer) : tokenizer_(tokenizer) {}

  // Adds one token; returns the text that is now ready to print (possibly empty).
  std::string put(int64_t id);
  // The text still held back (an unfinished character at the end of the generation).
  std::string flush();

 private:
  const Tokenizer& tokenizer_;
  std::vector<int64_t> pending_;  // tokens whose text has not been returned yet
};

}  // namespace titan
