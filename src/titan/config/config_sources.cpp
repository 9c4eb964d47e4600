// Filling a FieldTable from a TOML file (toml++) and from command-line overrides.
#include "titan/config/config_sources.h"

#include "titan/common/check.h"
#include "titan/common/file_io.h"

#include <toml++/toml.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace titan::detail {

namespace {

constexpr const char* kFromCommandLine = "from the command line";

bool starts_with(const std::string& text, const std::string& prefix) {
  return text.compare(0, prefix.size(), prefix) == 0;
}

std::string where_in_file(const std::string& path, const toml::source_region& source) {
  return path + ":" + std::to_string(source.begin.line) + ":" + std::to_string(source.begin.column);
}

// "'ten' (a string" / "an array (": how a TOML value is shown after "got" in a type error; the
// caller closes the parenthesis after adding where it is.
std::string describe_value(const toml::node& node) {
  switch (node.type()) {
    case toml::node_type::string: return "'" + node.as_string()->get() + "' (a string";
    case toml::node_type::integer:
      return "'" + std::to_string(node.as_integer()->get()) + "' (an integer";
    case toml::node_type::floating_point:
      return "'" + format_number(node.as_floating_point()->get()) + "' (a float";
    case toml::node_type::boolean:
      return std::string("'") + (node.as_boolean()->get() ? "true" : "false") + "' (a boolean";
    case toml::node_type::array: return "an array (";
    case toml::node_type::table: return "a table (";
    case toml::node_type::date: return "a date (";
    case toml::node_type::time: return "a time (";
    case toml::node_type::date_time: return "a date-time (";
    default: return "an empty value (";
  }
}

[[noreturn]] void throw_toml_type_error(const FieldRef& field, const toml::node& node,
                                        const std::string& path) {
  std::string got = describe_value(node);
  std::string where = "in TOML file " + where_in_file(path, node.source());
  bool open_paren_only = got.back() == '(';
  throw ConfigError(message("config key '", field.name(), "' expects ", expected_phrase(field.type),
                            ", got ", got, (open_paren_only ? "" : " "), where, ")"));
}

// A TOML float that is a whole number in int64 range (steps = 1e4 or 10.0).
bool integral_double(double value, int64_t* out) {
  if (!std::isfinite(value) || std::floor(value) != value || value < -9.2e18 || value > 9.2e18) {
    return false;
  }
  *out = static_cast<int64_t>(value);
  return true;
}

// The strings of a TOML array; anything else in it is a type error of `field`.
std::vector<std::string> string_items(const FieldRef& field, const toml::array& array,
                                      const std::string& path) {
  std::vector<std::string> items;
  for (const toml::node& item : array) {
    const auto* s = item.as_string();
    if (s == nullptr) {
      throw_toml_type_error(field, item, path);
    }
    items.push_back(s->get());
  }
  return items;
}

// Stores a TOML value in `field`. Integers are fine for floats, whole floats for integers.
void set_from_toml(const FieldRef& field, const toml::node& node, const std::string& path) {
  switch (field.type) {
    case FieldType::kBool:
      if (const auto* b = node.as_boolean()) {
        *static_cast<bool*>(field.value) = b->get();
        return;
      }
      break;
    case FieldType::kInt:
      if (const auto* i = node.as_integer()) {
        *static_cast<int64_t*>(field.value) = i->get();
        return;
      }
      if (const auto* d = node.as_floating_point()) {
        if (integral_double(d->get(), static_cast<int64_t*>(field.value))) {
          return;
        }
      }
      break;
    case FieldType::kDouble:
      if (const auto* d = node.as_floating_point()) {
        *static_cast<double*>(field.value) = d->get();
        return;
      }
      if (const auto* i = node.as_integer()) {
        *static_cast<double*>(field.value) = static_cast<double>(i->get());
        return;
      }
      break;
    case FieldType::kString:
      if (const auto* s = node.as_string()) {
        *static_cast<std::string*>(field.value) = s->get();
        return;
      }
      break;
    case FieldType::kStringList:
      if (const auto* array = node.as_array()) {
        *static_cast<std::vector<std::string>*>(field.value) = string_items(field, *array, path);
        return;
      }
      // TorchTitan's "list[str] | str" keys (and its older files) give a comma-separated string.
      if (node.as_string() != nullptr) {
        set_from_text(field, node.as_string()->get(), "in TOML file " + path);
        return;
      }
      break;
    case FieldType::kStringLists:
      if (const auto* array = node.as_array()) {
        std::vector<std::vector<std::string>> lists;
        for (const toml::node& item : *array) {
          const auto* inner = item.as_array();
          if (inner == nullptr) {
            throw_toml_type_error(field, item, path);
          }
          lists.push_back(string_items(field, *inner, path));
        }
        *static_cast<std::vector<std::vector<std::string>>*>(field.value) = std::move(lists);
        return;
      }
      break;
  }
  throw_toml_type_error(field, node, path);
}

std::string read_file(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    throw ConfigError(message("config file '", path,
                              "' (job.config_file) does not exist (a relative path is "
                              "taken from the current directory)"));
  }
  if (std::filesystem::is_directory(path, ec)) {
    throw ConfigError(
        message("config file '", path, "' (job.config_file) is a directory, not a file"));
  }
  // A FIFO would block the read forever, a device could fill memory: only regular files.
  if (const std::string kind = non_regular_file_kind(path); !kind.empty()) {
    throw ConfigError(
        message("config file '", path, "' (job.config_file) is ", kind,
                ", not a regular file. HINT: write the config to a file and name that file"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in.is_open()) {
    throw ConfigError(
        message("cannot open config file '", path, "' (job.config_file) for reading"));
  }
  std::ostringstream content;
  content << in.rdbuf();
  return content.str();
}

[[noreturn]] void throw_unexpected_argument(const FieldTable& table, const std::string& arg) {
  std::string text = "unexpected command-line argument '" + shown_name(arg) +
                     "'; overrides look like --section.key value or --section.key=value";
  // "--steps 10": a key without its section.
  if (starts_with(arg, "--")) {
    std::string key =
        arg.substr(2, arg.find('=') == std::string::npos ? std::string::npos : arg.find('=') - 2);
    std::vector<std::string> names = table.names_with_key(key);
    if (!names.empty()) {
      text += "; did you mean '--" + names.front() + "'";
      for (size_t i = 1; i < names.size(); ++i) {
        text += " or '--" + names[i] + "'";
      }
      text += "?";
    }
  }
  throw ConfigError(text);
}

// Stores the keys of the TOML table `[section]`. A sub-table is a section of its own
// ([training.dataloader]) or holds some ([quantize] holds [quantize.linear.float8]).
void apply_toml_table(const FieldTable& table, const std::string& section,
                      const toml::table& section_table, const std::string& at,
                      const std::string& path) {
  const bool is_section = table.has_section(section);
  if (!is_section && !table.has_sections_under(section)) {
    table.require_section(section, at);  // throws, naming the nearest section
  }
  for (auto&& [key_name, node] : section_table) {
    const std::string key(key_name.str());
    const std::string where = "in TOML file " + where_in_file(path, key_name.source());
    const std::string sub = section + "." + key;
    if (node.is_table() && (table.has_section(sub) || table.has_sections_under(sub))) {
      apply_toml_table(table, sub, *node.as_table(), where, path);
    } else if (is_section) {
      set_from_toml(table.lookup(section, key, where), node, path);
    } else {
      table.require_section(sub, where);  // [quantize] holds only sections
    }
  }
}

}  // namespace

std::vector<Override> parse_overrides(const FieldTable& table,
                                      const std::vector<std::string>& args) {
  std::vector<Override> overrides;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (!starts_with(arg, "--")) {
      throw_unexpected_argument(table, arg);
    }
    std::string name = arg.substr(2);
    size_t eq = name.find('=');
    bool has_inline_value = eq != std::string::npos;
    std::string inline_value = has_inline_value ? name.substr(eq + 1) : "";
    name = name.substr(0, eq);
    // Section names may hold dots (training.dataloader), keys never do.
    size_t dot = name.rfind('.');
    if (dot == std::string::npos || dot == 0 || dot + 1 == name.size()) {
      throw_unexpected_argument(table, arg);
    }
    const FieldRef& field = table.lookup(name.substr(0, dot), name.substr(dot + 1),
                                         std::string(kFromCommandLine) + ": " + shown_name(arg));

    if (has_inline_value) {
      overrides.push_back({&field, inline_value});
    } else if (field.type == FieldType::kBool) {
      bool explicit_value = i + 1 < args.size() && is_bool_text(args[i + 1]);
      overrides.push_back({&field, explicit_value ? args[++i] : "true"});
    } else if (i + 1 < args.size() && !starts_with(args[i + 1], "--")) {
      overrides.push_back({&field, args[++i]});
    } else {
      throw ConfigError(message("config key '", field.name(),
                                "' is given no value on the command line; write --", field.name(),
                                " ", type_label(field.type), " (or --", field.name(),
                                "=VALUE for a value that starts with --)"));
    }
  }
  return overrides;
}

void apply_overrides(const std::vector<Override>& overrides) {
  for (const Override& o : overrides) {
    set_from_text(*o.field, o.text, kFromCommandLine);
  }
}

void apply_toml_file(const FieldTable& table, const std::string& path) {
  apply_toml_text(table, read_file(path), path);
}

void apply_toml_text(const FieldTable& table, const std::string& content, const std::string& path) {
  toml::table document;
  try {
    document = toml::parse(content, path);
  } catch (const toml::parse_error& e) {
    throw ConfigError(message("cannot parse TOML config file ", where_in_file(path, e.source()),
                              ": ", e.description()));
  }

  for (auto&& [section_key, section_node] : document) {
    std::string section(section_key.str());
    std::string at = "in TOML file " + where_in_file(path, section_key.source());
    const toml::table* section_table = section_node.as_table();
    if (section_table == nullptr) {
      // `steps = 10` before any [section] header.
      if (table.has_section(section)) {
        throw ConfigError(
            message("config section '", section, "' must be a table ([", section, "]) (", at, ")"));
      }
      std::vector<std::string> names = table.names_with_key(section);
      std::string text = "config key '" + shown_name(section) + "' is outside any [section]";
      if (!names.empty()) {
        text += "; did you mean '" + names.front() + "'?";
      }
      throw ConfigError(message(text, " (", at, ")"));
    }
    apply_toml_table(table, section, *section_table, at, path);
  }
}

}  // namespace titan::detail
