// The SIGTERM/SIGINT report of a training run; see interrupt.h.
#include "titan/trainer/interrupt.h"

#include "titan/checkpoint/checkpoint_files.h"
#include "titan/common/logging.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>

namespace titan {

namespace {

// Handler state: a signal handler can only reach globals. Lock-free atomics are safe in it.
std::atomic<bool> g_active{false};  // a reporter is installed
std::atomic<int> g_write_fd{-1};
std::atomic<int> g_signals{0};
struct sigaction g_old_int {};
struct sigaction g_old_term {};

void on_signal(int sig) {
  const int saved_errno = errno;
  const int fd = g_write_fd.load();
  if (g_signals.fetch_add(1) > 0 || fd < 0) {  // a second signal: end now
    std::signal(sig, SIG_DFL);
    std::raise(sig);
    return;
  }
  const auto byte = static_cast<unsigned char>(sig);
  if (::write(fd, &byte, 1) != 1) {  // the watcher cannot hear us: act as if not installed
    std::signal(sig, SIG_DFL);
    std::raise(sig);
  }
  errno = saved_errno;
}

const char* signal_name(int sig) {
  switch (sig) {
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    default: return "a signal";
  }
}

}  // namespace

InterruptReporter::InterruptReporter(int64_t total_steps,
                                     std::function<std::string()> last_checkpoint, bool log)
    : total_steps_(total_steps), last_checkpoint_(std::move(last_checkpoint)) {
  bool idle = false;
  // Trainers on several threads of one process (tests): the first one reports.
  if (!log || !g_active.compare_exchange_strong(idle, true)) return;
  if (::pipe2(pipe_, O_CLOEXEC) != 0) {
    log_warning("cannot report interruptions (pipe: ", std::strerror(errno), ")");
    g_active.store(false);
    return;
  }
  g_signals.store(0);
  g_write_fd.store(pipe_[1]);
  watcher_ = std::thread([this] { watch(); });
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // training's own system calls carry on until the line is logged
  sigaction(SIGINT, &sa, &g_old_int);
  sigaction(SIGTERM, &sa, &g_old_term);
  installed_ = true;
}

InterruptReporter::~InterruptReporter() {
  if (!installed_) return;
  // Handlers first: a signal from now on acts as before; one already caught is in the pipe ahead
  // of the stop byte, so the watcher still reports it.
  sigaction(SIGINT, &g_old_int, nullptr);
  sigaction(SIGTERM, &g_old_term, nullptr);
  const unsigned char stop = 0;
  while (::write(pipe_[1], &stop, 1) < 0 && errno == EINTR) {
  }
  watcher_.join();
  g_write_fd.store(-1);
  ::close(pipe_[0]);
  ::close(pipe_[1]);
  g_active.store(false);
}

void InterruptReporter::watch() {
  unsigned char byte = 0;
  for (;;) {
    const ssize_t n = ::read(pipe_[0], &byte, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0 || byte == 0) return;
    const int sig = byte;
    std::string where;
    try {
      where = last_checkpoint_();
    } catch (const std::exception& e) {
      where = std::string("the last checkpoint could not be determined (") + e.what() + ")";
    }
    log_warning(message(sig, step_.load(), total_steps_, where));
    std::signal(sig, SIG_DFL);
    std::raise(sig);  // ends the process (the default action) as if never caught
    return;
  }
}

std::string InterruptReporter::message(int signal, int64_t step, int64_t total_steps,
                                       const std::string& last_checkpoint) {
  const std::string when = step < 1 ? "before step 1" : "during step " + std::to_string(step);
  return std::string("training interrupted by ") + signal_name(signal) + " " + when + " of " +
         std::to_string(total_steps) + "; " + last_checkpoint;
}

std::string describe_last_checkpoint(bool enabled, const std::string& folder) {
  if (!enabled) {
    return "no checkpoint is kept (checkpoint.enable is false), so this run's steps are lost. "
           "HINT: --checkpoint.enable saves every checkpoint.interval steps";
  }
  const auto steps = ckpt::list_step_dirs(folder);
  if (steps.empty()) return "no checkpoint in " + folder + " yet; a new run starts at step 1";
  return "the last checkpoint is " + steps.back().second +
         "; run the same command to resume from it";
}

}  // namespace titan
