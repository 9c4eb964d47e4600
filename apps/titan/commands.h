// The `titan` subcommands. Each takes the arguments after its name and returns an exit code;
// ConfigError escapes to main(), which prints it and exits with code 2.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace titan {

int run_train(const std::vector<std::string>& args);
int run_inspect(const std::vector<std::string>& args);
int run_bench(const std::vector<std::string>& args);
int run_tokenizer(const std::vector<std::string>& args);
int run_data(const std::vector<std::string>& args);
int run_convert(const std::vector<std::string>& args);
int run_generate(const std::vector<std::string>& args);
int run_launch(const std::vector<std::string>& args);    // `titan run`
int run_selftest(const std::vector<std::string>& args);  // multi-process launch check
int run_fr(const std::vector<std::string>& args);  // `titan fr analyze`: flight-recorder dumps
// `titan pipeline-schedule`: a pipeline schedule's per-rank table and simulated bubble.
int run_pipeline_schedule(const std::vector<std::string>& args);
// `titan plan`: enumerates parallel layouts and predicts their memory and step time.
int run_plan(const std::vector<std::string>& args);
// `titan plot`: an SVG of runs' metrics (loss, lr, tokens/s, memory, ...) against steps.
int run_plot(const std::vector<std::string>& args);
// `titan flux encode`: FLUX's frozen encoders run once over a dataset, for training from them.
int run_flux(const std::vector<std::string>& args);
// `titan ft lighthouse`: the coordinator of fault-tolerant replica groups.
int run_ft(const std::vector<std::string>& args);

// True (and prints help for `command`) when args ask for --help / -h.
bool maybe_print_help(const std::string& command, const std::vector<std::string>& args);

// Strict argument parsing shared by the commands; each caller words its own error.
// A decimal integer that is the whole of `text` (sign allowed, no spaces); nullopt otherwise.
std::optional<int64_t> parse_int64(const std::string& text);
// Whitespace-separated integers; nullopt at the first field that is not one (stored in *bad).
std::optional<std::vector<int64_t>> parse_int_list(const std::string& text, std::string* bad);

}  // namespace titan
