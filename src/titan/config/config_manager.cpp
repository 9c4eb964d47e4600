// The JobConfig entry points: parse (defaults, then TOML, then command line, then validate),
// --help and --job.print_config.
#include "titan/config/config_manager.h"

#include "titan/config/config_sources.h"
#include "titan/config/field_table.h"

namespace titan {

namespace {

constexpr const char* kConfigFileKey = "job.config_file";

}  // namespace

JobConfig parse_job_config(const std::vector<std::string>& args) {
  JobConfig config;
  detail::FieldTable table = detail::FieldTable::of(config);
  // Split the whole command line first so a misspelled key fails before any file is read.
  std::vector<detail::Override> overrides = detail::parse_overrides(table, args);
  std::string config_file;
  for (const detail::Override& o : overrides) {
    if (o.field->name() == kConfigFileKey) {
      config_file = o.text;
    }
  }
  if (!config_file.empty()) {
    detail::apply_toml_file(table, config_file);
  }
  detail::apply_overrides(overrides);
  validate_job_config(config);
  return config;
}

std::string render_help(const std::string& command) {
  JobConfig defaults;
  return detail::render_help(detail::FieldTable::of(defaults), command);
}

std::string render_config_toml(const JobConfig& config) {
  JobConfig copy = config;
  return detail::render_toml(detail::FieldTable::of(copy));
}

}  // namespace titan
