// The JobConfig entry points: parse (defaults, then TOML, then command line, then validate),
// --help, --job.print_config, and the edit-distance helper behind every "did you mean".
#include "titan/config/config_manager.h"

#include "titan/config/config_sources.h"
#include "titan/config/field_table.h"

#include <algorithm>
#include <cstdint>

namespace titan {

namespace {

constexpr const char* kConfigFileKey = "job.config_file";

size_t levenshtein(const std::string& a, const std::string& b) {
  // One row of the (|a|+1) x (|b|+1) edit-distance table at a time.
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) {
    row[j] = j;
  }
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t above = row[j];
      size_t substitute = diagonal + (a[i - 1] == b[j - 1] ? 0 : 1);
      row[j] = std::min({above + 1, row[j - 1] + 1, substitute});
      diagonal = above;
    }
  }
  return row[b.size()];
}

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

std::string nearest_name(const std::string& name, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_distance = SIZE_MAX;
  for (const std::string& candidate : candidates) {
    size_t distance = levenshtein(name, candidate);
    // Strictly smaller: on a tie the earlier candidate stays.
    if (distance < best_distance) {
      best = candidate;
      best_distance = distance;
    }
  }
  return best;
}

}  // namespace titan
