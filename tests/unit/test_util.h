// Helpers shared by the unit tests: writing files, fresh folders, reading an exception's message.
#pragma once

#include "titan/config/job_config.h"

#include <filesystem>
#include <fstream>
#include <functional>

#include <gtest/gtest.h>
#include <string>
#include <unistd.h>

namespace titan::test {

// Writes `text` to `path`, creating parent folders.
inline void write_file(const std::filesystem::path& path, const std::string& text) {
  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary);
  out << text;
}

// The what() of the exception `fn` throws, or "" if it throws nothing.
inline std::string message_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

// An empty folder unique to this process and the running test: <tmp>/<prefix>_<pid>_<test>.
inline std::filesystem::path fresh_test_dir(const std::string& prefix) {
  const auto dir = std::filesystem::temp_directory_path() /
                   (prefix + "_" + std::to_string(getpid()) + "_" +
                    ::testing::UnitTest::GetInstance()->current_test_info()->name());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// A job config for trainer tests: the tiny flavor, 32-token sequences, float32, one thread, no
// FLOP probe, quiet metrics, writing into `dump_folder`, on the CPU (training.device's default,
// auto, would take a GPU where one is visible, and threads-as-ranks tests would then need one
// GPU per rank). Tests set data, steps and seed.
inline JobConfig tiny_training_config(const std::string& dump_folder) {
  JobConfig c;
  c.job.dump_folder = dump_folder;
  c.training.device = "cpu";
  c.model.flavor = "tiny";
  c.training.seq_len = 32;
  c.training.mixed_precision_param = "float32";
  c.training.num_threads = 1;
  c.metrics.log_freq = 100;
  c.metrics.peak_flops = 1e12;  // skip the probe
  c.metrics.disable_color_printing = true;
  return c;
}

inline bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

}  // namespace titan::test
