// The one place where differences between libtorch versions are handled.
// titan.cpp builds against Debian's libtorch 1.13 (CPU) and libtorch 2.x (CPU or CUDA).
#pragma once

#include <torch/version.h>

#define TITAN_TORCH_VERSION_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||                \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

// at::scaled_dot_product_attention appeared in 2.0; on 1.13 attention is computed explicitly.
#define TITAN_HAS_SDPA TITAN_TORCH_VERSION_AT_LEAST(2, 0)
