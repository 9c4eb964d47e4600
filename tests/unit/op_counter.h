// Counts the calls of one ATen op by name while alive, on every thread (a global RecordFunction
// callback: autograd runs a CUDA backward on threads of its own), so a test can tell whether a
// kernel ran again:
//
//   test::OpCounter flash("aten::_scaled_dot_product_flash_attention");
//   ... forward + backward ...
//   EXPECT_EQ(flash.count(), n_layers);
//
// One counter at a time.
#pragma once

#include <ATen/record_function.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

namespace titan::test {

class OpCounter {
 public:
  explicit OpCounter(std::string op) : op_(std::move(op)) {
    EXPECT_EQ(active(), nullptr) << "one OpCounter at a time";
    active() = this;
    handle_ = at::addGlobalCallback(at::RecordFunctionCallback(&on_start));
  }
  ~OpCounter() {
    at::removeCallback(handle_);
    active() = nullptr;
  }
  OpCounter(const OpCounter&) = delete;
  OpCounter& operator=(const OpCounter&) = delete;

  int64_t count() const { return count_.load(); }

 private:
  static std::atomic<OpCounter*>& active() {
    static std::atomic<OpCounter*> counter{nullptr};
    return counter;
  }
  static std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
    OpCounter* counter = active().load();
    if (counter != nullptr && std::strcmp(fn.name(), counter->op_.c_str()) == 0) {
      ++counter->count_;
    }
    return nullptr;
  }

  std::string op_;
  std::atomic<int64_t> count_{0};
  at::CallbackHandle handle_ = 0;
};

}  // namespace titan::test
