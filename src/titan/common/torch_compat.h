// The one place where differences between the libtorch releases we support are handled.
// titan.cpp builds against libtorch 2.11 to 2.15 (CPU or CUDA builds); cmake/titan_torch.cmake
// refuses older ones. Add a guard here, with the release that changed, rather than #if-ing on
// versions elsewhere.
#pragma once

#include <torch/version.h>

#define TITAN_TORCH_VERSION_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||                \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

static_assert(TITAN_TORCH_VERSION_AT_LEAST(2, 11), "titan.cpp needs libtorch 2.11 or newer");

// NCCL process groups: the libtorch must be built with them (USE_C10D_NCCL, CUDA builds) and
// NCCL's header must be on the include path (c10d's NCCL header includes <nccl.h>).
#if defined(USE_C10D_NCCL) && defined(__has_include)
#if __has_include(<nccl.h>)
#define TITAN_HAS_NCCL 1
#endif
#endif
#ifndef TITAN_HAS_NCCL
#define TITAN_HAS_NCCL 0
#endif

// CUDA: defined to 1 by CMake for a CUDA libtorch (cmake/titan_torch.cmake's TITAN_TORCH_CUDA).
// Only titan/common/device.cpp, the files that drive streams and the memory profiler
// (titan/components/profiling.cpp) include CUDA headers.
#ifndef TITAN_HAS_CUDA
#define TITAN_HAS_CUDA 0
#endif
