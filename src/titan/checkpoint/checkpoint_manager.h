// The checkpoint manager: when to save, what goes in, where it goes, and resuming.
//
// Training state is a list of named StateEntry objects ("model", "optimizer", "lr_scheduler",
// "dataloader", "train_state", "rng"), each contributing tensors (by global name, possibly as a
// local box of a sharded tensor) and JSON. The manager knows none of their types, so parallelisms
// that shard parameters or optimizer state only change what their entries hand over.
//
// Layout: <dump_folder>/<checkpoint.folder>/step-N/ (see checkpoint_files.h). A save is
// invisible until complete; stale temporaries of killed runs are removed at start-up (not those
// of processes alive on this host). Resuming takes the newest complete full checkpoint that
// verifies (index checksum, sizes + CRC32C), falling back to older ones with a warning when the
// newest is corrupt; model-only exports are never resumed from: a folder of exports only, or
// load_step on one, is a ConfigError, not a fresh start. keep_latest_k never deletes the newest
// full checkpoint, and deletes by renaming first. A save never overwrites a step folder it did not
// write: one that load() found unusable (model-only, unloadable, incomplete) is moved aside, any
// other is an error.
//
// One path for every job: the ranks of a group save and load together, and a single process is a
// group of one (its exchanges are the identity; it writes plain "shard-<n>" files). Every method
// is collective; all ranks call it at the same points with the same arguments. Each rank writes
// only the tensors its entries hand over (its FSDP shards; a replicated tensor is handed over by
// one rank only) as its own shard files in a temporary directory shared by all ranks (the folder
// must be on a file system every rank sees); rank 0 merges the ranks' index fragments, renames
// the directory (the commit) and purges old checkpoints. Any rank's failure leaves no checkpoint
// behind and throws on every rank. When loading, rank 0 chooses the checkpoint (and verifies its
// checksums) and broadcasts the choice, then every rank restores its part from it; a DataError on
// any rank makes all of them fall back to the previous checkpoint together. Exchanges run only on
// the thread that calls these methods; with async_mode, only the file writing runs in the
// background and the commit happens on the calling thread: in the first maybe_save() after every
// rank has finished writing (one tiny all-gather per call while a save is pending), or at the
// latest in the next save(), wait() or the destructor.
#pragma once

#include "titan/checkpoint/checkpoint_files.h"
#include "titan/checkpoint/staging.h"
#include "titan/config/job_config.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace titan::dist {
class Group;
}  // namespace titan::dist

namespace titan::ckpt {

struct StateEntry {
  std::string name;
  // Appends this entry's tensors and fills its JSON. Tensors may alias live training state: the
  // manager copies them before an asynchronous write.
  std::function<void(std::vector<SavedTensor>& tensors, nlohmann::json& state)> save;
  // Restores from `reader` (tensors by the names save used) and `state` (this entry's JSON).
  std::function<void(const CheckpointReader& reader, const nlohmann::json& state)> load;
  bool is_model = false;  // the entry saved by model-only checkpoints
};

struct LoadResult {
  bool loaded = false;
  int64_t step = 0;         // train_state step of the checkpoint (0 for model-only loads)
  bool model_only = false;  // only the model entry was restored
  std::string dir;
};

class CheckpointManager {
 public:
  // `describe` is stored in every checkpoint's state (model name/flavor, tokenizer_path,
  // job_config) so tools like `titan generate` and `titan convert` can rebuild the model.
  // `group`: every rank of the job that holds part of the state (normally the world group); null
  // or of size 1 for a single process. The entries' save callbacks run on every rank, and the
  // "state" JSON stored is rank 0's.
  CheckpointManager(const CheckpointSection& config, const std::string& dump_folder,
                    std::vector<StateEntry> states, nlohmann::json describe,
                    std::shared_ptr<dist::Group> group = nullptr);
  // Waits for a pending asynchronous save and commits it; with peers (a collective) not while an
  // exception is unwinding the stack or when the group is broken, in which case the save is
  // abandoned (its temporary directory is removed by the next load()).
  ~CheckpointManager();

  bool enabled() const { return config_.enable; }
  const std::string& folder() const { return folder_; }

  // Resumes from checkpoint.load_step (or the newest complete checkpoint holding full training
  // state) in the folder; without one, from checkpoint.initial_load_path. Honors
  // exclude_from_loading. `hf_loader`, when set, loads initial_load_path as a Hugging Face
  // folder (checkpoint.initial_load_in_hf).
  LoadResult load(const std::function<void(const std::string&)>& hf_loader = {});

  // The step of the newest model-only checkpoint in the folder that is newer than every full
  // one (a finished run's final save), or -1.
  int64_t final_model_only_step() const;

  // Whether step `step` should be saved (interval, first step, last step); never under
  // checkpoint.load_only.
  bool should_save(int64_t step, int64_t last_step) const;
  // Saves step `step` if should_save(); the last step honors last_save_model_only. Returns true
  // if a save was started (finished, unless async).
  bool maybe_save(int64_t step, int64_t last_step);
  // Saves unconditionally (model_only: only entries with is_model, cast to export_dtype unless
  // keep_dtype, as for the seed checkpoint).
  void save(int64_t step, bool model_only, bool keep_dtype = false);
  // Blocks until an asynchronous save has finished and commits it; rethrows its error.
  void wait();

  // The host copies asynchronous saves write from (null with async_mode "disabled").
  const Stager* stager() const { return stager_.get(); }

 private:
  struct PendingSave;  // a save whose files are written (or being written) but not committed

  dist::Group* peers() const;  // the group when it has more than one rank; null for a group of one
  int rank() const;
  int world_size() const;
  void collect(int64_t step, bool model_only, bool keep_dtype, std::vector<SavedTensor>& tensors,
               nlohmann::json& state) const;
  void commit_pending();
  void purge_old();
  // This rank's part of checkpoint `dir`.
  LoadResult load_dir(const std::string& dir, bool model_only_requested, bool verify);
  // load_dir on every rank; with fall_back_on_data_error, DataErrors on any rank make every rank
  // return an unloaded result (and `data_error` says why) instead of throwing.
  LoadResult load_dir_together(const std::string& dir, bool model_only_requested,
                               bool fall_back_on_data_error, std::string* data_error);

  CheckpointSection config_;
  std::string folder_;
  std::vector<StateEntry> states_;
  nlohmann::json describe_;
  std::shared_ptr<dist::Group> group_;

  // Step directories found at load() that must not be overwritten but are no resumption point
  // (dir -> "model-only" | "unloadable" | "incomplete"); a save of their step moves them aside.
  std::map<std::string, std::string> unusable_;

  std::unique_ptr<Stager> stager_;  // async_mode: the snapshot a save's files are written from
  std::thread writer_;              // writes the pending save's files (async_mode)
  std::unique_ptr<PendingSave> pending_;
};

}  // namespace titan::ckpt
