// CPU thread configuration. ATen's intra-op pool and BLAS must agree on one thread count per
// rank; two pools spinning side by side (OpenBLAS pthreads next to OpenMP) run ~3x slower.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <optional>
#include <string>

namespace titan {

// The most intra-op threads a rank may ask for (training.num_threads, OMP_NUM_THREADS): more
// only stalls start-up spawning threads. Above the core count is allowed, with a warning.
constexpr int64_t kMaxNumThreads = 1024;

// Whether this CPU multiplies bfloat16 matrices at speed, measured once per process (the first
// call; about 50 ms): ATen's bf16 and float32 GEMMs, 512^3 products in alternation on one thread,
// each timed by that thread's CPU time (so another busy process on the same cores does not
// decide it), the best of each. Fast unless float32 measured more than kWidenWhenFloat32Faster
// times faster. Without AVX-512 (BW, VL, DQ: ATen's test for sending them to oneDNN) bf16 GEMMs
// are a generic loop at about 1 GFLOP/s on 2 cores against 50-250 in float32 (told apart on one
// 256^3 product); and an AVX-512 BF16 CPU may still multiply bf16 at half float32's speed (a
// 2-core Intel Xeon with AVX-512 FP16: 84 against 159 GFLOP/s per core), so no feature flag
// decides. TITAN_CPU_FAST_BF16_MATMUL=0 or 1 overrides the measurement (benchmarks that take
// another CPU's paths here, runs that must not depend on a timing); the trainer makes its ranks
// agree (set_fast_bf16_matmul).
bool cpu_has_fast_bf16_matmul();
// Why cpu_has_fast_bf16_matmul says what it says, for the log, e.g. "bf16 GEMMs measured 84
// GFLOP/s per core on this CPU, float32 159" or "TITAN_CPU_FAST_BF16_MATMUL=0".
std::string fast_bf16_matmul_reason();
// Makes `fast` this process's choice from now on, with `why` as its reason (the trainer, when one
// of its ranks measured otherwise).
void set_fast_bf16_matmul(bool fast, const std::string& why);

// bf16 GEMMs count as slow when float32's run more than this many times faster. Widening costs
// casts around each product (the activations', and one pass over the weight each way): at 1.8x in
// the GEMM (the Intel Xeon above) the default bf16 job trained 1.3-1.5x faster widened.
constexpr double kWidenWhenFloat32Faster = 1.3;
// The rule on two measured rates (FLOP/s).
bool bf16_gemm_is_fast(double bf16_flops, double float_flops);
struct Bf16MatmulMeasurement {
  double bf16_flops = 0;
  double float_flops = 0;
  bool fast = true;  // bf16_gemm_is_fast(bf16_flops, float_flops)
};
// Times the two GEMMs now (what the first cpu_has_fast_bf16_matmul does), without changing the
// choice, the random generators, autograd graphs, what an op recorder counts or the intra-op
// threads (one while it measures).
Bf16MatmulMeasurement measure_bf16_matmul();
// Tests take either path on any CPU: true or false overrides the choice, nullopt restores it.
void override_fast_bf16_matmul_for_testing(std::optional<bool> fast);
// Whether titan runs matmuls of `dtype` on `device` in float32 on the operands as rounded to
// `dtype` (one rounding of the result at the end): 16-bit floats on a CPU without fast bf16
// GEMMs. The one rule for every matmul that decides it (Linear, the fused loss, titan's
// attention) and for the GEMM probe that MFU is measured against.
bool widens_reduced_matmul(c10::ScalarType dtype, const c10::Device& device);

// Sets ATen's intra-op threads (and OpenBLAS's, when it has its own pool) to `num_threads`;
// 0 means hardware cores / local_ranks. Logs a warning when asked for more than the cores.
// Returns a one-line description for the log.
std::string configure_threads(int64_t num_threads, int64_t local_ranks = 1);

// Resolves the kernel choice of every MKL vector-math (VML) function that ATen's float and double
// unary ops call (exp, log, sqrt, sin, cos, tanh, erf, erfinv, ...), by one serial one-element
// call of each. oneMKL picks a function's kernel at its first call; the oneMKL in the pinned torch
// wheel (2024.2) races when that first call runs on several intra-op threads at once, and one
// thread then computes its whole chunk with a low-accuracy kernel although ATen asks for high
// accuracy (measured here: the first exp of a FLUX step, on 8,192 elements, came out up to 1.5e-4
// off, about 200 ulp, in its second half, in 1 to 4 runs of 100 on a loaded 2-core machine; the
// next call is right). Call once at start-up, before any parallel work. Runs nothing on builds
// without MKL; invisible to op recorders and to autograd. Returns how many calls it made.
int64_t warm_up_vector_math();

// This machine's memory for CPU runs in bytes: physical RAM, or the container's cgroup limit
// when lower. 0 when unknown.
double machine_memory_bytes();

// The CPU time the calling thread has used, in seconds (time it waits or is descheduled does
// not count).
double thread_cpu_seconds();

// This machine's host name ("?" when unknown), for messages that name a process.
std::string host_name();

// Keeps freed memory in the process heap instead of returning it to the kernel. glibc maps every
// block over ~32 MB afresh and unmaps it on free, so each step pays first-touch page faults on its
// large activations (measured: cross-entropy over 2048 x 32000 logits 2.9 s -> 35 ms). Call once
// at start-up, before threads exist.
void configure_cpu_allocator();

}  // namespace titan
