// The host copies an asynchronous save writes from (checkpoint.async_mode), taken while the
// training loop waits, so that it can go on changing parameters and optimizer state in place.
//
//   "async"                  fresh CPU copies at every save, freed when their write ends (as
//                            TorchTitan's plain async save stages its state dict to CPU).
//   "async_with_pinned_mem"  one set of host buffers, allocated at the first save and reused by
//                            every later one (TorchTitan allocates its pinned CPU state dict
//                            once, too). Buffers come from empty_staging: page-locked when the
//                            tensor lives on a CUDA device, ordinary memory otherwise. A buffer
//                            is re-allocated only when its tensor's shape or dtype changed (a
//                            model-only save in export_dtype), and buffers of tensors a save no
//                            longer hands over are freed, so at most one set is held. Copies from
//                            a device are non_blocking, followed by one synchronization of each
//                            device before the writer thread reads the buffers.
// The manager never stages while a write is in flight: save() first waits for the previous one
// (CheckpointManager::wait), so no buffer is overwritten while it is being written.
#pragma once

#include "titan/checkpoint/checkpoint_files.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace titan::ckpt {

class Stager {
 public:
  // `reuse`: keep one set of (pinned) buffers across saves ("async_with_pinned_mem").
  explicit Stager(bool reuse) : reuse_(reuse) {}

  // Replaces every tensor's `local` with its host copy; returns when every copy is complete.
  void stage(std::vector<SavedTensor>& tensors);

  bool reuses() const { return reuse_; }
  // The buffers held for reuse, by tensor name and box offsets ("name" or "name@0_64"); empty
  // without reuse.
  const std::map<std::string, at::Tensor>& buffers() const { return buffers_; }
  int64_t allocations() const { return allocations_; }  // buffers allocated so far
  int64_t bytes() const;                                // bytes of the buffers held

 private:
  bool reuse_;
  std::map<std::string, at::Tensor> buffers_;
  int64_t allocations_ = 0;
};

// The key of a saved tensor's buffer: its name, plus its box offsets when it is a box.
std::string staging_key(const SavedTensor& t);

}  // namespace titan::ckpt
