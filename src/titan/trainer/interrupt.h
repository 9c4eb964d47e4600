// What a SIGTERM or SIGINT during training leaves behind: one log line naming the step that was
// interrupted and the newest complete checkpoint (or that there is none), then the process ends
// by that signal as before (exit status 128 + signal; `titan run` reports it as usual).
//
// A signal handler may do almost nothing safely, so it only writes the signal number to a pipe;
// a watcher thread reads it, composes and logs the line, restores the default action and raises
// the signal again. A second signal while the line is being written ends the process at once.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

namespace titan {

class InterruptReporter {
 public:
  // `total_steps`: training.steps. `last_checkpoint` runs on the watcher thread after a signal
  // and says where training can resume from, e.g. "the last checkpoint is <dir> (step 8)".
  // With `log` false (ranks other than 0), or while another reporter is installed in this
  // process, nothing is installed: the signal acts as before.
  InterruptReporter(int64_t total_steps, std::function<std::string()> last_checkpoint, bool log);
  // Restores the previous signal actions and stops the watcher.
  ~InterruptReporter();
  InterruptReporter(const InterruptReporter&) = delete;
  InterruptReporter& operator=(const InterruptReporter&) = delete;

  // The step now running (1-based).
  void set_step(int64_t step) { step_.store(step); }

  // The line logged for `signal` during step `step` of `total_steps` (for tests).
  static std::string message(int signal, int64_t step, int64_t total_steps,
                             const std::string& last_checkpoint);

 private:
  void watch();

  int64_t total_steps_;
  std::function<std::string()> last_checkpoint_;
  std::atomic<int64_t> step_{0};
  bool installed_ = false;
  int pipe_[2] = {-1, -1};
  std::thread watcher_;
};

// "the last checkpoint is <folder>/step-N; run the same command to resume from it", or that
// there is none (checkpointing disabled, or no complete step-N in `folder` yet).
std::string describe_last_checkpoint(bool enabled, const std::string& folder);

}  // namespace titan
