// Stager: host copies of the state an asynchronous save writes, fresh or in one reused set of
// (pinned) buffers.
#include "titan/checkpoint/staging.h"

#include "titan/common/device.h"

#include <ATen/core/grad_mode.h>

#include <algorithm>

namespace titan::ckpt {

std::string staging_key(const SavedTensor& t) {
  std::string key = t.name;
  if (!t.box.offsets.empty()) {
    key += "@";
    for (size_t d = 0; d < t.box.offsets.size(); ++d) {
      key += (d ? "_" : "") + std::to_string(t.box.offsets[d]);
    }
  }
  return key;
}

int64_t Stager::bytes() const {
  int64_t n = 0;
  for (const auto& [key, buffer] : buffers_) n += buffer.numel() * buffer.element_size();
  return n;
}

void Stager::stage(std::vector<SavedTensor>& tensors) {
  at::NoGradGuard no_grad;
  if (!reuse_) {
    for (SavedTensor& t : tensors) {
      t.local = t.local.detach().to(at::kCPU, /*non_blocking=*/false, /*copy=*/true);
      ++allocations_;
    }
    return;
  }
  std::map<std::string, at::Tensor> kept;  // this save's set; replaces buffers_
  std::vector<at::Device> devices;         // the devices copied from, synchronized once
  for (SavedTensor& t : tensors) {
    const std::string key = staging_key(t);
    const at::Tensor src = t.local.detach();
    at::Tensor buffer;
    const auto it = buffers_.find(key);
    if (it != buffers_.end() && it->second.sizes() == src.sizes() &&
        it->second.scalar_type() == src.scalar_type()) {
      buffer = it->second;
    } else {
      buffer = empty_staging(src.sizes(), src.scalar_type(), src.device());
      ++allocations_;
    }
    buffer.copy_(src, /*non_blocking=*/!src.device().is_cpu());
    if (!src.device().is_cpu() &&
        std::find(devices.begin(), devices.end(), src.device()) == devices.end()) {
      devices.push_back(src.device());
    }
    t.local = buffer;
    kept[key] = buffer;
  }
  // The copies above are queued on each device's current stream; the writer reads the buffers
  // on another thread, so they must be complete before stage() returns.
  for (const at::Device& device : devices) synchronize_device(device);
  buffers_ = std::move(kept);
}

}  // namespace titan::ckpt
