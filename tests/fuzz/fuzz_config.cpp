// Fuzzes the job config: a TOML file plus command-line overrides, through parse_job_config (TOML
// syntax, unknown sections/keys, types, list and bool overrides, validate_job_config).
//
// Input: the TOML text, optionally followed by a line "--8<--" and the command-line arguments, one
// per line. An argument naming job.config_file is dropped (the harness supplies the file, so the
// fuzzer cannot point it at /dev/zero). A config that parses must survive the --job.print_config
// round trip: its rendered TOML parses back to the same rendering.
#include "fuzz_util.h"

#include "titan/config/config_manager.h"

#include <cstdio>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace titan;
  const std::vector<std::string_view> parts = fuzz::split_input(data, size, "\n--8<--\n");
  const std::string toml_path = fuzz::write_input("config.toml", parts[0]);
  std::vector<std::string> args = {"--job.config_file", toml_path};
  for (size_t p = 1; p < parts.size(); ++p) {
    std::string_view rest = parts[p];
    while (!rest.empty()) {
      const size_t end = std::min(rest.find('\n'), rest.size());
      std::string arg(rest.substr(0, end));
      rest.remove_prefix(std::min(end + 1, rest.size()));
      if (arg.find("config_file") == std::string::npos) args.push_back(std::move(arg));
    }
  }
  fuzz::expect_success_or_rejection([&] {
    const std::string rendered = render_config_toml(parse_job_config(args));
    // Written over the input so that job.config_file renders the same.
    fuzz::write_input("config.toml", rendered);
    const std::string again =
        render_config_toml(parse_job_config({"--job.config_file", toml_path}));
    if (again != rendered) {
      std::fprintf(stderr, "print_config round trip differs:\n%s\n---- became ----\n%s\n",
                   rendered.c_str(), again.c_str());
      std::abort();
    }
  });
  return 0;
}
