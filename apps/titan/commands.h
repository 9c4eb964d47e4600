// The `titan` subcommands. Each takes the arguments after its name and returns an exit code;
// ConfigError escapes to main(), which prints it and exits with code 2.
#pragma once

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

// True (and prints help for `command`) when args ask for --help / -h.
bool maybe_print_help(const std::string& command, const std::vector<std::string>& args);

}  // namespace titan
