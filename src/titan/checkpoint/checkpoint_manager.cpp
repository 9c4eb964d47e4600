// CheckpointManager: save scheduling, model-only exports, async writes, retention and resuming, by
// the ranks of a group; a single process is a group of one, whose exchanges are the identity.
#include "titan/checkpoint/checkpoint_manager.h"

#include "titan/checkpoint/checkpoint_folder.h"

#include "titan/common/check.h"
#include "titan/common/format.h"
#include "titan/common/logging.h"
#include "titan/distributed/comm.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <map>
#include <unistd.h>

namespace titan::ckpt {

namespace fs = std::filesystem;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// ---- exchanges between the ranks: tiny int64 / uint8 tensors, rank 0 as the root --------------

// Outcome of one rank's part of a collective step, exchanged so that every rank acts alike.
enum Status : int64_t { kOk = 0, kDataError = 1, kConfigError = 2, kFailed = 3 };

Status status_of(const std::exception_ptr& error) {
  if (!error) return kOk;
  try {
    std::rethrow_exception(error);
  } catch (const DataError&) {
    return kDataError;
  } catch (const ConfigError&) {
    return kConfigError;
  } catch (...) {
    return kFailed;
  }
}

std::string message_of(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown error";
  }
}

std::vector<int64_t> to_vector(const at::Tensor& t) {
  const at::Tensor c = t.cpu().contiguous();
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

// The exchanges take the group of more than one rank, or null for a group of one (a single
// process), where each is the identity.

// Every rank's `mine` (the same length on every rank), concatenated in rank order.
std::vector<int64_t> all_gather_ints(dist::Group* g, const std::vector<int64_t>& mine) {
  if (g == nullptr) return mine;
  const at::Tensor in = at::tensor(mine, at::kLong).to(g->device());
  const at::Tensor out = at::empty({g->size() * static_cast<int64_t>(mine.size())},
                                   at::TensorOptions().dtype(at::kLong).device(g->device()));
  g->all_gather_into_tensor(out, in).wait();
  return to_vector(out);
}

// Rank 0's `values` / `text` on every rank.
std::vector<int64_t> broadcast_ints(dist::Group* g, const std::vector<int64_t>& values) {
  return g == nullptr ? values : g->broadcast_ints(values, /*root=*/0);
}

std::string broadcast_string(dist::Group* g, const std::string& text) {
  return g == nullptr ? text : g->broadcast_string(text, /*root=*/0);
}

bool all_ok(const std::vector<int64_t>& statuses) {
  return std::all_of(statuses.begin(), statuses.end(), [](int64_t s) { return s == kOk; });
}

// "1, 3": the ranks whose status is not kOk.
std::string failed_ranks(const std::vector<int64_t>& statuses) {
  std::vector<size_t> failed;
  for (size_t r = 0; r < statuses.size(); ++r) {
    if (statuses[r] != kOk) failed.push_back(r);
  }
  return join(failed);
}

// After an exchange of statuses: when any rank failed, every rank throws, the failed ones their
// own error, the others an error of the first failed rank's kind that names the failed ranks.
void throw_if_any_failed(const std::vector<int64_t>& statuses, const std::exception_ptr& mine,
                         const std::string& what) {
  if (all_ok(statuses)) return;
  if (mine) std::rethrow_exception(mine);
  const auto first =
      std::find_if(statuses.begin(), statuses.end(), [](int64_t s) { return s != kOk; });
  const std::string message =
      what + ": rank(s) " + failed_ranks(statuses) + " failed (their log has the error)";
  if (*first == kConfigError) throw ConfigError(message);
  throw DataError(message);
}

}  // namespace

// A save between its writing (possibly on the writer thread) and its commit.
struct CheckpointManager::PendingSave {
  std::string dir;
  std::string tmp;
  nlohmann::json state;  // rank 0's: stored in index.json at the commit
  bool model_only = false;
  std::chrono::steady_clock::time_point t0;
  uint64_t bytes = 0;        // tensor bytes this rank wrote
  std::exception_ptr error;  // this rank's writing failed
  std::atomic<bool> written{false};
};

CheckpointManager::CheckpointManager(const CheckpointSection& config,
                                     const std::string& dump_folder, std::vector<StateEntry> states,
                                     nlohmann::json describe, std::shared_ptr<dist::Group> group)
    : config_(config),
      folder_((fs::path(dump_folder) / config.folder).string()),
      states_(std::move(states)),
      describe_(std::move(describe)),
      group_(std::move(group)) {
  if (config_.async_mode != "disabled") {
    stager_ = std::make_unique<Stager>(/*reuse=*/config_.async_mode == "async_with_pinned_mem");
  }
  for (const std::string& name : config_.exclude_from_loading) {
    const bool known = std::any_of(states_.begin(), states_.end(),
                                   [&](const StateEntry& e) { return e.name == name; });
    if (!known) {
      throw ConfigError(message("checkpoint.exclude_from_loading names '", name,
                                "', which this trainer does not checkpoint"));
    }
  }
}

CheckpointManager::~CheckpointManager() {
  if (!pending_) return;
  // Committing with peers is a collective: not while an exception unwinds this rank (its peers
  // may never get here) nor over a broken group, either of which would only hang until the
  // timeout. A group of one has nobody to wait for and always commits.
  if (peers() != nullptr && (std::uncaught_exceptions() > 0 || !peers()->healthy())) {
    if (writer_.joinable()) writer_.join();
    log_warning("checkpoint ", pending_->dir, " abandoned before its commit; the next load() ",
                "removes its temporary directory ", pending_->tmp);
    return;
  }
  try {
    wait();
  } catch (const std::exception& e) {
    log_error("checkpoint: the last asynchronous save failed: ", e.what());
  }
}

dist::Group* CheckpointManager::peers() const {
  return group_ && group_->size() > 1 ? group_.get() : nullptr;
}

int CheckpointManager::rank() const { return peers() ? peers()->rank() : 0; }

int CheckpointManager::world_size() const { return peers() ? peers()->size() : 1; }

bool CheckpointManager::should_save(int64_t step, int64_t last_step) const {
  if (!config_.enable || config_.load_only) return false;  // load_only: load, never save
  return step % config_.interval == 0 || step == last_step ||
         (config_.enable_first_step_checkpoint && step == 1);
}

bool CheckpointManager::maybe_save(int64_t step, int64_t last_step) {
  const bool save_now = should_save(step, last_step);
  if (pending_ && !save_now) {
    // An asynchronous save commits as soon as every rank has written its files.
    const std::vector<int64_t> written = all_gather_ints(peers(), {pending_->written ? 1 : 0});
    if (std::all_of(written.begin(), written.end(), [](int64_t w) { return w == 1; })) {
      commit_pending();
    }
  }
  if (!save_now) return false;
  save(step, /*model_only=*/step == last_step && config_.last_save_model_only);
  return true;
}

void CheckpointManager::collect(int64_t step, bool model_only, bool keep_dtype,
                                std::vector<SavedTensor>& tensors, nlohmann::json& state) const {
  state = describe_;
  state["step"] = step;
  state["model_only"] = model_only;
  state["entries"] = nlohmann::json::object();
  for (const StateEntry& entry : states_) {
    if (model_only && !entry.is_model) continue;
    nlohmann::json entry_state = nlohmann::json::object();
    entry.save(tensors, entry_state);
    state["entries"][entry.name] = std::move(entry_state);
  }
  if (model_only && !keep_dtype) {
    // Cast on the host: an export_dtype copy of the model would not fit beside a full GPU.
    const at::ScalarType dtype = dtype_from_name(config_.export_dtype);
    for (auto& t : tensors) {
      if (t.local.is_floating_point()) t.local = t.local.to(at::kCPU, dtype);
    }
  }
}

void CheckpointManager::save(int64_t step, bool model_only, bool keep_dtype) {
  wait();
  auto p = std::make_unique<PendingSave>();
  p->t0 = std::chrono::steady_clock::now();
  p->dir = step_dir(folder_, step);
  p->model_only = model_only;
  const bool async = config_.async_mode != "disabled";
  std::vector<SavedTensor> tensors;
  std::exception_ptr error;
  int64_t nonce = 0;
  try {
    collect(step, model_only, keep_dtype, tensors, p->state);
    // Snapshot on the host: the training loop changes parameters and optimizer state in place.
    // wait() above ended the previous write, so reused buffers are free.
    if (async) stager_->stage(tensors);
    if (rank() == 0) {
      nonce = ::getpid();
      prepare_step_dir(folder_, p->dir, unusable_);
      make_temp_dir(p->dir, nonce);
    }
  } catch (...) {
    error = std::current_exception();
  }
  // One exchange tells every rank whether all are ready and rank 0's nonce, which names the
  // temporary directory they all write into: (status, nonce) per rank.
  const std::vector<int64_t> ready = all_gather_ints(peers(), {status_of(error), nonce});
  std::vector<int64_t> statuses;
  for (size_t i = 0; i < ready.size(); i += 2) statuses.push_back(ready[i]);
  p->tmp = temp_dir_of(p->dir, ready[1]);
  if (!all_ok(statuses) && rank() == 0) {
    std::error_code ec;
    fs::remove_all(p->tmp, ec);
  }
  throw_if_any_failed(statuses, error, "checkpoint " + p->dir + " not saved");
  if (rank() != 0) p->state = nullptr;  // only rank 0's goes into the index

  PendingSave* pending = p.get();
  pending_ = std::move(p);
  auto write = [pending, rank = rank(), size = world_size(), tensors = std::move(tensors)]() {
    try {
      pending->bytes = write_rank_files(pending->tmp, rank, size, tensors);
    } catch (...) {
      pending->error = std::current_exception();
    }
    pending->written = true;
  };
  if (!async) {
    write();
    commit_pending();
    return;
  }
  log_info("checkpoint ", model_only ? "(model only) " : "", pending->dir, ": state staged",
           stager_->reuses() ? " into reused host buffers (" +
                                   human_bytes(static_cast<uint64_t>(stager_->bytes())) + ")"
                             : "",
           " in ", seconds_since(pending->t0), "s; writing ",
           world_size() > 1 ? "this rank's part" : "it", " in the background");
  writer_ = std::thread(std::move(write));
}

void CheckpointManager::commit_pending() {
  if (writer_.joinable()) writer_.join();
  const std::unique_ptr<PendingSave> p = std::move(pending_);
  const std::string what = "checkpoint " + p->dir + " not saved";
  // Every rank's files and fragment are fsynced once it reports kOk here.
  const std::vector<int64_t> statuses = all_gather_ints(peers(), {status_of(p->error)});
  if (!all_ok(statuses) && rank() == 0) {
    std::error_code ec;
    fs::remove_all(p->tmp, ec);
  }
  throw_if_any_failed(statuses, p->error, what);
  std::exception_ptr error;
  if (rank() == 0) {
    try {
      merge_rank_fragments(p->tmp, world_size(), p->state);
      commit_checkpoint_dir(p->tmp, p->dir);  // the commit: the checkpoint exists from here on
    } catch (...) {
      error = std::current_exception();
      std::error_code ec;
      fs::remove_all(p->tmp, ec);
    }
    if (!error) {
      try {
        purge_old();
      } catch (const std::exception& e) {
        log_warning("checkpoint: cannot purge old checkpoints: ", e.what());
      }
    }
  }
  // Rank 0's outcome; waiting for it also keeps every rank behind the rename and the purge.
  if (broadcast_ints(peers(), {status_of(error)})[0] != kOk) {
    if (error) std::rethrow_exception(error);
    throw DataError(what + ": rank 0 failed to merge or commit it (its log has the error)");
  }
  const std::string by = world_size() > 1 ? " by " + std::to_string(world_size()) + " ranks (" +
                                                human_bytes(p->bytes) + " from this rank)"
                                          : " (" + human_bytes(p->bytes) + ")";
  log_info("checkpoint ", p->model_only ? "(model only) " : "", p->dir, " saved", by, " in ",
           seconds_since(p->t0), "s");
}

void CheckpointManager::wait() {
  if (pending_) commit_pending();
}

void CheckpointManager::purge_old() {
  if (config_.keep_latest_k <= 0) return;
  const auto steps = list_step_dirs(folder_);
  const int64_t excess = static_cast<int64_t>(steps.size()) - config_.keep_latest_k;
  if (excess <= 0) return;
  // The newest full checkpoint is what a restart resumes from: model-only exports (a finished
  // run's final save) never push it out.
  std::string newest_full;
  for (auto it = steps.rbegin(); it != steps.rend() && newest_full.empty(); ++it) {
    try {
      if (it->first == 0 || !is_model_only(it->second)) newest_full = it->second;
    } catch (const DataError&) {
    }
  }
  for (int64_t i = 0; i < excess; ++i) {
    if (steps[i].second != newest_full) delete_step_dir(steps[i].second);
  }
}

int64_t CheckpointManager::final_model_only_step() const {
  auto decide = [&]() -> int64_t {
    auto steps = list_step_dirs(folder_);
    if (steps.empty()) return -1;
    const auto& [step, dir] = steps.back();
    try {
      CheckpointReader reader(dir, /*verify=*/false);
      if (reader.state().value("model_only", false) && step > 0) return step;
    } catch (const DataError&) {
    }
    return -1;
  };
  return broadcast_ints(peers(), {rank() == 0 ? decide() : 0})[0];  // rank 0 decides for all
}

LoadResult CheckpointManager::load_dir(const std::string& dir, bool model_only_requested,
                                       bool verify) {
  const auto t0 = std::chrono::steady_clock::now();
  // Verifies sizes (and checksums) before anything is restored.
  CheckpointReader reader(dir, verify);
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
  log_info("loaded checkpoint ", dir, " (", join(loaded),
           skipped.empty() ? "" : "; not loaded: " + join(skipped), ") in ", seconds_since(t0),
           "s");
  return result;
}

// ---- loading: every rank restores its part of the checkpoint rank 0 chooses ---------------------

LoadResult CheckpointManager::load_dir_together(const std::string& dir, bool model_only_requested,
                                                bool fall_back_on_data_error,
                                                std::string* data_error) {
  LoadResult result;
  std::exception_ptr error;
  try {
    // Rank 0 verifies every file's checksum; the others check sizes and read what they need.
    result = load_dir(dir, model_only_requested, /*verify=*/rank() == 0);
  } catch (...) {
    error = std::current_exception();
  }
  const std::vector<int64_t> statuses = all_gather_ints(peers(), {status_of(error)});
  const bool only_data_errors = std::all_of(statuses.begin(), statuses.end(),
                                            [](int64_t s) { return s == kOk || s == kDataError; });
  if (fall_back_on_data_error && only_data_errors && !all_ok(statuses)) {
    // Every rank falls back together; rank 0 reports why.
    if (error && rank() != 0) {
      log_warning("checkpoint ", dir, " cannot be loaded on this rank: ", message_of(error));
    }
    *data_error = error && rank() == 0 ? message_of(error)
                                       : "rank(s) " + failed_ranks(statuses) +
                                             " cannot load it (their log has the error)";
    return LoadResult{};
  }
  throw_if_any_failed(statuses, error, "loading checkpoint " + dir);
  return result;
}

LoadResult CheckpointManager::load(const std::function<void(const std::string&)>& hf_loader) {
  dist::Group* g = peers();
  const bool root = rank() == 0;
  // Rank 0 chooses what to load and broadcasts it as JSON: {"dir": d}, {"none": true} or
  // {"error": "config" | "data", "message": m}. Every rank then loads that directory.
  auto receive = [&](const nlohmann::json& choice) {
    const nlohmann::json c = nlohmann::json::parse(broadcast_string(g, root ? choice.dump() : ""));
    if (c.contains("error")) {
      const std::string message = c["message"].get<std::string>();
      if (c["error"] == "config") throw ConfigError(message);
      throw DataError(message);
    }
    return c;
  };
  if (config_.enable) {
    std::unique_ptr<ResumeChooser> chooser;
    if (root) chooser = std::make_unique<ResumeChooser>(config_, folder_, unusable_);
    std::string failed;
    while (true) {
      const nlohmann::json choice = receive(root ? chooser->next(failed) : nlohmann::json());
      if (choice.contains("none")) break;
      const std::string dir = choice["dir"].get<std::string>();
      LoadResult r = load_dir_together(dir, /*model_only_requested=*/false,
                                       /*fall_back_on_data_error=*/config_.load_step < 0, &failed);
      if (r.loaded) return r;
    }
  }
  if (config_.initial_load_path.empty()) return {};
  const std::string& path = config_.initial_load_path;
  if (config_.initial_load_in_hf) {
    TITAN_CHECK(static_cast<bool>(hf_loader),
                "checkpoint.initial_load_in_hf: no Hugging Face loader");
    std::exception_ptr error;
    try {
      hf_loader(path);
    } catch (...) {
      error = std::current_exception();
    }
    throw_if_any_failed(all_gather_ints(g, {status_of(error)}), error,
                        "loading the Hugging Face folder " + path);
    log_info("loaded the model from the Hugging Face folder ", path);
    LoadResult r;
    r.loaded = r.model_only = true;
    r.dir = path;
    return r;
  }
  nlohmann::json choice;
  if (root) {
    choice = {{"dir", path}};
    if (!is_checkpoint_dir(path)) {
      const auto steps = list_step_dirs(path);
      if (steps.empty()) {
        choice = {{"error", "config"},
                  {"message", "checkpoint.initial_load_path '" + path +
                                  "' is neither a checkpoint (no index.json) nor a folder of "
                                  "step-N checkpoints"}};
      } else {
        choice = {{"dir", steps.back().second}};
      }
    }
  }
  const std::string dir = receive(choice)["dir"].get<std::string>();
  LoadResult r = load_dir_together(dir, config_.initial_load_model_only,
                                   /*fall_back_on_data_error=*/false, nullptr);
  if (r.model_only) r.step = 0;
  return r;
}

}  // namespace titan::ckpt
