// Operators, attribute and item access, and the str and dict methods of the chat template engine
// (see chat_template_builtins.h).
// Each follows what Jinja2 3.1 does on Python objects, messages of its errors included, since a
// template that rejects a conversation must fail here as it fails in transformers.
#include "titan/components/tokenizer/chat_template_builtins.h"

#include "titan/common/check.h"
#include "titan/components/tokenizer/chat_template_ast.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>

namespace titan::jinja {

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

int64_t jinja_int_of(const Value& v, const char* what) {
  if (v.kind == Value::Kind::kInt) return v.integer;
  if (v.kind == Value::Kind::kBool) return v.boolean;
  jinja_type_error(message(what, " must be an integer, not '", py_type_name(v), "'"));
}

bool jinja_ascii(const std::string& s) {
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return static_cast<unsigned char>(c) < 0x80; });
}

// Whether a code point may change under Python's upper()/lower(): the scripts with case (Latin,
// Greek, Cyrillic, Armenian, Georgian, Cherokee, Glagolitic, Coptic, Deseret, fullwidth Latin...).
// Mapping them needs Unicode tables we lack, so text holding them is refused rather than mis-cased.
bool jinja_cased_non_ascii(uint32_t cp) {
  static const uint32_t kRanges[][2] = {
      {0xB5, 0xB5},       {0xC0, 0x2AF},      {0x345, 0x345},     {0x370, 0x58F},
      {0x10A0, 0x10FF},   {0x13A0, 0x13FF},   {0x1C80, 0x1CBF},   {0x1D00, 0x1DBF},
      {0x1E00, 0x1FFF},   {0x2100, 0x218F},   {0x24B6, 0x24E9},   {0x2C00, 0x2D2F},
      {0xA640, 0xA69F},   {0xA720, 0xA7FF},   {0xAB30, 0xABBF},   {0xFB00, 0xFB17},
      {0xFF21, 0xFF5A},   {0x10400, 0x104FF}, {0x10570, 0x105BF}, {0x10C80, 0x10CFF},
      {0x118A0, 0x118FF}, {0x16E40, 0x16E9F}, {0x1E900, 0x1E95F}};
  for (const auto& range : kRanges) {
    if (cp >= range[0] && cp <= range[1]) return true;
  }
  return false;
}

// Case mapping (upper, lower, capitalize, str.title) of text whose only cased letters are ASCII;
// CJK, digits, emoji and punctuation pass through unchanged, as in Python.
std::string jinja_case(const std::string& s, const std::string& how) {
  if (!jinja_ascii(s)) {
    for (const uint32_t cp : utf8_decode(s)) {
      if (cp >= 0x80 && jinja_cased_non_ascii(cp)) {
        throw ConfigError(message("'", how, "' of text with non-ASCII letters is not supported"));
      }
    }
  }
  auto up = [](char c) { return c >= 'a' && c <= 'z' ? static_cast<char>(c - 32) : c; };
  auto down = [](char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c + 32) : c; };
  std::string out = s;
  bool word_start = true;
  for (size_t i = 0; i < out.size(); ++i) {
    const char c = out[i];
    if (how == "upper") {
      out[i] = up(c);
    } else if (how == "lower") {
      out[i] = down(c);
    } else if (how == "capitalize") {
      out[i] = i == 0 ? up(c) : down(c);
    } else {  // str.title(): a letter after an uncased character starts a word
      out[i] = word_start ? up(c) : down(c);
      word_start = !std::isalpha(static_cast<unsigned char>(c));
    }
  }
  return out;
}

// markupsafe.escape, which Markup + str applies to the str.
std::string jinja_html_escape(const std::string& s) {
  std::string out;
  for (const char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

List jinja_items(const Dict& dict) {
  List items;
  for (const auto& item : dict.items) {
    items.push_back(
        Value::from_list({dict.key_at(static_cast<size_t>(&item - dict.items.data())), item.second},
                         /*is_tuple=*/true));
  }
  return items;
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
  if (a.is_sequence() && b.is_sequence()) {
    for (size_t i = 0; i < std::min(a.list->size(), b.list->size()); ++i) {
      if (!py_equal((*a.list)[i], (*b.list)[i])) return jinja_order((*a.list)[i], (*b.list)[i], op);
    }
    return a.list->size() < b.list->size() ? -1 : a.list->size() > b.list->size() ? 1 : 0;
  }
  jinja_type_error(message("'", op, "' not supported between instances of '", py_type_name(a),
                           "' and '", py_type_name(b), "'"));
}

namespace {

const std::string& jinja_string_arg(const Args& args, size_t position, const char* name,
                                    const char* what) {
  const Value* v = jinja_arg(args, position, name);
  if (v == nullptr || !v->is_string())
    jinja_type_error(message(what, "() needs a string for '", name, "'"));
  return v->string;
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
      List candidates = p->is_sequence() ? *p->list : List{*p};
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

Value jinja_dict_method(const Value& object, const std::string& name) {
  std::shared_ptr<Dict> dict = object.dict;
  if (name == "items")
    return jinja_bound(
        [dict](Args&) { return Value::from_iterator(jinja_items(*dict), "dict_items"); });
  if (name == "keys" || name == "values") {
    const bool keys = name == "keys";
    return jinja_bound([dict, keys](Args&) {
      List out;
      for (const auto& item : dict->items)
        out.push_back(keys ? dict->key_at(static_cast<size_t>(&item - dict->items.data()))
                           : item.second);
      return Value::from_iterator(std::move(out), keys ? "dict_keys" : "dict_values");
    });
  }
  return jinja_bound([dict](Args& args) {
    const Value* key = jinja_arg(args, 0, "key");
    const Value* fallback = jinja_arg(args, 1, "default");
    if (key == nullptr) jinja_type_error("get expected at least 1 argument, got 0");
    const Value* found = dict->find(Dict::encode_key(*key));
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

}  // namespace

Value get_attr(const Value& object, const std::string& name) {
  switch (object.kind) {
    case Value::Kind::kUndefined: throw DataError(object.undefined_message);
    case Value::Kind::kDict: {
      if (jinja_is_dict_method(name)) return jinja_dict_method(object, name);
      if (jinja_is_unsupported_dict_method(name)) {
        if (name == "copy" || name == "fromkeys") {
          throw ConfigError(message("the dict method '", name, "' is not supported"));
        }
        return Value::undefined(
            message("access to attribute '", name, "' of 'dict' object is unsafe."));
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
      if (name == "index" || name == "count") {
        std::shared_ptr<const List> list = object.list;
        const bool index = name == "index";
        return jinja_bound([list, index](Args& args) {
          const Value* x = jinja_arg(args, 0, "value");
          if (x == nullptr || args.positional.size() > 1) {
            throw ConfigError("list.index/count take exactly one value here");
          }
          int64_t count = 0;
          for (size_t i = 0; i < list->size(); ++i) {
            if (!py_equal((*list)[i], *x)) continue;
            if (index) return Value::from_int(static_cast<int64_t>(i));
            ++count;
          }
          if (index) throw DataError(message("ValueError: ", py_repr(*x), " is not in list"));
          return Value::from_int(count);
        });
      }
      static const std::set<std::string> mutating = {"append", "extend", "insert", "remove",
                                                     "pop",    "clear",  "sort",   "reverse"};
      if (mutating.count(name) != 0) {
        // transformers' sandbox is immutable: the attribute is an undefined value whose use fails.
        return Value::undefined(message("access to attribute '", name, "' of '",
                                        py_type_name(object), "' object is unsafe."));
      }
      if (name == "copy") throw ConfigError("the list method 'copy' is not supported");
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
  if (object.is_list() && !object.is_sequence()) {
    if (key.is_string()) return get_attr(object, key.string);
    jinja_type_error(message("'", object.iterator_type, "' object is not subscriptable"));
  }
  if (object.is_dict()) {
    const bool hashable = !key.is_list() && !key.is_dict() && key.kind != Value::Kind::kNamespace &&
                          key.kind != Value::Kind::kFunction && !key.is_undefined();
    const Value* found = hashable ? object.dict->find(Dict::encode_key(key)) : nullptr;
    if (found != nullptr) return *found;
    if (key.is_string() &&
        (jinja_is_dict_method(key.string) || jinja_is_unsupported_dict_method(key.string))) {
      return get_attr(object, key.string);
    }
    return Value::undefined(message("'dict object' has no attribute ", py_repr(key)));
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
  if (object.is_list() && !object.is_sequence()) {
    jinja_type_error(message("'", object.iterator_type, "' object is not subscriptable"));
  }
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
    case Value::Kind::kList:
      if (v.is_one_shot()) {
        // A generator yields its items once; a second loop over it sees nothing.
        if (*v.consumed) return {};
        *v.consumed = true;
      }
      return *v.list;
    case Value::Kind::kDict: {
      List keys;
      for (size_t i = 0; i < v.dict->items.size(); ++i) keys.push_back(v.dict->key_at(i));
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

// Python's printf-style `format % args` (what Jinja's format filter and `%` on strings do): a
// tuple supplies the arguments in order, a dict supplies %(name)s fields, anything else is the one
// argument.
Value jinja_percent_format(const std::string& format, const Value& args) {
  List positional;
  const Dict* mapping = nullptr;
  if (args.is_sequence() && args.is_tuple) {
    positional = *args.list;
  } else if (args.is_dict()) {
    mapping = args.dict.get();
    positional.push_back(args);
  } else {
    positional.push_back(args);
  }
  size_t next = 0;
  std::string out;
  for (size_t i = 0; i < format.size(); ++i) {
    if (format[i] != '%') {
      out += format[i];
      continue;
    }
    if (++i >= format.size()) throw DataError("ValueError: incomplete format");
    const Value* arg = nullptr;
    if (format[i] == '(') {
      const size_t close = format.find(')', i);
      if (close == std::string::npos || mapping == nullptr) {
        jinja_type_error("format requires a mapping");
      }
      arg = mapping->find(format.substr(i + 1, close - i - 1));
      if (arg == nullptr)
        throw DataError(message("KeyError: '", format.substr(i + 1, close - i - 1), "'"));
      i = close + 1;
    }
    std::string flags;
    while (i < format.size() && std::strchr("-+ #0", format[i]) != nullptr) flags += format[i++];
    std::string width, precision;
    while (i < format.size() && std::isdigit(static_cast<unsigned char>(format[i])))
      width += format[i++];
    if (i < format.size() && format[i] == '.') {
      precision = ".";
      ++i;
      while (i < format.size() && std::isdigit(static_cast<unsigned char>(format[i])))
        precision += format[i++];
    }
    if (i < format.size() && format[i] == '*')
      throw ConfigError("'*' widths in % formatting are not supported");
    if (i >= format.size()) throw DataError("ValueError: incomplete format");
    const char conv = format[i];
    if (conv == '%') {
      out += '%';
      continue;
    }
    if (arg == nullptr) {
      if (next >= positional.size()) jinja_type_error("not enough arguments for format string");
      arg = &positional[next++];
    }
    std::string piece;
    if (conv == 's' || conv == 'r' || conv == 'a') {
      std::vector<uint32_t> cps = utf8_decode(conv == 's' ? py_str(*arg) : py_repr(*arg));
      if (precision.size() > 1)
        cps.resize(std::min<size_t>(cps.size(), std::stoul(precision.substr(1))));
      piece = utf8_encode(cps, 0, cps.size());
      const size_t w = width.empty() ? 0 : std::stoul(width);
      if (cps.size() < w) {
        const std::string pad(w - cps.size(), ' ');
        piece = flags.find('-') != std::string::npos ? piece + pad : pad + piece;
      }
    } else if (std::strchr("diouxXeEfFgGc", conv) != nullptr) {
      if (!arg->is_number()) {
        jinja_type_error(
            message("%", conv, " format: a real number is required, not ", py_type_name(*arg)));
      }
      const std::string spec = "%" + flags + width + precision;
      char buffer[512];
      if (std::strchr("diouxXc", conv) != nullptr) {
        const long long v = arg->kind == Value::Kind::kFloat ? static_cast<long long>(arg->number)
                                                             : jinja_int_of(*arg, "");
        if (conv == 'c') throw ConfigError("%c in % formatting is not supported");
        const std::string c_spec = spec + "ll" + (conv == 'i' || conv == 'u' ? 'd' : conv);
        std::snprintf(buffer, sizeof(buffer), c_spec.c_str(), v);
      } else {
        std::snprintf(buffer, sizeof(buffer), (spec + conv).c_str(), arg->as_double());
      }
      piece = buffer;
    } else {
      throw DataError(message("ValueError: unsupported format character '", conv, "'"));
    }
    out += piece;
  }
  if (mapping == nullptr && next < positional.size()) {
    jinja_type_error("not all arguments converted during string formatting");
  }
  return Value::from_string(out);
}

namespace {

// Python ints never overflow; ours are 64-bit, so a result beyond them is refused.
Value jinja_checked(const std::string& op, int64_t x, int64_t y) {
  int64_t r = 0;
  const bool overflow = op == "+"   ? __builtin_add_overflow(x, y, &r)
                        : op == "-" ? __builtin_sub_overflow(x, y, &r)
                                    : __builtin_mul_overflow(x, y, &r);
  if (overflow) throw ConfigError("integer arithmetic beyond 64 bits is not supported");
  return Value::from_int(r);
}

}  // namespace

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
    if (numbers) return jinja_checked(op, jinja_int_of(a, ""), jinja_int_of(b, ""));
    if (a.is_string() && b.is_string()) {
      if (a.is_markup == b.is_markup) {
        Value out = Value::from_string(a.string + b.string);
        out.is_markup = a.is_markup;
        return out;
      }
      Value out = Value::from_string(a.is_markup ? a.string + jinja_html_escape(b.string)
                                                 : jinja_html_escape(a.string) + b.string);
      out.is_markup = true;
      return out;
    }
    if (a.is_sequence() && b.is_sequence() && a.is_tuple == b.is_tuple) {
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
    if (numbers) return jinja_checked(op, jinja_int_of(a, ""), jinja_int_of(b, ""));
    const Value* seq = a.is_number() ? &b : &a;
    const Value* count = a.is_number() ? &a : &b;
    if (count->kind == Value::Kind::kInt || count->kind == Value::Kind::kBool) {
      const int64_t n = jinja_int_of(*count, "");
      if (seq->is_string()) {
        std::string out;
        for (int64_t i = 0; i < n; ++i) out += seq->string;
        return Value::from_string(out);
      }
      if (seq->is_sequence()) {
        List out;
        for (int64_t i = 0; i < n; ++i) out.insert(out.end(), seq->list->begin(), seq->list->end());
        return Value::from_list(std::move(out), seq->is_tuple);
      }
    }
    return unsupported();
  }
  if (!numbers) {
    if (op == "%" && a.is_string()) return jinja_percent_format(a.string, b);
    return unsupported();
  }
  if (op == "-") {
    if (floats) return Value::from_float(a.as_double() - b.as_double());
    return jinja_checked(op, jinja_int_of(a, ""), jinja_int_of(b, ""));
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
      const int64_t base = jinja_int_of(a, ""), n = jinja_int_of(b, "");
      if (base == 0 || base == 1) return Value::from_int(n == 0 ? 1 : base);
      if (base == -1) return Value::from_int(n % 2 == 0 ? 1 : -1);
      Value result = Value::from_int(1);
      for (int64_t i = 0; i < n; ++i) {
        result = jinja_checked("*", result.integer, base);
      }
      return result;
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
      found = b.dict->find(Dict::encode_key(a)) != nullptr;
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

}  // namespace titan::jinja
