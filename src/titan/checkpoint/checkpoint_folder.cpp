// Step-folder housekeeping and the choice of the checkpoint to resume from.
#include "titan/checkpoint/checkpoint_folder.h"

#include "titan/checkpoint/checkpoint_files.h"
#include "titan/common/check.h"
#include "titan/common/logging.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <unistd.h>

namespace titan::ckpt {

namespace fs = std::filesystem;

namespace {

// Whether process `pid` exists on this host (another process than this one).
bool process_alive(int64_t pid) {
  if (pid <= 0 || pid == ::getpid()) return false;
  return ::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM;
}

// Renames `dir` to "<dir>.<why>-<unix seconds>", out of the way of a save of the same step;
// nothing is deleted.
void move_aside(const std::string& dir, const std::string& why) {
  const auto now = std::chrono::duration_cast<std::chrono::seconds>(
                       std::chrono::system_clock::now().time_since_epoch())
                       .count();
  const std::string to = dir + "." + why + "-" + std::to_string(now);
  std::error_code ec;
  fs::rename(dir, to, ec);
  if (ec)
    throw DataError("cannot move '" + dir + "' out of the way to '" + to + "': " + ec.message());
  log_warning("moved ", dir, " (", why, ") to ", to, " to save this run's checkpoint of that step");
}

std::string step_list(const std::vector<std::pair<int64_t, std::string>>& steps) {
  std::string out;
  for (const auto& s : steps) out += (out.empty() ? "step-" : ", step-") + std::to_string(s.first);
  return out.empty() ? "none" : out;
}

}  // namespace

void remove_stale_temporaries(const std::string& folder) {
  std::error_code ec;
  if (!fs::is_directory(folder, ec)) return;
  std::vector<std::pair<fs::path, int64_t>> stale;
  for (const auto& entry : fs::directory_iterator(folder, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("step-", 0) != 0) continue;
    for (const char* tag : {".tmp-", ".deleting-"}) {
      const size_t at = name.find(tag);
      if (at == std::string::npos) continue;
      const std::string digits = name.substr(at + std::strlen(tag));
      const bool numeric = !digits.empty() && digits.size() < 10 &&
                           digits.find_first_not_of("0123456789") == std::string::npos;
      stale.emplace_back(entry.path(), numeric ? std::stoll(digits) : -1);
    }
  }
  for (const auto& [path, pid] : stale) {
    if (process_alive(pid)) {
      log_warning("keeping ", path.string(), ": process ", pid,
                  " that wrote it is still running on this host (another run on this folder?)");
      continue;
    }
    log_warning("removing ", path.string(),
                " (a previous run stopped while saving or deleting that checkpoint)");
    fs::remove_all(path, ec);
    if (ec) log_warning("cannot remove ", path.string(), ": ", ec.message());
  }
}

void delete_step_dir(const std::string& dir) {
  const std::string doomed = dir + ".deleting-" + std::to_string(::getpid());
  std::error_code ec;
  fs::rename(dir, doomed, ec);
  if (ec) {
    log_warning("cannot delete old checkpoint ", dir, ": ", ec.message());
    return;
  }
  fs::remove_all(doomed, ec);
  if (ec) log_warning("cannot finish deleting ", doomed, ": ", ec.message());
}

bool is_model_only(const std::string& dir) {
  CheckpointReader peek(dir, /*verify=*/false);
  return peek.state().value("model_only", false);
}

void prepare_step_dir(const std::string& folder, const std::string& dir,
                      const std::map<std::string, std::string>& unusable) {
  std::error_code ec;
  fs::create_directories(folder, ec);
  if (ec) throw DataError("cannot create the checkpoint folder '" + folder + "': " + ec.message());
  if (!fs::exists(dir, ec)) return;
  const auto it = unusable.find(dir);
  if (it != unusable.end()) {
    move_aside(dir, it->second);
    return;
  }
  throw DataError("checkpoint " + dir + " exists and was not written by this run; not " +
                  "overwriting it. HINT: another run may be using the folder " + folder +
                  "; move that step folder away if it is stale");
}

// ---- ResumeChooser
// --------------------------------------------------------------------------------

ResumeChooser::ResumeChooser(const CheckpointSection& config, const std::string& folder,
                             std::map<std::string, std::string>& unusable)
    : config_(config), folder_(folder), unusable_(unusable) {
  remove_stale_temporaries(folder_);
  for (const auto& [step, dir] : list_incomplete_step_dirs(folder_)) {
    log_warning(dir, " is not a complete checkpoint (no index.json: a deletion or a copy was ",
                "interrupted?); it is not resumed from and will be moved aside if this run ",
                "saves step ", step);
    unusable_[dir] = "incomplete";
  }
  steps_ = list_step_dirs(folder_);
  next_ = steps_.size();
}

nlohmann::json ResumeChooser::next(const std::string& previous_failed) {
  if (config_.load_step >= 0) return explicit_step(previous_failed);
  if (!previous_failed.empty()) {
    last_error_ = previous_failed;
    log_warning("checkpoint ", chosen_, " cannot be loaded: ", previous_failed,
                "; falling back to the previous checkpoint");
    unusable_[chosen_] = "unloadable";
  }
  while (next_ > 0) {
    const auto& [step, dir] = steps_[--next_];
    try {
      if (step > 0 && is_model_only(dir)) {
        // A finished run's final save: weights only, nothing to resume training from.
        model_only_.emplace_back(step, dir);
        unusable_[dir] = "model-only";
        continue;
      }
    } catch (const DataError& e) {
      last_error_ = e.what();
      log_warning("checkpoint ", dir, " cannot be loaded: ", e.what(),
                  "; falling back to the previous checkpoint");
      unusable_[dir] = "unloadable";
      continue;
    }
    if (step == 0 && !model_only_.empty()) break;  // a seed checkpoint is no resumption point
    chosen_ = dir;
    return {{"dir", dir}};
  }
  if (!last_error_.empty()) {
    return error("data", "no checkpoint in " + folder_ + " can be loaded; the last error: " +
                             last_error_ + ". Move the folder away to start from scratch.");
  }
  if (!model_only_.empty()) {
    const std::string newest = model_only_.front().second;
    return error("config",
                 folder_ + " holds only model-only checkpoints (" + step_list(model_only_) +
                     ": weights without optimizer, learning-rate or data-loader state), from "
                     "which training cannot resume; not starting from scratch over them. "
                     "HINT: to train on from the weights of " +
                     newest +
                     " with fresh "
                     "optimizer state, run with --checkpoint.initial_load_path " +
                     newest +
                     " and a new --job.dump_folder (or --checkpoint.folder); to start over, "
                     "move " +
                     folder_ +
                     " away. Keep full checkpoints with "
                     "--checkpoint.last_save_model_only false or a smaller checkpoint.interval");
  }
  return {{"none", true}};
}

nlohmann::json ResumeChooser::error(const std::string& kind, const std::string& message) {
  return {{"error", kind}, {"message", message}};
}

nlohmann::json ResumeChooser::explicit_step(const std::string& previous_failed) {
  if (!previous_failed.empty()) return error("data", previous_failed);
  const int64_t want = config_.load_step;
  const auto it =
      std::find_if(steps_.begin(), steps_.end(), [&](const auto& s) { return s.first == want; });
  const std::string what = "checkpoint.load_step " + std::to_string(want);
  if (it == steps_.end()) {
    return error("config", what + ": no complete checkpoint step-" + std::to_string(want) + " in " +
                               folder_ + " (have: " + step_list(steps_) + ")");
  }
  try {
    if (want > 0 && is_model_only(it->second)) {
      return error("config",
                   what + ": " + it->second +
                       " is a model-only checkpoint (weights without "
                       "optimizer, learning-rate or data-loader state); training cannot resume "
                       "from it. HINT: to train on from its weights with fresh optimizer state, "
                       "run with --checkpoint.initial_load_path " +
                       it->second + " and a new --job.dump_folder (or --checkpoint.folder)");
    }
  } catch (const DataError& e) {
    return error("data", what + ": " + e.what());
  }
  const std::vector<std::pair<int64_t, std::string>> newer(it + 1, steps_.end());
  if (!newer.empty()) {
    return error("config", what + ": " + folder_ + " also holds newer checkpoints (" +
                               step_list(newer) +
                               ") of the run that went on from there; training from step-" +
                               std::to_string(want) +
                               " would overwrite them, and a restart would resume "
                               "from the newest. HINT: move them out of " +
                               folder_ + " to go back to step-" + std::to_string(want) +
                               ", or drop checkpoint.load_step to resume from the newest");
  }
  return {{"dir", it->second}};
}

}  // namespace titan::ckpt
