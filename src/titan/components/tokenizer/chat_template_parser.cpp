// Parser of chat templates: Jinja2's grammar (statements, and expressions with its precedence of
// conditionals, boolean operators, comparisons, arithmetic, filters and tests) over the tokens of
// chat_template_lexer.cpp.
#include "titan/components/tokenizer/chat_template_ast.h"

#include "titan/common/check.h"
#include "titan/components/tokenizer/chat_template_builtins.h"
#include "titan/components/tokenizer/chat_template_lexer.h"

namespace titan::jinja {

namespace {

bool jinja_mentions(const Body& body, const std::string& name);

// Whether an expression reads the variable `name` (Jinja's undeclared-name scan for macros).
bool jinja_mentions(const Expr* e, const std::string& name) {
  if (e == nullptr) return false;
  if (e->kind == Expr::Kind::kName && e->name == name) return true;
  for (const auto& child : e->children) {
    if (jinja_mentions(child.get(), name)) return true;
  }
  for (const auto& kw : e->kwargs) {
    if (jinja_mentions(kw.second.get(), name)) return true;
  }
  return false;
}

bool jinja_mentions(const Body& body, const std::string& name) {
  for (const auto& node : body) {
    if (jinja_mentions(node->expr.get(), name) || jinja_mentions(node->value.get(), name) ||
        jinja_mentions(node->body, name) || jinja_mentions(node->else_body, name)) {
      return true;
    }
    for (const auto& branch : node->branches) {
      if (jinja_mentions(branch.first.get(), name) || jinja_mentions(branch.second, name))
        return true;
    }
    for (const auto& param : node->params) {
      if (jinja_mentions(param.second.get(), name)) return true;
    }
  }
  return false;
}

ExprPtr jinja_make(Expr::Kind kind, int line) {
  auto e = std::make_unique<Expr>();
  e->kind = kind;
  e->line = line;
  return e;
}

class JinjaParser {
 public:
  JinjaParser(std::vector<JinjaToken> tokens, const std::string& name)
      : tokens_(std::move(tokens)), name_(name) {}

  std::unique_ptr<Program> parse() {
    auto program = std::make_unique<Program>();
    std::string end_tag;
    program->body = parse_body({}, &end_tag);
    return program;
  }

 private:
  const JinjaToken& peek(size_t ahead = 0) const {
    return tokens_[std::min(pos_ + ahead, tokens_.size() - 1)];
  }
  const JinjaToken& next() {
    const JinjaToken& t = tokens_[pos_];
    if (pos_ + 1 < tokens_.size()) ++pos_;
    return t;
  }
  bool is_op(const char* op, size_t ahead = 0) const {
    return peek(ahead).kind == JinjaToken::Kind::kOp && peek(ahead).text == op;
  }
  bool is_name(const char* name, size_t ahead = 0) const {
    return peek(ahead).kind == JinjaToken::Kind::kName && peek(ahead).text == name;
  }
  // Evaluating and destroying an expression recurse through its tree, and parsing recurses through
  // nested brackets, `not`s and blocks: both are bounded, so a template nested beyond what any
  // real one needs is refused instead of overflowing the stack.
  static constexpr int kMaxDepth = 200;
  void deepen(Expr& parent, const Expr& child) {
    parent.depth = std::max(parent.depth, child.depth + 1);
    if (parent.depth > kMaxDepth) {
      fail(message("an expression nested more than ", kMaxDepth, " levels deep"));
    }
  }
  // parent->children.push_back(child), keeping the depth bound (`child` may be null).
  void adopt(Expr* parent, ExprPtr child) {
    if (child) deepen(*parent, *child);
    parent->children.push_back(std::move(child));
  }
  void adopt(const ExprPtr& parent, ExprPtr child) { adopt(parent.get(), std::move(child)); }
  struct Nesting {
    JinjaParser* parser;
    explicit Nesting(JinjaParser* p) : parser(p) {
      if (++parser->nesting_ > kMaxDepth) {
        parser->fail(
            message("brackets, `not`s or blocks nested more than ", kMaxDepth, " levels deep"));
      }
    }
    ~Nesting() { --parser->nesting_; }
  };
  int nesting_ = 0;

  [[noreturn]] void fail(const std::string& what) const {
    jinja_syntax_error(name_, peek().line, what);
  }
  void expect_op(const char* op) {
    if (!is_op(op)) fail(message("expected '", op, "', got '", describe(peek()), "'"));
    next();
  }
  std::string expect_name() {
    if (peek().kind != JinjaToken::Kind::kName)
      fail(message("expected a name, got '", describe(peek()), "'"));
    return next().text;
  }
  void expect_block_end() {
    if (peek().kind != JinjaToken::Kind::kBlockEnd)
      fail(message("expected end of tag, got '", describe(peek()), "'"));
    next();
  }
  static std::string describe(const JinjaToken& t) {
    switch (t.kind) {
      case JinjaToken::Kind::kBlockEnd: return "%}";
      case JinjaToken::Kind::kVarEnd: return "}}";
      case JinjaToken::Kind::kEnd: return "end of template";
      default: return t.text;
    }
  }

  // Parses nodes until a block tag whose name is in `ends`; leaves that name in *end_tag with the
  // parser after the name (its arguments, if any, and %} are for the caller).
  Body parse_body(const std::vector<std::string>& ends, std::string* end_tag) {
    const Nesting nesting(this);
    Body body;
    while (true) {
      const JinjaToken& t = peek();
      if (t.kind == JinjaToken::Kind::kEnd) {
        if (!ends.empty())
          fail(message("unexpected end of template; expected {% ", ends.back(), " %}"));
        return body;
      }
      if (t.kind == JinjaToken::Kind::kText) {
        auto node = std::make_unique<Node>();
        node->kind = Node::Kind::kText;
        node->line = t.line;
        node->text = t.text;
        body.push_back(std::move(node));
        next();
      } else if (t.kind == JinjaToken::Kind::kVarBegin) {
        next();
        auto node = std::make_unique<Node>();
        node->kind = Node::Kind::kOutput;
        node->line = t.line;
        node->expr = parse_expression();
        if (peek().kind != JinjaToken::Kind::kVarEnd)
          fail(message("expected '}}', got '", describe(peek()), "'"));
        next();
        body.push_back(std::move(node));
        check_unknown_names();
      } else if (t.kind == JinjaToken::Kind::kBlockBegin) {
        next();
        const std::string tag = expect_name();
        for (const auto& end : ends) {
          if (tag == end) {
            *end_tag = tag;
            return body;
          }
        }
        body.push_back(parse_statement(tag, t.line));
        check_unknown_names();
      } else {
        fail(message("unexpected '", describe(t), "'"));
      }
    }
  }

  std::unique_ptr<Node> parse_statement(const std::string& tag, int line) {
    auto node = std::make_unique<Node>();
    node->line = line;
    std::string end;
    if (tag == "if") {
      SoftFrame soft(this, true);
      node->kind = Node::Kind::kIf;
      ExprPtr cond = parse_expression();
      expect_block_end();
      while (true) {
        Body body = parse_body({"elif", "else", "endif"}, &end);
        node->branches.emplace_back(std::move(cond), std::move(body));
        if (end == "elif") {
          cond = parse_expression();
          expect_block_end();
          continue;
        }
        expect_block_end();
        if (end == "else") {
          node->else_body = parse_body({"endif"}, &end);
          expect_block_end();
        }
        break;
      }
    } else if (tag == "for") {
      node->kind = Node::Kind::kFor;
      node->targets.push_back(expect_name());
      while (is_op(",")) {
        next();
        node->targets.push_back(expect_name());
      }
      if (!is_name("in")) fail("expected 'in' in a for tag");
      next();
      node->expr = parse_or_chain(/*allow_condexpr=*/false);
      SoftFrame loop_frame(this, false);
      if (is_name("if")) {
        next();
        node->value = parse_or_chain(/*allow_condexpr=*/false);
      }
      if (is_name("recursive")) fail("recursive for loops are not supported");
      expect_block_end();
      node->body = parse_body({"else", "endfor"}, &end);
      expect_block_end();
      if (end == "else") {
        node->else_body = parse_body({"endfor"}, &end);
        expect_block_end();
      }
    } else if (tag == "set") {
      const std::string first = expect_name();
      if (is_op(".")) {
        next();
        node->kind = Node::Kind::kSet;
        node->expr = jinja_make(Expr::Kind::kName, line);
        node->expr->name = first;
        node->attr = expect_name();
        expect_op("=");
        node->value = parse_expression();
        expect_block_end();
        return node;
      }
      node->targets.push_back(first);
      while (is_op(",")) {
        next();
        node->targets.push_back(expect_name());
      }
      if (is_op("=")) {
        next();
        node->kind = Node::Kind::kSet;
        node->value = parse_expression();
        expect_block_end();
      } else {
        if (node->targets.size() != 1) fail("a block set takes one name");
        if (is_op("|")) fail("filters on a block set are not supported");
        node->kind = Node::Kind::kSetBlock;
        SoftFrame block_frame(this, false);
        expect_block_end();
        node->body = parse_body({"endset"}, &end);
        expect_block_end();
      }
    } else if (tag == "macro") {
      node->kind = Node::Kind::kMacro;
      SoftFrame macro_frame(this, false);
      node->text = expect_name();
      expect_op("(");
      while (!is_op(")")) {
        std::string param = expect_name();
        ExprPtr fallback;
        if (is_op("=")) {
          next();
          fallback = parse_expression();
        }
        node->params.emplace_back(std::move(param), std::move(fallback));
        if (!is_op(")")) expect_op(",");
      }
      next();
      expect_block_end();
      node->body = parse_body({"endmacro"}, &end);
      node->takes_varargs = jinja_mentions(node->body, "varargs");
      node->takes_kwargs = jinja_mentions(node->body, "kwargs");
      if (jinja_mentions(node->body, "caller")) {
        jinja_syntax_error(name_, line,
                           "macros that use `caller` ({% call %} blocks) are not supported");
      }
      if (peek().kind == JinjaToken::Kind::kName) next();  // {% endmacro name %}
      expect_block_end();
    } else if (tag == "break" || tag == "continue") {
      node->kind = tag == "break" ? Node::Kind::kBreak : Node::Kind::kContinue;
      expect_block_end();
    } else if (tag == "filter") {
      node->kind = Node::Kind::kFilterBlock;
      node->expr = jinja_make(Expr::Kind::kFilter, line);
      node->expr->name = expect_name();
      adopt(node->expr, nullptr);  // the rendered body
      if (is_op("(")) parse_call_args(node->expr.get());
      if (is_op("|")) fail("chained filters on a filter block are not supported");
      note_name(node->expr->name, /*is_filter=*/true, line);
      SoftFrame block_frame(this, false);
      expect_block_end();
      node->body = parse_body({"endfilter"}, &end);
      expect_block_end();
    } else if (tag == "with") {
      node->kind = Node::Kind::kWith;
      while (peek().kind != JinjaToken::Kind::kBlockEnd) {
        std::string target = expect_name();
        expect_op("=");
        node->params.emplace_back(std::move(target), parse_expression());
        if (peek().kind != JinjaToken::Kind::kBlockEnd) expect_op(",");
      }
      SoftFrame with_frame(this, false);
      expect_block_end();
      node->body = parse_body({"endwith"}, &end);
      expect_block_end();
    } else if (tag == "generation") {
      node->kind = Node::Kind::kGeneration;
      SoftFrame block_frame(this, false);
      expect_block_end();
      node->body = parse_body({"endgeneration"}, &end);
      expect_block_end();
    } else {
      jinja_syntax_error(name_, line, message("the tag '", tag, "' is not supported"));
    }
    return node;
  }

  // Jinja's expression grammar, loosest first: conditional, or, and, not, comparison, + -, ~,
  // * / // %, **, unary, then postfix (. [] ()) with filters and tests.
  ExprPtr parse_expression() {
    const Nesting nesting(this);
    return parse_or_chain(/*allow_condexpr=*/true);
  }

  ExprPtr parse_or_chain(bool allow_condexpr) {
    const size_t unknown_before = unknown_.size();
    ExprPtr expr = parse_or();
    if (allow_condexpr && is_name("if")) {
      // A conditional expression compiles in a soft frame, operands parsed before the `if`
      // included.
      SoftFrame soft(this, true);
      unknown_.resize(unknown_before);
      return parse_condexpr(std::move(expr));
    }
    return expr;
  }

  ExprPtr parse_condexpr(ExprPtr expr) {
    while (is_name("if")) {
      const int line = next().line;
      auto cond = jinja_make(Expr::Kind::kCondExpr, line);
      adopt(cond, parse_or());
      adopt(cond, std::move(expr));
      if (is_name("else")) {
        next();
        adopt(cond, parse_or_chain(true));
      } else {
        adopt(cond, nullptr);
      }
      expr = std::move(cond);
    }
    return expr;
  }

  ExprPtr parse_binary_chain(Expr::Kind kind, const char* keyword,
                             ExprPtr (JinjaParser::*inner)()) {
    ExprPtr left = (this->*inner)();
    while (is_name(keyword)) {
      auto node = jinja_make(kind, next().line);
      adopt(node, std::move(left));
      adopt(node, (this->*inner)());
      left = std::move(node);
    }
    return left;
  }
  ExprPtr parse_or() { return parse_binary_chain(Expr::Kind::kOr, "or", &JinjaParser::parse_and); }
  ExprPtr parse_and() {
    return parse_binary_chain(Expr::Kind::kAnd, "and", &JinjaParser::parse_not);
  }
  ExprPtr parse_not() {
    const Nesting nesting(this);
    if (is_name("not")) {
      auto node = jinja_make(Expr::Kind::kNot, next().line);
      adopt(node, parse_not());
      return node;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    ExprPtr first = parse_math1();
    ExprPtr node;
    while (true) {
      std::string op;
      const JinjaToken& t = peek();
      if (t.kind == JinjaToken::Kind::kOp && (t.text == "==" || t.text == "!=" || t.text == "<" ||
                                              t.text == "<=" || t.text == ">" || t.text == ">=")) {
        op = t.text;
        next();
      } else if (is_name("in")) {
        op = "in";
        next();
      } else if (is_name("not") && is_name("in", 1)) {
        op = "not in";
        next();
        next();
      } else {
        break;
      }
      if (!node) {
        node = jinja_make(Expr::Kind::kCompare, t.line);
        adopt(node, std::move(first));
      }
      node->ops.push_back(op);
      adopt(node, parse_math1());
    }
    return node ? std::move(node) : std::move(first);
  }

  ExprPtr binary(ExprPtr left, const std::string& op, ExprPtr right, int line) {
    auto node = jinja_make(Expr::Kind::kBinary, line);
    node->name = op;
    adopt(node, std::move(left));
    adopt(node, std::move(right));
    return node;
  }

  ExprPtr parse_math1() {
    ExprPtr left = parse_concat();
    while (is_op("+") || is_op("-")) {
      const JinjaToken& t = next();
      left = binary(std::move(left), t.text, parse_concat(), t.line);
    }
    return left;
  }
  ExprPtr parse_concat() {
    ExprPtr left = parse_math2();
    while (is_op("~")) {
      const int line = next().line;
      left = binary(std::move(left), "~", parse_math2(), line);
    }
    return left;
  }
  ExprPtr parse_math2() {
    ExprPtr left = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const JinjaToken& t = next();
      left = binary(std::move(left), t.text, parse_pow(), t.line);
    }
    return left;
  }
  ExprPtr parse_pow() {
    ExprPtr left = parse_unary(true);
    while (is_op("**")) {
      const int line = next().line;
      left = binary(std::move(left), "**", parse_unary(true), line);
    }
    return left;
  }

  ExprPtr parse_unary(bool with_filter) {
    const Nesting nesting(this);
    ExprPtr node;
    if (is_op("-") || is_op("+")) {
      const JinjaToken& t = next();
      node = jinja_make(t.text == "-" ? Expr::Kind::kNeg : Expr::Kind::kPos, t.line);
      adopt(node, parse_unary(false));
    } else {
      node = parse_primary();
    }
    node = parse_postfix(std::move(node));
    if (with_filter) node = parse_filter_expr(std::move(node));
    return node;
  }

  ExprPtr parse_primary() {
    const JinjaToken& t = peek();
    if (t.kind == JinjaToken::Kind::kName) {
      next();
      auto node = jinja_make(Expr::Kind::kLiteral, t.line);
      if (t.text == "true" || t.text == "True") {
        node->literal = Value::from_bool(true);
      } else if (t.text == "false" || t.text == "False") {
        node->literal = Value::from_bool(false);
      } else if (t.text == "none" || t.text == "None") {
        node->literal = Value::none();
      } else {
        node->kind = Expr::Kind::kName;
        node->name = t.text;
      }
      return node;
    }
    if (t.kind == JinjaToken::Kind::kString) {
      std::string text;
      while (peek().kind == JinjaToken::Kind::kString) text += next().text;  // "a" "b" is "ab"
      auto node = jinja_make(Expr::Kind::kLiteral, t.line);
      node->literal = Value::from_string(std::move(text));
      return node;
    }
    if (t.kind == JinjaToken::Kind::kInt || t.kind == JinjaToken::Kind::kFloat) {
      next();
      auto node = jinja_make(Expr::Kind::kLiteral, t.line);
      node->literal = t.kind == JinjaToken::Kind::kInt ? Value::from_int(t.integer)
                                                       : Value::from_float(t.number);
      return node;
    }
    if (is_op("(")) {
      next();
      if (is_op(")")) {
        next();
        return jinja_make(Expr::Kind::kTuple, t.line);
      }
      ExprPtr first = parse_or_chain(true);
      if (!is_op(",")) {
        expect_op(")");
        return first;
      }
      auto tuple = jinja_make(Expr::Kind::kTuple, t.line);
      adopt(tuple, std::move(first));
      while (is_op(",")) {
        next();
        if (is_op(")")) break;
        adopt(tuple, parse_or_chain(true));
      }
      expect_op(")");
      return tuple;
    }
    if (is_op("[")) {
      next();
      auto list = jinja_make(Expr::Kind::kList, t.line);
      while (!is_op("]")) {
        adopt(list, parse_expression());
        if (!is_op("]")) expect_op(",");
      }
      next();
      return list;
    }
    if (is_op("{")) {
      next();
      auto dict = jinja_make(Expr::Kind::kDict, t.line);
      while (!is_op("}")) {
        adopt(dict, parse_expression());
        expect_op(":");
        adopt(dict, parse_expression());
        if (!is_op("}")) expect_op(",");
      }
      next();
      return dict;
    }
    fail(message("unexpected '", describe(t), "' in an expression"));
  }

  void parse_call_args(Expr* call) {
    expect_op("(");
    while (!is_op(")")) {
      if (is_op("*") || is_op("**")) fail("*args and **kwargs in calls are not supported");
      if (peek().kind == JinjaToken::Kind::kName && is_op("=", 1)) {
        std::string key = next().text;
        next();
        call->kwargs.emplace_back(std::move(key), parse_expression());
        deepen(*call, *call->kwargs.back().second);
      } else {
        if (!call->kwargs.empty()) fail("a positional argument follows a keyword argument");
        adopt(call, parse_expression());
      }
      if (!is_op(")")) expect_op(",");
    }
    next();
  }

  ExprPtr parse_postfix(ExprPtr node) {
    while (true) {
      if (is_op(".")) {
        const int line = next().line;
        const JinjaToken& t = next();
        if (t.kind == JinjaToken::Kind::kName) {
          auto attr = jinja_make(Expr::Kind::kGetAttr, line);
          attr->name = t.text;
          adopt(attr, std::move(node));
          node = std::move(attr);
        } else if (t.kind == JinjaToken::Kind::kInt) {
          auto item = jinja_make(Expr::Kind::kGetItem, line);
          adopt(item, std::move(node));
          auto index = jinja_make(Expr::Kind::kLiteral, line);
          index->literal = Value::from_int(t.integer);
          adopt(item, std::move(index));
          node = std::move(item);
        } else {
          fail("expected a name after '.'");
        }
      } else if (is_op("[")) {
        const int line = next().line;
        ExprPtr parts[3];
        int colons = 0;
        while (!is_op("]")) {
          if (is_op(":")) {
            next();
            if (++colons > 2) fail("too many ':' in a subscript");
            continue;
          }
          if (parts[colons]) fail("expected ']' or ':' in a subscript");
          parts[colons] = parse_expression();
        }
        next();
        if (colons == 0) {
          if (!parts[0]) fail("empty subscript");
          auto item = jinja_make(Expr::Kind::kGetItem, line);
          adopt(item, std::move(node));
          adopt(item, std::move(parts[0]));
          node = std::move(item);
        } else {
          auto slice = jinja_make(Expr::Kind::kSlice, line);
          adopt(slice, std::move(node));
          for (auto& part : parts) adopt(slice, std::move(part));
          node = std::move(slice);
        }
      } else if (is_op("(")) {
        auto call = jinja_make(Expr::Kind::kCall, peek().line);
        adopt(call, std::move(node));
        parse_call_args(call.get());
        node = std::move(call);
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_filter_expr(ExprPtr node) {
    while (true) {
      if (is_op("|")) {
        const int line = next().line;
        auto filter = jinja_make(Expr::Kind::kFilter, line);
        filter->name = expect_name();
        note_name(filter->name, /*is_filter=*/true, line);
        while (is_op(".")) {
          next();
          filter->name += "." + expect_name();
        }
        adopt(filter, std::move(node));
        if (is_op("(")) parse_call_args(filter.get());
        node = std::move(filter);
      } else if (is_name("is")) {
        const int line = next().line;
        auto test = jinja_make(Expr::Kind::kTest, line);
        if (is_name("not")) {
          next();
          test->negated = true;
        }
        test->name = expect_name();
        note_name(test->name, /*is_filter=*/false, line);
        adopt(test, std::move(node));
        const JinjaToken& t = peek();
        if (is_op("(")) {
          parse_call_args(test.get());
        } else if ((t.kind == JinjaToken::Kind::kName || t.kind == JinjaToken::Kind::kString ||
                    t.kind == JinjaToken::Kind::kInt || t.kind == JinjaToken::Kind::kFloat ||
                    is_op("[") || is_op("{")) &&
                   !is_name("else") && !is_name("or") && !is_name("and")) {
          // `x is divisibleby 3`, `x is sameas none`: one argument without parentheses.
          adopt(test, parse_postfix(parse_primary()));
        }
        node = std::move(test);
      } else if (is_op("(")) {
        auto call = jinja_make(Expr::Kind::kCall, peek().line);
        adopt(call, std::move(node));
        parse_call_args(call.get());
        node = std::move(call);
      } else {
        return node;
      }
    }
  }

  std::vector<JinjaToken> tokens_;
  const std::string& name_;
  size_t pos_ = 0;

  // Jinja 3 rejects a filter or test nobody defines when it compiles the template, except inside
  // an `if` (its condition and branches) or a conditional expression, where only running it
  // fails. soft_ says whether the parser is in such a place; unknown_ holds the names it met
  // outside one.
  struct SoftFrame {
    SoftFrame(JinjaParser* owner, bool soft) : parser(owner), saved(owner->soft_) {
      owner->soft_ = soft;
    }
    ~SoftFrame() { parser->soft_ = saved; }
    JinjaParser* parser;
    bool saved;
  };
  void note_name(const std::string& name, bool is_filter, int line) {
    if (soft_ || (is_filter ? jinja_has_filter(name) : jinja_has_test(name))) return;
    unknown_.emplace_back(message("No ", is_filter ? "filter" : "test", " named '", name, "'."),
                          line);
  }
  void check_unknown_names() {
    if (!unknown_.empty()) jinja_syntax_error(name_, unknown_[0].second, unknown_[0].first);
  }
  bool soft_ = false;
  std::vector<std::pair<std::string, int>> unknown_;
};

}  // namespace

std::unique_ptr<Program> parse_template(const std::string& source, const std::string& name) {
  JinjaParser parser(lex_template(source, name), name);
  return parser.parse();
}

}  // namespace titan::jinja
