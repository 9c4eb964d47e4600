// Operators, filters, tests and methods of the chat template engine (see chat_template_builtins.h).
// Each follows what Jinja2 3.1 does on Python objects, messages of its errors included, since a
// template that rejects a conversation must fail here as it fails in transformers.
#include "titan/components/tokenizer/chat_template_builtins.h"

#include "titan/common/check.h"
#include "titan/components/tokenizer/chat_template_ast.h"

#include <algorithm>
#include <cmath>
#include <set>

namespace titan::jinja {

namespace {

[[noreturn]] void jinja_type_error(const std::string& what) {
  throw DataError(message("TypeError: ", what));
}

void jinja_check_defined(const Value& v) {
  if (v.is_undefined()) throw DataError(v.undefined_message);
}

// An argument by position or by keyword; null when absent.
const Value* jinja_arg(const Args& args, size_t position, const char* name) {
  if (position < args.positional.size()) return &args.positional[position];
  for (const auto& kw : args.keyword) {
    if (kw.first == name) return &kw.second;
  }
  return nullptr;
}

const std::string& jinja_string_arg(const Args& args, size_t position, const char* name,
                                    const char* what) {
  const Value* v = jinja_arg(args, position, name);
  if (v == nullptr || !v->is_string())
    jinja_type_error(message(what, "() needs a string for '", name, "'"));
  return v->string;
}

int64_t jinja_int_of(const Value& v, const char* what) {
  if (v.kind == Value::Kind::kInt) return v.integer;
  if (v.kind == Value::Kind::kBool) return v.boolean;
  jinja_type_error(message(what, " must be an integer, not '", py_type_name(v), "'"));
}

bool jinja_ascii(const std::string& s) {
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return static_cast<unsigned char>(c) < 0x80; });
}

// Case mapping of ASCII text; other scripts would need Unicode tables Python has and we lack.
std::string jinja_case(const std::string& s, const std::string& how) {
  if (!jinja_ascii(s)) {
    throw ConfigError(message("'", how, "' of non-ASCII text is not supported"));
  }
  std::string out = s;
  bool word_start = true;
  for (size_t i = 0; i < out.size(); ++i) {
    const char c = out[i];
    if (how == "upper") {
      out[i] = static_cast<char>(std::toupper(c));
    } else if (how == "lower") {
      out[i] = static_cast<char>(std::tolower(c));
    } else if (how == "capitalize") {
      out[i] = static_cast<char>(i == 0 ? std::toupper(c) : std::tolower(c));
    } else {  // title
      out[i] = static_cast<char>(word_start ? std::toupper(c) : std::tolower(c));
      word_start = !std::isalpha(static_cast<unsigned char>(c));
    }
  }
  return out;
}

Value jinja_bound(Function fn) { return Value::from_function(std::move(fn)); }

const std::set<std::string>& jinja_str_methods() {
  static const std::set<std::string> names = {
      "capitalize",   "casefold",    "center",    "count",      "encode",       "endswith",
      "expandtabs",   "find",        "format",    "format_map", "index",        "isalnum",
      "isalpha",      "isascii",     "isdecimal", "isdigit",    "isidentifier", "islower",
      "isnumeric",    "isprintable", "isspace",   "istitle",    "isupper",      "join",
      "ljust",        "lower",       "lstrip",    "maketrans",  "partition",    "removeprefix",
      "removesuffix", "replace",     "rfind",     "rindex",     "rjust",        "rpartition",
      "rsplit",       "rstrip",      "split",     "splitlines", "startswith",   "strip",
      "swapcase",     "title",       "translate", "upper",      "zfill"};
  return names;
}

Value jinja_str_format(const std::string& format, const Args& args) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < format.size(); ++i) {
    const char c = format[i];
    if ((c == '{' || c == '}') && i + 1 < format.size() && format[i + 1] == c) {
      out += c;
      ++i;
      continue;
    }
    if (c == '}') throw DataError("ValueError: Single '}' encountered in format string");
    if (c != '{') {
      out += c;
      continue;
    }
    const size_t close = format.find('}', i);
    if (close == std::string::npos)
      throw DataError("ValueError: Single '{' encountered in format string");
    const std::string field = format.substr(i + 1, close - i - 1);
    if (field.find_first_of(":!.[") != std::string::npos) {
      throw ConfigError(
          "str.format fields with conversions, specs or attributes are not supported");
    }
    const Value* v = nullptr;
    if (field.empty()) {
      v = jinja_arg(args, auto_index++, "");
    } else if (std::isdigit(static_cast<unsigned char>(field[0]))) {
      v = jinja_arg(args, std::stoul(field), "");
    } else {
      v = jinja_arg(args, SIZE_MAX, field.c_str());
    }
    if (v == nullptr) throw DataError(message("str.format: no argument for '{", field, "}'"));
    out += py_str(*v);
    i = close;
  }
  return Value::from_string(out);
}

Value jinja_str_method(const std::string& s, const std::string& name) {
  if (name == "startswith" || name == "endswith") {
    const bool start = name == "startswith";
    return jinja_bound([s, start](Args& args) {
      const Value* p = jinja_arg(args, 0, "prefix");
      if (p == nullptr || args.positional.size() > 1)
        jinja_type_error("startswith/endswith take one prefix");
      List candidates = p->is_list() ? *p->list : List{*p};
      for (const auto& c : candidates) {
        if (!c.is_string()) jinja_type_error("startswith/endswith need strings");
        const std::string& x = c.string;
        if (x.size() <= s.size() && (start ? s.compare(0, x.size(), x) == 0
                                           : s.compare(s.size() - x.size(), x.size(), x) == 0)) {
          return Value::from_bool(true);
        }
      }
      return Value::from_bool(false);
    });
  }
  if (name == "split" || name == "rsplit") {
    const bool right = name == "rsplit";
    return jinja_bound([s, right](Args& args) {
      const Value* sep = jinja_arg(args, 0, "sep");
      const Value* max = jinja_arg(args, 1, "maxsplit");
      if (sep != nullptr && !sep->is_none() && !sep->is_string())
        jinja_type_error("must be str or None");
      const int64_t maxsplit = max == nullptr ? -1 : jinja_int_of(*max, "maxsplit");
      List parts;
      for (auto& part : py_split(s, sep != nullptr && sep->is_string() ? &sep->string : nullptr,
                                 maxsplit, right)) {
        parts.push_back(Value::from_string(std::move(part)));
      }
      return Value::from_list(std::move(parts));
    });
  }
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    const bool left = name != "rstrip", right = name != "lstrip";
    return jinja_bound([s, left, right](Args& args) {
      const Value* chars = jinja_arg(args, 0, "chars");
      if (chars != nullptr && !chars->is_none() && !chars->is_string())
        jinja_type_error("strip arg must be None or str");
      return Value::from_string(py_strip(
          s, chars != nullptr && chars->is_string() ? &chars->string : nullptr, left, right));
    });
  }
  if (name == "upper" || name == "lower" || name == "title" || name == "capitalize") {
    return jinja_bound([s, name](Args&) { return Value::from_string(jinja_case(s, name)); });
  }
  if (name == "replace") {
    return jinja_bound([s](Args& args) {
      const std::string& old = jinja_string_arg(args, 0, "old", "replace");
      const std::string& repl = jinja_string_arg(args, 1, "new", "replace");
      const Value* count = jinja_arg(args, 2, "count");
      return Value::from_string(
          py_replace(s, old, repl, count == nullptr ? -1 : jinja_int_of(*count, "count")));
    });
  }
  if (name == "find" || name == "rfind" || name == "count") {
    return jinja_bound([s, name](Args& args) {
      const std::string& sub = jinja_string_arg(args, 0, "sub", name.c_str());
      if (args.positional.size() > 1)
        throw ConfigError(message("str.", name, " with start/end is not supported"));
      auto to_cp_index = [&](size_t byte) {
        return static_cast<int64_t>(utf8_decode(s.substr(0, byte)).size());
      };
      if (name == "count") {
        if (sub.empty()) return Value::from_int(static_cast<int64_t>(utf8_decode(s).size()) + 1);
        int64_t n = 0;
        for (size_t at = s.find(sub); at != std::string::npos; at = s.find(sub, at + sub.size()))
          ++n;
        return Value::from_int(n);
      }
      const size_t at = name == "find" ? s.find(sub) : s.rfind(sub);
      return Value::from_int(at == std::string::npos ? -1 : to_cp_index(at));
    });
  }
  if (name == "join") {
    return jinja_bound([s](Args& args) {
      const Value* items = jinja_arg(args, 0, "iterable");
      if (items == nullptr) jinja_type_error("join() takes one argument");
      std::string out;
      bool first = true;
      for (const auto& item : iterate(*items)) {
        if (!item.is_string())
          jinja_type_error(
              message("sequence item: expected str instance, ", py_type_name(item), " found"));
        if (!first) out += s;
        first = false;
        out += item.string;
      }
      return Value::from_string(out);
    });
  }
  if (name == "format") {
    return jinja_bound([s](Args& args) { return jinja_str_format(s, args); });
  }
  if (jinja_str_methods().count(name) != 0) {
    throw ConfigError(message("the string method '", name, "' is not supported"));
  }
  return Value::undefined(message("'str object' has no attribute '", name, "'"));
}

List jinja_items(const Dict& dict) {
  List items;
  for (const auto& item : dict.items) {
    items.push_back(
        Value::from_list({Value::from_string(item.first), item.second}, /*is_tuple=*/true));
  }
  return items;
}

Value jinja_dict_method(const Value& object, const std::string& name) {
  std::shared_ptr<Dict> dict = object.dict;
  if (name == "items")
    return jinja_bound([dict](Args&) { return Value::from_list(jinja_items(*dict)); });
  if (name == "keys" || name == "values") {
    const bool keys = name == "keys";
    return jinja_bound([dict, keys](Args&) {
      List out;
      for (const auto& item : dict->items)
        out.push_back(keys ? Value::from_string(item.first) : item.second);
      return Value::from_list(std::move(out));
    });
  }
  return jinja_bound([dict](Args& args) {
    const Value* key = jinja_arg(args, 0, "key");
    const Value* fallback = jinja_arg(args, 1, "default");
    if (key == nullptr) jinja_type_error("get expected at least 1 argument, got 0");
    const Value* found = key->is_string() ? dict->find(key->string) : nullptr;
    return found != nullptr ? *found : (fallback != nullptr ? *fallback : Value::none());
  });
}

bool jinja_is_dict_method(const std::string& name) {
  return name == "items" || name == "keys" || name == "values" || name == "get";
}

bool jinja_is_unsupported_dict_method(const std::string& name) {
  static const std::set<std::string> names = {"pop",   "popitem", "setdefault", "update",
                                              "clear", "copy",    "fromkeys"};
  return names.count(name) != 0;
}

// Python's slice.indices: clamps start and stop for the step's direction.
std::vector<size_t> jinja_slice_indices(size_t n, const Value& start, const Value& stop,
                                        const Value& step) {
  const int64_t len = static_cast<int64_t>(n);
  const int64_t st = step.is_none() ? 1 : jinja_int_of(step, "slice step");
  if (st == 0) throw DataError("ValueError: slice step cannot be zero");
  auto bound = [&](const Value& v, int64_t fallback) {
    if (v.is_none()) return fallback;
    int64_t i = jinja_int_of(v, "slice indices");
    if (i < 0) i += len;
    if (st > 0) return std::clamp<int64_t>(i, 0, len);
    return std::clamp<int64_t>(i, -1, len - 1);
  };
  const int64_t b = bound(start, st > 0 ? 0 : len - 1);
  const int64_t e = bound(stop, st > 0 ? len : -1);
  std::vector<size_t> indices;
  for (int64_t i = b; st > 0 ? i < e : i > e; i += st) indices.push_back(static_cast<size_t>(i));
  return indices;
}

int jinja_order(const Value& a, const Value& b, const std::string& op) {
  jinja_check_defined(a);
  jinja_check_defined(b);
  if (a.is_number() && b.is_number()) {
    const double x = a.as_double(), y = b.as_double();
    if (a.kind != Value::Kind::kFloat && b.kind != Value::Kind::kFloat) {
      const int64_t i = a.kind == Value::Kind::kBool ? a.boolean : a.integer;
      const int64_t j = b.kind == Value::Kind::kBool ? b.boolean : b.integer;
      return i < j ? -1 : i > j ? 1 : 0;
    }
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) return a.string < b.string ? -1 : a.string > b.string ? 1 : 0;
  if (a.is_list() && b.is_list()) {
    for (size_t i = 0; i < std::min(a.list->size(), b.list->size()); ++i) {
      if (!py_equal((*a.list)[i], (*b.list)[i])) return jinja_order((*a.list)[i], (*b.list)[i], op);
    }
    return a.list->size() < b.list->size() ? -1 : a.list->size() > b.list->size() ? 1 : 0;
  }
  jinja_type_error(message("'", op, "' not supported between instances of '", py_type_name(a),
                           "' and '", py_type_name(b), "'"));
}

}  // namespace

Value get_attr(const Value& object, const std::string& name) {
  switch (object.kind) {
    case Value::Kind::kUndefined: throw DataError(object.undefined_message);
    case Value::Kind::kDict: {
      if (jinja_is_dict_method(name)) return jinja_dict_method(object, name);
      if (jinja_is_unsupported_dict_method(name)) {
        throw ConfigError(message("the dict method '", name, "' is not supported"));
      }
      const Value* found = object.dict->find(name);
      if (found != nullptr) return *found;
      return Value::undefined(message("'dict object' has no attribute '", name, "'"));
    }
    case Value::Kind::kNamespace: {
      const Value* found = object.dict->find(name);
      if (found != nullptr) return *found;
      return Value::undefined(message("'Namespace object' has no attribute '", name, "'"));
    }
    case Value::Kind::kString: return jinja_str_method(object.string, name);
    case Value::Kind::kList: {
      static const std::set<std::string> methods = {"append", "extend",  "insert", "remove",
                                                    "pop",    "clear",   "index",  "count",
                                                    "sort",   "reverse", "copy"};
      if (methods.count(name) != 0)
        throw ConfigError(message("the list method '", name, "' is not supported"));
      return Value::undefined(message("'list object' has no attribute '", name, "'"));
    }
    case Value::Kind::kNone:
      return Value::undefined(message("'None' has no attribute '", name, "'"));
    default:
      return Value::undefined(
          message("'", py_type_name(object), " object' has no attribute '", name, "'"));
  }
}

Value get_item(const Value& object, const Value& key) {
  jinja_check_defined(object);
  if (object.is_dict()) {
    if (key.is_string()) {
      const Value* found = object.dict->find(key.string);
      if (found != nullptr) return *found;
      if (jinja_is_dict_method(key.string) || jinja_is_unsupported_dict_method(key.string)) {
        return get_attr(object, key.string);
      }
    }
    return Value::undefined(message("'dict object' has no attribute '", py_str(key), "'"));
  }
  if ((object.is_list() || object.is_string()) &&
      (key.kind == Value::Kind::kInt || key.kind == Value::Kind::kBool)) {
    const int64_t raw = jinja_int_of(key, "index");
    if (object.is_list()) {
      const int64_t n = static_cast<int64_t>(object.list->size());
      const int64_t i = raw < 0 ? raw + n : raw;
      if (i < 0 || i >= n) return Value::undefined(message("list object has no element ", raw));
      return (*object.list)[i];
    }
    const std::vector<uint32_t> cps = utf8_decode(object.string);
    const int64_t n = static_cast<int64_t>(cps.size());
    const int64_t i = raw < 0 ? raw + n : raw;
    if (i < 0 || i >= n) return Value::undefined(message("str object has no element ", raw));
    return Value::from_string(utf8_encode(cps, i, i + 1));
  }
  if (key.is_string()) return get_attr(object, key.string);
  return Value::undefined(
      message("'", py_type_name(object), " object' has no element ", py_repr(key)));
}

Value slice(const Value& object, const Value& start, const Value& stop, const Value& step) {
  jinja_check_defined(object);
  if (object.is_list()) {
    List out;
    for (const size_t i : jinja_slice_indices(object.list->size(), start, stop, step))
      out.push_back((*object.list)[i]);
    return Value::from_list(std::move(out), object.is_tuple);
  }
  if (object.is_string()) {
    const std::vector<uint32_t> cps = utf8_decode(object.string);
    std::string out;
    for (const size_t i : jinja_slice_indices(cps.size(), start, stop, step))
      utf8_append(&out, cps[i]);
    return Value::from_string(out);
  }
  jinja_type_error(message("'", py_type_name(object), "' object is not subscriptable"));
}

List iterate(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kUndefined: return {};
    case Value::Kind::kList: return *v.list;
    case Value::Kind::kDict: {
      List keys;
      for (const auto& item : v.dict->items) keys.push_back(Value::from_string(item.first));
      return keys;
    }
    case Value::Kind::kString: {
      List chars;
      const std::vector<uint32_t> cps = utf8_decode(v.string);
      for (size_t i = 0; i < cps.size(); ++i)
        chars.push_back(Value::from_string(utf8_encode(cps, i, i + 1)));
      return chars;
    }
    default: jinja_type_error(message("'", py_type_name(v), "' object is not iterable"));
  }
}

Value unary(const std::string& op, const Value& v) {
  jinja_check_defined(v);
  if (v.kind == Value::Kind::kFloat) return Value::from_float(op == "-" ? -v.number : v.number);
  if (v.is_number()) {
    const int64_t i = jinja_int_of(v, "operand");
    return Value::from_int(op == "-" ? -i : i);
  }
  jinja_type_error(message("bad operand type for unary ", op, ": '", py_type_name(v), "'"));
}

Value binary_op(const std::string& op, const Value& a, const Value& b) {
  if (op == "~") return Value::from_string(py_str(a) + py_str(b));
  jinja_check_defined(a);
  jinja_check_defined(b);
  const bool numbers = a.is_number() && b.is_number();
  const bool floats = numbers && (a.kind == Value::Kind::kFloat || b.kind == Value::Kind::kFloat);
  auto unsupported = [&]() -> Value {
    jinja_type_error(message("unsupported operand type(s) for ", op, ": '", py_type_name(a),
                             "' and '", py_type_name(b), "'"));
  };
  if (op == "+") {
    if (floats) return Value::from_float(a.as_double() + b.as_double());
    if (numbers) return Value::from_int(jinja_int_of(a, "") + jinja_int_of(b, ""));
    if (a.is_string() && b.is_string()) return Value::from_string(a.string + b.string);
    if (a.is_list() && b.is_list() && a.is_tuple == b.is_tuple) {
      List out = *a.list;
      out.insert(out.end(), b.list->begin(), b.list->end());
      return Value::from_list(std::move(out), a.is_tuple);
    }
    if (a.is_string())
      jinja_type_error(message("can only concatenate str (not \"", py_type_name(b), "\") to str"));
    if (a.is_list())
      jinja_type_error(message("can only concatenate ", py_type_name(a), " (not \"",
                               py_type_name(b), "\") to ", py_type_name(a)));
    return unsupported();
  }
  if (op == "*") {
    if (floats) return Value::from_float(a.as_double() * b.as_double());
    if (numbers) return Value::from_int(jinja_int_of(a, "") * jinja_int_of(b, ""));
    const Value* seq = a.is_number() ? &b : &a;
    const Value* count = a.is_number() ? &a : &b;
    if (count->kind == Value::Kind::kInt || count->kind == Value::Kind::kBool) {
      const int64_t n = jinja_int_of(*count, "");
      if (seq->is_string()) {
        std::string out;
        for (int64_t i = 0; i < n; ++i) out += seq->string;
        return Value::from_string(out);
      }
      if (seq->is_list()) {
        List out;
        for (int64_t i = 0; i < n; ++i) out.insert(out.end(), seq->list->begin(), seq->list->end());
        return Value::from_list(std::move(out), seq->is_tuple);
      }
    }
    return unsupported();
  }
  if (!numbers) {
    if (op == "%" && a.is_string())
      throw ConfigError("printf-style string formatting (%) is not supported");
    return unsupported();
  }
  if (op == "-") {
    if (floats) return Value::from_float(a.as_double() - b.as_double());
    return Value::from_int(jinja_int_of(a, "") - jinja_int_of(b, ""));
  }
  if (op == "/") {
    if (b.as_double() == 0) throw DataError("ZeroDivisionError: division by zero");
    return Value::from_float(a.as_double() / b.as_double());
  }
  if (op == "//" || op == "%") {
    if (b.as_double() == 0)
      throw DataError("ZeroDivisionError: integer division or modulo by zero");
    if (floats) {
      const double x = a.as_double(), y = b.as_double();
      const double q = std::floor(x / y);
      return Value::from_float(op == "//" ? q : x - q * y);
    }
    const int64_t x = jinja_int_of(a, ""), y = jinja_int_of(b, "");
    int64_t q = x / y;
    if ((x % y != 0) && ((x < 0) != (y < 0))) --q;
    return Value::from_int(op == "//" ? q : x - q * y);
  }
  if (op == "**") {
    if (!floats && jinja_int_of(b, "") >= 0) {
      int64_t result = 1;
      for (int64_t i = 0, x = jinja_int_of(a, ""); i < jinja_int_of(b, ""); ++i) result *= x;
      return Value::from_int(result);
    }
    return Value::from_float(std::pow(a.as_double(), b.as_double()));
  }
  return unsupported();
}

bool compare(const std::string& op, const Value& a, const Value& b) {
  if (op == "==") return py_equal(a, b);
  if (op == "!=") return !py_equal(a, b);
  if (op == "in" || op == "not in") {
    bool found = false;
    if (b.is_string()) {
      if (!a.is_string())
        jinja_type_error(
            message("'in <string>' requires string as left operand, not ", py_type_name(a)));
      found = b.string.find(a.string) != std::string::npos;
    } else if (b.is_list()) {
      found = std::any_of(b.list->begin(), b.list->end(),
                          [&](const Value& x) { return py_equal(a, x); });
    } else if (b.is_dict()) {
      found = a.is_string() && b.dict->find(a.string) != nullptr;
    } else if (b.is_undefined()) {
      found = false;  // Undefined iterates as empty
    } else {
      jinja_type_error(message("argument of type '", py_type_name(b), "' is not iterable"));
    }
    return op == "in" ? found : !found;
  }
  const int order = jinja_order(a, b, op);
  if (op == "<") return order < 0;
  if (op == "<=") return order <= 0;
  if (op == ">") return order > 0;
  return order >= 0;
}

namespace {

Value jinja_tojson(const Value& input, const Args& args) {
  JsonOptions options;
  const Value* ensure_ascii = jinja_arg(args, 0, "ensure_ascii");
  const Value* indent = jinja_arg(args, 1, "indent");
  const Value* separators = jinja_arg(args, 2, "separators");
  const Value* sort_keys = jinja_arg(args, 3, "sort_keys");
  options.ensure_ascii = ensure_ascii != nullptr && truthy(*ensure_ascii);
  options.sort_keys = sort_keys != nullptr && truthy(*sort_keys);
  if (indent != nullptr && !indent->is_none()) {
    options.has_indent = true;
    if (indent->is_string()) {
      options.indent = indent->string;
    } else {
      options.indent = std::string(
          static_cast<size_t>(std::max<int64_t>(0, jinja_int_of(*indent, "indent"))), ' ');
    }
  }
  if (separators != nullptr && !separators->is_none()) {
    if (!separators->is_list() || separators->list->size() != 2 ||
        !(*separators->list)[0].is_string() || !(*separators->list)[1].is_string()) {
      jinja_type_error("tojson separators must be a pair of strings");
    }
    options.item_sep = (*separators->list)[0].string;
    options.key_sep = (*separators->list)[1].string;
    // An empty separator is valid in Python; JsonOptions treats empty as "default", so keep a
    // marker-free path by refusing it rather than printing the default.
    if (options.item_sep.empty() || options.key_sep.empty())
      throw ConfigError("tojson with an empty separator is not supported");
  }
  return Value::from_string(py_json_dumps(input, options));
}

Value jinja_attribute_of(const Value& item, const std::string& attribute) {
  // Jinja's attribute arguments may name nested fields with dots ("function.name").
  Value v = item;
  size_t start = 0;
  while (true) {
    const size_t dot = attribute.find('.', start);
    const std::string part =
        attribute.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (!part.empty() && std::all_of(part.begin(), part.end(), ::isdigit)) {
      v = get_item(v, Value::from_int(std::stoll(part)));
    } else {
      v = get_item(v, Value::from_string(part));
    }
    if (dot == std::string::npos) return v;
    start = dot + 1;
  }
}

Value jinja_select(const std::string& name, const Value& input, Args& args) {
  const bool by_attr = name == "selectattr" || name == "rejectattr";
  const bool keep = name == "selectattr" || name == "select";
  size_t next = 0;
  std::string attribute;
  if (by_attr) {
    if (args.positional.empty() || !args.positional[0].is_string())
      jinja_type_error(name + " needs an attribute name");
    attribute = args.positional[0].string;
    next = 1;
  }
  std::string test;
  if (next < args.positional.size()) {
    if (!args.positional[next].is_string()) jinja_type_error(name + " needs a test name");
    test = args.positional[next].string;
    if (!is_known_test(test)) throw ConfigError(message("the test '", test, "' is not supported"));
    ++next;
  }
  Args test_args;
  test_args.positional.assign(args.positional.begin() + next, args.positional.end());
  test_args.keyword = args.keyword;
  List out;
  for (const auto& item : iterate(input)) {
    const Value subject = by_attr ? jinja_attribute_of(item, attribute) : item;
    const bool ok = test.empty() ? truthy(subject) : apply_test(test, subject, test_args);
    if (ok == keep) out.push_back(item);
  }
  return Value::from_list(std::move(out));
}

Value jinja_map(const Value& input, Args& args) {
  const Value* attribute = jinja_arg(args, SIZE_MAX, "attribute");
  List out;
  if (attribute != nullptr) {
    if (!attribute->is_string()) jinja_type_error("map attribute must be a string");
    const Value* fallback = jinja_arg(args, SIZE_MAX, "default");
    for (const auto& item : iterate(input)) {
      Value v = jinja_attribute_of(item, attribute->string);
      if (v.is_undefined() && fallback != nullptr) v = *fallback;
      out.push_back(std::move(v));
    }
    return Value::from_list(std::move(out));
  }
  if (args.positional.empty() || !args.positional[0].is_string())
    jinja_type_error("map needs a filter name or attribute=");
  const std::string filter = args.positional[0].string;
  if (!is_known_filter(filter))
    throw ConfigError(message("the filter '", filter, "' is not supported"));
  Args filter_args;
  filter_args.positional.assign(args.positional.begin() + 1, args.positional.end());
  filter_args.keyword = args.keyword;
  for (const auto& item : iterate(input)) out.push_back(apply_filter(filter, item, filter_args));
  return Value::from_list(std::move(out));
}

int64_t jinja_length(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kUndefined: return 0;
    case Value::Kind::kString: return static_cast<int64_t>(utf8_decode(v.string).size());
    case Value::Kind::kList: return static_cast<int64_t>(v.list->size());
    case Value::Kind::kDict: return static_cast<int64_t>(v.dict->items.size());
    default: jinja_type_error(message("object of type '", py_type_name(v), "' has no len()"));
  }
}

}  // namespace

Value apply_filter(const std::string& name, const Value& input, Args& args) {
  if (name == "tojson") return jinja_tojson(input, args);
  if (name == "safe") return input;
  if (name == "string") return Value::from_string(py_str(input));
  if (name == "length" || name == "count") return Value::from_int(jinja_length(input));
  if (name == "default" || name == "d") {
    const Value* fallback = jinja_arg(args, 0, "default_value");
    const Value* boolean = jinja_arg(args, 1, "boolean");
    const bool use =
        input.is_undefined() || (boolean != nullptr && truthy(*boolean) && !truthy(input));
    return use ? (fallback != nullptr ? *fallback : Value::from_string("")) : input;
  }
  if (name == "items") {
    if (input.is_undefined()) return Value::from_list({});
    if (!input.is_dict()) jinja_type_error("Can only get item pairs from a mapping.");
    return Value::from_list(jinja_items(*input.dict));
  }
  if (name == "list") return Value::from_list(iterate(input));
  if (name == "selectattr" || name == "rejectattr" || name == "select" || name == "reject") {
    return jinja_select(name, input, args);
  }
  if (name == "map") return jinja_map(input, args);
  if (name == "first" || name == "last") {
    List items = iterate(input);
    if (items.empty()) return Value::undefined(message("No ", name, " item, sequence was empty."));
    return name == "first" ? items.front() : items.back();
  }
  if (name == "join") {
    const Value* sep = jinja_arg(args, 0, "d");
    const Value* attribute = jinja_arg(args, 1, "attribute");
    std::string out;
    bool first = true;
    for (const auto& item : iterate(input)) {
      if (!first) out += sep != nullptr ? py_str(*sep) : "";
      first = false;
      out += py_str(attribute != nullptr ? jinja_attribute_of(item, py_str(*attribute)) : item);
    }
    return Value::from_string(out);
  }
  if (name == "reverse") {
    if (input.is_string()) {
      std::vector<uint32_t> cps = utf8_decode(input.string);
      std::reverse(cps.begin(), cps.end());
      return Value::from_string(utf8_encode(cps, 0, cps.size()));
    }
    List items = iterate(input);
    std::reverse(items.begin(), items.end());
    return Value::from_list(std::move(items));
  }
  if (name == "unique" || name == "sort") {
    const Value* case_arg = jinja_arg(args, name == "sort" ? 1 : 0, "case_sensitive");
    const bool case_sensitive = case_arg != nullptr && truthy(*case_arg);
    const Value* attribute = jinja_arg(args, name == "sort" ? 2 : 1, "attribute");
    auto key_of = [&](const Value& item) {
      Value key = attribute != nullptr ? jinja_attribute_of(item, py_str(*attribute)) : item;
      // Jinja compares strings case-insensitively unless told otherwise.
      if (key.is_string() && !case_sensitive && jinja_ascii(key.string)) {
        key = Value::from_string(jinja_case(key.string, "lower"));
      }
      return key;
    };
    List items = iterate(input);
    if (name == "unique") {
      List out, seen;
      for (const auto& item : items) {
        const Value key = key_of(item);
        if (std::none_of(seen.begin(), seen.end(),
                         [&](const Value& s) { return py_equal(s, key); })) {
          seen.push_back(key);
          out.push_back(item);
        }
      }
      return Value::from_list(std::move(out));
    }
    const Value* reverse = jinja_arg(args, 0, "reverse");
    std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
      return jinja_order(key_of(x), key_of(y), "<") < 0;
    });
    if (reverse != nullptr && truthy(*reverse)) std::reverse(items.begin(), items.end());
    return Value::from_list(std::move(items));
  }
  if (name == "trim") {
    const Value* chars = jinja_arg(args, 0, "chars");
    return Value::from_string(
        py_strip(py_str(input), chars != nullptr && chars->is_string() ? &chars->string : nullptr,
                 true, true));
  }
  if (name == "upper" || name == "lower" || name == "capitalize" || name == "title") {
    return Value::from_string(jinja_case(py_str(input), name));
  }
  if (name == "replace") {
    const Value* count = jinja_arg(args, 2, "count");
    return Value::from_string(py_replace(
        py_str(input), py_str(*jinja_arg(args, 0, "old")), py_str(*jinja_arg(args, 1, "new")),
        count == nullptr || count->is_none() ? -1 : jinja_int_of(*count, "count")));
  }
  if (name == "int" || name == "float") {
    const Value* fallback = jinja_arg(args, 0, "default");
    const Value dflt = fallback != nullptr
                           ? *fallback
                           : (name == "int" ? Value::from_int(0) : Value::from_float(0));
    if (input.is_number()) {
      return name == "int" ? Value::from_int(input.kind == Value::Kind::kFloat
                                                 ? static_cast<int64_t>(input.number)
                                                 : jinja_int_of(input, ""))
                           : Value::from_float(input.as_double());
    }
    if (input.is_string()) {
      const std::string text = py_strip(input.string, nullptr, true, true);
      char* end = nullptr;
      if (name == "int") {
        const long long v = std::strtoll(text.c_str(), &end, 10);
        if (!text.empty() && *end == '\0') return Value::from_int(v);
      } else {
        const double v = std::strtod(text.c_str(), &end);
        if (!text.empty() && *end == '\0') return Value::from_float(v);
      }
    }
    return dflt;
  }
  if (name == "abs") {
    if (input.kind == Value::Kind::kFloat) return Value::from_float(std::fabs(input.number));
    return Value::from_int(std::llabs(jinja_int_of(input, "abs() operand")));
  }
  if (name == "sum") {
    Value total = Value::from_int(0);
    const Value* attribute = jinja_arg(args, 0, "attribute");
    for (const auto& item : iterate(input)) {
      total = binary_op("+", total,
                        attribute != nullptr ? jinja_attribute_of(item, py_str(*attribute)) : item);
    }
    return total;
  }
  throw ConfigError(message("the filter '", name, "' is not supported"));
}

bool apply_test(const std::string& name, const Value& input, Args& args) {
  auto other = [&]() -> const Value& {
    if (args.positional.empty())
      jinja_type_error(message("the test '", name, "' needs an argument"));
    return args.positional[0];
  };
  if (name == "defined") return !input.is_undefined();
  if (name == "undefined") return input.is_undefined();
  if (name == "none") return input.is_none();
  if (name == "string") return input.is_string();
  if (name == "number") return input.is_number();
  if (name == "integer") return input.kind == Value::Kind::kInt;
  if (name == "float") return input.kind == Value::Kind::kFloat;
  if (name == "boolean") return input.kind == Value::Kind::kBool;
  if (name == "true") return input.kind == Value::Kind::kBool && input.boolean;
  if (name == "false") return input.kind == Value::Kind::kBool && !input.boolean;
  if (name == "mapping") return input.is_dict();
  if (name == "iterable")
    return input.is_undefined() || input.is_string() || input.is_list() || input.is_dict();
  if (name == "sequence") return input.is_string() || input.is_list() || input.is_dict();
  if (name == "callable") return input.kind == Value::Kind::kFunction;
  if (name == "equalto" || name == "eq" || name == "==") return py_equal(input, other());
  if (name == "ne" || name == "!=") return !py_equal(input, other());
  if (name == "lt" || name == "<" || name == "lessthan") return compare("<", input, other());
  if (name == "le" || name == "<=") return compare("<=", input, other());
  if (name == "gt" || name == ">" || name == "greaterthan") return compare(">", input, other());
  if (name == "ge" || name == ">=") return compare(">=", input, other());
  if (name == "in") return compare("in", input, other());
  if (name == "sameas") {
    const Value& o = other();
    if (input.kind != o.kind) return false;
    if (input.is_none() || input.is_undefined()) return true;
    if (input.kind == Value::Kind::kBool) return input.boolean == o.boolean;
    if (input.is_list()) return input.list == o.list;
    if (input.is_dict() || input.kind == Value::Kind::kNamespace) return input.dict == o.dict;
    throw ConfigError("'sameas' on numbers or strings (Python object identity) is not supported");
  }
  if (name == "odd" || name == "even") {
    const int64_t i = jinja_int_of(input, "odd/even operand");
    return ((i % 2 + 2) % 2 == 1) == (name == "odd");
  }
  if (name == "divisibleby") {
    const int64_t d = jinja_int_of(other(), "divisor");
    if (d == 0) throw DataError("ZeroDivisionError: integer division or modulo by zero");
    return jinja_int_of(input, "dividend") % d == 0;
  }
  if (name == "lower" || name == "upper") {
    if (!input.is_string()) return false;
    bool cased = false;
    for (const char c : input.string) {
      if (std::isalpha(static_cast<unsigned char>(c))) {
        cased = true;
        if (name == "lower" ? std::isupper(static_cast<unsigned char>(c))
                            : std::islower(static_cast<unsigned char>(c)))
          return false;
      }
    }
    if (!jinja_ascii(input.string))
      throw ConfigError("the tests 'lower'/'upper' on non-ASCII text are not supported");
    return cased;
  }
  throw ConfigError(message("the test '", name, "' is not supported"));
}

bool is_known_filter(const std::string& name) {
  static const std::set<std::string> names = {
      "tojson", "safe",       "string",     "length", "count",  "default", "d",     "items",
      "list",   "selectattr", "rejectattr", "select", "reject", "map",     "first", "last",
      "join",   "reverse",    "unique",     "sort",   "trim",   "upper",   "lower", "capitalize",
      "title",  "replace",    "int",        "float",  "abs",    "sum"};
  return names.count(name) != 0;
}

bool is_known_test(const std::string& name) {
  static const std::set<std::string> names = {
      "defined",  "undefined", "none",        "string",      "number",  "integer",
      "float",    "boolean",   "true",        "false",       "mapping", "iterable",
      "sequence", "callable",  "equalto",     "eq",          "==",      "ne",
      "!=",       "lt",        "<",           "lessthan",    "le",      "<=",
      "gt",       ">",         "greaterthan", "ge",          ">=",      "in",
      "sameas",   "odd",       "even",        "divisibleby", "lower",   "upper"};
  return names.count(name) != 0;
}

}  // namespace titan::jinja
