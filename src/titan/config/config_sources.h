// The two sources that fill a FieldTable: a TOML file and command-line overrides.
//
// Internal to src/titan/config. parse_job_config() splits the command line first (so an unknown
// key fails before any file is read), loads the TOML file it names, then applies the overrides,
// which gives the precedence command line > TOML > defaults.
#pragma once

#include "titan/config/field_table.h"

#include <string>
#include <vector>

namespace titan::detail {

// One `--section.key [value]` from the command line; bare bool switches carry "true".
struct Override {
  const FieldRef* field;
  std::string text;
};

// Splits `args` into overrides: `--section.key value`, `--section.key=value`, and bool switches
// (a bool followed by true/false/1/0 takes it as its value, otherwise it is a bare switch).
// A token that starts with "--" is never taken as a value. Throws ConfigError for anything that
// is not `--section.key`, unknown names, and non-bool keys with no value.
std::vector<Override> parse_overrides(const FieldTable& table,
                                      const std::vector<std::string>& args);

// Stores each override's value in its field, in order (a repeated key: the last one wins).
void apply_overrides(const std::vector<Override>& overrides);

// Reads the TOML file at `path` and stores every key it sets. Throws ConfigError for a missing
// or unreadable file, a TOML syntax error (with file:line:col), unknown sections and keys, and
// values of the wrong type (with where they are in the file).
void apply_toml_file(const FieldTable& table, const std::string& path);
// The same for TOML text already in memory; `path` names it in messages.
void apply_toml_text(const FieldTable& table, const std::string& content, const std::string& path);

}  // namespace titan::detail
