// The checkpoint manager: when to save, what goes in, where it goes, and resuming.
//
// Training state is a list of named StateEntry objects ("model", "optimizer", "lr_scheduler",
// "dataloader", "train_state", "rng"), each contributing tensors (by global name, possibly as a
// local box of a sharded tensor) and JSON. The manager knows none of their types, so parallelisms
// that shard parameters or optimizer state only change what their entries hand over.
//
// Layout: <dump_folder>/<checkpoint.folder>/step-N/ (see checkpoint_files.h). A save is
// invisible until complete; stale temporaries of killed runs are removed at start-up. Resuming
// takes the newest complete checkpoint that verifies (sizes + CRC32C), falling back to older ones
// with a warning when the newest is corrupt.
#pragma once

#include "titan/checkpoint/checkpoint_files.h"
#include "titan/config/job_config.h"

#include <nlohmann/json.hpp>

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

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
  CheckpointManager(const CheckpointSection& config, const std::string& dump_folder,
                    std::vector<StateEntry> states, nlohmann::json describe);
  ~CheckpointManager();  // waits for a pending asynchronous save

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

  // Whether step `step` should be saved (interval, first step, last step).
  bool should_save(int64_t step, int64_t last_step) const;
  // Saves step `step` if should_save(); the last step honors last_save_model_only. Returns true
  // if a save was started (finished, unless async).
  bool maybe_save(int64_t step, int64_t last_step);
  // Saves unconditionally (model_only: only entries with is_model, cast to export_dtype unless
  // keep_dtype, as for the seed checkpoint).
  void save(int64_t step, bool model_only, bool keep_dtype = false);
  // Blocks until an asynchronous save has finished; rethrows its error.
  void wait();

 private:
  void write_and_purge(const std::string& dir, const std::vector<SavedTensor>& tensors,
                       const nlohmann::json& state);
  void purge_old();
  LoadResult load_dir(const std::string& dir, bool model_only_requested);

  CheckpointSection config_;
  std::string folder_;
  std::vector<StateEntry> states_;
  nlohmann::json describe_;

  std::thread writer_;
  std::exception_ptr writer_error_;
};

}  // namespace titan::ckpt
