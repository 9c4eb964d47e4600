// The values a chat template computes with, and how Python shows them. Internal to the chat
// template engine (chat_template*.cpp): Jinja2 evaluates templates over Python objects, so
// printing, comparing, json.dumps and the str methods templates call must follow Python's rules
// (None, True, 1.0,
// ['a'], code-point indexing) for the rendering to match byte for byte.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace titan::jinja {

struct Value;
using List = std::vector<Value>;

// A Python dict: insertion-ordered; keys are strings (JSON objects and the dict literals
// templates write have no others).
struct Dict {
  // Keys are strings in JSON and in almost every template, so entries are found by string. A dict
  // literal with other keys ({0: 0, 512: 128}) stores each key's encoding (encode_key) there and
  // the keys themselves in typed_keys, parallel to items.
  std::vector<std::pair<std::string, Value>> items;
  std::vector<Value> typed_keys;
  const Value* find(const std::string& key) const;
  void set(const std::string& key, Value value);
  // d[key] = value for a key of any hashable type (Python's rule: 1, 1.0 and True are one key).
  void set_typed(const Value& key, Value value);
  Value key_at(size_t i) const;
  // The string under which `key` is stored; DataError for unhashable keys (lists, dicts).
  static std::string encode_key(const Value& key);
};

// Arguments of a call: positional, then keyword in call order.
struct Args {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

using Function = std::function<Value(Args& args)>;

struct Value {
  enum class Kind {
    kUndefined,
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kList,
    kDict,
    kNamespace,
    kFunction
  };
  Kind kind = Kind::kUndefined;
  bool boolean = false;
  int64_t integer = 0;
  double number = 0;
  std::string string;
  // Lists and dicts are shared and never modified after construction (the sandbox transformers
  // uses forbids mutation); a namespace is shared and mutable, as a Python object is.
  std::shared_ptr<const List> list;
  std::shared_ptr<Dict> dict;
  std::shared_ptr<const Function> function;
  bool is_tuple = false;  // a list that prints as a Python tuple: (1, 2)
  // Non-empty for a list that stands for a Python iterator or view rather than a list, named by
  // its Python type: "generator" (what select, map, items... return), "list_reverseiterator",
  // "dict_items", "dict_keys", "dict_values". Jinja templates see the difference: an iterator is
  // truthy even when empty, has no len(), cannot be indexed or JSON-dumped, and a generator is
  // consumed by the first loop over it.
  std::string iterator_type;
  // A string that is markupsafe's Markup (what |safe returns): concatenating a plain string to it
  // HTML-escapes that string, as Python does even with autoescape off.
  bool is_markup = false;
  std::shared_ptr<bool> consumed;
  // For an undefined value: the error Jinja raises when it is used ("'x' is undefined").
  std::string undefined_message;

  static Value undefined(std::string message);
  static Value none();
  static Value from_bool(bool b);
  static Value from_int(int64_t i);
  static Value from_float(double d);
  static Value from_string(std::string s);
  static Value from_list(List items, bool is_tuple = false);
  static Value from_iterator(List items, std::string type);
  static Value from_dict(Dict dict);
  static Value new_namespace(Dict attrs);
  static Value from_function(Function fn);
  static Value from_json(const nlohmann::ordered_json& json);

  bool is_undefined() const { return kind == Kind::kUndefined; }
  bool is_none() const { return kind == Kind::kNone; }
  bool is_string() const { return kind == Kind::kString; }
  bool is_number() const {
    return kind == Kind::kInt || kind == Kind::kFloat || kind == Kind::kBool;
  }
  bool is_list() const { return kind == Kind::kList; }
  // A Python list or tuple (not an iterator or view).
  bool is_sequence() const { return kind == Kind::kList && iterator_type.empty(); }
  // A Python iterator (single pass, always truthy), not a dict view.
  bool is_one_shot() const {
    return kind == Kind::kList && !iterator_type.empty() && iterator_type != "dict_items" &&
           iterator_type != "dict_keys" && iterator_type != "dict_values";
  }
  bool is_dict() const { return kind == Kind::kDict; }
  double as_double() const;
};

// Python's type name of a value, as its error messages say it: 'str', 'dict', 'NoneType'.
std::string py_type_name(const Value& v);
// Python truthiness (an undefined value is falsy).
bool truthy(const Value& v);
// str(v) and repr(v). Undefined prints as the empty string.
std::string py_str(const Value& v);
std::string py_repr(const Value& v);
std::string py_float_repr(double d);
// Python ==.
bool py_equal(const Value& a, const Value& b);

// json.dumps(v, ensure_ascii, indent, separators, sort_keys) as transformers' tojson calls it.
// has_indent false means indent=None; has_separators false means Python's default separators for
// that indent (", " and ": ", or "," and ": " with an indent).
struct JsonOptions {
  bool ensure_ascii = false;
  std::string indent;  // the string one nesting level adds
  bool has_indent = false;
  bool has_separators = false;
  std::string item_sep;
  std::string key_sep;
  bool sort_keys = false;
};
std::string py_json_dumps(const Value& v, const JsonOptions& options);

// Code points: Python strings index, slice and count code points, not bytes.
std::vector<uint32_t> utf8_decode(const std::string& s);
std::string utf8_encode(const std::vector<uint32_t>& cps, size_t begin, size_t end);
void utf8_append(std::string* out, uint32_t cp);
bool py_is_space(uint32_t cp);
// str.strip/lstrip/rstrip: `chars` null means whitespace.
std::string py_strip(const std::string& s, const std::string* chars, bool left, bool right);
// str.split/rsplit: `sep` null means runs of whitespace; maxsplit < 0 means no limit.
std::vector<std::string> py_split(const std::string& s, const std::string* sep, int64_t maxsplit,
                                  bool from_right);
std::string py_replace(const std::string& s, const std::string& old, const std::string& replacement,
                       int64_t count);

}  // namespace titan::jinja
