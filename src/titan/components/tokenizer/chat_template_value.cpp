// Values of the chat template engine and Python's way of showing them (see chat_template_value.h).
#include "titan/components/tokenizer/chat_template_value.h"

#include "titan/common/check.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace titan::jinja {

const Value* Dict::find(const std::string& key) const {
  for (const auto& item : items) {
    if (item.first == key) return &item.second;
  }
  return nullptr;
}

void Dict::set(const std::string& key, Value value) {
  for (auto& item : items) {
    if (item.first == key) {
      item.second = std::move(value);
      return;
    }
  }
  if (!typed_keys.empty()) typed_keys.push_back(Value::from_string(key));
  items.emplace_back(key, std::move(value));
}

std::string Dict::encode_key(const Value& key) {
  // \x1f cannot start a key a template writes as a string, so encodings never collide with one.
  switch (key.kind) {
    case Value::Kind::kString: return key.string;
    case Value::Kind::kNone: return "\x1fNone";
    case Value::Kind::kBool: return "\x1f" + std::to_string(key.boolean ? 1 : 0);
    case Value::Kind::kInt: return "\x1f" + std::to_string(key.integer);
    case Value::Kind::kFloat:
      if (key.number == std::floor(key.number) && std::fabs(key.number) < 9.2e18) {
        return "\x1f" + std::to_string(static_cast<int64_t>(key.number));
      }
      return "\x1f" + py_float_repr(key.number);
    default: throw DataError(message("TypeError: unhashable type: '", py_type_name(key), "'"));
  }
}

void Dict::set_typed(const Value& key, Value value) {
  const std::string encoded = encode_key(key);
  for (auto& item : items) {
    if (item.first == encoded) {
      item.second = std::move(value);  // Python keeps the first key object
      return;
    }
  }
  if (typed_keys.empty() && !key.is_string()) {
    // The first non-string key: from now on every key is kept as itself.
    for (const auto& item : items) typed_keys.push_back(Value::from_string(item.first));
    typed_keys.push_back(key);
  } else if (!typed_keys.empty()) {
    typed_keys.push_back(key);
  }
  items.emplace_back(encoded, std::move(value));
}

Value Dict::key_at(size_t i) const {
  return typed_keys.empty() ? Value::from_string(items[i].first) : typed_keys[i];
}

Value Value::undefined(std::string message) {
  Value v;
  v.undefined_message = std::move(message);
  return v;
}

Value Value::none() {
  Value v;
  v.kind = Kind::kNone;
  return v;
}

Value Value::from_bool(bool b) {
  Value v;
  v.kind = Kind::kBool;
  v.boolean = b;
  return v;
}

Value Value::from_int(int64_t i) {
  Value v;
  v.kind = Kind::kInt;
  v.integer = i;
  return v;
}

Value Value::from_float(double d) {
  Value v;
  v.kind = Kind::kFloat;
  v.number = d;
  return v;
}

Value Value::from_string(std::string s) {
  Value v;
  v.kind = Kind::kString;
  v.string = std::move(s);
  return v;
}

Value Value::from_list(List items, bool is_tuple) {
  Value v;
  v.kind = Kind::kList;
  v.list = std::make_shared<const List>(std::move(items));
  v.is_tuple = is_tuple;
  return v;
}

Value Value::from_iterator(List items, std::string type) {
  Value v = from_list(std::move(items));
  v.iterator_type = std::move(type);
  v.consumed = std::make_shared<bool>(false);
  return v;
}

Value Value::from_dict(Dict dict) {
  Value v;
  v.kind = Kind::kDict;
  v.dict = std::make_shared<Dict>(std::move(dict));
  return v;
}

Value Value::new_namespace(Dict attrs) {
  Value v;
  v.kind = Kind::kNamespace;
  v.dict = std::make_shared<Dict>(std::move(attrs));
  return v;
}

Value Value::from_function(Function fn) {
  Value v;
  v.kind = Kind::kFunction;
  v.function = std::make_shared<const Function>(std::move(fn));
  return v;
}

Value Value::from_json(const nlohmann::ordered_json& json) {
  switch (json.type()) {
    case nlohmann::ordered_json::value_t::null: return none();
    case nlohmann::ordered_json::value_t::boolean: return from_bool(json.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return from_int(json.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const uint64_t u = json.get<uint64_t>();
      TITAN_CONFIG_CHECK(u <= static_cast<uint64_t>(INT64_MAX), "chat template input: integer ", u,
                         " does not fit in 64 bits");
      return from_int(static_cast<int64_t>(u));
    }
    case nlohmann::ordered_json::value_t::number_float: return from_float(json.get<double>());
    case nlohmann::ordered_json::value_t::string: return from_string(json.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      List items;
      items.reserve(json.size());
      for (const auto& item : json) items.push_back(from_json(item));
      return from_list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      Dict dict;
      dict.items.reserve(json.size());
      for (const auto& item : json.items())
        dict.items.emplace_back(item.key(), from_json(item.value()));
      return from_dict(std::move(dict));
    }
    default:
      throw ConfigError("chat template input: binary or discarded JSON values are not supported");
  }
}

double Value::as_double() const {
  if (kind == Kind::kFloat) return number;
  if (kind == Kind::kBool) return boolean ? 1 : 0;
  return static_cast<double>(integer);
}

std::string py_type_name(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kUndefined: return "Undefined";
    case Value::Kind::kNone: return "NoneType";
    case Value::Kind::kBool: return "bool";
    case Value::Kind::kInt: return "int";
    case Value::Kind::kFloat: return "float";
    case Value::Kind::kString: return v.is_markup ? "Markup" : "str";
    case Value::Kind::kList:
      if (!v.iterator_type.empty()) return v.iterator_type;
      return v.is_tuple ? "tuple" : "list";
    case Value::Kind::kDict: return "dict";
    case Value::Kind::kNamespace: return "Namespace";
    case Value::Kind::kFunction: return "function";
  }
  return "object";
}

bool truthy(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone: return false;
    case Value::Kind::kBool: return v.boolean;
    case Value::Kind::kInt: return v.integer != 0;
    case Value::Kind::kFloat: return v.number != 0;
    case Value::Kind::kString: return !v.string.empty();
    case Value::Kind::kList: return v.is_one_shot() || !v.list->empty();
    case Value::Kind::kDict: return !v.dict->items.empty();
    default: return true;
  }
}

// repr(float): the shortest digits that read back as the same double, laid out fixed between
// 1e-4 and 1e16 and in exponent form elsewhere, as Python's float_repr_style 'short' does.
std::string py_float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buffer[64];
  int precision = 1;
  for (; precision <= 17; ++precision) {
    std::snprintf(buffer, sizeof(buffer), "%.*e", precision - 1, d);
    if (std::strtod(buffer, nullptr) == d) break;
  }
  std::string text(buffer);
  const bool negative = text[0] == '-';
  if (negative) text.erase(0, 1);
  const size_t e_pos = text.find('e');
  const int exponent = std::atoi(text.c_str() + e_pos + 1);
  std::string digits;
  for (size_t i = 0; i < e_pos; ++i) {
    if (text[i] != '.') digits += text[i];
  }
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  std::string out;
  if (exponent >= -4 && exponent < 16) {
    if (exponent >= 0) {
      std::string int_part = digits.substr(0, std::min<size_t>(digits.size(), exponent + 1));
      while (static_cast<int>(int_part.size()) < exponent + 1) int_part += '0';
      std::string frac =
          digits.size() > static_cast<size_t>(exponent + 1) ? digits.substr(exponent + 1) : "0";
      out = int_part + "." + frac;
    } else {
      out = "0." + std::string(-exponent - 1, '0') + digits;
    }
  } else {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char exp_text[16];
    std::snprintf(exp_text, sizeof(exp_text), "e%c%02d", exponent < 0 ? '-' : '+',
                  std::abs(exponent));
    out += exp_text;
  }
  return negative ? "-" + out : out;
}

namespace {

// Whether repr() escapes a code point: Python escapes what str.isprintable() rejects, the
// categories Cc, Cf, Cs, Co, Cn, Zl, Zp and Zs other than the space. Listed here: the controls,
// separators, common format characters and private use areas (unassigned code points are not).
bool jinja_unprintable(uint32_t cp) {
  if (cp < 0x20 || (cp >= 0x7F && cp < 0xA0)) return true;
  static const uint32_t kRanges[][2] = {
      {0xA0, 0xA0},       {0xAD, 0xAD},       {0x600, 0x605},     {0x61C, 0x61C},
      {0x6DD, 0x6DD},     {0x70F, 0x70F},     {0x1680, 0x1680},   {0x180E, 0x180E},
      {0x2000, 0x200F},   {0x2028, 0x202F},   {0x205F, 0x2064},   {0x2066, 0x206F},
      {0x3000, 0x3000},   {0xD800, 0xF8FF},   {0xFEFF, 0xFEFF},   {0xFFF9, 0xFFFB},
      {0x110BD, 0x110BD}, {0x1BCA0, 0x1BCA3}, {0x1D173, 0x1D17A}, {0xE0001, 0xE0001},
      {0xE0020, 0xE007F}, {0xF0000, 0x10FFFF}};
  for (const auto& range : kRanges) {
    if (cp >= range[0] && cp <= range[1]) return true;
  }
  return false;
}

void jinja_repr_string(const std::string& s, std::string* out) {
  const bool has_single = s.find('\'') != std::string::npos;
  const bool has_double = s.find('"') != std::string::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  *out += quote;
  for (const uint32_t c : utf8_decode(s)) {
    if (c == static_cast<uint32_t>(quote) || c == '\\') {
      *out += '\\';
      *out += static_cast<char>(c);
    } else if (c == '\n') {
      *out += "\\n";
    } else if (c == '\r') {
      *out += "\\r";
    } else if (c == '\t') {
      *out += "\\t";
    } else if (jinja_unprintable(c)) {
      char hex[16];
      if (c <= 0xFF) {
        std::snprintf(hex, sizeof(hex), "\\x%02x", c);
      } else if (c <= 0xFFFF) {
        std::snprintf(hex, sizeof(hex), "\\u%04x", c);
      } else {
        std::snprintf(hex, sizeof(hex), "\\U%08x", c);
      }
      *out += hex;
    } else {
      utf8_append(out, c);
    }
  }
  *out += quote;
}

void jinja_repr(const Value& v, std::string* out) {
  switch (v.kind) {
    case Value::Kind::kString: jinja_repr_string(v.string, out); return;
    case Value::Kind::kList: {
      if (v.is_one_shot()) {
        // Python prints "<generator object ... at 0x...>", an address no renderer can reproduce.
        throw ConfigError(message("printing a ", v.iterator_type, " (add |list) is not supported"));
      }
      if (!v.iterator_type.empty()) {
        *out += v.iterator_type + "(";
        jinja_repr(Value::from_list(*v.list), out);
        *out += ')';
        return;
      }
      *out += v.is_tuple ? '(' : '[';
      for (size_t i = 0; i < v.list->size(); ++i) {
        if (i > 0) *out += ", ";
        jinja_repr((*v.list)[i], out);
      }
      if (v.is_tuple && v.list->size() == 1) *out += ',';
      *out += v.is_tuple ? ')' : ']';
      return;
    }
    case Value::Kind::kDict: {
      *out += '{';
      bool first = true;
      for (const auto& item : v.dict->items) {
        if (!first) *out += ", ";
        first = false;
        jinja_repr(v.dict->key_at(static_cast<size_t>(&item - v.dict->items.data())), out);
        *out += ": ";
        jinja_repr(item.second, out);
      }
      *out += '}';
      return;
    }
    case Value::Kind::kNamespace: {
      *out += "<Namespace ";
      jinja_repr(Value::from_dict(*v.dict), out);
      *out += '>';
      return;
    }
    default: *out += py_str(v);
  }
}

}  // namespace

std::string py_str(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kUndefined: return "";
    case Value::Kind::kNone: return "None";
    case Value::Kind::kBool: return v.boolean ? "True" : "False";
    case Value::Kind::kInt: return std::to_string(v.integer);
    case Value::Kind::kFloat: return py_float_repr(v.number);
    case Value::Kind::kString: return v.string;
    case Value::Kind::kFunction:
      // Python would print "<built-in method ...>", an address no renderer can reproduce.
      throw ConfigError("printing a function or method (call it with ()) is not supported");
    default: {
      std::string out;
      jinja_repr(v, &out);
      return out;
    }
  }
}

std::string py_repr(const Value& v) {
  std::string out;
  jinja_repr(v, &out);
  return out;
}

bool py_equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind != Value::Kind::kFloat && b.kind != Value::Kind::kFloat) {
      const int64_t x = a.kind == Value::Kind::kBool ? a.boolean : a.integer;
      const int64_t y = b.kind == Value::Kind::kBool ? b.boolean : b.integer;
      return x == y;
    }
    return a.as_double() == b.as_double();
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone: return true;
    case Value::Kind::kString: return a.string == b.string;
    case Value::Kind::kList: {
      if (!a.iterator_type.empty() || !b.iterator_type.empty()) return a.list == b.list;
      if (a.list->size() != b.list->size()) return false;
      for (size_t i = 0; i < a.list->size(); ++i) {
        if (!py_equal((*a.list)[i], (*b.list)[i])) return false;
      }
      return true;
    }
    case Value::Kind::kDict: {
      if (a.dict->items.size() != b.dict->items.size()) return false;
      for (const auto& item : a.dict->items) {
        const Value* other = b.dict->find(item.first);
        if (other == nullptr || !py_equal(item.second, *other)) return false;
      }
      return true;
    }
    default: return a.dict == b.dict && a.function == b.function;
  }
}

namespace {

void jinja_json_string(const std::string& s, bool ensure_ascii, std::string* out) {
  *out += '"';
  auto escape_unit = [out](uint32_t unit) {
    char hex[16];
    std::snprintf(hex, sizeof(hex), "\\u%04x", unit);
    *out += hex;
  };
  if (!ensure_ascii) {
    for (const unsigned char c : s) {
      switch (c) {
        case '"': *out += "\\\""; break;
        case '\\': *out += "\\\\"; break;
        case '\n': *out += "\\n"; break;
        case '\r': *out += "\\r"; break;
        case '\t': *out += "\\t"; break;
        case '\b': *out += "\\b"; break;
        case '\f': *out += "\\f"; break;
        default:
          if (c < 0x20) {
            escape_unit(c);
          } else {
            *out += static_cast<char>(c);
          }
      }
    }
  } else {
    for (const uint32_t cp : utf8_decode(s)) {
      if (cp < 0x80) {
        std::string one(1, static_cast<char>(cp));
        std::string escaped;
        jinja_json_string(one, false, &escaped);
        *out += escaped.substr(1, escaped.size() - 2);
      } else if (cp < 0x10000) {
        escape_unit(cp);
      } else {
        const uint32_t v = cp - 0x10000;
        escape_unit(0xD800 + (v >> 10));
        escape_unit(0xDC00 + (v & 0x3FF));
      }
    }
  }
  *out += '"';
}

void jinja_json(const Value& v, const JsonOptions& o, int depth, std::string* out) {
  const std::string item_sep = o.has_separators ? o.item_sep : (o.has_indent ? "," : ", ");
  const std::string key_sep = o.has_separators ? o.key_sep : ": ";
  auto newline = [&](int level) {
    if (!o.has_indent) return;
    *out += '\n';
    for (int i = 0; i < level; ++i) *out += o.indent;
  };
  switch (v.kind) {
    case Value::Kind::kNone: *out += "null"; return;
    case Value::Kind::kBool: *out += v.boolean ? "true" : "false"; return;
    case Value::Kind::kInt: *out += std::to_string(v.integer); return;
    case Value::Kind::kFloat:
      if (std::isnan(v.number)) {
        *out += "NaN";
      } else if (std::isinf(v.number)) {
        *out += v.number > 0 ? "Infinity" : "-Infinity";
      } else {
        *out += py_float_repr(v.number);
      }
      return;
    case Value::Kind::kString: jinja_json_string(v.string, o.ensure_ascii, out); return;
    case Value::Kind::kList: {
      if (!v.iterator_type.empty()) {
        throw DataError(
            message("TypeError: Object of type ", v.iterator_type, " is not JSON serializable"));
      }
      if (v.list->empty()) {
        *out += "[]";
        return;
      }
      *out += '[';
      for (size_t i = 0; i < v.list->size(); ++i) {
        if (i > 0) *out += item_sep;
        newline(depth + 1);
        jinja_json((*v.list)[i], o, depth + 1, out);
      }
      newline(depth);
      *out += ']';
      return;
    }
    case Value::Kind::kDict: {
      if (v.dict->items.empty()) {
        *out += "{}";
        return;
      }
      // json.dumps writes keys as strings: 512 -> "512", True -> "true", None -> "null".
      std::vector<std::pair<std::string, const Value*>> items;
      for (size_t i = 0; i < v.dict->items.size(); ++i) {
        const Value key = v.dict->key_at(i);
        std::string text;
        if (key.is_string()) {
          text = key.string;
        } else if (key.kind == Value::Kind::kBool) {
          text = key.boolean ? "true" : "false";
        } else if (key.is_none()) {
          text = "null";
        } else {
          text = py_str(key);
        }
        items.emplace_back(std::move(text), &v.dict->items[i].second);
      }
      if (o.sort_keys) {
        if (!v.dict->typed_keys.empty()) {
          throw ConfigError(
              "tojson(sort_keys=true) of a dict with non-string keys is not supported");
        }
        std::stable_sort(items.begin(), items.end(),
                         [](const auto& a, const auto& b) { return a.first < b.first; });
      }
      *out += '{';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0) *out += item_sep;
        newline(depth + 1);
        jinja_json_string(items[i].first, o.ensure_ascii, out);
        *out += key_sep;
        jinja_json(*items[i].second, o, depth + 1, out);
      }
      newline(depth);
      *out += '}';
      return;
    }
    default:
      throw DataError(message("Object of type ", py_type_name(v), " is not JSON serializable"));
  }
}

}  // namespace

std::string py_json_dumps(const Value& v, const JsonOptions& options) {
  std::string out;
  jinja_json(v, options, 0, &out);
  return out;
}

std::vector<uint32_t> utf8_decode(const std::string& s) {
  std::vector<uint32_t> cps;
  cps.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = s[i];
    int extra = c < 0x80 ? 0 : c < 0xE0 ? 1 : c < 0xF0 ? 2 : 3;
    uint32_t cp = extra == 0 ? c : extra == 1 ? (c & 0x1F) : extra == 2 ? (c & 0x0F) : (c & 0x07);
    if (c >= 0x80 && c < 0xC0) extra = 0, cp = c;  // a stray continuation byte stands alone
    size_t j = i + 1;
    for (int k = 0; k < extra && j < s.size(); ++k, ++j) cp = (cp << 6) | (s[j] & 0x3F);
    cps.push_back(cp);
    i = j;
  }
  return cps;
}

void utf8_append(std::string* out, uint32_t cp) {
  if (cp < 0x80) {
    *out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    *out += static_cast<char>(0xC0 | (cp >> 6));
    *out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    *out += static_cast<char>(0xE0 | (cp >> 12));
    *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    *out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    *out += static_cast<char>(0xF0 | (cp >> 18));
    *out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    *out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

std::string utf8_encode(const std::vector<uint32_t>& cps, size_t begin, size_t end) {
  std::string out;
  for (size_t i = begin; i < end; ++i) utf8_append(&out, cps[i]);
  return out;
}

// str.isspace(): the characters Python strips and splits on by default.
bool py_is_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 ||
         cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
         cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

std::string py_strip(const std::string& s, const std::string* chars, bool left, bool right) {
  const std::vector<uint32_t> cps = utf8_decode(s);
  std::vector<uint32_t> set;
  if (chars != nullptr) set = utf8_decode(*chars);
  auto strip_it = [&](uint32_t cp) {
    return chars == nullptr ? py_is_space(cp) : std::find(set.begin(), set.end(), cp) != set.end();
  };
  size_t begin = 0, end = cps.size();
  if (left) {
    while (begin < end && strip_it(cps[begin])) ++begin;
  }
  if (right) {
    while (end > begin && strip_it(cps[end - 1])) --end;
  }
  return utf8_encode(cps, begin, end);
}

std::vector<std::string> py_split(const std::string& s, const std::string* sep, int64_t maxsplit,
                                  bool from_right) {
  std::vector<std::string> parts;
  if (sep != nullptr) {
    if (sep->empty()) throw DataError("ValueError: empty separator");
    if (!from_right) {
      size_t start = 0;
      while (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) {
        const size_t at = s.find(*sep, start);
        if (at == std::string::npos) break;
        parts.push_back(s.substr(start, at - start));
        start = at + sep->size();
      }
      parts.push_back(s.substr(start));
    } else {
      size_t end = s.size();
      while (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) {
        if (end < sep->size()) break;
        const size_t at = s.rfind(*sep, end - sep->size());
        if (at == std::string::npos) break;
        parts.push_back(s.substr(at + sep->size(), end - at - sep->size()));
        end = at;
      }
      parts.push_back(s.substr(0, end));
      std::reverse(parts.begin(), parts.end());
    }
    return parts;
  }
  // Runs of whitespace separate; leading and trailing whitespace makes no empty parts, and the
  // unsplit remainder keeps its inner and far-side whitespace.
  const std::vector<uint32_t> cps = utf8_decode(s);
  if (!from_right) {
    size_t i = 0;
    while (true) {
      while (i < cps.size() && py_is_space(cps[i])) ++i;
      if (i == cps.size()) break;
      if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
        parts.push_back(utf8_encode(cps, i, cps.size()));
        break;
      }
      size_t j = i;
      while (j < cps.size() && !py_is_space(cps[j])) ++j;
      parts.push_back(utf8_encode(cps, i, j));
      i = j;
    }
  } else {
    size_t i = cps.size();
    while (true) {
      while (i > 0 && py_is_space(cps[i - 1])) --i;
      if (i == 0) break;
      if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
        parts.push_back(utf8_encode(cps, 0, i));
        break;
      }
      size_t j = i;
      while (j > 0 && !py_is_space(cps[j - 1])) --j;
      parts.push_back(utf8_encode(cps, j, i));
      i = j;
    }
    std::reverse(parts.begin(), parts.end());
  }
  return parts;
}

std::string py_replace(const std::string& s, const std::string& old, const std::string& replacement,
                       int64_t count) {
  std::string out;
  if (old.empty()) {
    // Python inserts the replacement between code points (and at both ends).
    const std::vector<uint32_t> cps = utf8_decode(s);
    int64_t done = 0;
    for (size_t i = 0; i <= cps.size(); ++i) {
      if (count < 0 || done < count) {
        out += replacement;
        ++done;
      }
      if (i < cps.size()) utf8_append(&out, cps[i]);
    }
    return out;
  }
  size_t start = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    const size_t at = s.find(old, start);
    if (at == std::string::npos) break;
    out += s.substr(start, at - start);
    out += replacement;
    start = at + old.size();
    ++done;
  }
  out += s.substr(start);
  return out;
}

}  // namespace titan::jinja
