// One checkpoint on disk: a step directory holding safetensors shard files and index.json.
//
//   <dir>/index.json
//     {"format": "titan-checkpoint", "version": 2,
//      "tensors": {"<name>": {"dtype": "F32", "shape": [global dims],
//                             "shards": [{"file": "shard-00000.safetensors", "key": "<name>",
//                                         "offsets": [..], "lengths": [..]}]}},
//      "files": {"shard-00000.safetensors": {"bytes": n, "crc32c": c}},
//      "state": {<non-tensor state as JSON>},
//      "checksum": <CRC32C of the index without this field, compact, keys sorted>}
//   <dir>/shard-00000.safetensors ...
//
// Every tensor records its global shape and, per shard, which box [offsets, offsets + lengths)
// of the global tensor that file holds, so a run sharded one way can load a checkpoint saved by a
// run sharded another way (read_slice assembles any box from any set of shards). Tensor names:
// model parameters by their FQN ("layers.0.attention.wq.weight"), optimizer state as
// "optimizer.<fqn>.exp_avg" etc.; see checkpoint_manager.h.
//
// Writing (one path for every job; checkpoint_manager.h drives it): the ranks of a group (a single
// process is a group of one) write into one temporary directory "<dir>.tmp-<nonce>". Each rank
// writes the tensors it owns as its shard files ("shard-r<rank>-<n>.safetensors"; plain
// "shard-<n>.safetensors" in a group of one) plus a fragment "fragment-r<rank>.json" (its part of
// the index); rank 0 merges the fragments into index.json, removes them, fsyncs and renames the
// directory to <dir>: the commit. A directory without a valid index.json is never taken for a
// checkpoint, so a killed save leaves nothing that looks complete.
#pragma once

#include "titan/common/shard_box.h"

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
  at::Tensor local;  // the data this process holds
  ShardBox box;  // where `local` sits in the whole tensor; empty global_shape: local is all of it
};

// Writes a complete checkpoint to `dir` as a group of one: make_temp_dir, write_rank_files,
// merge_rank_fragments, commit_checkpoint_dir (the temporary directory is removed on failure).
// `dir` must not exist. Tensors are split over shard files of about `max_shard_bytes` each.
void write_checkpoint(const std::string& dir, const std::vector<SavedTensor>& tensors,
                      const nlohmann::json& state, uint64_t max_shard_bytes = 2ull << 30);

// ---- the steps of a save ------------------------------------------------------------------------

// "<dir>.tmp-<nonce>": the temporary directory a checkpoint is written into before the rename.
// Every rank of a group must use the same nonce (rank 0's pid, broadcast).
std::string temp_dir_of(const std::string& dir, int64_t nonce);

// Creates temp_dir_of(dir, nonce) empty (removing what a previous run left there) and returns it.
std::string make_temp_dir(const std::string& dir, int64_t nonce);

// Rank `rank` of `world_size` writes `tensors` (the boxes it owns; several ranks may hand over
// different boxes of one tensor, never overlapping ones) into the existing directory `tmp_dir`,
// as "shard-r<rank>-<n>.safetensors" files ("shard-<n>.safetensors" when world_size is 1) of
// about max_shard_bytes each, then its fragment "fragment-r<rank>.json" (its tensors' boxes, its
// files' bytes and CRC32C). Everything is fsynced. Returns the number of tensor bytes written.
uint64_t write_rank_files(const std::string& tmp_dir, int rank, int world_size,
                          const std::vector<SavedTensor>& tensors,
                          uint64_t max_shard_bytes = 2ull << 30);

// Merges the fragments of ranks 0..world_size-1 in `tmp_dir` into index.json (with `state`, rank
// 0's), fsyncs it and removes the fragments. A tensor listed by several ranks becomes one entry
// with every rank's boxes; throws DataError naming the tensor and the ranks when their dtypes or
// global shapes differ, when boxes overlap (a replicated tensor handed over by more than one
// rank), when the boxes leave part of the tensor uncovered, or when a fragment is missing.
void merge_rank_fragments(const std::string& tmp_dir, int world_size, const nlohmann::json& state);

// The commit: fsyncs `tmp_dir`, renames it to `dir` (which must not exist) and fsyncs the parent.
void commit_checkpoint_dir(const std::string& tmp_dir, const std::string& dir);

// ---- reading ------------------------------------------------------------------------------------

struct TensorMeta {
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> shape;  // global
};

// Reads a checkpoint directory. The constructor parses index.json, checks its own checksum, that
// every file it names is a plain name inside `dir`, that the folder name (step-N), the state's
// step and train_state's step agree, and every shard's size and CRC32C (verify = true), throwing
// DataError naming the file on any mismatch.
class CheckpointReader {
 public:
  explicit CheckpointReader(const std::string& dir, bool verify = true);
  ~CheckpointReader();

  const std::string& dir() const { return dir_; }
  std::vector<std::string> names() const;  // sorted
  bool has(const std::string& name) const;
  const TensorMeta& meta(const std::string& name) const;  // DataError if absent
  at::Tensor read(const std::string& name) const;         // the whole global tensor
  // The box [offsets, offsets + lengths) of the global tensor, assembled from the shards.
  at::Tensor read_slice(const std::string& name, const std::vector<int64_t>& offsets,
                        const std::vector<int64_t>& lengths) const;
  // Restores a live tensor: copies the box of `name` that `dst` holds (at box.offsets, dst's
  // sizes) into `dst`, casting the dtype. DataError when the checkpoint lacks the tensor or its
  // global shape is not box.global_shape (a different model flavor?).
  void read_box_into(const std::string& name, const ShardBox& box, at::Tensor dst) const;
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

// The directories named "step-N" in `folder` that hold no index.json (a save's commit never
// leaves one; a deletion or a copy that was interrupted does), as (N, path), ascending.
std::vector<std::pair<int64_t, std::string>> list_incomplete_step_dirs(const std::string& folder);

// "<folder>/step-<step>".
std::string step_dir(const std::string& folder, int64_t step);

}  // namespace titan::ckpt
