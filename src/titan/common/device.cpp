#include "titan/common/device.h"

#include "titan/common/check.h"
#include "titan/common/cpu.h"
#include "titan/common/format.h"
#include "titan/common/logging.h"
#include "titan/common/torch_compat.h"

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <ATen/detail/CUDAHooksInterface.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <thread>

#if TITAN_HAS_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <ATen/native/transformers/cuda/sdp_utils.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace titan {

namespace {

std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) != 0) continue;
    const size_t colon = line.find(':');
    if (colon == std::string::npos) break;
    size_t begin = line.find_first_not_of(" \t", colon + 1);
    return begin == std::string::npos ? std::string("cpu") : line.substr(begin);
  }
  return "cpu";
}

std::string cuda_visible_devices() {
  const char* v = std::getenv("CUDA_VISIBLE_DEVICES");
  return v == nullptr ? std::string("unset") : "'" + std::string(v) + "'";
}

}  // namespace

bool cuda_build() { return TITAN_HAS_CUDA != 0; }

int64_t cuda_device_count() {
#if TITAN_HAS_CUDA
  // The hooks report 0 without a driver or devices instead of throwing.
  return at::detail::getCUDAHooks().deviceCount();
#else
  return 0;
#endif
}

bool shared_device_mode() {
  const char* v = std::getenv("TITAN_SHARED_DEVICE");
  if (v == nullptr || *v == '\0' || std::string(v) == "0") return false;
  if (std::string(v) == "1") return true;
  throw ConfigError(
      message("TITAN_SHARED_DEVICE='", v,
              "' must be 1 (test mode: ranks share GPUs over Gloo) or 0; unset it to give "
              "every rank a GPU of its own"));
}

at::Device resolve_device(const std::string& setting, int64_t local_rank, int64_t local_world_size,
                          int64_t cuda_devices, const std::string& key, bool shared_device) {
  if (setting == "cpu") return at::Device(at::kCPU);
  if (setting != "auto" && setting != "cuda") {
    throw ConfigError(message(key, " '", setting, "' is not one of auto, cpu, cuda"));
  }
  if (cuda_devices == 0) {
    if (setting == "auto") return at::Device(at::kCPU);
    throw ConfigError(
        message(key, " = \"cuda\" but ",
                (cuda_build() ? "no CUDA device is visible (CUDA_VISIBLE_DEVICES " +
                                    cuda_visible_devices() + ", or no driver)"
                              : std::string("this binary was built against a libtorch "
                                            "without CUDA")),
                ". HINT: use ", key, " = \"auto\" or \"cpu\""));
  }
  if (shared_device) {
    return at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(local_rank % cuda_devices));
  }
  if (local_world_size > cuda_devices || local_rank >= cuda_devices) {
    throw ConfigError(message(key, " = \"", setting, "\": ", local_world_size,
                              " ranks on this node need one CUDA device each, but ", cuda_devices,
                              " are visible (CUDA_VISIBLE_DEVICES ", cuda_visible_devices(),
                              "). HINT: launch at most ", cuda_devices,
                              " ranks per node (--nproc_per_node), or ", key, " = \"cpu\""));
  }
  return at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(local_rank));
}

at::Device select_device(const std::string& setting, int64_t local_rank, int64_t local_world_size,
                         const std::string& key) {
  // "cpu" never touches the CUDA runtime (no driver probe).
  const int64_t count = setting == "cpu" ? 0 : cuda_device_count();
  const bool shared = shared_device_mode();
  const at::Device device =
      resolve_device(setting, local_rank, local_world_size, count, key, shared);
#if TITAN_HAS_CUDA
  if (device.is_cuda()) c10::cuda::set_device(device.index());
#endif
  if (shared && device.is_cuda()) {
    log_warning("TEST MODE (TITAN_SHARED_DEVICE=1): local rank ", local_rank, " of ",
                local_world_size, " computes on ", device, " with ",
                ranks_per_device(local_rank, local_world_size, count) - 1,
                " other rank(s); process groups are Gloo over host copies of the CUDA tensors. "
                "For testing parallelism on one GPU: slow, never for training");
  }
  return device;
}

int64_t ranks_per_device(int64_t local_rank, int64_t local_world_size, int64_t cuda_devices) {
  if (cuda_devices <= 0 || local_world_size <= cuda_devices) return 1;
  // Local ranks r with r % cuda_devices == local_rank % cuda_devices.
  const int64_t rest = local_world_size % cuda_devices;
  return local_world_size / cuda_devices + (local_rank % cuda_devices < rest ? 1 : 0);
}

std::string DeviceInfo::describe() const {
  std::string out = device.str() + " (" + name;
  if (device.is_cuda()) {
    out += ", " + human_bytes(static_cast<uint64_t>(total_memory)) + ", sm_" +
           std::to_string(compute_major) + std::to_string(compute_minor) + ", " +
           std::to_string(multiprocessors) + " SMs";
  } else {
    out += ", " + std::to_string(std::thread::hardware_concurrency()) + " cores";
  }
  return out + ")";
}

DeviceInfo device_info(const at::Device& device) {
  DeviceInfo info;
  info.device = device;
  if (device.is_cpu()) {
    info.name = cpu_model_name();
    info.total_memory = static_cast<int64_t>(machine_memory_bytes());
    return info;
  }
#if TITAN_HAS_CUDA
  if (device.is_cuda()) {
    const cudaDeviceProp* p = at::cuda::getDeviceProperties(device.index());
    info.name = p->name;
    info.total_memory = static_cast<int64_t>(p->totalGlobalMem);
    info.compute_major = p->major;
    info.compute_minor = p->minor;
    info.multiprocessors = p->multiProcessorCount;
    return info;
  }
#endif
  TITAN_CHECK(false, "no device facts for ", device, " in this build");
}

bool supports_float8(const DeviceInfo& info) {
  return info.device.is_cuda() &&
         (info.compute_major > 8 || (info.compute_major == 8 && info.compute_minor >= 9));
}

bool cuda_flash_attention_fits(const at::Tensor& q, const at::Tensor& k) {
#if TITAN_HAS_CUDA
  if (!q.is_cuda()) return false;
  const sdp::sdp_params params{q,
                               k,
                               k,
                               /*attn_mask=*/std::nullopt,
                               /*dropout=*/0.0,
                               /*is_causal=*/true,
                               /*enable_gqa=*/q.size(1) != k.size(1)};
  return sdp::can_use_flash_attention(params, /*debug=*/false);
#else
  (void)q;
  (void)k;
  return false;
#endif
}

DeviceMemoryStats device_memory_stats(const at::Device& device) {
  DeviceMemoryStats out;
#if TITAN_HAS_CUDA
  if (device.is_cuda()) {
    // The caching allocator knows no device before CUDA is initialized in this process
    // ("Invalid device argument"): a process may ask before its first allocation.
    at::globalContext().lazyInitDevice(at::kCUDA);
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
    constexpr size_t kAll = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    out.max_active_bytes = stats.active_bytes[kAll].peak;
    out.max_reserved_bytes = stats.reserved_bytes[kAll].peak;
    out.alloc_retries = stats.num_alloc_retries;
    out.ooms = stats.num_ooms;
  }
#endif
  return out;
}

void reset_device_memory_stats(const at::Device& device) {
#if TITAN_HAS_CUDA
  if (device.is_cuda()) {
    at::globalContext().lazyInitDevice(at::kCUDA);  // as in device_memory_stats
    c10::cuda::CUDACachingAllocator::resetPeakStats(device.index());
    c10::cuda::CUDACachingAllocator::resetAccumulatedStats(device.index());
  }
#endif
}

void synchronize_device(const at::Device& device) {
#if TITAN_HAS_CUDA
  if (device.is_cuda()) c10::cuda::device_synchronize();
#endif
}

double best_matmul_flops(const at::Tensor& a, const at::Tensor& b, int min_iters, double budget_s) {
  at::Tensor c = at::empty({a.size(0), b.size(1)}, a.options());
  at::mm_out(c, a, b);
  synchronize_device(a.device());
  const double flops = 2.0 * static_cast<double>(a.size(0) * a.size(1) * b.size(1));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(budget_s);
  double best = 0.0;
  for (int iters = 0;
       iters < 200 && (iters < min_iters || std::chrono::steady_clock::now() < deadline); ++iters) {
    const auto t0 = std::chrono::steady_clock::now();
    at::mm_out(c, a, b);
    synchronize_device(a.device());
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, flops / std::max(s, 1e-9));
  }
  return best;
}

at::Tensor empty_staging(at::IntArrayRef sizes, at::ScalarType dtype, const at::Device& device) {
  const bool pin = device.is_cuda() && cuda_device_count() > 0;
  return at::empty(sizes, at::TensorOptions().dtype(dtype).pinned_memory(pin));
}

at::Tensor to_device_async(const at::Tensor& host, const at::Device& device) {
  if (host.device() == device) return host;
  if (!device.is_cuda()) return host.to(device);
  return host.pin_memory().to(device, /*non_blocking=*/true);
}

void set_deterministic(const at::Device& device, bool warn_only) {
  at::globalContext().setDeterministicAlgorithms(true, warn_only);
  if (device.is_cuda()) {
    // cuBLAS reads it when its first handle is made; ":4096:8" is the documented setting for
    // reproducible results (a fixed workspace per stream). A user's own value is kept.
    setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);
    // SDPA's flash and memory-efficient backward kernels are not deterministic; ATen's
    // deterministic mode makes SDPA pick the math or a deterministic kernel.
  }
}

}  // namespace titan
