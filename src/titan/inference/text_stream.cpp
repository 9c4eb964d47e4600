// Character-boundary text streaming (see text_stream.h). The held-back tokens are decoded
// together, which relies on byte-level tokenizers decoding a sequence to the concatenation of
// its tokens' bytes (true of the byte and BPE tokenizers).
#include "titan/inference/text_stream.h"

namespace titan {

size_t utf8_complete_prefix(const std::string& text) {
  // Walk back over at most three continuation bytes (10xxxxxx) to the last lead byte.
  const size_t size = text.size();
  for (size_t back = 1; back <= 4 && back <= size; ++back) {
    const auto byte = static_cast<unsigned char>(text[size - back]);
    if ((byte & 0xC0) == 0x80) {
      continue;  // continuation byte
    }
    size_t needed = 1;  // ASCII, or a malformed byte
    if ((byte & 0xE0) == 0xC0) {
      needed = 2;
    } else if ((byte & 0xF0) == 0xE0) {
      needed = 3;
    } else if ((byte & 0xF8) == 0xF0) {
      needed = 4;
    }
    return back < needed ? size - back : size;
  }
  return size;  // only continuation bytes at the end: malformed, print them
}

std::string TextStream::put(int64_t id) {
  pending_.push_back(id);
  const std::string text = tokenizer_.decode(pending_);
  // A character has at most 4 bytes, so holding more than a few tokens means malformed output
  // that waiting will not fix.
  if (utf8_complete_prefix(text) < text.size() && pending_.size() < 8) {
    return {};
  }
  pending_.clear();
  return text;
}

std::string TextStream::flush() {
  const std::string text = pending_.empty() ? std::string() : tokenizer_.decode(pending_);
  pending_.clear();
  return text;
}

}  // namespace titan
