// Multi-rank tests in one process (the c10d test pattern): one thread per rank, every rank's
// group built over one shared HashStore, Gloo over loopback. An exception on any rank fails the
// test with that rank named; a rank that never returns is caught by the group timeout.
#pragma once

#include "titan/distributed/comm.h"

#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <gtest/gtest.h>

#include <exception>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace titan::test {

inline dist::GroupOptions loopback_options(
    std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
  dist::GroupOptions o;
  o.gloo_hostname = "127.0.0.1";
  o.timeout = timeout;
  o.check_agreement = true;
  o.gloo_threads = 1;
  return o;
}

// Runs body(rank, world) on `size` threads, each with its own world group. Returns each rank's
// exception message ("" when it returned normally) so tests can assert on failures.
inline std::vector<std::string> run_ranks_collect(
    int size, const std::function<void(int, std::shared_ptr<dist::Group>)>& body,
    dist::GroupOptions options = loopback_options()) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::string> errors(size);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      try {
        auto world = dist::Group::create(store, r, size, options);
        body(r, world);
      } catch (const c10::Error& e) {
        errors[r] = e.what_without_backtrace();
        if (errors[r].empty()) errors[r] = "(empty c10::Error)";
      } catch (const std::exception& e) {
        errors[r] = e.what();
        if (errors[r].empty()) errors[r] = "(empty exception)";
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

// As above, and every rank must succeed.
inline void run_ranks(int size, const std::function<void(int, std::shared_ptr<dist::Group>)>& body,
                      dist::GroupOptions options = loopback_options()) {
  auto errors = run_ranks_collect(size, body, options);
  for (int r = 0; r < size; ++r) {
    EXPECT_EQ(errors[r], "") << "rank " << r << " of " << size << " failed";
  }
}

}  // namespace titan::test
