// The JobConfig entry points: parse (defaults, then TOML, then command line, then validate),
// --help, --job.print_config and job.save_config_file.
#include "titan/config/config_manager.h"

#include "titan/common/check.h"
#include "titan/common/file_io.h"
#include "titan/common/logging.h"
#include "titan/config/config_sources.h"
#include "titan/config/field_table.h"

#include <filesystem>

namespace titan {

namespace {

constexpr const char* kConfigFileKey = "job.config_file";

}  // namespace

namespace {

// What every parsed config goes through last: TorchTitan's deprecated model.tokenizer_path still
// wins over hf_assets_path, as there; then the cross-field checks.
void finish_job_config(JobConfig& config) {
  if (!config.model.tokenizer_path.empty()) {
    log_warning(
        "model.tokenizer_path is deprecated, use model.hf_assets_path; setting "
        "hf_assets_path to '",
        config.model.tokenizer_path, "'");
    config.model.hf_assets_path = config.model.tokenizer_path;
  }
  validate_job_config(config);
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
  finish_job_config(config);
  return config;
}

JobConfig parse_job_config_toml(const std::string& toml, const std::string& origin) {
  JobConfig config;
  detail::apply_toml_text(detail::FieldTable::of(config), toml, origin);
  finish_job_config(config);
  return config;
}

std::string save_config_file(const JobConfig& config) {
  if (config.job.save_config_file.empty()) {
    return "";
  }
  const std::filesystem::path path =
      std::filesystem::path(config.job.dump_folder) / config.job.save_config_file;
  std::error_code ec;
  if (path.has_parent_path()) {
    std::filesystem::create_directories(path.parent_path(), ec);
  }
  if (ec) {
    throw DataError("cannot create the folder of job.save_config_file '" + path.string() + "': " +
                    ec.message() + ". HINT: check job.dump_folder and job.save_config_file");
  }
  replace_file(path.string(), render_config_toml(config));
  return path.string();
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
