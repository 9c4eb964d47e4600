// Filters and tests of the chat template engine (see chat_template_builtins.h): what Jinja2 3.1
// and transformers' tojson do, down to which filters return one-shot generators.
#include "titan/common/check.h"
#include "titan/components/tokenizer/chat_template_ast.h"
#include "titan/components/tokenizer/chat_template_builtins.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>

namespace titan::jinja {

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
    options.has_separators = true;
    options.item_sep = (*separators->list)[0].string;
    options.key_sep = (*separators->list)[1].string;
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
    check_test_exists(test, /*found=*/false);
    ++next;
  }
  Args test_args;
  test_args.positional.assign(args.positional.begin() + next, args.positional.end());
  test_args.keyword = args.keyword;
  List out;
  // Jinja skips a falsy input (None, undefined, empty) rather than iterating it.
  for (const auto& item : truthy(input) ? iterate(input) : List{}) {
    const Value subject = by_attr ? jinja_attribute_of(item, attribute) : item;
    const bool ok = test.empty() ? truthy(subject) : apply_test(test, subject, test_args);
    if (ok == keep) out.push_back(item);
  }
  return Value::from_iterator(std::move(out), "generator");
}

Value jinja_map(const Value& input, Args& args) {
  const Value* attribute = jinja_arg(args, SIZE_MAX, "attribute");
  List out;
  if (attribute != nullptr) {
    if (!attribute->is_string()) jinja_type_error("map attribute must be a string");
    const Value* fallback = jinja_arg(args, SIZE_MAX, "default");
    for (const auto& item : truthy(input) ? iterate(input) : List{}) {
      Value v = jinja_attribute_of(item, attribute->string);
      if (v.is_undefined() && fallback != nullptr) v = *fallback;
      out.push_back(std::move(v));
    }
    return Value::from_iterator(std::move(out), "generator");
  }
  if (args.positional.empty() || !args.positional[0].is_string())
    jinja_type_error("map needs a filter name or attribute=");
  const std::string filter = args.positional[0].string;
  check_filter_exists(filter, /*found=*/false);
  Args filter_args;
  filter_args.positional.assign(args.positional.begin() + 1, args.positional.end());
  filter_args.keyword = args.keyword;
  for (const auto& item : truthy(input) ? iterate(input) : List{}) {
    out.push_back(apply_filter(filter, item, filter_args));
  }
  return Value::from_iterator(std::move(out), "generator");
}

int64_t jinja_length(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kUndefined: return 0;
    case Value::Kind::kString: return static_cast<int64_t>(utf8_decode(v.string).size());
    case Value::Kind::kList:
      if (v.is_one_shot()) {
        jinja_type_error(message("object of type '", v.iterator_type, "' has no len()"));
      }
      return static_cast<int64_t>(v.list->size());
    case Value::Kind::kDict: return static_cast<int64_t>(v.dict->items.size());
    default: jinja_type_error(message("object of type '", py_type_name(v), "' has no len()"));
  }
}

}  // namespace

Value apply_filter(const std::string& name, const Value& input, Args& args) {
  if (name == "tojson") return jinja_tojson(input, args);
  if (name == "safe") {
    Value out = Value::from_string(py_str(input));
    out.is_markup = true;
    return out;
  }
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
    if (input.is_undefined()) return Value::from_iterator({}, "generator");
    if (!input.is_dict()) jinja_type_error("Can only get item pairs from a mapping.");
    return Value::from_iterator(jinja_items(*input.dict), "generator");
  }
  if (name == "list") return Value::from_list(iterate(input));
  if (name == "selectattr" || name == "rejectattr" || name == "select" || name == "reject") {
    return jinja_select(name, input, args);
  }
  if (name == "map") return jinja_map(input, args);
  if (name == "first" || name == "last") {
    if (name == "last" && input.is_one_shot()) {
      jinja_type_error(message("'", input.iterator_type, "' object is not reversible"));
    }
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
    const bool one_shot = input.is_one_shot();
    List items = iterate(input);
    std::reverse(items.begin(), items.end());
    // reversed() of a list or dict is an iterator; a generator is not reversible, so Jinja
    // falls back to a reversed list.
    if (one_shot) return Value::from_list(std::move(items));
    return Value::from_iterator(
        std::move(items), input.is_dict() ? "dict_reversekeyiterator" : "list_reverseiterator");
  }
  if (name == "unique" || name == "sort") {
    const Value* case_arg = jinja_arg(args, name == "sort" ? 1 : 0, "case_sensitive");
    const bool case_sensitive = case_arg != nullptr && truthy(*case_arg);
    const Value* attribute = jinja_arg(args, name == "sort" ? 2 : 1, "attribute");
    if (attribute != nullptr && py_str(*attribute).find(',') != std::string::npos) {
      throw ConfigError(
          message("'", name, "' by several comma-separated attributes is not supported"));
    }
    auto key_of = [&](const Value& item) {
      Value key = attribute != nullptr ? jinja_attribute_of(item, py_str(*attribute)) : item;
      // Jinja compares strings case-insensitively unless told otherwise.
      if (key.is_string() && !case_sensitive)
        key = Value::from_string(jinja_case(key.string, "lower"));
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
      return Value::from_iterator(std::move(out), "generator");
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
  if (name == "upper" || name == "lower" || name == "capitalize") {
    return Value::from_string(jinja_case(py_str(input), name));
  }
  if (name == "title") {
    // Jinja's title is not str.title: words start after runs of - ( { [ < and whitespace, so
    // "they're" stays "They're".
    const std::string text = py_str(input);
    jinja_case(text, "title");  // refuses text with non-ASCII letters
    std::string out;
    bool word_start = true;
    for (const char c : text) {
      const bool separator = std::strchr("-({[< \t\n\r\f\v", c) != nullptr;
      if (separator) {
        out += c;
        word_start = true;
      } else {
        const bool lower = c >= 'A' && c <= 'Z', upper = c >= 'a' && c <= 'z';
        out += static_cast<char>(word_start && upper ? c - 32 : !word_start && lower ? c + 32 : c);
        word_start = false;
      }
    }
    return Value::from_string(out);
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
    jinja_check_defined(input);  // int(Undefined) raises in Jinja, unlike most filters
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
        // Jinja falls back to int(float(text)): "2.5" | int is 2.
        const double d = std::strtod(text.c_str(), &end);
        if (!text.empty() && *end == '\0' && std::isfinite(d)) {
          return Value::from_int(static_cast<int64_t>(d));
        }
      } else {
        const double v = std::strtod(text.c_str(), &end);
        if (!text.empty() && *end == '\0') return Value::from_float(v);
      }
    }
    return dflt;
  }
  if (name == "dictsort") {
    if (!input.is_dict()) jinja_type_error("dictsort: input must be a mapping");
    const Value* case_arg = jinja_arg(args, 0, "case_sensitive");
    const Value* by = jinja_arg(args, 1, "by");
    const Value* reverse = jinja_arg(args, 2, "reverse");
    const bool case_sensitive = case_arg != nullptr && truthy(*case_arg);
    const bool by_value = by != nullptr && py_str(*by) == "value";
    if (by != nullptr && !by_value && py_str(*by) != "key") {
      throw DataError("FilterArgumentError: You can only sort by either \"key\" or \"value\"");
    }
    List items = jinja_items(*input.dict);
    auto key_of = [&](const Value& item) {
      Value key = (*item.list)[by_value ? 1 : 0];
      if (key.is_string() && !case_sensitive)
        key = Value::from_string(jinja_case(key.string, "lower"));
      return key;
    };
    const bool descending = reverse != nullptr && truthy(*reverse);
    std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
      const int order = jinja_order(key_of(x), key_of(y), "<");
      return descending ? order > 0 : order < 0;
    });
    return Value::from_list(std::move(items));
  }
  if (name == "indent") {
    jinja_check_defined(input);  // Jinja appends a newline to the input, which Undefined refuses
    const Value* width = jinja_arg(args, 0, "width");
    const Value* first = jinja_arg(args, 1, "first");
    const Value* blank = jinja_arg(args, 2, "blank");
    std::string indention = "    ";
    if (width != nullptr) {
      indention =
          width->is_string() ? width->string : std::string(jinja_int_of(*width, "width"), ' ');
    }
    // str.splitlines() of the text plus a newline (Jinja's quirk to keep a trailing line).
    const std::vector<uint32_t> cps = utf8_decode(py_str(input) + "\n");
    std::vector<std::string> lines;
    std::string line;
    for (size_t i = 0; i < cps.size(); ++i) {
      const uint32_t c = cps[i];
      const bool breaks = c == '\n' || c == '\r' || c == 0x0B || c == 0x0C ||
                          (c >= 0x1C && c <= 0x1E) || c == 0x85 || c == 0x2028 || c == 0x2029;
      if (!breaks) {
        utf8_append(&line, c);
        continue;
      }
      if (c == '\r' && i + 1 < cps.size() && cps[i + 1] == '\n') ++i;
      lines.push_back(std::move(line));
      line.clear();
    }
    if (!line.empty()) lines.push_back(std::move(line));
    const bool pad_blank = blank != nullptr && truthy(*blank);
    std::string out;
    for (size_t i = 0; i < lines.size(); ++i) {
      if (i > 0) out += "\n";
      if (i > 0 && (pad_blank || !lines[i].empty())) out += indention;
      out += lines[i];
    }
    if (first != nullptr && truthy(*first)) out = indention + out;
    Value result = Value::from_string(out);
    result.is_markup = input.is_markup;
    return result;
  }
  if (name == "format") {
    if (!args.positional.empty() && !args.keyword.empty()) {
      throw DataError(
          "FilterArgumentError: can't handle positional and keyword arguments at the same time");
    }
    if (!args.keyword.empty()) {
      Dict kwargs;
      for (const auto& kw : args.keyword) kwargs.set(kw.first, kw.second);
      return jinja_percent_format(py_str(input), Value::from_dict(std::move(kwargs)));
    }
    return jinja_percent_format(py_str(input),
                                Value::from_list(args.positional, /*is_tuple=*/true));
  }
  if (name == "round") {
    const Value* precision_arg = jinja_arg(args, 0, "precision");
    const Value* method_arg = jinja_arg(args, 1, "method");
    const int64_t precision =
        precision_arg != nullptr ? jinja_int_of(*precision_arg, "precision") : 0;
    const std::string method = method_arg != nullptr ? py_str(*method_arg) : "common";
    if (method != "common" && method != "ceil" && method != "floor") {
      throw DataError("FilterArgumentError: method must be common, ceil or floor");
    }
    if (precision < 0 || precision > 30)
      throw ConfigError("round with this precision is not supported");
    jinja_check_defined(input);
    if (!input.is_number())
      jinja_type_error(message("type ", py_type_name(input), " doesn't define __round__ method"));
    if (method == "common") {
      if (input.kind != Value::Kind::kFloat) return Value::from_int(jinja_int_of(input, ""));
      // printf rounds the exact binary value half to even, as Python's round() does.
      char buffer[512];
      std::snprintf(buffer, sizeof(buffer), "%.*f", static_cast<int>(precision), input.number);
      return Value::from_float(std::strtod(buffer, nullptr));
    }
    const double scale = std::pow(10.0, static_cast<double>(precision));
    const double scaled = input.as_double() * scale;
    return Value::from_float((method == "ceil" ? std::ceil(scaled) : std::floor(scaled)) / scale);
  }
  if (name == "min" || name == "max") {
    const Value* case_arg = jinja_arg(args, 0, "case_sensitive");
    const Value* attribute = jinja_arg(args, 1, "attribute");
    const bool case_sensitive = case_arg != nullptr && truthy(*case_arg);
    auto key_of = [&](const Value& item) {
      Value key = attribute != nullptr ? jinja_attribute_of(item, py_str(*attribute)) : item;
      if (key.is_string() && !case_sensitive)
        key = Value::from_string(jinja_case(key.string, "lower"));
      return key;
    };
    const List items = iterate(input);
    if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
    size_t best = 0;
    for (size_t i = 1; i < items.size(); ++i) {
      const int order = jinja_order(key_of(items[i]), key_of(items[best]), "<");
      if (name == "min" ? order < 0 : order > 0) best = i;
    }
    return items[best];
  }
  if (name == "escape" || name == "e" || name == "forceescape") {
    if (input.is_markup && name != "forceescape") return input;
    Value out = Value::from_string(jinja_html_escape(py_str(input)));
    out.is_markup = true;
    return out;
  }
  if (name == "abs") {
    if (input.kind == Value::Kind::kFloat) return Value::from_float(std::fabs(input.number));
    return Value::from_int(std::llabs(jinja_int_of(input, "abs() operand")));
  }
  if (name == "sum") {
    const Value* attribute = jinja_arg(args, 0, "attribute");
    const Value* start = jinja_arg(args, 1, "start");
    Value total = start != nullptr ? *start : Value::from_int(0);
    for (const auto& item : iterate(input)) {
      total = binary_op("+", total,
                        attribute != nullptr ? jinja_attribute_of(item, py_str(*attribute)) : item);
    }
    return total;
  }
  check_filter_exists(name, /*found=*/true);
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
  if (name == "sequence") return input.is_string() || input.is_sequence() || input.is_dict();
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
  check_test_exists(name, /*found=*/true);
  throw ConfigError(message("the test '", name, "' is not supported"));
}

bool is_known_filter(const std::string& name) {
  static const std::set<std::string> names = {
      "tojson", "safe",   "string",     "length",     "count",   "default", "d",
      "items",  "list",   "selectattr", "rejectattr", "select",  "reject",  "map",
      "first",  "last",   "join",       "reverse",    "unique",  "sort",    "trim",
      "upper",  "lower",  "capitalize", "title",      "replace", "int",     "float",
      "abs",    "sum",    "dictsort",   "indent",     "format",  "round",   "min",
      "max",    "escape", "e",          "forceescape"};
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

// Like Jinja 3, a template may name a filter or test that does not exist in a branch it never
// takes; only running it fails, with Jinja's message. One that Jinja has and we lack is ours to
// report as unsupported.
bool jinja_has_filter(const std::string& name) {
  static const std::set<std::string> names = {
      "abs",    "attr",       "batch",       "capitalize", "center",   "count",
      "d",      "default",    "dictsort",    "e",          "escape",   "filesizeformat",
      "first",  "float",      "forceescape", "format",     "groupby",  "indent",
      "int",    "items",      "join",        "last",       "length",   "list",
      "lower",  "map",        "max",         "min",        "pprint",   "random",
      "reject", "rejectattr", "replace",     "reverse",    "round",    "safe",
      "select", "selectattr", "slice",       "sort",       "string",   "striptags",
      "sum",    "title",      "tojson",      "trim",       "truncate", "unique",
      "upper",  "urlencode",  "urlize",      "wordcount",  "wordwrap", "xmlattr"};
  return names.count(name) != 0;
}

bool jinja_has_test(const std::string& name) {
  return is_known_test(name) || name == "escaped" || name == "filter" || name == "test";
}

void check_filter_exists(const std::string& name, bool found) {
  if (is_known_filter(name)) return;
  if (jinja_has_filter(name))
    throw ConfigError(message("the filter '", name, "' is not supported"));
  throw DataError(message("No filter named '", name, found ? "' found." : "'."));
}

void check_test_exists(const std::string& name, bool found) {
  if (is_known_test(name)) return;
  if (jinja_has_test(name)) throw ConfigError(message("the test '", name, "' is not supported"));
  throw DataError(message("No test named '", name, found ? "' found." : "'."));
}

}  // namespace titan::jinja
