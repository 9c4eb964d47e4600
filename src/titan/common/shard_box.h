// Where a rank's tensor sits in a larger one: the one shard-geometry type shared by tensor
// parallelism (a parameter's slice), FSDP (a row block of that), the optimizer state and
// checkpoints (which write and read boxes, so any layout loads any other's checkpoint).
//
// A box is plain (one rectangular block of the whole) or packed: tensor parallelism of a layer
// whose weight packs several parts along one dimension (FLUX's fused q, k, v rows) gives each rank
// the same slice of every part, so its tensor is, along that dimension, a concatenation of runs
// taken from different places of the whole. pieces() cuts a packed box into plain ones; code that
// reads or writes the whole tensor at a box's place goes through them (narrow does).
#pragma once

#include "titan/common/check.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace titan {

struct ShardPiece;

struct ShardBox {
  std::vector<int64_t> global_shape;  // of the whole tensor
  std::vector<int64_t> offsets;       // where the local box starts in it, one per dimension

  // A packed box: along dimension `packed_dim`, local [local_start, local_start + length) is the
  // whole's [start, start + length); there offsets[packed_dim] is 0 and unused. Empty: plain.
  struct Run {
    int64_t local_start = 0, start = 0, length = 0;
    bool operator==(const Run& o) const {
      return local_start == o.local_start && start == o.start && length == o.length;
    }
  };
  int64_t packed_dim = -1;
  std::vector<Run> runs;

  bool packed() const { return !runs.empty(); }

  // The box that is the whole tensor of `shape`.
  static ShardBox whole(at::IntArrayRef shape) {
    return ShardBox{shape.vec(), std::vector<int64_t>(shape.size(), 0)};
  }

  // The box of slice `index` of `count` of every part of a tensor packed along `dim`:
  // `part_sizes` (summing to global_shape[dim]) each divisible by count. With one part it is
  // plain.
  static ShardBox packed_slice(at::IntArrayRef global_shape, int64_t dim,
                               const std::vector<int64_t>& part_sizes, int64_t index,
                               int64_t count) {
    ShardBox box = whole(global_shape);
    int64_t start = 0, local = 0;
    for (int64_t size : part_sizes) {
      TITAN_CHECK(size % count == 0, "ShardBox: a part of ", size, " in ", count, " slices");
      box.runs.push_back({local, start + index * (size / count), size / count});
      local += size / count;
      start += size;
    }
    TITAN_CHECK(start == global_shape[dim], "ShardBox: parts of ", start, " along dimension ", dim,
                " of ", global_shape);
    box.packed_dim = dim;
    return box.normalized();
  }

  // The plain pieces of the box (itself when plain).
  std::vector<ShardPiece> pieces() const;

  // The box of local [first, first + count) along dimension 0 (FSDP's row block of a
  // tensor-parallel piece).
  ShardBox rows(int64_t first, int64_t count) const {
    ShardBox out = *this;
    if (offsets.empty()) return out;
    if (!packed() || packed_dim != 0) {
      out.offsets[0] += first;
      return out;
    }
    out.runs.clear();
    for (const Run& run : runs) {
      const int64_t lo = std::max(run.local_start, first);
      const int64_t hi = std::min(run.local_start + run.length, first + count);
      if (lo < hi) out.runs.push_back({lo - first, run.start + (lo - run.local_start), hi - lo});
    }
    if (out.runs.empty()) {  // no rows: a plain empty box where the block starts
      out.packed_dim = -1;
      out.offsets[0] = std::min(first, global_shape[0]);
      return out;
    }
    return out.normalized();
  }

  // The box of local `sizes` cut out of `whole` (global_shape): a view, or for a packed box the
  // concatenation of its pieces (a copy).
  at::Tensor narrow(const at::Tensor& whole, at::IntArrayRef sizes) const;

 private:
  // One run, or runs that continue each other, as a plain box.
  ShardBox normalized() const;
};

// A plain piece of a (possibly packed) box: local [local_start, local_start + length) along `dim`
// of the tensor the box describes is `box` of the whole (dim -1: all of it).
struct ShardPiece {
  ShardBox box;
  int64_t dim = -1, local_start = 0, length = 0;
  at::Tensor of(const at::Tensor& local) const {
    return dim < 0 ? local : local.narrow(dim, local_start, length);
  }
};

inline std::vector<ShardPiece> ShardBox::pieces() const {
  if (!packed()) return {ShardPiece{*this}};
  std::vector<ShardPiece> out;
  for (const Run& run : runs) {
    ShardBox plain{global_shape, offsets};
    plain.offsets[packed_dim] = run.start;
    out.push_back({plain, packed_dim, run.local_start, run.length});
  }
  return out;
}

inline at::Tensor ShardBox::narrow(const at::Tensor& whole, at::IntArrayRef sizes) const {
  TITAN_CHECK(whole.sizes().vec() == global_shape, "ShardBox: the whole tensor is ", whole.sizes(),
              ", the box expects ", at::IntArrayRef(global_shape));
  TITAN_CHECK(sizes.size() == offsets.size(), "ShardBox: ", sizes.size(), "-d box of a ",
              offsets.size(), "-d tensor");
  if (packed()) {
    std::vector<at::Tensor> parts;
    for (const ShardPiece& p : pieces()) {
      std::vector<int64_t> piece_sizes = sizes.vec();
      piece_sizes[p.dim] = p.length;
      parts.push_back(p.box.narrow(whole, piece_sizes));
    }
    return at::cat(parts, packed_dim);
  }
  at::Tensor out = whole;
  for (size_t d = 0; d < offsets.size(); ++d) {
    out = out.narrow(static_cast<int64_t>(d), offsets[d], sizes[d]);
  }
  return out;
}

inline ShardBox ShardBox::normalized() const {
  ShardBox out = *this;
  out.runs.clear();
  for (const Run& run : runs) {
    if (!out.runs.empty()) {
      Run& last = out.runs.back();
      if (last.local_start + last.length == run.local_start &&
          last.start + last.length == run.start) {
        last.length += run.length;
        continue;
      }
    }
    out.runs.push_back(run);
  }
  if (out.runs.size() == 1) {
    out.offsets[packed_dim] = out.runs[0].start;
    out.runs.clear();
    out.packed_dim = -1;
  }
  return out;
}

}  // namespace titan
