// The counting CPU allocator (see memory_probe.h). Each block is allocated through the wrapped
// allocator's raw interface with a 64-byte header in front that records its size, so the
// deleter can subtract it wherever the free happens (even after another allocator took over),
// and the DataPtr keeps data == context, which raw_allocate() users of the CPU allocator need.
#include "titan/common/memory_probe.h"

#include "titan/common/check.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>

namespace titan {
namespace {

// Keeps the 64-byte alignment of the wrapped allocator's blocks.
constexpr size_t kHeader = 64;

std::atomic<int64_t> g_live{0};
std::atomic<int64_t> g_peak{0};
std::atomic<int64_t> g_limit{0};
c10::DeleterFnPtr g_inner_delete = nullptr;

void release(void* data) {
  if (data == nullptr) return;
  char* base = static_cast<char*>(data) - kHeader;
  int64_t bytes = 0;
  std::memcpy(&bytes, base, sizeof(bytes));
  g_live.fetch_sub(bytes);
  g_inner_delete(base);
}

class CountingAllocator final : public c10::Allocator {
 public:
  explicit CountingAllocator(c10::Allocator* inner) : inner_(inner) {}

  c10::DataPtr allocate(size_t n) override {
    const int64_t bytes = static_cast<int64_t>(n);
    const int64_t limit = g_limit.load(std::memory_order_relaxed);
    if (limit > 0 && g_live.load() + bytes > limit) {
      TORCH_CHECK_WITH(OutOfMemoryError, false, "CPU out of memory: tried to allocate ", bytes,
                       " bytes with ", g_live.load(), " bytes in use and a limit of ", limit,
                       " bytes (TITAN_CPU_MEMORY_LIMIT)");
    }
    char* base = static_cast<char*>(inner_->raw_allocate(n + kHeader));
    std::memcpy(base, &bytes, sizeof(bytes));
    const int64_t live = g_live.fetch_add(bytes) + bytes;
    int64_t peak = g_peak.load();
    while (live > peak && !g_peak.compare_exchange_weak(peak, live)) {
    }
    void* data = base + kHeader;
    return {data, data, &release, c10::Device(c10::DeviceType::CPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &release; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }

 private:
  c10::Allocator* inner_;
};

std::once_flag g_once;

}  // namespace

void CpuMemoryProbe::install() {
  std::call_once(g_once, [] {
    c10::Allocator* inner = c10::GetCPUAllocator();
    g_inner_delete = inner->raw_deleter();
    TITAN_CHECK(g_inner_delete != nullptr, "CpuMemoryProbe: the CPU allocator has no raw deleter");
    // Never destroyed: blocks allocated through it may outlive everything else. The highest
    // priority, so that it stays the CPU allocator.
    c10::SetCPUAllocator(new CountingAllocator(inner), /*priority=*/255);
  });
}

int64_t CpuMemoryProbe::live_bytes() { return g_live.load(); }

int64_t CpuMemoryProbe::peak_bytes() { return g_peak.load(); }

void CpuMemoryProbe::reset_peak() { g_peak.store(g_live.load()); }

void CpuMemoryProbe::set_limit(int64_t bytes) { g_limit.store(std::max<int64_t>(0, bytes)); }

}  // namespace titan
