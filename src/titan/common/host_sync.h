// Device-to-host reads, counted. On a GPU every read of a device value by the host (`.item()`, a
// copy to the CPU) waits for all the work queued before it, so the host stops running ahead of
// the device; a lean training step makes at most one on steps that do not log. Every such read in
// the training path goes through these functions, which count them per thread (one thread issues
// a rank's work), and the trainer writes the count of each logged step to metrics.jsonl
// (`host_syncs`). The count is the same on the CPU, where the reads cost nothing, so CPU tests pin
// the budget a GPU run will have.
//
//   double loss = host_item<double>(loss_tensor);   // one counted read
//   at::Tensor counts = to_host(device_counts);     // one counted copy (as is on the CPU)
//   int64_t before = host_sync_count(); ...; int64_t made = host_sync_count() - before;
//
// Only values on the training device go through here; host-side tensors (data batches before
// their copy, checkpoint staging) are not device reads.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace titan {

namespace detail {
inline thread_local int64_t host_syncs = 0;
}  // namespace detail

// Device-to-host reads this thread has made through the functions below.
inline int64_t host_sync_count() { return detail::host_syncs; }

// Counts one read made some other way (e.g. a CUDA event's synchronize).
inline void note_host_sync() { ++detail::host_syncs; }

// `t` in host memory: a copy from a device (one counted read), or `t` itself on the CPU (counted
// too: the same code reads a device there).
inline at::Tensor to_host(const at::Tensor& t) {
  note_host_sync();
  return t.device().is_cpu() ? t : t.to(at::kCPU);
}

// The value of a one-element tensor (one counted read).
template <typename T>
T host_item(const at::Tensor& t) {
  note_host_sync();
  return t.item<T>();
}

}  // namespace titan
