// Helpers shared by the unit tests: writing files, fresh folders, reading an exception's message.
#pragma once

#include <filesystem>
#include <fstream>
#include <functional>

#include <gtest/gtest.h>
#include <unistd.h>
#include <string>

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

inline bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

}  // namespace titan::test
