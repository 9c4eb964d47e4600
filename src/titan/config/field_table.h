// The config as a flat table of fields (section, key, type, pointer to the member), built from
// the sections' visit functions, plus the value conversions every config source shares.
//
// Internal to src/titan/config: config_manager.cpp builds a table over a JobConfig and fills it
// from TOML and the command line (config_sources.h); tests build one over small configs of
// their own (e.g. with a list field). A table points into the config it was built from and must
// not outlive it.
#pragma once

#include "titan/config/key_support.h"

#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

namespace titan::detail {

// kStringLists: a list of lists of strings (TOML [["a", "b"], ["c"]]; command line a,b;c).
enum class FieldType { kBool, kInt, kDouble, kString, kStringList, kStringLists };

struct FieldRef {
  std::string section;
  std::string key;
  std::string description;
  FieldType type;
  // bool*, int64_t*, double*, std::string*, std::vector<std::string>* or
  // std::vector<std::vector<std::string>>*, according to `type`.
  void* value;
  KeySupport support;

  std::string name() const { return section + "." + key; }
};

class FieldTable {
 public:
  // Every section and field of `config` (anything with visit_sections), in visit order.
  template <class Config>
  static FieldTable of(Config& config) {
    FieldTable table;
    Collector collector{&table};
    config.visit_sections(collector);
    return table;
  }

  const std::vector<std::string>& sections() const { return sections_; }
  const std::vector<FieldRef>& fields() const { return fields_; }
  bool has_section(const std::string& section) const;
  // Whether some section's dotted name continues `prefix` ("quantize" for
  // "quantize.linear.float8"): a TOML table that only holds sections.
  bool has_sections_under(const std::string& prefix) const;
  // Full names ("optimizer.lr") of the fields whose key is `key`, in any section.
  std::vector<std::string> names_with_key(const std::string& key) const;

  // Throws ConfigError "unknown config section 'x'; did you mean 'y'? (<origin>)" unless
  // `section` exists.
  void require_section(const std::string& section, const std::string& origin) const;
  // The field section.key. Otherwise throws ConfigError naming the nearest section, the same key
  // in another section, or the nearest key of the section; `origin` (e.g. "from the command
  // line") ends the message.
  const FieldRef& lookup(const std::string& section, const std::string& key,
                         const std::string& origin) const;

 private:
  struct Collector {
    FieldTable* table;
    std::string current;

    template <class Section>
    void section(const char* name, Section& section) {
      current = name;
      table->sections_.push_back(name);
      section.visit(*this);
    }
    void operator()(const char* key, bool& v, const char* doc, KeySupport s = kSupported) {
      add(key, FieldType::kBool, &v, doc, s);
    }
    void operator()(const char* key, int64_t& v, const char* doc, KeySupport s = kSupported) {
      add(key, FieldType::kInt, &v, doc, s);
    }
    void operator()(const char* key, double& v, const char* doc, KeySupport s = kSupported) {
      add(key, FieldType::kDouble, &v, doc, s);
    }
    void operator()(const char* key, std::string& v, const char* doc, KeySupport s = kSupported) {
      add(key, FieldType::kString, &v, doc, s);
    }
    void operator()(const char* key, std::vector<std::string>& v, const char* doc,
                    KeySupport s = kSupported) {
      add(key, FieldType::kStringList, &v, doc, s);
    }
    void operator()(const char* key, std::vector<std::vector<std::string>>& v, const char* doc,
                    KeySupport s = kSupported) {
      add(key, FieldType::kStringLists, &v, doc, s);
    }
    // Any other member type is a compile error here rather than a silent omission.
    template <class T>
    void operator()(const char* key, T& v, const char* doc, KeySupport s = kSupported) {
      static_assert(!std::is_same<T, T>::value,
                    "config fields must be bool, int64_t, double, std::string, "
                    "std::vector<std::string> or std::vector<std::vector<std::string>>");
    }
    void add(const char* key, FieldType type, void* value, const char* doc, KeySupport s) {
      table->fields_.push_back(FieldRef{current, key, doc, type, value, s});
    }
  };

  std::vector<std::string> sections_;
  std::vector<FieldRef> fields_;
};

// "<bool>", "<int>", "<float>", "<str>", "<list>", "<lists>": the type as --help shows it.
// A name from user input as an error message shows it: whole up to 64 bytes, else its first 64
// bytes and its length (an unknown 1 MB key is not echoed whole).
std::string shown_name(const std::string& name);

std::string type_label(FieldType type);
// "an integer", "a number", ...: what a value of `type` must look like, for error messages.
std::string expected_phrase(FieldType type);

// A double for people: the shortest form of at most 15 significant digits (0.8, 1e-08, 0.0008),
// so float noise such as 0.30000000000000004 prints as 0.3.
std::string format_number(double value);
// A double as a TOML float that parses back to exactly the same value (1.0, 0.0008, -1.0, inf).
std::string format_toml_float(double value);
// A string as a TOML basic string, quoted and escaped.
std::string quote_toml_string(const std::string& text);

// The field's current value as a TOML literal (round-trips exactly).
std::string format_toml_value(const FieldRef& field);
// The field's current value as --help shows it: strings quoted, lists as a comma list.
std::string format_help_value(const FieldRef& field);

// Parses command-line `text` as the field's type and stores it. Bools take true/false/1/0 (any
// case), lists are comma-separated (items trimmed, empty items dropped), lists of lists are
// ';'-separated lists. Throws ConfigError
// "config key 'a.b' expects an integer, got 'ten' (<origin>)".
void set_from_text(const FieldRef& field, const std::string& text, const std::string& origin);
// Whether `text` is one of the boolean spellings set_from_text accepts.
bool is_bool_text(const std::string& text);

// Every section and key as `[section]` + `key = value` lines, in table order.
std::string render_toml(const FieldTable& table);
// The --help text for `titan <command>`: usage line, then each section with one aligned line per
// key: `  --section.key <type>  (default: X)  description`, the description ending with
// "[not supported yet: ...]" for keys whose feature is not built (key_support.h).
std::string render_help(const FieldTable& table, const std::string& command);

}  // namespace titan::detail
