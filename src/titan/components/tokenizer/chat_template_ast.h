// The syntax tree of a chat template and the parser that builds it (chat_template_parser.cpp).
// Internal to the chat template engine; see chat_template.h.
#pragma once

#include "titan/components/tokenizer/chat_template_value.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace titan::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    kLiteral,  // literal
    kName,     // name
    kList,     // children: items
    kTuple,    // children: items
    kDict,     // children: key, value, key, value, ...
    kGetAttr,  // children[0].name
    kGetItem,  // children[0][children[1]]
    kSlice,    // children[0][children[1]:children[2]:children[3]], each bound may be null
    kCall,     // children[0](children[1:], kwargs)
    kFilter,   // children[0] | name(children[1:], kwargs)
    kTest,     // children[0] is [not] name(children[1:], kwargs)
    kNeg,      // -children[0]
    kPos,      // +children[0]
    kBinary,   // children[0] name children[1] with name one of + - * / // % ** ~
    kCompare,  // children[0] ops[0] children[1] ops[1] children[2] ... (chained as Python does)
    kAnd,
    kOr,
    kNot,
    kCondExpr,  // children[1] if children[0] else children[2] (children[2] may be null)
  };
  Kind kind;
  int line = 0;
  int depth = 1;  // levels of the tree from this node down, which the parser bounds
  Value literal;
  std::string name;
  std::vector<ExprPtr> children;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;
  bool negated = false;
};

struct Node;
using Body = std::vector<std::unique_ptr<Node>>;

struct Node {
  enum class Kind {
    kText,      // text
    kOutput,    // {{ expr }}
    kIf,        // branches: (condition, body) ...; else_body
    kFor,       // for targets in expr [if filter] body [else else_body]
    kSet,       // set targets = expr, or set expr.attr = value (attr non-empty)
    kSetBlock,  // set targets[0] %}body{% endset
    kMacro,     // macro name(params) body
    kBreak,
    kContinue,
    kGeneration,  // transformers' {% generation %}: renders its body
    kWith,        // with params (name = value, ...) body: the values are computed outside its scope
    kFilterBlock,  // filter expr %}body{% endfilter: expr is a kFilter whose input is the body
  };
  Kind kind;
  int line = 0;
  std::string text;
  ExprPtr expr;
  ExprPtr value;  // set: the assigned value; for: the loop filter
  std::string attr;
  std::vector<std::string> targets;
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body body;
  Body else_body;
  std::vector<std::pair<std::string, ExprPtr>> params;  // macro parameters and their defaults
  // A macro whose body names `varargs` / `kwargs` takes extra positional / keyword arguments.
  bool takes_varargs = false;
  bool takes_kwargs = false;
};

struct Program {
  Body body;
};

// Parses a template as transformers' Jinja environment does (trim_blocks, lstrip_blocks, one
// trailing newline dropped). Throws ConfigError naming `name` and the line.
std::unique_ptr<Program> parse_template(const std::string& source, const std::string& name);

}  // namespace titan::jinja
