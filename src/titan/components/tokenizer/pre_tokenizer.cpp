// The GPT-2 and Llama-3 pre-tokenizer scanners. Each match_* function returns the end of the
// match that the regex would find at `pos`, trying the alternatives in the regex's order.
#include "titan/components/tokenizer/pre_tokenizer.h"

#include "titan/components/tokenizer/unicode.h"

namespace titan {
namespace {

constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr std::string_view kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|)"
    R"( ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

constexpr std::string_view kClipPattern =
    R"(<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|)"
    R"([^\s\p{L}\p{N}]+)";

constexpr uint8_t kAnyClass = kLetter | kNumber | kSpace;

struct Unit {
  uint32_t cp = 0;
  size_t len = 0;  // 0 past the end of the text
  uint8_t cls = 0;
};

class Scanner {
 public:
  explicit Scanner(std::string_view text) : text_(text) {}

  Unit at(size_t pos) const {
    Unit u;
    if (pos >= text_.size()) return u;
    u.cp = decode_utf8(text_, pos, &u.len);
    u.cls = char_class(u.cp);
    return u;
  }

  // End of the run of units starting at `pos` whose class has any of `bits`.
  size_t skip_class(size_t pos, uint8_t bits) const {
    for (Unit u = at(pos); u.len > 0 && (u.cls & bits); u = at(pos)) pos += u.len;
    return pos;
  }

  // End of the run of units in none of the classes (the [^\s\p{L}\p{N}]+ of both regexes).
  size_t skip_other(size_t pos) const {
    for (Unit u = at(pos); u.len > 0 && !(u.cls & kAnyClass); u = at(pos)) pos += u.len;
    return pos;
  }

  // `\s+(?!\S)|\s+` at a whitespace unit: the run, less its last unit when a non-space follows
  // and the run has more than one unit.
  size_t match_space_run(size_t pos) const {
    size_t last = pos;
    size_t end = pos;
    for (Unit u = at(end); u.len > 0 && (u.cls & kSpace); u = at(end)) {
      last = end;
      end += u.len;
    }
    if (end == text_.size() || last == pos) return end;
    return last;
  }

  // Length of the contraction ('s 't 're 've 'm 'll 'd) at `pos`, or 0.
  size_t match_contraction(size_t pos, bool ignore_case) const {
    const auto lower = [&](size_t i) -> uint32_t {
      Unit u = at(i);
      if (u.len != 1) return (ignore_case && u.cp == 0x17F) ? 's' : 0;  // U+017F folds to s
      const uint32_t c = u.cp;
      return (ignore_case && c >= 'A' && c <= 'Z') ? c + 32 : c;
    };
    const uint32_t c1 = lower(pos + 1);
    if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return 1 + at(pos + 1).len;
    const uint32_t c2 = (c1 == 'r' || c1 == 'v' || c1 == 'l') ? lower(pos + 2) : 0;
    if (((c1 == 'r' || c1 == 'v') && c2 == 'e') || (c1 == 'l' && c2 == 'l')) return 3;
    return 0;
  }

  size_t match_gpt2(size_t pos) const {
    const Unit u = at(pos);
    if (u.cp == '\'') {
      if (size_t n = match_contraction(pos, /*ignore_case=*/false)) return pos + n;
    }
    // ' ?\p{L}+', ' ?\p{N}+', ' ?[^\s\p{L}\p{N}]+': the optional space binds to what follows.
    size_t start = pos;
    Unit v = u;
    if (u.cp == ' ') {
      start += 1;
      v = at(start);
    }
    if (v.len > 0) {
      if (v.cls & kLetter) return skip_class(start, kLetter);
      if (v.cls & kNumber) return skip_class(start, kNumber);
      if (!(v.cls & kAnyClass)) return skip_other(start);
    }
    return match_space_run(pos);
  }

  // CLIP's alternatives at a unit that is not white space.
  size_t match_clip(size_t pos) const {
    for (std::string_view special :
         {std::string_view("<|startoftext|>"), std::string_view("<|endoftext|>")}) {
      if (text_.compare(pos, special.size(), special) == 0) return pos + special.size();
    }
    const Unit u = at(pos);
    if (u.cp == '\'') {
      if (size_t n = match_contraction(pos, /*ignore_case=*/false)) return pos + n;
    }
    if (u.cls & kLetter) return skip_class(pos, kLetter);
    if (u.cls & kNumber) return pos + u.len;
    return skip_other(pos);
  }

  size_t match_llama3(size_t pos) const {
    const Unit u = at(pos);
    if (u.cp == '\'') {
      if (size_t n = match_contraction(pos, /*ignore_case=*/true)) return pos + n;
    }
    // [^\r\n\p{L}\p{N}]?\p{L}+
    if (u.cls & kLetter) return skip_class(pos, kLetter);
    if (u.cp != '\r' && u.cp != '\n' && !(u.cls & (kLetter | kNumber))) {
      if (at(pos + u.len).cls & kLetter) return skip_class(pos + u.len, kLetter);
    }
    // \p{N}{1,3}
    if (u.cls & kNumber) {
      size_t end = pos;
      for (int i = 0; i < 3; ++i) {
        const Unit n = at(end);
        if (n.len == 0 || !(n.cls & kNumber)) break;
        end += n.len;
      }
      return end;
    }
    //  ?[^\s\p{L}\p{N}]+[\r\n]*
    size_t start = pos;
    Unit v = u;
    if (u.cp == ' ') {
      start += 1;
      v = at(start);
    }
    if (v.len > 0 && !(v.cls & kAnyClass)) {
      size_t end = skip_other(start);
      while (end < text_.size() && (text_[end] == '\r' || text_[end] == '\n')) ++end;
      return end;
    }
    // \s*[\r\n]+ : the space run up to and including its last line break.
    size_t end = pos;
    size_t after_break = 0;
    for (Unit w = at(end); w.len > 0 && (w.cls & kSpace); w = at(end)) {
      end += w.len;
      if (w.cp == '\r' || w.cp == '\n') after_break = end;
    }
    if (after_break > 0) return after_break;
    return match_space_run(pos);
  }

 private:
  std::string_view text_;
};

}  // namespace

std::string_view pre_tokenizer_pattern(PreTokenizer kind) {
  switch (kind) {
    case PreTokenizer::kGpt2: return kGpt2Pattern;
    case PreTokenizer::kLlama3: return kLlama3Pattern;
    case PreTokenizer::kClip:
    case PreTokenizer::kClipThenGpt2: return kClipPattern;
  }
  return kGpt2Pattern;
}

std::optional<PreTokenizer> pre_tokenizer_from_pattern(std::string_view pattern) {
  if (pattern == kGpt2Pattern) return PreTokenizer::kGpt2;
  if (pattern == kLlama3Pattern) return PreTokenizer::kLlama3;
  if (pattern == kClipPattern) return PreTokenizer::kClip;
  return std::nullopt;
}

void pre_tokenize(PreTokenizer kind, std::string_view text, std::vector<std::string_view>* pieces) {
  const Scanner scanner(text);
  size_t pos = 0;
  if (kind == PreTokenizer::kClip || kind == PreTokenizer::kClipThenGpt2) {
    while (pos < text.size()) {
      const Unit u = scanner.at(pos);
      if (u.cls & kSpace) {
        pos += u.len;
        continue;
      }
      const size_t end = scanner.match_clip(pos);
      if (kind == PreTokenizer::kClipThenGpt2) {
        pre_tokenize(PreTokenizer::kGpt2, text.substr(pos, end - pos), pieces);
      } else {
        pieces->push_back(text.substr(pos, end - pos));
      }
      pos = end;
    }
    return;
  }
  while (pos < text.size()) {
    const size_t end =
        kind == PreTokenizer::kGpt2 ? scanner.match_gpt2(pos) : scanner.match_llama3(pos);
    pieces->push_back(text.substr(pos, end - pos));
    pos = end;
  }
}

}  // namespace titan
