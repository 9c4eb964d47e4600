// Lexer of chat templates. It reproduces Jinja2's whitespace handling as transformers configures
// it, since that decides the bytes between tags: `{%-`/`-%}` strip all whitespace on their side,
// trim_blocks drops the first newline after a block or comment tag, and lstrip_blocks drops the
// spaces and tabs before a block or comment tag that starts its line.
#include "titan/components/tokenizer/chat_template_lexer.h"

#include "titan/common/check.h"
#include "titan/components/tokenizer/chat_template_value.h"

#include <cctype>
#include <cstdlib>
#include <cstring>

namespace titan::jinja {

void jinja_syntax_error(const std::string& name, int line, const std::string& what) {
  throw ConfigError(message("chat template '", name, "' line ", line, ": ", what));
}

namespace {

bool jinja_all_space(const std::string& s, size_t from) {
  if (from >= s.size()) return false;  // Jinja's \s+ needs at least one character
  for (const uint32_t cp : utf8_decode(s.substr(from))) {
    if (!py_is_space(cp)) return false;
  }
  return true;
}

std::string jinja_rstrip(const std::string& s) {
  return py_strip(s, nullptr, /*left=*/false, /*right=*/true);
}

// Python's unicode-escape decoding of a string literal's body, which Jinja applies.
std::string jinja_unescape(const std::string& body, const std::string& name, int line) {
  std::string out;
  for (size_t i = 0; i < body.size(); ++i) {
    if (body[i] != '\\' || i + 1 == body.size()) {
      out += body[i];
      continue;
    }
    const char c = body[++i];
    auto hex = [&](int digits) {
      if (i + digits >= body.size()) {
        jinja_syntax_error(name, line, "truncated escape in a string literal");
      }
      const std::string h = body.substr(i + 1, digits);
      char* end = nullptr;
      const unsigned long cp = std::strtoul(h.c_str(), &end, 16);
      if (h.size() != static_cast<size_t>(digits) || *end != '\0') {
        jinja_syntax_error(name, line, "bad escape in a string literal");
      }
      i += digits;
      utf8_append(&out, static_cast<uint32_t>(cp));
    };
    switch (c) {
      case 'n': out += '\n'; break;
      case 't': out += '\t'; break;
      case 'r': out += '\r'; break;
      case '\\': out += '\\'; break;
      case '\'': out += '\''; break;
      case '"': out += '"'; break;
      case 'a': out += '\a'; break;
      case 'b': out += '\b'; break;
      case 'f': out += '\f'; break;
      case 'v': out += '\v'; break;
      case '\n': break;
      case 'x': hex(2); break;
      case 'u': hex(4); break;
      case 'U': hex(8); break;
      case 'N': jinja_syntax_error(name, line, "\\N{...} escapes are not supported");
      default:
        if (c >= '0' && c <= '7') {
          int value = 0, n = 0;
          --i;
          while (n < 3 && i + 1 < body.size() && body[i + 1] >= '0' && body[i + 1] <= '7') {
            value = value * 8 + (body[++i] - '0');
            ++n;
          }
          utf8_append(&out, static_cast<uint32_t>(value));
        } else {
          out += '\\';  // Python keeps unknown escapes as written
          out += c;
        }
    }
  }
  return out;
}

class JinjaLexer {
 public:
  JinjaLexer(const std::string& source, const std::string& name) : name_(name) {
    // Jinja normalizes newlines and drops one trailing newline (keep_trailing_newline=False).
    for (size_t i = 0; i < source.size(); ++i) {
      if (source[i] == '\r') {
        src_ += '\n';
        if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
      } else {
        src_ += source[i];
      }
    }
    if (!src_.empty() && src_.back() == '\n') src_.pop_back();
  }

  std::vector<JinjaToken> run() {
    bool line_starting = true;
    while (pos_ < src_.size()) {
      size_t open = pos_;
      while (true) {
        open = src_.find('{', open);
        if (open == std::string::npos || open + 1 >= src_.size()) {
          open = std::string::npos;
          break;
        }
        const char c = src_[open + 1];
        if (c == '{' || c == '%' || c == '#') break;
        ++open;
      }
      if (open == std::string::npos) {
        emit_text(src_.substr(pos_));
        pos_ = src_.size();
        break;
      }
      std::string text = src_.substr(pos_, open - pos_);
      const char type = src_[open + 1];
      const char sign = open + 2 < src_.size() ? src_[open + 2] : '\0';
      if (sign == '-') {
        text = jinja_rstrip(text);
      } else if (sign != '+' && type != '{') {
        const size_t l_pos = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
        if ((l_pos > 0 || line_starting) && jinja_all_space(text, l_pos))
          text = text.substr(0, l_pos);
      }
      emit_text(text);
      line_ += count_newlines(pos_, open);
      pos_ = open + 2 + ((sign == '-' || sign == '+') ? 1 : 0);
      if (type == '#') {
        line_starting = lex_comment();
      } else if (type == '%' && raw_begin_end(pos_) != std::string::npos) {
        line_starting = lex_raw();
      } else {
        line_starting = lex_tag(type == '%');
      }
    }
    tokens_.push_back({JinjaToken::Kind::kEnd, "", line_});
    return std::move(tokens_);
  }

 private:
  int count_newlines(size_t from, size_t to) const {
    int n = 0;
    for (size_t i = from; i < to && i < src_.size(); ++i) n += src_[i] == '\n';
    return n;
  }

  // Where `{% raw %}` ends if the block tag whose body starts at `from` is one (after the
  // opening sign); npos otherwise. Sets raw_sign_ to the closing sign.
  size_t raw_begin_end(size_t from) {
    size_t i = from;
    while (i < src_.size() && std::strchr(" \t\n\r\f\v", src_[i]) != nullptr) ++i;
    if (src_.compare(i, 3, "raw") != 0) return std::string::npos;
    i += 3;
    if (i < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[i])) || src_[i] == '_')) {
      return std::string::npos;  // a name like raw_text
    }
    while (i < src_.size() && std::strchr(" \t\n\r\f\v", src_[i]) != nullptr) ++i;
    raw_sign_ = '\0';
    if (src_.compare(i, 3, "-%}") == 0) {
      raw_sign_ = '-';
      return i + 3;
    }
    return src_.compare(i, 2, "%}") == 0 ? i + 2 : std::string::npos;
  }

  // {% raw %}text{% endraw %}: the text is data, tags in it included. Jinja trims after
  // `raw -%}` but applies no trim_blocks there; the text before `{% endraw` gets the same `-`
  // and lstrip_blocks treatment as text before any block tag, and the end tag trim_blocks.
  bool lex_raw() {
    const int line = line_;
    size_t start = raw_begin_end(pos_);
    bool line_starting = false;
    if (raw_sign_ == '-') {
      const size_t before = start;
      while (start < src_.size() && py_is_space(static_cast<unsigned char>(src_[start]))) ++start;
      line_starting = start > before && src_[start - 1] == '\n';
    }
    for (size_t at = src_.find("{%", start); at != std::string::npos;
         at = src_.find("{%", at + 1)) {
      size_t i = at + 2;
      const char sign = i < src_.size() && (src_[i] == '-' || src_[i] == '+') ? src_[i++] : '\0';
      while (i < src_.size() && std::strchr(" \t\n\r\f\v", src_[i]) != nullptr) ++i;
      if (src_.compare(i, 6, "endraw") != 0) continue;
      i += 6;
      while (i < src_.size() && std::strchr(" \t\n\r\f\v", src_[i]) != nullptr) ++i;
      char end_sign = '\0';
      if (i < src_.size() && (src_[i] == '-' || src_[i] == '+')) end_sign = src_[i++];
      if (src_.compare(i, 2, "%}") != 0) continue;
      std::string text = src_.substr(start, at - start);
      if (sign == '-') {
        text = jinja_rstrip(text);
      } else if (sign != '+') {
        const size_t l_pos = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
        if ((l_pos > 0 || line_starting) && jinja_all_space(text, l_pos))
          text = text.substr(0, l_pos);
      }
      line_ = line;
      emit_text(text);
      line_ += count_newlines(pos_, i + 2);
      pos_ = i + 2;
      return finish_tag(end_sign, /*block_like=*/true);
    }
    jinja_syntax_error(name_, line, "missing end of raw directive");
  }

  void emit_text(const std::string& text) {
    if (!text.empty()) tokens_.push_back({JinjaToken::Kind::kText, text, line_});
  }

  // Consumes what follows a closing tag; returns whether that consumption ended with a newline
  // (Jinja's line_starting, which lets lstrip_blocks act on the next line's first tag).
  bool finish_tag(char sign, bool block_like) {
    const size_t start = pos_;
    if (sign == '-') {
      // Jinja's \s* after -%}: every whitespace code point, multi-byte ones (U+00A0...) included.
      while (pos_ < src_.size()) {
        const std::vector<uint32_t> cp = utf8_decode(src_.substr(pos_, 4));
        if (cp.empty() || !py_is_space(cp[0])) break;
        std::string encoded;
        utf8_append(&encoded, cp[0]);
        pos_ += encoded.size();
      }
    } else if (sign != '+' && block_like && pos_ < src_.size() && src_[pos_] == '\n') {
      ++pos_;  // trim_blocks
    }
    line_ += count_newlines(start, pos_);
    return pos_ > start ? src_[pos_ - 1] == '\n' : false;
  }

  bool lex_comment() {
    const size_t end = src_.find("#}", pos_);
    if (end == std::string::npos) jinja_syntax_error(name_, line_, "missing end of comment tag");
    const char sign = end > pos_ ? src_[end - 1] : '\0';
    line_ += count_newlines(pos_, end);
    pos_ = end + 2;
    return finish_tag(sign == '-' || sign == '+' ? sign : '\0', /*block_like=*/true);
  }

  bool lex_tag(bool block) {
    tokens_.push_back(
        {block ? JinjaToken::Kind::kBlockBegin : JinjaToken::Kind::kVarBegin, "", line_});
    const char* close = block ? "%}" : "}}";
    int depth = 0;
    while (true) {
      while (pos_ < src_.size() && std::strchr(" \t\n\r\f\v", src_[pos_]) != nullptr) {
        line_ += src_[pos_] == '\n';
        ++pos_;
      }
      if (pos_ >= src_.size())
        jinja_syntax_error(name_, line_, "unexpected end of template in a tag");
      if (depth == 0) {
        char sign = '\0';
        size_t at = pos_;
        if ((src_[at] == '-' || (block && src_[at] == '+')) &&
            src_.compare(at + 1, 2, close) == 0) {
          sign = src_[at];
          ++at;
        }
        if (src_.compare(at, 2, close) == 0) {
          tokens_.push_back(
              {block ? JinjaToken::Kind::kBlockEnd : JinjaToken::Kind::kVarEnd, "", line_});
          pos_ = at + 2;
          return finish_tag(sign, block);
        }
      }
      lex_expression_token(&depth);
    }
  }

  void lex_expression_token(int* depth) {
    const char c = src_[pos_];
    JinjaToken token{JinjaToken::Kind::kOp, "", line_};
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t end = pos_;
      while (end < src_.size() &&
             (std::isalnum(static_cast<unsigned char>(src_[end])) || src_[end] == '_'))
        ++end;
      token.kind = JinjaToken::Kind::kName;
      token.text = src_.substr(pos_, end - pos_);
      pos_ = end;
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t end = pos_;
      while (end < src_.size() &&
             (std::isdigit(static_cast<unsigned char>(src_[end])) || src_[end] == '_'))
        ++end;
      bool is_float = false;
      if (end + 1 < src_.size() && src_[end] == '.' &&
          std::isdigit(static_cast<unsigned char>(src_[end + 1]))) {
        is_float = true;
        ++end;
        while (end < src_.size() && std::isdigit(static_cast<unsigned char>(src_[end]))) ++end;
      }
      if (end < src_.size() && (src_[end] == 'e' || src_[end] == 'E')) {
        size_t e = end + 1;
        if (e < src_.size() && (src_[e] == '+' || src_[e] == '-')) ++e;
        if (e < src_.size() && std::isdigit(static_cast<unsigned char>(src_[e]))) {
          is_float = true;
          end = e;
          while (end < src_.size() && std::isdigit(static_cast<unsigned char>(src_[end]))) ++end;
        }
      }
      std::string digits;
      for (size_t i = pos_; i < end; ++i) {
        if (src_[i] != '_') digits += src_[i];
      }
      token.kind = is_float ? JinjaToken::Kind::kFloat : JinjaToken::Kind::kInt;
      token.text = digits;
      if (is_float) {
        token.number = std::strtod(digits.c_str(), nullptr);
      } else {
        token.integer = std::strtoll(digits.c_str(), nullptr, 10);
      }
      pos_ = end;
    } else if (c == '\'' || c == '"') {
      size_t end = pos_ + 1;
      while (end < src_.size() && src_[end] != c) {
        if (src_[end] == '\\') ++end;
        ++end;
      }
      if (end >= src_.size()) jinja_syntax_error(name_, line_, "unterminated string literal");
      token.kind = JinjaToken::Kind::kString;
      token.text = jinja_unescape(src_.substr(pos_ + 1, end - pos_ - 1), name_, line_);
      line_ += count_newlines(pos_, end);
      pos_ = end + 1;
    } else {
      static const char* const kOps[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*",
                                         "/",  "%",  "~",  "<",  ">",  "=",  "(", ")", "[",
                                         "]",  "{",  "}",  ",",  ".",  ":",  "|", ";"};
      for (const char* op : kOps) {
        if (src_.compare(pos_, std::strlen(op), op) == 0) {
          token.text = op;
          break;
        }
      }
      if (token.text.empty()) {
        jinja_syntax_error(name_, line_, message("unexpected character '", c, "' in a tag"));
      }
      if (token.text == "(" || token.text == "[" || token.text == "{") ++*depth;
      if (token.text == ")" || token.text == "]" || token.text == "}") --*depth;
      pos_ += token.text.size();
    }
    tokens_.push_back(std::move(token));
  }

  std::string src_;
  const std::string& name_;
  size_t pos_ = 0;
  int line_ = 1;
  char raw_sign_ = '\0';
  std::vector<JinjaToken> tokens_;
};

}  // namespace

std::vector<JinjaToken> lex_template(const std::string& source, const std::string& name) {
  return JinjaLexer(source, name).run();
}

}  // namespace titan::jinja
