// Tokens of a chat template and the lexer that makes them (chat_template_lexer.cpp). Internal to
// the chat template engine; see chat_template.h.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace titan::jinja {

struct JinjaToken {
  enum class Kind {
    kText,
    kVarBegin,
    kVarEnd,
    kBlockBegin,
    kBlockEnd,
    kName,
    kString,
    kInt,
    kFloat,
    kOp,
    kEnd
  };
  Kind kind;
  std::string text;
  int line;
  int64_t integer = 0;
  double number = 0;
};

// Throws ConfigError("chat template 'NAME' line N: what").
[[noreturn]] void jinja_syntax_error(const std::string& name, int line, const std::string& what);

// Splits a template into text and tag tokens with transformers' whitespace rules (trim_blocks,
// lstrip_blocks, one trailing newline dropped); the last token is kEnd.
std::vector<JinjaToken> lex_template(const std::string& source, const std::string& name);

}  // namespace titan::jinja
