// The folder of step checkpoints: what to resume from, what a killed run left behind, and how
// step directories are deleted or moved out of the way without ever looking complete when they
// are not, or overwriting what this run did not write. Used by the CheckpointManager on rank 0 (a
// single process is a group of one).
#pragma once

#include "titan/config/job_config.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace titan::ckpt {

// Removes the "step-N.tmp-<pid>" (a save) and "step-N.deleting-<pid>" (a purge) directories of
// runs that were killed while writing or deleting them; those of a process alive on this host
// are kept (with a warning).
void remove_stale_temporaries(const std::string& folder);

// Deletes a step directory by renaming it to "step-N.deleting-<pid>" first, then removing it.
void delete_step_dir(const std::string& dir);

// Whether the checkpoint in `dir` is a model-only export (index verified, shard files not);
// DataError when the index is corrupt.
bool is_model_only(const std::string& dir);

// Before a save: the folder exists and nothing is in the way of `dir`. A directory of the same
// step is moved aside to "<dir>.<why>-<unix seconds>" when start-up found it unusable
// (`unusable`: dir -> why); any other one is a checkpoint this run must not overwrite (DataError).
void prepare_step_dir(const std::string& folder, const std::string& dir,
                      const std::map<std::string, std::string>& unusable);

// What to resume from, decided by rank 0 for every rank, from the checkpoints in the folder. Each
// next() answers {"dir": d}, {"none": true} (start from scratch) or {"error": "config" | "data",
// "message": m}; after a candidate failed to load, next(why) gives the previous one (automatic
// resumption falls back past corrupt checkpoints; an explicit load_step does not). Whatever
// resuming leaves behind newer than the chosen step is recorded in `unusable` (dir -> why) so that
// saving that step later moves it aside instead of overwriting it.
class ResumeChooser {
 public:
  // Removes stale temporaries and reports incomplete step folders (recorded in `unusable`).
  ResumeChooser(const CheckpointSection& config, const std::string& folder,
                std::map<std::string, std::string>& unusable);
  nlohmann::json next(const std::string& previous_failed = "");

 private:
  static nlohmann::json error(const std::string& kind, const std::string& message);
  nlohmann::json explicit_step(const std::string& previous_failed);

  const CheckpointSection& config_;
  std::string folder_;
  std::map<std::string, std::string>& unusable_;
  std::vector<std::pair<int64_t, std::string>> steps_;
  size_t next_ = 0;  // candidates left: steps_[next_ - 1], steps_[next_ - 2], ...
  std::string chosen_;
  std::string last_error_;
  std::vector<std::pair<int64_t, std::string>> model_only_;  // newest first
};

}  // namespace titan::ckpt
