// Shared pieces of the libFuzzer harnesses (tests/fuzz/fuzz_*.cpp): a scratch folder private to
// the process, inputs written as files (the parsers read paths, as the app does), splitting one
// input into several files, and the rule for what counts as a finding.
//
// The contract under test: a parser given any bytes either succeeds or throws titan::ConfigError /
// titan::DataError (the app's exit codes 2 / 1). Any other exception escapes the harness, and
// libFuzzer reports it like a crash, a leak, a hang or a sanitizer report.
#pragma once

#include "titan/common/check.h"

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

namespace titan::fuzz {

// <TMPDIR>/titan-fuzz-<pid>, created on first use and removed when the process exits normally.
inline const std::filesystem::path& scratch_dir() {
  static const std::filesystem::path dir = [] {
    std::filesystem::path d =
        std::filesystem::temp_directory_path() / ("titan-fuzz-" + std::to_string(getpid()));
    std::filesystem::remove_all(d);
    std::filesystem::create_directories(d);
    std::atexit([] { std::filesystem::remove_all(scratch_dir()); });
    return d;
  }();
  return dir;
}

// Writes `bytes` to `name` inside the scratch folder and returns its path.
inline std::string write_input(const std::string& name, std::string_view bytes) {
  const std::filesystem::path path = scratch_dir() / name;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) std::abort();  // the harness itself failed, not the parser
  return path.string();
}

// The parts of `data` between occurrences of `separator` (a line such as "--8<--\n"); always at
// least one part. Lets one input carry several files (vocab.json + merges.txt, TOML + arguments).
inline std::vector<std::string_view> split_input(const uint8_t* data, size_t size,
                                                 std::string_view separator) {
  std::string_view rest(reinterpret_cast<const char*>(data), size);
  std::vector<std::string_view> parts;
  for (size_t at; (at = rest.find(separator)) != std::string_view::npos;) {
    parts.push_back(rest.substr(0, at));
    rest.remove_prefix(at + separator.size());
  }
  parts.push_back(rest);
  return parts;
}

// Runs `parse`; the documented rejections return normally, everything else propagates.
template <typename Fn>
void expect_success_or_rejection(Fn&& parse) {
  try {
    parse();
  } catch (const ConfigError&) {
  } catch (const DataError&) {
  }
}

// Writes the input to `name` in the scratch folder and runs `parse(path)` as above.
template <typename Fn>
void parse_input_file(const std::string& name, const uint8_t* data, size_t size, Fn&& parse) {
  const std::string path = write_input(name, {reinterpret_cast<const char*>(data), size});
  expect_success_or_rejection([&] { parse(path); });
}

}  // namespace titan::fuzz
