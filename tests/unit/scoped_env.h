// An environment variable set (or unset) for a scope, restored afterwards: for tests of code that
// reads the environment. Not thread-safe, as setenv is not: use it outside threads-as-ranks code.
#pragma once

#include <cstdlib>
#include <string>

namespace titan::test {

class ScopedEnv {
 public:
  // value null: unset for the scope.
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* old = std::getenv(name);
    had_ = old != nullptr;
    if (had_) old_ = old;
    if (value == nullptr) {
      ::unsetenv(name);
    } else {
      ::setenv(name, value, 1);
    }
  }
  ~ScopedEnv() {
    if (had_) {
      ::setenv(name_.c_str(), old_.c_str(), 1);
    } else {
      ::unsetenv(name_.c_str());
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_;
  bool had_ = false;
  std::string old_;
};

}  // namespace titan::test
