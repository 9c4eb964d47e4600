// CheckpointManager: save scheduling, model-only exports, async writes, retention and resuming.
#include "titan/checkpoint/checkpoint_manager.h"

#include "titan/common/check.h"
#include "titan/common/format.h"
#include "titan/common/logging.h"

#include <algorithm>
#include <chrono>
#include <filesystem>

namespace titan::ckpt {

namespace fs = std::filesystem;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

uint64_t total_bytes(const std::vector<SavedTensor>& tensors) {
  uint64_t n = 0;
  for (const auto& t : tensors) n += static_cast<uint64_t>(t.local.numel()) * t.local.element_size();
  return n;
}

// Removes "step-N.tmp-<pid>" directories left by runs killed while saving.
void remove_stale_temporaries(const std::string& folder) {
  std::error_code ec;
  if (!fs::is_directory(folder, ec)) return;
  std::vector<fs::path> stale;
  for (const auto& entry : fs::directory_iterator(folder, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("step-", 0) == 0 && name.find(".tmp-") != std::string::npos) {
      stale.push_back(entry.path());
    }
  }
  for (const auto& path : stale) {
    log_warning("removing the unfinished checkpoint ", path.string(),
                " (a previous run stopped while saving it)");
    fs::remove_all(path, ec);
  }
}

}  // namespace

CheckpointManager::CheckpointManager(const CheckpointSection& config,
                                     const std::string& dump_folder,
                                     std::vector<StateEntry> states, nlohmann::json describe)
    : config_(config),
      folder_((fs::path(dump_folder) / config.folder).string()),
      states_(std::move(states)),
      describe_(std::move(describe)) {
  for (const std::string& name : config_.exclude_from_loading) {
    const bool known = std::any_of(states_.begin(), states_.end(),
                                   [&](const StateEntry& e) { return e.name == name; });
    if (!known) {
      throw ConfigError("checkpoint.exclude_from_loading names '" + name +
                        "', which this trainer does not checkpoint");
    }
  }
}

CheckpointManager::~CheckpointManager() {
  try {
    wait();
  } catch (const std::exception& e) {
    log_error("checkpoint: the last asynchronous save failed: ", e.what());
  }
}

bool CheckpointManager::should_save(int64_t step, int64_t last_step) const {
  if (!config_.enable) return false;
  return step % config_.interval == 0 || step == last_step ||
         (config_.enable_first_step_checkpoint && step == 1);
}

bool CheckpointManager::maybe_save(int64_t step, int64_t last_step) {
  if (!should_save(step, last_step)) return false;
  save(step, /*model_only=*/step == last_step && config_.last_save_model_only);
  return true;
}

void CheckpointManager::save(int64_t step, bool model_only, bool keep_dtype) {
  wait();
  const auto t0 = std::chrono::steady_clock::now();
  const std::string dir = step_dir(folder_, step);
  std::error_code ec;
  fs::create_directories(folder_, ec);
  if (ec) throw DataError("cannot create the checkpoint folder '" + folder_ + "': " + ec.message());
  if (fs::exists(dir)) {
    // A resumed run re-saves a step it saved before (it resumed from an older checkpoint).
    log_warning("checkpoint ", dir, " exists; replacing it");
    fs::remove_all(dir, ec);
  }

  nlohmann::json state = describe_;
  state["step"] = step;
  state["model_only"] = model_only;
  state["entries"] = nlohmann::json::object();
  std::vector<SavedTensor> tensors;
  for (const StateEntry& entry : states_) {
    if (model_only && !entry.is_model) continue;
    nlohmann::json entry_state = nlohmann::json::object();
    entry.save(tensors, entry_state);
    state["entries"][entry.name] = std::move(entry_state);
  }
  if (model_only && !keep_dtype) {
    const at::ScalarType dtype = dtype_from_name(config_.export_dtype);
    for (auto& t : tensors) {
      if (t.local.is_floating_point()) t.local = t.local.to(dtype);
    }
  }
  if (config_.async_mode == "disabled") {
    write_and_purge(dir, tensors, state);
    log_info("checkpoint ", model_only ? "(model only) " : "", dir, " saved: ",
             human_bytes(total_bytes(tensors)), " in ", seconds_since(t0), "s");
    return;
  }
  // Snapshot: the training loop changes parameters and optimizer state in place.
  for (auto& t : tensors) t.local = t.local.detach().clone();
  log_info("checkpoint ", model_only ? "(model only) " : "", dir, ": state snapshotted in ",
           seconds_since(t0), "s; writing ", human_bytes(total_bytes(tensors)),
           " in the background");
  writer_ = std::thread([this, dir, tensors = std::move(tensors), state = std::move(state)]() {
    try {
      const auto w0 = std::chrono::steady_clock::now();
      write_and_purge(dir, tensors, state);
      log_info("checkpoint ", dir, " written in ", seconds_since(w0), "s (async)");
    } catch (...) {
      writer_error_ = std::current_exception();
    }
  });
}

void CheckpointManager::wait() {
  if (writer_.joinable()) writer_.join();
  if (writer_error_) {
    std::exception_ptr e = writer_error_;
    writer_error_ = nullptr;
    std::rethrow_exception(e);
  }
}

void CheckpointManager::write_and_purge(const std::string& dir,
                                        const std::vector<SavedTensor>& tensors,
                                        const nlohmann::json& state) {
  write_checkpoint(dir, tensors, state);
  purge_old();
}

void CheckpointManager::purge_old() {
  if (config_.keep_latest_k <= 0) return;
  auto steps = list_step_dirs(folder_);
  const int64_t excess = static_cast<int64_t>(steps.size()) - config_.keep_latest_k;
  for (int64_t i = 0; i < excess; ++i) {
    std::error_code ec;
    fs::remove_all(steps[i].second, ec);
    if (ec) log_warning("cannot delete old checkpoint ", steps[i].second, ": ", ec.message());
  }
}

int64_t CheckpointManager::final_model_only_step() const {
  auto steps = list_step_dirs(folder_);
  if (steps.empty()) return -1;
  const auto& [step, dir] = steps.back();
  try {
    CheckpointReader reader(dir, /*verify=*/false);
    if (reader.state().value("model_only", false) && step > 0) return step;
  } catch (const DataError&) {
  }
  return -1;
}

LoadResult CheckpointManager::load_dir(const std::string& dir, bool model_only_requested) {
  const auto t0 = std::chrono::steady_clock::now();
  CheckpointReader reader(dir);  // verifies sizes and checksums before anything is restored
  const nlohmann::json& state = reader.state();
  const bool model_only = model_only_requested || state.value("model_only", false);
  const nlohmann::json entries = state.value("entries", nlohmann::json::object());
  std::vector<std::string> loaded, skipped;
  for (const StateEntry& entry : states_) {
    const bool excluded =
        std::find(config_.exclude_from_loading.begin(), config_.exclude_from_loading.end(),
                  entry.name) != config_.exclude_from_loading.end();
    if (excluded || (model_only && !entry.is_model)) {
      skipped.push_back(entry.name);
      continue;
    }
    if (!entries.contains(entry.name)) {
      if (entry.is_model) throw DataError("checkpoint '" + dir + "' holds no model state");
      log_warning("checkpoint ", dir, " has no '", entry.name, "' state; keeping the fresh one");
      skipped.push_back(entry.name);
      continue;
    }
    entry.load(reader, entries.at(entry.name));
    loaded.push_back(entry.name);
  }
  LoadResult result;
  result.loaded = true;
  result.model_only = model_only;
  result.step = model_only ? 0 : state.value("step", int64_t{0});
  result.dir = dir;
  std::string list;
  for (const auto& n : loaded) list += (list.empty() ? "" : ", ") + n;
  std::string skip;
  for (const auto& n : skipped) skip += (skip.empty() ? "" : ", ") + n;
  log_info("loaded checkpoint ", dir, " (", list, skip.empty() ? "" : "; not loaded: " + skip,
           ") in ", seconds_since(t0), "s");
  return result;
}

LoadResult CheckpointManager::load(const std::function<void(const std::string&)>& hf_loader) {
  if (config_.enable) {
    remove_stale_temporaries(folder_);
    const auto steps = list_step_dirs(folder_);
    if (config_.load_step >= 0) {
      for (const auto& [step, dir] : steps) {
        if (step == config_.load_step) return load_dir(dir, /*model_only_requested=*/false);
      }
      std::string have;
      for (const auto& s : steps) have += (have.empty() ? "" : ", ") + std::to_string(s.first);
      throw ConfigError("checkpoint.load_step " + std::to_string(config_.load_step) +
                        ": no complete checkpoint step-" + std::to_string(config_.load_step) +
                        " in " + folder_ + " (have: " + (have.empty() ? "none" : have) + ")");
    }
    std::string last_error;
    for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
      const auto& [step, dir] = *it;
      try {
        if (step > 0) {
          // A model-only save (a finished run's final export) cannot resume training.
          CheckpointReader peek(dir, /*verify=*/false);
          if (peek.state().value("model_only", false)) continue;
        }
        return load_dir(dir, /*model_only_requested=*/false);
      } catch (const DataError& e) {
        last_error = e.what();
        log_warning("checkpoint ", dir, " cannot be loaded: ", e.what(),
                    "; falling back to the previous checkpoint");
      }
    }
    if (!last_error.empty()) {
      throw DataError("no checkpoint in " + folder_ + " can be loaded; the last error: " +
                      last_error + ". Move the folder away to start from scratch.");
    }
  }
  if (config_.initial_load_path.empty()) return {};
  const std::string& path = config_.initial_load_path;
  if (config_.initial_load_in_hf) {
    TITAN_CHECK(static_cast<bool>(hf_loader), "checkpoint.initial_load_in_hf: no Hugging Face loader");
    hf_loader(path);
    log_info("loaded the model from the Hugging Face folder ", path);
    LoadResult r;
    r.loaded = true;
    r.model_only = true;
    r.dir = path;
    return r;
  }
  std::string dir = path;
  if (!is_checkpoint_dir(path)) {
    const auto steps = list_step_dirs(path);
    if (steps.empty()) {
      throw ConfigError("checkpoint.initial_load_path '" + path +
                        "' is neither a checkpoint (no index.json) nor a folder of step-N "
                        "checkpoints");
    }
    dir = steps.back().second;
  }
  LoadResult r = load_dir(dir, config_.initial_load_model_only);
  if (r.model_only) r.step = 0;
  return r;
}

}  // namespace titan::ckpt
