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

// Whether this CPU multiplies bfloat16 matrices at speed: ATen's bf16 matmuls go through oneDNN
// only with AVX-512 (BW, VL, DQ: ATen's own test); without them (AVX2) a generic loop runs them
// at about 1 GFLOP/s on 2 cores against 50 in float32. True off x86.
// TITAN_CPU_FAST_BF16_MATMUL=0 or 1 overrides the detection (benchmarks that take another CPU's
// paths here, e.g. an AVX2 machine's on an AVX-512 one).
bool cpu_has_fast_bf16_matmul();
// Tests take either path on any CPU: true or false overrides the detection, nullopt restores it.
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

// This machine's memory for CPU runs in bytes: physical RAM, or the container's cgroup limit
// when lower. 0 when unknown.
double machine_memory_bytes();

// This machine's host name ("?" when unknown), for messages that name a process.
std::string host_name();

// Keeps freed memory in the process heap instead of returning it to the kernel. glibc maps every
// block over ~32 MB afresh and unmaps it on free, so each step pays first-touch page faults on its
// large activations (measured: cross-entropy over 2048 x 32000 logits 2.9 s -> 35 ms). Call once
// at start-up, before threads exist.
void configure_cpu_allocator();

}  // namespace titan
