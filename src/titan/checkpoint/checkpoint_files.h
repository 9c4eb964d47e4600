// One checkpoint on disk: a step directory holding safetensors shard files and index.json.
//
//   <dir>/index.json
//     {"format": "titan-checkpoint", "version": 1,
//      "tensors": {"<name>": {"dtype": "F32", "shape": [global dims],
//                             "shards": [{"file": "shard-00000.safetensors", "key": "<name>",
//                                         "offsets": [..], "lengths": [..]}]}},
//      "files": {"shard-00000.safetensors": {"bytes": n, "crc32c": c}},
//      "state": {<non-tensor state as JSON>}}
//   <dir>/shard-00000.safetensors ...
//
// Every tensor records its global shape and, per shard, which box [offsets, offsets + lengths)
// of the global tensor that file holds, so a run sharded one way can load a checkpoint saved by a
// run sharded another way (read_slice assembles any box from any set of shards). Tensor names:
// model parameters by their FQN ("layers.0.attention.wq.weight"), optimizer state as
// "optimizer.<fqn>.exp_avg" etc.; see checkpoint_manager.h.
//
// Crash safety: everything is written into "<dir>.tmp-<pid>", fsynced, and renamed to <dir>; a
// directory without a valid index.json is never taken for a checkpoint.
#pragma once

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace titan::ckpt {

// A tensor (or the local box of a sharded tensor) to save.
struct SavedTensor {
  std::string name;
  at::Tensor local;                   // the data this process holds
  std::vector<int64_t> global_shape;  // empty: local is the whole tensor
  std::vector<int64_t> offsets;       // where `local` starts in the global tensor (empty: zeros)
};

// Writes a complete single-writer checkpoint to `dir` atomically (temp dir, fsync, rename). `dir`
// must not exist. Tensors are split over shard files of about `max_shard_bytes` each.
void write_checkpoint(const std::string& dir, const std::vector<SavedTensor>& tensors,
                      const nlohmann::json& state, uint64_t max_shard_bytes = 2ull << 30);

struct TensorMeta {
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> shape;  // global
};

// Reads a checkpoint directory. The constructor parses index.json and checks every shard's size
// and CRC32C (verify = true), throwing DataError naming the file on any mismatch.
class CheckpointReader {
 public:
  explicit CheckpointReader(const std::string& dir, bool verify = true);
  ~CheckpointReader();

  const std::string& dir() const { return dir_; }
  std::vector<std::string> names() const;                      // sorted
  bool has(const std::string& name) const;
  const TensorMeta& meta(const std::string& name) const;       // DataError if absent
  at::Tensor read(const std::string& name) const;              // the whole global tensor
  // The box [offsets, offsets + lengths) of the global tensor, assembled from the shards.
  at::Tensor read_slice(const std::string& name, const std::vector<int64_t>& offsets,
                        const std::vector<int64_t>& lengths) const;
  const nlohmann::json& state() const { return state_; }

 private:
  struct Impl;
  std::string dir_;
  nlohmann::json state_;
  std::unique_ptr<Impl> impl_;
};

// True if `dir` holds an index.json (a complete checkpoint; contents not verified).
bool is_checkpoint_dir(const std::string& dir);

// The complete checkpoints "step-N" in `folder` as (N, path), ascending by N. Unfinished
// temporary directories ("step-N.tmp-*") and other names are skipped. Empty if `folder` is absent.
std::vector<std::pair<int64_t, std::string>> list_step_dirs(const std::string& folder);

// "<folder>/step-<step>".
std::string step_dir(const std::string& folder, int64_t step);

}  // namespace titan::ckpt
