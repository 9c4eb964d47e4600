// Where a rank's tensor sits in a larger one: the one shard-geometry type shared by tensor
// parallelism (a parameter's slice), FSDP (a row block of that), the optimizer state and
// checkpoints (which write and read boxes, so any layout loads any other's checkpoint).
#pragma once

#include "titan/common/check.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

namespace titan {

struct ShardBox {
  std::vector<int64_t> global_shape;  // of the whole tensor
  std::vector<int64_t> offsets;       // where the local box starts in it, one per dimension

  // The box that is the whole tensor of `shape`.
  static ShardBox whole(at::IntArrayRef shape) {
    return ShardBox{shape.vec(), std::vector<int64_t>(shape.size(), 0)};
  }

  // The box of local `sizes` cut out of `whole` (global_shape), a view.
  at::Tensor narrow(const at::Tensor& whole, at::IntArrayRef sizes) const {
    TITAN_CHECK(whole.sizes().vec() == global_shape, "ShardBox: the whole tensor is ",
                whole.sizes(), ", the box expects ", at::IntArrayRef(global_shape));
    TITAN_CHECK(sizes.size() == offsets.size(), "ShardBox: ", sizes.size(), "-d box of a ",
                offsets.size(), "-d tensor");
    at::Tensor out = whole;
    for (size_t d = 0; d < offsets.size(); ++d) {
      out = out.narrow(static_cast<int64_t>(d), offsets[d], sizes[d]);
    }
    return out;
  }
};

}  // namespace titan
