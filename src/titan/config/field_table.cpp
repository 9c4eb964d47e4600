// Field lookup with "did you mean" suggestions, value parsing and formatting, and the two
// renderings of a whole table: TOML (--job.print_config) and --help text.
#include "titan/config/field_table.h"

#include "titan/common/check.h"
#include "titan/common/format.h"
#include "titan/config/config_manager.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>

namespace titan::detail {

namespace {

std::string to_lower(std::string text) {
  for (char& c : text) {
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  return text;
}

std::string trim(const std::string& text) {
  size_t begin = text.find_first_not_of(" \t");
  if (begin == std::string::npos) {
    return "";
  }
  size_t end = text.find_last_not_of(" \t");
  return text.substr(begin, end - begin + 1);
}

// Quoted names joined with " or ": 'a.b' or 'c.b'.
std::string quoted_alternatives(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) {
    out += (i == 0 ? "'" : " or '") + names[i] + "'";
  }
  return out;
}

bool parse_bool(const std::string& text, bool* out) {
  std::string lower = to_lower(text);
  if (lower == "true" || lower == "1") {
    *out = true;
    return true;
  }
  if (lower == "false" || lower == "0") {
    *out = false;
    return true;
  }
  return false;
}

// The whole of `text` as a base-10 integer (no surrounding spaces, no overflow).
bool parse_int(const std::string& text, int64_t* out) {
  if (text.empty() || std::isspace(static_cast<unsigned char>(text[0]))) {
    return false;
  }
  errno = 0;
  char* end = nullptr;
  long long value = std::strtoll(text.c_str(), &end, 10);
  if (errno == ERANGE || end != text.c_str() + text.size()) {
    return false;
  }
  *out = static_cast<int64_t>(value);
  return true;
}

// The whole of `text` as a decimal float (strtod's hex floats are not accepted).
bool parse_double(const std::string& text, double* out) {
  if (text.empty() || std::isspace(static_cast<unsigned char>(text[0])) ||
      text.find_first_of("xX") != std::string::npos) {
    return false;
  }
  errno = 0;
  char* end = nullptr;
  double value = std::strtod(text.c_str(), &end);
  if (errno == ERANGE || end != text.c_str() + text.size()) {
    return false;
  }
  *out = value;
  return true;
}

// The trimmed, non-empty pieces of `text` between `separator`s.
std::vector<std::string> split_trimmed(const std::string& text, char separator) {
  std::vector<std::string> items;
  std::stringstream stream(text);
  std::string item;
  while (std::getline(stream, item, separator)) {
    item = trim(item);
    if (!item.empty()) {
      items.push_back(item);
    }
  }
  return items;
}

std::string toml_string_array(const std::vector<std::string>& items) {
  std::string out = "[";
  for (size_t i = 0; i < items.size(); ++i) {
    out += (i == 0 ? "" : ", ") + quote_toml_string(items[i]);
  }
  return out + "]";
}

// What --help shows for a key whose feature is not built (key_support.h).
std::string support_note(const KeySupport& support) {
  switch (support.kind) {
    case KeySupport::kYes: return "";
    case KeySupport::kNotYet: return " [not supported yet: must keep its default]";
    case KeySupport::kUsedWith:
      return std::string(" [not supported yet: read only with ") + support.switch_key + "]";
  }
  return "";
}

// The shortest %g form with at most `max_digits` significant digits that reads back as `value`;
// %.<max_digits>g when none does.
std::string shortest_repr(double value, int max_digits) {
  if (std::isnan(value)) {
    return "nan";
  }
  if (std::isinf(value)) {
    return value > 0 ? "inf" : "-inf";
  }
  char buf[64];
  for (int digits = 1; digits <= max_digits; ++digits) {
    std::snprintf(buf, sizeof(buf), "%.*g", digits, value);
    if (std::strtod(buf, nullptr) == value) {
      return buf;
    }
  }
  std::snprintf(buf, sizeof(buf), "%.*g", max_digits, value);
  return buf;
}

}  // namespace

bool FieldTable::has_section(const std::string& section) const {
  return std::find(sections_.begin(), sections_.end(), section) != sections_.end();
}

bool FieldTable::has_sections_under(const std::string& prefix) const {
  return std::any_of(sections_.begin(), sections_.end(), [&](const std::string& section) {
    return section.size() > prefix.size() && section.compare(0, prefix.size(), prefix) == 0 &&
           section[prefix.size()] == '.';
  });
}

std::vector<std::string> FieldTable::names_with_key(const std::string& key) const {
  std::vector<std::string> names;
  for (const FieldRef& field : fields_) {
    if (field.key == key) {
      names.push_back(field.name());
    }
  }
  return names;
}

std::string shown_name(const std::string& name) {
  constexpr size_t kShown = 64;
  if (name.size() <= kShown) return name;
  return name.substr(0, kShown) + "... (" + std::to_string(name.size()) + " bytes)";
}

void FieldTable::require_section(const std::string& section, const std::string& origin) const {
  if (has_section(section)) {
    return;
  }
  std::string text = "unknown config section '" + shown_name(section) + "'";
  std::string nearest = nearest_name(section, sections_);
  if (!nearest.empty()) {
    text += "; did you mean '" + nearest + "'?";
  }
  throw ConfigError(message(text, " (", origin, ")"));
}

const FieldRef& FieldTable::lookup(const std::string& section, const std::string& key,
                                   const std::string& origin) const {
  require_section(section, origin);
  std::vector<std::string> section_keys;
  for (const FieldRef& field : fields_) {
    if (field.section != section) {
      continue;
    }
    if (field.key == key) {
      return field;
    }
    section_keys.push_back(field.key);
  }
  // A key that exists in another section means the section is wrong, not the key:
  // training.lr -> optimizer.lr.
  std::vector<std::string> suggestions = names_with_key(key);
  if (suggestions.empty() && !section_keys.empty()) {
    const std::string nearest = nearest_name(key, section_keys);
    if (!nearest.empty()) suggestions.push_back(section + "." + nearest);
  }
  std::string text = "unknown config key '" + shown_name(section + "." + key) + "'";
  if (!suggestions.empty()) {
    text += "; did you mean " + quoted_alternatives(suggestions) + "?";
  }
  throw ConfigError(message(text, " (", origin, ")"));
}

std::string type_label(FieldType type) {
  switch (type) {
    case FieldType::kBool: return "<bool>";
    case FieldType::kInt: return "<int>";
    case FieldType::kDouble: return "<float>";
    case FieldType::kString: return "<str>";
    case FieldType::kStringList: return "<list>";
    case FieldType::kStringLists: return "<lists>";
  }
  return "<?>";
}

std::string expected_phrase(FieldType type) {
  switch (type) {
    case FieldType::kBool: return "a boolean (true or false)";
    case FieldType::kInt: return "an integer";
    case FieldType::kDouble: return "a number";
    case FieldType::kString: return "a string";
    case FieldType::kStringList: return "a list of strings";
    case FieldType::kStringLists: return "a list of lists of strings";
  }
  return "a value";
}

std::string format_number(double value) { return shortest_repr(value, /*max_digits=*/15); }

std::string format_toml_float(double value) {
  std::string text = shortest_repr(value, /*max_digits=*/17);
  // TOML needs a '.' or an exponent to read a float; inf and nan are already TOML.
  if (std::isfinite(value) && text.find_first_of(".eE") == std::string::npos) {
    text += ".0";
  }
  return text;
}

std::string quote_toml_string(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\b': out += "\\b"; break;
      case '\t': out += "\\t"; break;
      case '\n': out += "\\n"; break;
      case '\f': out += "\\f"; break;
      case '\r': out += "\\r"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned char>(c));
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

std::string format_toml_value(const FieldRef& field) {
  switch (field.type) {
    case FieldType::kBool: return *static_cast<const bool*>(field.value) ? "true" : "false";
    case FieldType::kInt: return std::to_string(*static_cast<const int64_t*>(field.value));
    case FieldType::kDouble: return format_toml_float(*static_cast<const double*>(field.value));
    case FieldType::kString:
      return quote_toml_string(*static_cast<const std::string*>(field.value));
    case FieldType::kStringList:
      return toml_string_array(*static_cast<const std::vector<std::string>*>(field.value));
    case FieldType::kStringLists: {
      const auto& lists = *static_cast<const std::vector<std::vector<std::string>>*>(field.value);
      std::string out = "[";
      for (size_t i = 0; i < lists.size(); ++i) {
        out += (i == 0 ? "" : ", ") + toml_string_array(lists[i]);
      }
      return out + "]";
    }
  }
  return "";
}

std::string format_help_value(const FieldRef& field) {
  switch (field.type) {
    case FieldType::kDouble: return format_number(*static_cast<const double*>(field.value));
    case FieldType::kStringList: {
      const auto& items = *static_cast<const std::vector<std::string>*>(field.value);
      return items.empty() ? "none" : join(items, ",");
    }
    case FieldType::kStringLists: {
      const auto& lists = *static_cast<const std::vector<std::vector<std::string>>*>(field.value);
      std::vector<std::string> parts;
      for (const auto& items : lists) {
        parts.push_back(join(items, ","));
      }
      return lists.empty() ? "none" : join(parts, ";");
    }
    default: return format_toml_value(field);
  }
}

bool is_bool_text(const std::string& text) {
  bool ignored = false;
  return parse_bool(text, &ignored);
}

void set_from_text(const FieldRef& field, const std::string& text, const std::string& origin) {
  bool ok = true;
  switch (field.type) {
    case FieldType::kBool: ok = parse_bool(text, static_cast<bool*>(field.value)); break;
    case FieldType::kInt: ok = parse_int(text, static_cast<int64_t*>(field.value)); break;
    case FieldType::kDouble: ok = parse_double(text, static_cast<double*>(field.value)); break;
    case FieldType::kString: *static_cast<std::string*>(field.value) = text; break;
    case FieldType::kStringList:
      *static_cast<std::vector<std::string>*>(field.value) = split_trimmed(text, ',');
      break;
    case FieldType::kStringLists: {
      std::vector<std::vector<std::string>> lists;
      for (const std::string& part : split_trimmed(text, ';')) {
        lists.push_back(split_trimmed(part, ','));
      }
      *static_cast<std::vector<std::vector<std::string>>*>(field.value) = std::move(lists);
      break;
    }
  }
  if (!ok) {
    throw ConfigError(message("config key '", field.name(), "' expects ",
                              expected_phrase(field.type), ", got '", text, "' (", origin, ")"));
  }
}

std::string render_toml(const FieldTable& table) {
  std::ostringstream out;
  for (size_t s = 0; s < table.sections().size(); ++s) {
    const std::string& section = table.sections()[s];
    out << (s == 0 ? "" : "\n") << "[" << section << "]\n";
    for (const FieldRef& field : table.fields()) {
      if (field.section == section) {
        out << field.key << " = " << format_toml_value(field) << "\n";
      }
    }
  }
  return out.str();
}

std::string render_help(const FieldTable& table, const std::string& command) {
  // Columns: "--section.key <type>", "(default: X)", description; widths over all keys so
  // every section lines up the same way.
  size_t flag_width = 0;
  size_t default_width = 0;
  for (const FieldRef& field : table.fields()) {
    flag_width = std::max(flag_width, field.name().size() + 3 + type_label(field.type).size());
    default_width = std::max(default_width, format_help_value(field).size() + 11);
  }
  auto pad = [](std::string text, size_t width) {
    text.resize(std::max(text.size(), width), ' ');
    return text;
  };

  std::ostringstream out;
  out << "usage: titan " << command << " [--job.config_file FILE] [--section.key value ...]\n\n"
      << "Settings come from the defaults below, then the TOML file, then the command line\n"
      << "(last wins). Values: --section.key value or --section.key=value; bool keys are\n"
      << "switches (--section.key alone means true, --section.key=false turns one off);\n"
      << "lists are comma-separated.\n";
  for (const std::string& section : table.sections()) {
    out << "\n[" << section << "]\n";
    for (const FieldRef& field : table.fields()) {
      if (field.section != section) {
        continue;
      }
      out << "  " << pad("--" + field.name() + " " + type_label(field.type), flag_width) << "  "
          << pad("(default: " + format_help_value(field) + ")", default_width) << "  "
          << field.description << support_note(field.support) << "\n";
    }
  }
  return out.str();
}

}  // namespace titan::detail
