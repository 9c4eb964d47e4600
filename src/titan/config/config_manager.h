// Turns a command line (and the TOML file it names) into a validated JobConfig.
//
// Precedence: command line > TOML file > defaults. Overrides are `--section.key value`,
// `--section.key=value`, bare boolean switches (`--job.print_config`, or `--section.key=false`),
// and comma-separated lists. Every problem is a ConfigError whose message names the key, the bad
// value and, for unknown names, the nearest valid one; the app turns it into exit code 2.
#pragma once

#include "titan/common/names.h"  // nearest_name, for the config layer's "did you mean"
#include "titan/config/job_config.h"

#include <string>
#include <vector>

namespace titan {

// Parses `args` (the arguments after the subcommand, e.g. {"--job.config_file", "x.toml",
// "--training.steps", "10"}): loads job.config_file if given, applies overrides on top, then
// runs validate_job_config(). Throws ConfigError.
JobConfig parse_job_config(const std::vector<std::string>& args);

// A config from TOML text (a checkpoint's recorded job config); `origin` names it in messages.
// Throws ConfigError as parse_job_config does.
JobConfig parse_job_config_toml(const std::string& toml, const std::string& origin);

// Range and cross-field checks that need no model or data (e.g. log_freq >= 1,
// global_batch_size divisible by local_batch_size * dp, decay_type known). Throws ConfigError
// showing the arithmetic.
void validate_job_config(const JobConfig& config);

// `titan <command> --help`: every section and key with its type, default and description.
std::string render_help(const std::string& command);

// The full config as TOML (for --job.print_config and for saving next to outputs).
std::string render_config_toml(const JobConfig& config);

// job.save_config_file: writes render_config_toml(config) to job.dump_folder /
// job.save_config_file (an absolute path stands alone), creating folders, and returns the path;
// "" when the key is unset. Throws DataError when it cannot write. Call on rank 0 only.
std::string save_config_file(const JobConfig& config);

}  // namespace titan
