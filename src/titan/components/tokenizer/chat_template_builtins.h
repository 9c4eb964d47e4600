// Operators, attribute and item access, filters, tests and methods of the chat template engine,
// with Python's and Jinja2's semantics. Internal to chat_template.cpp. Errors are thrown without a
// template line (the evaluator adds it): DataError where Jinja raises on this input, ConfigError
// where the engine lacks the feature.
#pragma once

#include "titan/components/tokenizer/chat_template_value.h"

#include <string>

namespace titan::jinja {

// obj.name: a dict's methods (items, keys, values, get) come first, then its keys, as Jinja's
// getattr-then-getitem does; a miss is undefined.
Value get_attr(const Value& object, const std::string& name);
// obj[key]: the key (or index, negative from the end) first, then the attribute.
Value get_item(const Value& object, const Value& key);
// obj[start:stop:step] of a list or a string (by code point); absent bounds are None.
Value slice(const Value& object, const Value& start, const Value& stop, const Value& step);
// The items a for loop visits: a list's items, a dict's keys, a string's characters.
List iterate(const Value& v);
Value unary(const std::string& op, const Value& v);
// + - * / // % ** and ~.
Value binary_op(const std::string& op, const Value& a, const Value& b);
// == != < <= > >= in, not in.
bool compare(const std::string& op, const Value& a, const Value& b);
Value apply_filter(const std::string& name, const Value& input, Args& args);
bool apply_test(const std::string& name, const Value& input, Args& args);
// Filters and tests the engine implements.
bool is_known_filter(const std::string& name);
bool is_known_test(const std::string& name);
// Filters and tests Jinja itself has (some of which the engine lacks).
bool jinja_has_filter(const std::string& name);
bool jinja_has_test(const std::string& name);
// Throw, for a filter or test the engine lacks, ConfigError (Jinja has it) or DataError with
// Jinja's message (nobody has it): "No filter named 'x' found." when an expression in an if
// branch runs it (`found`), "No filter named 'x'." when map() or select() names it.
void check_filter_exists(const std::string& name, bool found);
void check_test_exists(const std::string& name, bool found);

// Helpers the operators (chat_template_builtins.cpp) and the filters (chat_template_filters.cpp)
// share.
[[noreturn]] void jinja_type_error(const std::string& what);  // DataError("TypeError: ...")
void jinja_check_defined(const Value& v);                     // throws an undefined value's error
// An argument by position or by keyword; null when absent.
const Value* jinja_arg(const Args& args, size_t position, const char* name);
int64_t jinja_int_of(const Value& v, const char* what);
bool jinja_ascii(const std::string& s);
// upper, lower, capitalize or title of ASCII text (ConfigError otherwise).
std::string jinja_case(const std::string& s, const std::string& how);
std::string jinja_html_escape(const std::string& s);
// A dict's (key, value) tuples.
List jinja_items(const Dict& dict);
// Python's `format % args`.
Value jinja_percent_format(const std::string& format, const Value& args);
// Python's ordering (-1, 0, 1) of two values, or a TypeError naming `op`.
int jinja_order(const Value& a, const Value& b, const std::string& op);

}  // namespace titan::jinja
