// Chat template evaluation: runs the syntax tree of chat_template_parser.cpp over the values of
// chat_template_value.h with Jinja2's scoping (a for loop's body gets a fresh scope each iteration,
// `if` makes none, a macro sees the scope it was defined in at call time) and transformers'
// globals.
#include "titan/components/tokenizer/chat_template.h"

#include "titan/common/check.h"
#include "titan/components/tokenizer/chat_template_ast.h"
#include "titan/components/tokenizer/chat_template_builtins.h"

#include <pthread.h>

#include <algorithm>
#include <cstdint>
#include <unordered_map>

namespace titan {

namespace jinja {

namespace {

struct JinjaFrame {
  std::unordered_map<std::string, Value> vars;
  std::shared_ptr<JinjaFrame> parent;
};
using JinjaFramePtr = std::shared_ptr<JinjaFrame>;

enum class JinjaFlow { kNormal, kBreak, kContinue };

class JinjaRenderer {
 public:
  JinjaRenderer(const std::string& name, std::optional<std::time_t> now) : name_(name), now_(now) {}
  JinjaRenderer(const JinjaRenderer&) = delete;
  JinjaRenderer& operator=(const JinjaRenderer&) = delete;

  // A macro holds the frame it was defined in while that frame holds the macro, and a namespace
  // may hold itself (ns.me = ns): reference cycles Python's collector frees. The renderer breaks
  // them when it ends, however the render ended, so rendering many conversations leaks nothing.
  ~JinjaRenderer() {
    for (const JinjaFramePtr& frame : captured_frames_) {
      frame->vars.clear();
      frame->parent.reset();
    }
    for (const std::shared_ptr<Dict>& ns : namespaces_) *ns = Dict();
  }

  std::string run(const Program& program, const nlohmann::ordered_json& variables) {
    TITAN_CONFIG_CHECK(variables.is_object(), "chat template '", name_,
                       "': the variables must be a JSON object");
    auto globals = std::make_shared<JinjaFrame>();
    install_globals(globals.get());
    for (const auto& item : variables.items())
      globals->vars[item.key()] = Value::from_json(item.value());
    auto root = std::make_shared<JinjaFrame>();
    root->parent = globals;
    std::string out;
    char base = 0;
    stack_base_ = reinterpret_cast<std::uintptr_t>(&base);
    stack_budget_ = stack_budget(stack_base_);
    exec_body(program.body, root, &out);
    return out;
  }

 private:
  [[noreturn]] void fail_data(int line, const std::string& what) const {
    throw DataError(message("chat template '", name_, "' line ", line, ": ", what));
  }
  [[noreturn]] void fail_config(int line, const std::string& what) const {
    throw ConfigError(message("chat template '", name_, "' line ", line, ": ", what));
  }
  // Errors from value helpers carry no line; the innermost node that sees them adds it.
  template <typename Fn>
  auto at_line(int line, Fn&& fn) -> decltype(fn()) {
    const std::string prefix = "chat template '" + name_ + "' line ";
    try {
      return fn();
    } catch (const DataError& e) {
      if (std::string(e.what()).rfind(prefix, 0) == 0) throw;
      fail_data(line, e.what());
    } catch (const ConfigError& e) {
      if (std::string(e.what()).rfind(prefix, 0) == 0) throw;
      fail_config(line, e.what());
    }
  }

  void install_globals(JinjaFrame* frame) {
    frame->vars["raise_exception"] = Value::from_function([](Args& args) -> Value {
      if (args.positional.empty()) throw DataError("raise_exception() needs a message");
      throw DataError(py_str(args.positional[0]));
    });
    const std::optional<std::time_t> now = now_;
    frame->vars["strftime_now"] = Value::from_function([now](Args& args) -> Value {
      if (args.positional.size() != 1 || !args.positional[0].is_string()) {
        throw DataError("strftime_now() takes one format string");
      }
      const std::time_t t = now ? *now : std::time(nullptr);
      std::tm local{};
      localtime_r(&t, &local);
      char buffer[512];
      const size_t n =
          std::strftime(buffer, sizeof(buffer), args.positional[0].string.c_str(), &local);
      return Value::from_string(std::string(buffer, n));
    });
    frame->vars["namespace"] = Value::from_function([this](Args& args) -> Value {
      Dict attrs;
      for (const auto& arg : args.positional) {
        if (!arg.is_dict()) throw DataError("namespace() takes a dict or keyword arguments");
        for (const auto& item : arg.dict->items) attrs.set(item.first, item.second);
      }
      for (const auto& item : args.keyword) attrs.set(item.first, item.second);
      Value ns = Value::new_namespace(std::move(attrs));
      namespaces_.push_back(ns.dict);
      return ns;
    });
    frame->vars["dict"] = Value::from_function([](Args& args) -> Value {
      Dict dict;
      for (const auto& arg : args.positional) {
        if (!arg.is_dict()) throw ConfigError("dict() of anything but a dict is not supported");
        for (size_t i = 0; i < arg.dict->items.size(); ++i) {
          dict.set_typed(arg.dict->key_at(i), arg.dict->items[i].second);
        }
      }
      for (const auto& item : args.keyword) dict.set(item.first, item.second);
      return Value::from_dict(std::move(dict));
    });
    frame->vars["range"] = Value::from_function([](Args& args) -> Value {
      std::vector<int64_t> bounds;
      for (const auto& arg : args.positional) {
        if (arg.kind != Value::Kind::kInt) throw DataError("range() takes integers");
        bounds.push_back(arg.integer);
      }
      if (bounds.empty() || bounds.size() > 3) throw DataError("range() takes 1 to 3 arguments");
      const int64_t start = bounds.size() == 1 ? 0 : bounds[0];
      const int64_t stop = bounds.size() == 1 ? bounds[0] : bounds[1];
      const int64_t step = bounds.size() == 3 ? bounds[2] : 1;
      if (step == 0) throw DataError("range() arg 3 must not be zero");
      List items;
      for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step)
        items.push_back(Value::from_int(i));
      return Value::from_list(std::move(items));
    });
  }

  Value lookup(const std::string& name, const JinjaFramePtr& frame) const {
    for (const JinjaFrame* f = frame.get(); f != nullptr; f = f->parent.get()) {
      auto it = f->vars.find(name);
      if (it != f->vars.end()) return it->second;
    }
    return Value::undefined(message("'", name, "' is undefined"));
  }

  // --- statements ---------------------------------------------------------------------------

  JinjaFlow exec_body(const Body& body, const JinjaFramePtr& frame, std::string* out) {
    for (const auto& node : body) {
      const JinjaFlow flow = exec(*node, frame, out);
      if (flow != JinjaFlow::kNormal) return flow;
    }
    return JinjaFlow::kNormal;
  }

  JinjaFlow exec(const Node& node, const JinjaFramePtr& frame, std::string* out) {
    check_stack(node.line);
    switch (node.kind) {
      case Node::Kind::kText: *out += node.text; return JinjaFlow::kNormal;
      case Node::Kind::kOutput: {
        const Value v = eval(*node.expr, frame);
        *out += at_line(node.line, [&] { return py_str(v); });
        return JinjaFlow::kNormal;
      }
      case Node::Kind::kIf:
        for (const auto& branch : node.branches) {
          if (truthy(eval(*branch.first, frame))) return exec_body(branch.second, frame, out);
        }
        return exec_body(node.else_body, frame, out);
      case Node::Kind::kFor: return exec_for(node, frame, out);
      case Node::Kind::kSet: {
        Value v = eval(*node.value, frame);
        if (!node.attr.empty()) {
          const Value target = eval(*node.expr, frame);
          if (target.kind != Value::Kind::kNamespace) {
            fail_data(node.line, "cannot assign attribute on non-namespace object");
          }
          target.dict->set(node.attr, std::move(v));
        } else {
          assign(node.targets, std::move(v), frame.get(), node.line);
        }
        return JinjaFlow::kNormal;
      }
      case Node::Kind::kSetBlock: {
        std::string captured;
        exec_body(node.body, frame, &captured);
        frame->vars[node.targets[0]] = Value::from_string(std::move(captured));
        return JinjaFlow::kNormal;
      }
      case Node::Kind::kMacro:
        frame->vars[node.text] = make_macro(node, frame);
        return JinjaFlow::kNormal;
      case Node::Kind::kBreak: return JinjaFlow::kBreak;
      case Node::Kind::kContinue: return JinjaFlow::kContinue;
      case Node::Kind::kGeneration: return exec_body(node.body, frame, out);
      case Node::Kind::kWith: {
        auto scope = std::make_shared<JinjaFrame>();
        scope->parent = frame;
        for (const auto& param : node.params) scope->vars[param.first] = eval(*param.second, frame);
        return exec_body(node.body, scope, out);
      }
      case Node::Kind::kFilterBlock: {
        std::string captured;
        const JinjaFlow flow = exec_body(node.body, frame, &captured);
        Args args = eval_args(*node.expr, frame);
        const Value input = Value::from_string(std::move(captured));
        const Value v =
            at_line(node.line, [&] { return apply_filter(node.expr->name, input, args); });
        *out += at_line(node.line, [&] { return py_str(v); });
        return flow;
      }
    }
    return JinjaFlow::kNormal;
  }

  void assign(const std::vector<std::string>& targets, Value v, JinjaFrame* frame, int line) {
    if (targets.size() == 1) {
      frame->vars[targets[0]] = std::move(v);
      return;
    }
    const List items = at_line(line, [&] { return iterate(v); });
    if (items.size() != targets.size()) {
      fail_data(line,
                message("cannot unpack ", items.size(), " values into ", targets.size(), " names"));
    }
    for (size_t i = 0; i < targets.size(); ++i) frame->vars[targets[i]] = items[i];
  }

  JinjaFlow exec_for(const Node& node, const JinjaFramePtr& frame, std::string* out) {
    const Value iterable = eval(*node.expr, frame);
    List all = at_line(node.line, [&] { return iterate(iterable); });
    // The loop filter runs first, so loop.length and loop.last count only what passes it.
    List items;
    for (auto& item : all) {
      if (node.value) {
        auto scope = std::make_shared<JinjaFrame>();
        scope->parent = frame;
        assign(node.targets, item, scope.get(), node.line);
        if (!truthy(eval(*node.value, scope))) continue;
      }
      items.push_back(std::move(item));
    }
    if (items.empty()) return exec_body(node.else_body, frame, out);
    const int64_t n = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < n; ++i) {
      auto scope = std::make_shared<JinjaFrame>();
      scope->parent = frame;
      Dict loop;
      loop.set("index", Value::from_int(i + 1));
      loop.set("index0", Value::from_int(i));
      loop.set("revindex", Value::from_int(n - i));
      loop.set("revindex0", Value::from_int(n - i - 1));
      loop.set("first", Value::from_bool(i == 0));
      loop.set("last", Value::from_bool(i == n - 1));
      loop.set("length", Value::from_int(n));
      loop.set("depth", Value::from_int(1));
      loop.set("depth0", Value::from_int(0));
      loop.set("previtem", i > 0 ? items[i - 1] : Value::undefined("there is no previous item"));
      loop.set("nextitem", i + 1 < n ? items[i + 1] : Value::undefined("there is no next item"));
      loop.set("cycle", Value::from_function([i](Args& args) -> Value {
                 if (args.positional.empty()) throw DataError("no items for cycling given");
                 return args.positional[i % args.positional.size()];
               }));
      loop.set("changed", Value::from_function([](Args&) -> Value {
                 throw ConfigError("loop.changed() is not supported");
               }));
      scope->vars["loop"] = Value::from_dict(std::move(loop));
      assign(node.targets, items[i], scope.get(), node.line);
      if (exec_body(node.body, scope, out) == JinjaFlow::kBreak) break;
    }
    return JinjaFlow::kNormal;
  }

  Value make_macro(const Node& node, const JinjaFramePtr& defining) {
    const Node* macro = &node;
    captured_frames_.push_back(defining);
    return Value::from_function([this, macro, defining](Args& args) -> Value {
      // Python stops runaway recursion (a macro calling itself forever) with RecursionError.
      if (++macro_depth_ > kMaxMacroDepth) {
        macro_depth_ = 0;
        fail_data(macro->line,
                  message("maximum recursion depth exceeded in macro '", macro->text, "'"));
      }
      struct DepthGuard {
        int* depth;
        ~DepthGuard() {
          if (*depth > 0) --*depth;
        }
      } guard{&macro_depth_};
      auto scope = std::make_shared<JinjaFrame>();
      scope->parent = defining;
      const size_t n = macro->params.size();
      if (args.positional.size() > n && !macro->takes_varargs) {
        fail_data(macro->line,
                  message("macro '", macro->text, "' takes not more than ", n, " argument(s)"));
      }
      std::vector<bool> given(n, false);
      List varargs;
      for (size_t i = 0; i < args.positional.size(); ++i) {
        if (i < n) {
          scope->vars[macro->params[i].first] = args.positional[i];
          given[i] = true;
        } else {
          varargs.push_back(args.positional[i]);
        }
      }
      Dict kwargs;
      for (const auto& kw : args.keyword) {
        size_t i = 0;
        while (i < n && macro->params[i].first != kw.first) ++i;
        if (i < n) {
          scope->vars[kw.first] = kw.second;
          given[i] = true;
        } else if (macro->takes_kwargs) {
          kwargs.set(kw.first, kw.second);
        } else {
          fail_data(macro->line, message("macro '", macro->text, "' takes no keyword argument '",
                                         kw.first, "'"));
        }
      }
      if (macro->takes_varargs) scope->vars["varargs"] = Value::from_list(std::move(varargs), true);
      if (macro->takes_kwargs) scope->vars["kwargs"] = Value::from_dict(std::move(kwargs));
      for (size_t i = 0; i < macro->params.size(); ++i) {
        if (given[i]) continue;
        scope->vars[macro->params[i].first] =
            macro->params[i].second
                ? eval(*macro->params[i].second, scope)
                : Value::undefined(
                      message("parameter '", macro->params[i].first, "' was not provided"));
      }
      std::string out;
      exec_body(macro->body, scope, &out);
      return Value::from_string(std::move(out));
    });
  }

  // --- expressions --------------------------------------------------------------------------

  Value eval(const Expr& e, const JinjaFramePtr& frame) {
    check_stack(e.line);
    switch (e.kind) {
      case Expr::Kind::kLiteral: return e.literal;
      case Expr::Kind::kName: return lookup(e.name, frame);
      case Expr::Kind::kList:
      case Expr::Kind::kTuple: {
        List items;
        for (const auto& child : e.children) items.push_back(eval(*child, frame));
        return Value::from_list(std::move(items), e.kind == Expr::Kind::kTuple);
      }
      case Expr::Kind::kDict: {
        Dict dict;
        for (size_t i = 0; i + 1 < e.children.size(); i += 2) {
          const Value key = eval(*e.children[i], frame);
          Value value = eval(*e.children[i + 1], frame);
          at_line(e.line, [&] { dict.set_typed(key, std::move(value)); });
        }
        return Value::from_dict(std::move(dict));
      }
      case Expr::Kind::kGetAttr: {
        const Value object = eval(*e.children[0], frame);
        return at_line(e.line, [&] { return get_attr(object, e.name); });
      }
      case Expr::Kind::kGetItem: {
        const Value object = eval(*e.children[0], frame);
        const Value key = eval(*e.children[1], frame);
        return at_line(e.line, [&] { return get_item(object, key); });
      }
      case Expr::Kind::kSlice: {
        const Value object = eval(*e.children[0], frame);
        Value bounds[3];
        for (int i = 0; i < 3; ++i) {
          bounds[i] = e.children[i + 1] ? eval(*e.children[i + 1], frame) : Value::none();
        }
        return at_line(e.line, [&] { return slice(object, bounds[0], bounds[1], bounds[2]); });
      }
      case Expr::Kind::kCall: {
        const Value callee = eval(*e.children[0], frame);
        Args args = eval_args(e, frame);
        if (callee.is_undefined()) fail_data(e.line, callee.undefined_message);
        if (callee.kind != Value::Kind::kFunction) {
          fail_data(e.line, message("'", py_type_name(callee), "' object is not callable"));
        }
        return at_line(e.line, [&] { return (*callee.function)(args); });
      }
      case Expr::Kind::kFilter: {
        const Value input = eval(*e.children[0], frame);
        Args args = eval_args(e, frame);
        return at_line(e.line, [&] { return apply_filter(e.name, input, args); });
      }
      case Expr::Kind::kTest: {
        const Value input = eval(*e.children[0], frame);
        Args args = eval_args(e, frame);
        const bool result = at_line(e.line, [&] { return apply_test(e.name, input, args); });
        return Value::from_bool(result != e.negated);
      }
      case Expr::Kind::kNeg:
      case Expr::Kind::kPos: {
        const Value v = eval(*e.children[0], frame);
        return at_line(e.line, [&] { return unary(e.kind == Expr::Kind::kNeg ? "-" : "+", v); });
      }
      case Expr::Kind::kBinary: {
        const Value a = eval(*e.children[0], frame);
        const Value b = eval(*e.children[1], frame);
        return at_line(e.line, [&] { return binary_op(e.name, a, b); });
      }
      case Expr::Kind::kCompare: {
        Value left = eval(*e.children[0], frame);
        for (size_t i = 0; i < e.ops.size(); ++i) {
          Value right = eval(*e.children[i + 1], frame);
          const bool ok = at_line(e.line, [&] { return compare(e.ops[i], left, right); });
          if (!ok) return Value::from_bool(false);
          left = std::move(right);
        }
        return Value::from_bool(true);
      }
      case Expr::Kind::kAnd: {
        Value a = eval(*e.children[0], frame);
        return truthy(a) ? eval(*e.children[1], frame) : a;
      }
      case Expr::Kind::kOr: {
        Value a = eval(*e.children[0], frame);
        return truthy(a) ? a : eval(*e.children[1], frame);
      }
      case Expr::Kind::kNot: return Value::from_bool(!truthy(eval(*e.children[0], frame)));
      case Expr::Kind::kCondExpr:
        if (truthy(eval(*e.children[0], frame))) return eval(*e.children[1], frame);
        if (e.children[2]) return eval(*e.children[2], frame);
        return Value::undefined(
            "the inline if expression evaluated to false and no else section was defined");
    }
    fail_config(e.line, "unknown expression");
  }

  Args eval_args(const Expr& e, const JinjaFramePtr& frame) {
    Args args;
    for (size_t i = 1; i < e.children.size(); ++i)
      args.positional.push_back(eval(*e.children[i], frame));
    for (const auto& kw : e.kwargs) args.keyword.emplace_back(kw.first, eval(*kw.second, frame));
    return args;
  }

  const std::string& name_;
  std::optional<std::time_t> now_;
  // Recursion (macros calling macros, expressions inside blocks inside macros) is bounded by the
  // stack it takes, not only by a count: frames differ in size from build to build (several times
  // larger under a sanitizer or without optimization), and threads' stacks differ in size. The
  // budget is half of what this thread's stack has left where rendering starts, at most 64 MiB;
  // 1 MiB where the stack's size cannot be read.
  static std::uintptr_t stack_budget(std::uintptr_t here) {
    constexpr std::uintptr_t kFallback = std::uintptr_t{1} << 20, kMax = std::uintptr_t{64} << 20;
    // Read once per thread: for the main thread glibc reads /proc/self/maps, and a data loader
    // renders a template per sample.
    struct Stack {
      std::uintptr_t bottom = 0, size = 0;  // size 0: unknown
    };
    thread_local const Stack stack = [] {
      Stack s;
      pthread_attr_t attr;
      if (pthread_getattr_np(pthread_self(), &attr) != 0) return s;
      void* low = nullptr;
      size_t size = 0;
      if (pthread_attr_getstack(&attr, &low, &size) == 0) {
        s.bottom = reinterpret_cast<std::uintptr_t>(low);
        s.size = size;
      }
      pthread_attr_destroy(&attr);
      return s;
    }();
    if (stack.size == 0 || here <= stack.bottom || here - stack.bottom > stack.size) {
      return kFallback;
    }
    return std::min((here - stack.bottom) / 2, kMax);
  }
  std::uintptr_t stack_base_ = 0;
  std::uintptr_t stack_budget_ = 0;
  void check_stack(int line) {
    char here = 0;
    const std::uintptr_t at = reinterpret_cast<std::uintptr_t>(&here);
    if (stack_base_ > at && stack_base_ - at > stack_budget_) {
      fail_data(line,
                "maximum recursion depth exceeded (the template nests or recurses too deeply)");
    }
  }
  static constexpr int kMaxMacroDepth = 500;
  int macro_depth_ = 0;
  std::vector<JinjaFramePtr> captured_frames_;     // frames macros were defined in
  std::vector<std::shared_ptr<Dict>> namespaces_;  // every namespace() made
};

}  // namespace

}  // namespace jinja

ChatTemplate::ChatTemplate(std::string source, std::string name)
    : name_(std::move(name)), program_(jinja::parse_template(source, name_)) {}

ChatTemplate::~ChatTemplate() = default;
ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;

std::string ChatTemplate::render(const nlohmann::ordered_json& variables,
                                 std::optional<std::time_t> now) const {
  jinja::JinjaRenderer renderer(name_, now);
  return renderer.run(*program_, variables);
}

std::string apply_chat_template(const ChatTemplate& chat_template,
                                const nlohmann::ordered_json& messages,
                                const ChatTemplateOptions& options) {
  TITAN_CONFIG_CHECK(messages.is_array() && !messages.empty(), "apply_chat_template (",
                     chat_template.name(),
                     "): the conversation must be a non-empty list of messages");
  static const char* const kReasoningFields[] = {"reasoning_content", "thinking", "reasoning"};
  nlohmann::ordered_json chat = nlohmann::ordered_json::array();
  for (const auto& message : messages) {
    TITAN_CONFIG_CHECK(message.is_object(), "apply_chat_template (", chat_template.name(),
                       "): each message must be an object, got ", message.dump());
    // transformers drops null fields: templates handle a missing key, not a None.
    nlohmann::ordered_json clean = nlohmann::ordered_json::object();
    for (const auto& item : message.items()) {
      if (!item.value().is_null()) clean[item.key()] = item.value();
    }
    // ...then copies the reasoning to the names templates read: `thinking` first (unless the
    // message has it already, where it keeps its place and value) and `reasoning_content`.
    const nlohmann::ordered_json* reasoning = nullptr;
    for (const char* field : kReasoningFields) {
      if (clean.contains(field)) {
        reasoning = &clean[field];
        break;
      }
    }
    if (reasoning != nullptr) {
      nlohmann::ordered_json aliased = nlohmann::ordered_json::object();
      aliased["thinking"] = *reasoning;
      for (const auto& item : clean.items()) aliased[item.key()] = item.value();
      aliased["reasoning_content"] = *reasoning;
      clean = std::move(aliased);
    }
    chat.push_back(std::move(clean));
  }
  nlohmann::ordered_json variables = nlohmann::ordered_json::object();
  for (const auto& item : options.special_tokens.items()) variables[item.key()] = item.value();
  variables["messages"] = std::move(chat);
  variables["tools"] = options.tools;
  variables["documents"] = options.documents;
  variables["add_generation_prompt"] = options.add_generation_prompt;
  for (const auto& item : options.extra.items()) variables[item.key()] = item.value();
  return chat_template.render(variables, options.now);
}

}  // namespace titan
