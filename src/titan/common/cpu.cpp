// Thread setup. OpenBLAS is reached through libtorch's BLAS dependency; its threading model is
// queried with dlsym so no OpenBLAS headers or link flags are needed.
#include "titan/common/cpu.h"

#include "titan/common/check.h"
#include "titan/common/logging.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/record_function.h>

#include <dlfcn.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <fstream>
#include <iomanip>
#include <mutex>
#include <sstream>
#include <tuple>
#include <utility>

namespace titan {

std::string configure_threads(int64_t num_threads, int64_t local_ranks) {
  if (num_threads < 0 || num_threads > kMaxNumThreads) {
    throw ConfigError(message(num_threads, " intra-op threads: must be in [0, ", kMaxNumThreads,
                              "] (spawning more would stall start-up); 0 = one per core"));
  }
  const int64_t cores = std::max<long>(1, sysconf(_SC_NPROCESSORS_ONLN));
  int64_t n = num_threads > 0 ? num_threads
                              : std::max<int64_t>(1, cores / std::max<int64_t>(1, local_ranks));
  if (num_threads > cores) {
    log_warning(num_threads, " intra-op threads on ", cores,
                " cores: oversubscribed threads "
                "slow every step. HINT: training.num_threads 0 (cores / local ranks) or at most ",
                cores);
  }
  // ATen's bfloat16 matmuls split their work for the threads asked for, and PyTorch 2.15 returns
  // NaN when OpenMP runs fewer (a 256 x 512 x 384 product, 2 threads asked, 1 run). OpenMP runs
  // fewer past its thread limit (OMP_THREAD_LIMIT), which therefore caps the threads asked for,
  // and under dynamic adjustment (OMP_DYNAMIC), which is turned off (it gave 1 thread of 2 on a
  // machine whose load average was 2).
  using GetInt = int (*)();
  using SetInt = void (*)(int);
  auto get_dynamic = reinterpret_cast<GetInt>(dlsym(RTLD_DEFAULT, "omp_get_dynamic"));
  auto set_dynamic = reinterpret_cast<SetInt>(dlsym(RTLD_DEFAULT, "omp_set_dynamic"));
  if (get_dynamic != nullptr && set_dynamic != nullptr && get_dynamic() != 0) {
    set_dynamic(0);
    log_warning(
        "OpenMP's dynamic thread adjustment (OMP_DYNAMIC) turned off: it may run fewer "
        "threads than ATen splits work for, and bfloat16 matmuls then give NaN");
  }
  auto get_limit = reinterpret_cast<GetInt>(dlsym(RTLD_DEFAULT, "omp_get_thread_limit"));
  const int64_t limit = get_limit != nullptr ? get_limit() : INT_MAX;
  const bool capped = n > limit && limit > 0;
  if (capped) {
    log_warning(n, " intra-op threads asked for, but OpenMP's thread limit (OMP_THREAD_LIMIT) is ",
                limit, ": using ", limit,
                ", since bfloat16 matmuls split for more threads than run give NaN. HINT: raise "
                "OMP_THREAD_LIMIT, or ask for at most ",
                limit, " (training.num_threads, OMP_NUM_THREADS)");
    n = limit;
  }
  at::set_num_threads(static_cast<int>(n));

  std::ostringstream desc;
  desc << n << " intra-op thread" << (n == 1 ? "" : "s") << " (" << cores << " cores"
       << (capped ? ", OMP_THREAD_LIMIT " + std::to_string(limit) : std::string()) << ")";
  using GetParallel = int (*)();
  using SetThreads = void (*)(int);
  auto get_parallel = reinterpret_cast<GetParallel>(dlsym(RTLD_DEFAULT, "openblas_get_parallel"));
  auto set_threads = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
  if (get_parallel != nullptr) {
    const int mode = get_parallel();  // 0 sequential, 1 pthreads, 2 OpenMP
    if (set_threads != nullptr) set_threads(static_cast<int>(n));
    desc << ", OpenBLAS " << (mode == 2 ? "openmp" : mode == 1 ? "pthreads" : "sequential");
    if (mode == 1) {
      desc << " (WARNING: the pthreads build of OpenBLAS competes with ATen's OpenMP threads; "
              "run scripts/setup.sh as root to select openblas-openmp)";
    }
  }
  return desc.str();
}

int64_t warm_up_vector_math() {
  if (!at::hasMKL()) return 0;
  // The functions ATen sends to VML (ATen/cpu/vml.h), each as ATen calls it: contiguous, in high
  // accuracy. One element runs serially on this thread.
  using Unary = at::Tensor (*)(const at::Tensor&);
  static constexpr Unary kFunctions[] = {
      &at::acos, &at::asin,  &at::atan, &at::cos, &at::erf,  &at::erfc, &at::erfinv, &at::exp,
      &at::log,  &at::log10, &at::log2, &at::sin, &at::sqrt, &at::tan,  &at::tanh,   &at::trunc};
  at::NoGradGuard no_grad;
  at::RecordFunctionGuard unrecorded(false);
  int64_t calls = 0;
  for (const auto dtype : {at::kFloat, at::kDouble}) {
    const at::Tensor x = at::full({1}, 0.5, at::TensorOptions().dtype(dtype));
    for (const Unary f : kFunctions) {
      (void)f(x);
      ++calls;
    }
  }
  return calls;
}

double machine_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGE_SIZE);
  double bytes = pages > 0 && page_size > 0 ? static_cast<double>(pages) * page_size : 0.0;
  // cgroup v2, then v1; "max" or an absurd v1 value means no limit.
  for (const char* path :
       {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    std::ifstream in(path);
    double limit = 0;
    if (in >> limit && limit > 0 && (bytes == 0 || limit < bytes)) bytes = limit;
  }
  return bytes;
}

void configure_cpu_allocator() {
#ifdef __GLIBC__
  // Serve large blocks from the heap (not fresh mmaps), never trim it, and grow it in big steps.
  // M_MMAP_MAX=0 instead was measured to give erratic 7-33 s steps; these three do not.
  mallopt(M_MMAP_THRESHOLD, 1 << 30);
  mallopt(M_TRIM_THRESHOLD, INT_MAX);
  mallopt(M_TOP_PAD, 1 << 30);
#endif
}

double thread_cpu_seconds() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

std::string host_name() {
  char name[256] = {0};
  if (::gethostname(name, sizeof(name) - 1) != 0) return "?";
  return name;
}

namespace {

// -1: not set; 0 or 1: a test's override, which wins over the choice below.
std::atomic<int> fast_bf16_matmul_override{-1};
// -1: not decided yet; 0 or 1: this process's choice (environment, measurement or agreement).
std::atomic<int> fast_bf16_matmul_choice{-1};
std::mutex fast_bf16_matmul_mutex;  // the first decision, and the reason below
std::string fast_bf16_matmul_why;

// The best rates of ATen's float32 and bf16 (n x n) @ (n x n) products on the CPU, timed in
// alternation for at least `min_pairs` pairs and more until `budget_s` has passed, each product by
// the calling thread's CPU time (the caller runs them on one thread: measure_bf16_matmul). Wall
// time misjudged a busy machine: beside a titan training on the same 2 cores, 2-thread products
// timed by the clock read 21-43 GFLOP/s for both dtypes in 5 of 10 starts (float32 300 and bf16
// 165 alone), and 4 of those chose the slow bf16 GEMMs; one thread's CPU time read a float32 /
// bf16 ratio of 1.84-1.90 in every start, as alone. Alternating keeps slow spells alike for both.
// Values need not be random: a GEMM's speed does not depend on them, and the global generator
// must stay as the seed left it.
std::pair<double, double> alternating_gemm_flops(int64_t n, int min_pairs, double budget_s) {
  const auto make = [n](at::ScalarType dtype) {
    const auto opts = at::TensorOptions().dtype(dtype);
    return std::array<at::Tensor, 3>{at::full({n, n}, 0.5, opts), at::full({n, n}, 0.25, opts),
                                     at::empty({n, n}, opts)};
  };
  std::array<at::Tensor, 3> f = make(at::kFloat), h = make(at::kBFloat16);
  at::mm_out(f[2], f[0], f[1]);  // set-up calls, untimed
  at::mm_out(h[2], h[0], h[1]);
  const double flops = 2.0 * static_cast<double>(n * n * n);
  const auto rate = [flops](std::array<at::Tensor, 3>& t) {
    const double t0 = thread_cpu_seconds();
    at::mm_out(t[2], t[0], t[1]);
    return flops / std::max(thread_cpu_seconds() - t0, 1e-9);
  };
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(budget_s);
  double best_float = 0.0, best_bf16 = 0.0;
  for (int pair = 0;
       pair < 200 && (pair < min_pairs || std::chrono::steady_clock::now() < deadline); ++pair) {
    best_float = std::max(best_float, rate(f));
    best_bf16 = std::max(best_bf16, rate(h));
  }
  return {best_float, best_bf16};
}

std::string gflops_text(double flops) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(flops < 10e9 ? 1 : 0) << flops / 1e9;
  return os.str();
}

// Decides once per process: TITAN_CPU_FAST_BF16_MATMUL, else the measurement.
void decide_fast_bf16_matmul() {
  std::lock_guard<std::mutex> lock(fast_bf16_matmul_mutex);
  if (fast_bf16_matmul_choice.load(std::memory_order_acquire) >= 0) return;
  const char* v = std::getenv("TITAN_CPU_FAST_BF16_MATMUL");
  const std::string value = v == nullptr ? "" : v;
  bool fast = true;
  if (!value.empty()) {
    if (value != "0" && value != "1") {
      throw ConfigError(message("TITAN_CPU_FAST_BF16_MATMUL='", value,
                                "' must be 0 or 1 (or unset: measured on this CPU)"));
    }
    fast = value == "1";
    fast_bf16_matmul_why = "TITAN_CPU_FAST_BF16_MATMUL=" + value;
  } else {
    const Bf16MatmulMeasurement m = measure_bf16_matmul();
    fast = m.fast;
    fast_bf16_matmul_why = "bf16 GEMMs measured " + gflops_text(m.bf16_flops) +
                           " GFLOP/s per core on this CPU, float32 " + gflops_text(m.float_flops);
  }
  fast_bf16_matmul_choice.store(fast ? 1 : 0, std::memory_order_release);
}

}  // namespace

bool bf16_gemm_is_fast(double bf16_flops, double float_flops) {
  return bf16_flops * kWidenWhenFloat32Faster >= float_flops;
}

Bf16MatmulMeasurement measure_bf16_matmul() {
  // Neither the autograd graph nor an op recorder (a profiler, titan bench --breakdown, a test's
  // op counter) sees the probe's products.
  const at::NoGradGuard no_grad;
  const at::RecordFunctionGuard no_recording(/*is_enabled=*/false);
  // One thread, so that its CPU time is the products' whole cost (MKL, oneDNN and ATen's own loop
  // compute on the caller then); the intra-op threads as they were afterwards.
  struct Threads {
    int before = at::get_num_threads();
    Threads() { at::set_num_threads(1); }
    ~Threads() { at::set_num_threads(before); }
  } one_thread;
  Bf16MatmulMeasurement m;
  // A generic loop (~1 GFLOP/s against 50-250 in float32) is told apart on one 256^3 product each
  // (~30 ms there) instead of 512^3 ones (~1 s each); otherwise 512^3 products in alternation,
  // 50 ms in all.
  std::tie(m.float_flops, m.bf16_flops) = alternating_gemm_flops(256, 1, 0.0);
  if (m.bf16_flops * 8 >= m.float_flops) {
    std::tie(m.float_flops, m.bf16_flops) = alternating_gemm_flops(512, 3, 0.05);
  }
  m.fast = bf16_gemm_is_fast(m.bf16_flops, m.float_flops);
  return m;
}

bool cpu_has_fast_bf16_matmul() {
  const int forced = fast_bf16_matmul_override.load(std::memory_order_relaxed);
  if (forced >= 0) return forced == 1;
  if (fast_bf16_matmul_choice.load(std::memory_order_acquire) < 0) decide_fast_bf16_matmul();
  return fast_bf16_matmul_choice.load(std::memory_order_acquire) == 1;
}

std::string fast_bf16_matmul_reason() {
  if (fast_bf16_matmul_override.load(std::memory_order_relaxed) >= 0) return "a test's override";
  cpu_has_fast_bf16_matmul();
  std::lock_guard<std::mutex> lock(fast_bf16_matmul_mutex);
  return fast_bf16_matmul_why;
}

void set_fast_bf16_matmul(bool fast, const std::string& why) {
  std::lock_guard<std::mutex> lock(fast_bf16_matmul_mutex);
  fast_bf16_matmul_why = why;
  fast_bf16_matmul_choice.store(fast ? 1 : 0, std::memory_order_release);
}

void override_fast_bf16_matmul_for_testing(std::optional<bool> fast) {
  fast_bf16_matmul_override.store(fast ? (*fast ? 1 : 0) : -1, std::memory_order_relaxed);
}

bool widens_reduced_matmul(c10::ScalarType dtype, const c10::Device& device) {
  return (dtype == c10::kBFloat16 || dtype == c10::kHalf) && device.is_cpu() &&
         !cpu_has_fast_bf16_matmul();
}

}  // namespace titan
