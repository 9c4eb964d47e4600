// The one place where differences between libtorch versions are handled.
// titan.cpp builds against Debian's libtorch 1.13 (CPU) and libtorch 2.x (CPU or CUDA).
#pragma once

#include <torch/version.h>

#define TITAN_TORCH_VERSION_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||                \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

// at::scaled_dot_product_attention appeared in 2.0; on 1.13 attention is computed explicitly.
#define TITAN_HAS_SDPA TITAN_TORCH_VERSION_AT_LEAST(2, 0)

// c10d: from 2.0 on, the backends (ProcessGroupGloo, ProcessGroupNCCL) derive from c10d::Backend
// and c10d::ProcessGroup is a dispatching wrapper around them; in 1.13 they derive from
// c10d::ProcessGroup, which then held the collectives itself. Both spell the collectives the same
// (allreduce, allgather, _allgather_base, _reduce_scatter_base, alltoall_base, send, recv, ...).
// Include the c10d headers before using the name.
#if TITAN_TORCH_VERSION_AT_LEAST(2, 0)
#define TITAN_C10D_BACKEND_CLASS ::c10d::Backend
#else
#define TITAN_C10D_BACKEND_CLASS ::c10d::ProcessGroup
#endif

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
