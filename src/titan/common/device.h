// The device a rank computes on, and the few facts about it that training needs, behind one API
// for CPU and CUDA. Everything else in titan.cpp is device-generic (at::Device, c10::Stream,
// c10::Event); this file (and device.cpp) is where CUDA-specific calls live, compiled only in a
// build against a CUDA libtorch (TITAN_HAS_CUDA). A CUDA build runs on machines without a GPU or
// driver: it then finds no CUDA device.
//
// Selection (training.device), as TorchTitan does it:
//   "auto"  cuda:LOCAL_RANK when CUDA devices are visible (CUDA_VISIBLE_DEVICES respected, as the
//           CUDA runtime applies it), otherwise cpu;
//   "cuda"  cuda:LOCAL_RANK, an error when no CUDA device is visible;
//   "cpu"   the CPU even when GPUs are visible.
// A rank whose LOCAL_RANK has no device of its own (more ranks per node than visible GPUs) is an
// error that shows the arithmetic, never two ranks on one GPU, except in the shared-device test
// mode (TITAN_SHARED_DEVICE=1): there local rank r takes cuda:(r % visible devices), so that
// several ranks share one GPU, and their process groups are Gloo over host copies of the CUDA
// tensors (NCCL refuses two ranks on one device; distributed/init.h). It exists to run FSDP's
// side streams, TP, PP, CP and EP with real CUDA asynchrony on a one-GPU machine; it is slow
// (every collective waits for the device and crosses the host) and never meant for training.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <string>

namespace titan {

// True when this binary was built against a CUDA libtorch (it can drive GPUs when a driver and
// devices are present).
bool cuda_build();
// CUDA devices this process can see (0 in a CPU build, without a driver, or without GPUs).
int64_t cuda_device_count();

// True when TITAN_SHARED_DEVICE=1 (the shared-device test mode above); unset, empty or 0: false.
// Any other value is a ConfigError naming the variable and its values.
bool shared_device_mode();

// The device for training.device `setting` on the rank with `local_rank` of `local_world_size`
// ranks on its node, when `cuda_devices` CUDA devices are visible; with `shared_device` (the test
// mode) ranks beyond the devices share them. Pure (tests call it with any count); throws
// ConfigError naming `key` (where the setting came from) and the arithmetic.
at::Device resolve_device(const std::string& setting, int64_t local_rank, int64_t local_world_size,
                          int64_t cuda_devices, const std::string& key = "training.device",
                          bool shared_device = false);
// resolve_device with this process's visible devices and shared_device_mode(); on CUDA also
// makes the device current. In the shared-device mode each rank's log says so in a warning.
at::Device select_device(const std::string& setting, int64_t local_rank, int64_t local_world_size,
                         const std::string& key = "training.device");
// How many of the node's `local_world_size` ranks compute on local rank `local_rank`'s CUDA
// device when `cuda_devices` are visible: 1, or more in the shared-device mode.
int64_t ranks_per_device(int64_t local_rank, int64_t local_world_size, int64_t cuda_devices);

// Facts about a device for logs and MFU.
struct DeviceInfo {
  at::Device device = at::kCPU;
  std::string name;          // "NVIDIA H200", or the CPU's model name
  int64_t total_memory = 0;  // bytes (device memory; machine memory for the CPU)
  int compute_major = 0;     // CUDA compute capability (0 on CPU)
  int compute_minor = 0;
  int64_t multiprocessors = 0;  // CUDA SMs (0 on CPU)
  // "cuda:0 (NVIDIA H200, 139.8 GiB, sm_90)" / "cpu (Intel(R) Xeon(R) ..., 2 cores)"
  std::string describe() const;
};
DeviceInfo device_info(const at::Device& device);

// True when `device` runs float8 matmuls (at::_scaled_mm): CUDA compute capability >= 8.9
// (Ada, Hopper, Blackwell).
bool supports_float8(const DeviceInfo& info);

// Whether libtorch's CUDA flash attention kernel takes this causal attention: q (bs, heads, L,
// hd), k (bs, kv_heads, L, hd) on a CUDA device, under the user's SDPA switches
// (at::globalContext().setSDPUseFlash). Asked of the kernel itself, not of SDPA's choice:
// libtorch 2.9 and later put cuDNN first on sm90 / sm100, where flash still runs. False on a
// libtorch without CUDA.
bool cuda_flash_attention_fits(const at::Tensor& q, const at::Tensor& k);

// The caching allocator's counters of a CUDA device since the last reset_device_memory_stats
// (TorchTitan's DeviceMemoryMonitor). All zero on the CPU.
struct DeviceMemoryStats {
  int64_t max_active_bytes = 0;    // peak of memory held by live tensors
  int64_t max_reserved_bytes = 0;  // peak of memory the allocator held from the driver
  int64_t alloc_retries = 0;       // cudaMalloc failures the allocator recovered from by freeing
  int64_t ooms = 0;                // out-of-memory errors raised
};
DeviceMemoryStats device_memory_stats(const at::Device& device);
// Starts a new window for the peaks and counters above (no-op on the CPU).
void reset_device_memory_stats(const at::Device& device);

// Waits until all work queued on `device` is done (no-op on the CPU).
void synchronize_device(const at::Device& device);

// The best rate (FLOP/s) of ATen's product a @ b (2-D, on one device) over at least `min_iters`
// timed products, more until `budget_s` has passed (at most 200), after one untimed product (the
// first call sets BLAS, oneDNN or cuBLAS up); each is timed to the device's completion.
double best_matmul_flops(const at::Tensor& a, const at::Tensor& b, int min_iters,
                         double budget_s = 0.0);

// Host memory whose copies to `device` can run asynchronously (page-locked) when `device` is a
// CUDA device; ordinary memory otherwise (the CPU, or no driver).
at::Tensor empty_staging(at::IntArrayRef sizes, at::ScalarType dtype, const at::Device& device);

// `host` (a CPU tensor) on `device`: as is on the CPU; on CUDA staged through page-locked memory
// (the pinned host allocator's cache, which keeps the block until the copy has run) and copied
// without blocking the host, ordered on the current stream.
at::Tensor to_device_async(const at::Tensor& host, const at::Device& device);

// Deterministic algorithms (debug.deterministic) on `device`: ATen's deterministic mode and, on
// CUDA, cuBLAS's fixed workspace (CUBLAS_WORKSPACE_CONFIG=:4096:8 when unset), which must be set
// before cuBLAS starts: call before the first matmul on the device.
void set_deterministic(const at::Device& device, bool warn_only);

}  // namespace titan
