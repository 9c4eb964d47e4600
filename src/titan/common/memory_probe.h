// Bytes of CPU tensor storage, live and at peak: a pass-through wrapper around ATen's CPU
// allocator that counts what it hands out and gets back. For tests and benchmarks that compare
// the memory of variants within one process (the process's peak RSS cannot be reset, and the
// heap keeps freed blocks). Counts every allocation made through c10::GetCPUAllocator() after
// install() (tensors, their storages); not BLAS or oneDNN scratch buffers, nor allocations made
// before install().
#pragma once

#include <cstdint>

namespace titan {

class CpuMemoryProbe {
 public:
  // Wraps the current CPU allocator (once per process; later calls do nothing). Call before
  // the allocations to be measured, ideally at start-up before other threads allocate.
  static void install();
  // Bytes allocated through the probe and not yet freed.
  static int64_t live_bytes();
  // The largest live_bytes() since the last reset_peak() (or install()).
  static int64_t peak_bytes();
  // Starts a new peak at the current live bytes.
  static void reset_peak();
  // An allocation that would take live_bytes() past `bytes` throws c10::OutOfMemoryError, as a
  // device's allocator does when it is full (0: no limit, the default). Lets a CPU run rehearse
  // what happens on an out-of-memory error (TITAN_CPU_MEMORY_LIMIT; see docs/observability.md).
  static void set_limit(int64_t bytes);
};

}  // namespace titan
