// The `titan run` supervisor: fork one child per local rank, relay their output line by line
// through pipes, and bring the whole job down as soon as one rank fails.
//
// One thread, one loop: poll() over every child's stdout/stderr with a short timeout, then reap
// exited children (waitpid WNOHANG) and handle forwarded signals. A failure therefore reaches the
// other ranks within one poll period (kPollMs), and the job ends within kGraceSeconds after that.
// With several nodes, the node that stops the job also writes why into the job's store
// (kJobStoppedKey), where the other nodes' ranks read it within a heartbeat (liveness.h).
#include "titan/distributed/launcher.h"

#include "titan/common/check.h"
#include "titan/common/cpu.h"
#include "titan/distributed/launch_env.h"
#include "titan/distributed/liveness.h"

#include <c10/util/Logging.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <set>
#include <sstream>
#include <thread>

extern char** environ;

namespace titan {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kPollMs = 50;
// How long the survivors of a failed rank get to write their flight-recorder dumps (SIGUSR1).
constexpr int kTraceDumpMs = 500;
// How long telling the other nodes may take (the store may be what failed).
constexpr auto kPublishTimeout = std::chrono::milliseconds(1500);
constexpr size_t kMaxLine = 1 << 16;  // a longer run without newline is printed in pieces
constexpr auto kDrainAfterExit = std::chrono::seconds(1);  // grandchildren may hold a pipe open

// The last SIGINT/SIGTERM the parent received, and how many so far (a second one escalates).
volatile sig_atomic_t g_signal = 0;
volatile sig_atomic_t g_signal_count = 0;

void on_signal(int sig) {
  g_signal = sig;
  g_signal_count = g_signal_count + 1;
}

std::string signal_name(int sig) {
  switch (sig) {
    case SIGKILL: return "SIGKILL";
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case SIGABRT: return "SIGABRT";
    case SIGSEGV: return "SIGSEGV";
    case SIGBUS: return "SIGBUS";
    case SIGFPE: return "SIGFPE";
    case SIGILL: return "SIGILL";
    case SIGHUP: return "SIGHUP";
    case SIGPIPE: return "SIGPIPE";
    default: return "signal " + std::to_string(sig);
  }
}

int64_t parse_option_int(const std::string& option, const std::string& value, int64_t min,
                         int64_t max) {
  size_t pos = 0;
  int64_t v = 0;
  try {
    v = std::stoll(value, &pos);
  } catch (const std::exception&) {
    pos = 0;
  }
  if (value.empty() || pos != value.size()) {
    throw ConfigError(message("--", option, " '", value, "' is not an integer"));
  }
  if (v < min || v > max) {
    throw ConfigError(message("--", option, " ", value, " is not in [", min, ", ", max, "]"));
  }
  return v;
}

// A port nothing listens on right now; rank 0's store binds it a moment later.
int64_t free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 29500;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  int64_t port = 29500;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

struct Stream {
  int fd = -1;
  bool is_stderr = false;
  std::string partial;
};

struct Child {
  int64_t rank = 0;
  pid_t pid = -1;
  bool running = false;
  Stream out, err;
};

class Job {
 public:
  Job(const LaunchOptions& opts, int64_t port, std::vector<bool> log_ranks)
      : opts_(opts), port_(port), log_ranks_(std::move(log_ranks)) {}

  int run(const std::vector<std::string>& argv, bool search_path,
          const std::vector<std::vector<std::string>>& envs);

 private:
  bool spawn(Child& c, const std::vector<std::string>& argv, bool search_path,
             const std::vector<std::string>& env);
  void pump(Child& c, Stream& s);
  void emit(const Child& c, const Stream& s, const std::string& line);
  void reap();
  void stop(int sig, const std::string& why);
  void kill_all(int sig);
  bool any_running() const;
  void publish_stop(const std::string& why);
  void await_publish();

  const LaunchOptions& opts_;
  int64_t port_ = 0;
  std::future<void> published_;
  bool stopped_elsewhere_ = false;  // a rank said another node stopped the job
  std::vector<bool> log_ranks_;
  std::vector<Child> children_;
  int exit_code_ = 0;
  bool stopping_ = false;
  bool killed_ = false;
  Clock::time_point kill_at_;
  Clock::time_point stopped_at_;  // when the failure (or signal) was seen
  std::string stop_cause_;        // "rank 1 failed", "SIGTERM"
};

bool Job::spawn(Child& c, const std::vector<std::string>& argv, bool search_path,
                const std::vector<std::string>& env) {
  int out[2], err[2];
  if (pipe2(out, O_CLOEXEC) != 0) return false;
  if (pipe2(err, O_CLOEXEC) != 0) {
    close(out[0]);
    close(out[1]);
    return false;
  }
  // Everything the child needs is prepared before fork(): after it, only async-signal-safe calls.
  std::vector<char*> cargv, cenv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  for (const auto& e : env) cenv.push_back(const_cast<char*>(e.c_str()));
  cenv.push_back(nullptr);
  const pid_t parent = getpid();

  const pid_t pid = fork();
  if (pid < 0) return false;
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the supervisor
    if (getppid() != parent) _exit(127);
    setpgid(0, 0);  // its own group, so stopping it also stops what it started
    const int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0) dup2(devnull, STDIN_FILENO);
    dup2(out[1], STDOUT_FILENO);
    dup2(err[1], STDERR_FILENO);
    signal(SIGPIPE, SIG_DFL);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    // SIGUSR1 asks for a flight-recorder dump (see reap()); a rank without a recorder ignores it.
    signal(SIGUSR1, SIG_IGN);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    if (search_path) {
      execvpe(cargv[0], cargv.data(), cenv.data());
    } else {
      execve(cargv[0], cargv.data(), cenv.data());
    }
    dprintf(STDERR_FILENO, "titan run: cannot execute %s: %s\n", cargv[0], strerror(errno));
    _exit(127);
  }
  setpgid(pid, pid);  // also from the parent, so a kill right after fork reaches the group
  close(out[1]);
  close(err[1]);
  fcntl(out[0], F_SETFL, fcntl(out[0], F_GETFL) | O_NONBLOCK);
  fcntl(err[0], F_SETFL, fcntl(err[0], F_GETFL) | O_NONBLOCK);
  c.pid = pid;
  c.running = true;
  c.out = {out[0], false, {}};
  c.err = {err[0], true, {}};
  return true;
}

// titan's own warning and error log lines go to stdout; they are shown for every rank.
bool is_warning_line(const std::string& line) {
  return line.find(" - WARNING - ") != std::string::npos ||
         line.find(" - ERROR - ") != std::string::npos;
}

void Job::emit(const Child& c, const Stream& s, const std::string& line) {
  if (line.find(dist::kJobStoppedBy) != std::string::npos) stopped_elsewhere_ = true;
  if (!s.is_stderr && !log_ranks_[static_cast<size_t>(c.rank)] && !is_warning_line(line)) return;
  const std::string text = "[rank " + std::to_string(c.rank) + "] " + line + "\n";
  std::FILE* f = s.is_stderr ? stderr : stdout;
  std::fwrite(text.data(), 1, text.size(), f);
  std::fflush(f);
}

// Reads what is available (non-blocking) and prints the complete lines; closes at EOF.
void Job::pump(Child& c, Stream& s) {
  char buf[1 << 16];
  while (s.fd >= 0) {
    const ssize_t n = read(s.fd, buf, sizeof(buf));
    if (n > 0) {
      s.partial.append(buf, static_cast<size_t>(n));
      size_t start = 0, nl;
      while ((nl = s.partial.find('\n', start)) != std::string::npos) {
        emit(c, s, s.partial.substr(start, nl - start));
        start = nl + 1;
      }
      s.partial.erase(0, start);
      if (s.partial.size() > kMaxLine) {
        emit(c, s, s.partial);
        s.partial.clear();
      }
    } else if (n == 0) {
      if (!s.partial.empty()) emit(c, s, s.partial);
      s.partial.clear();
      close(s.fd);
      s.fd = -1;
    } else if (errno != EINTR) {
      return;  // EAGAIN: nothing more for now
    }
  }
}

bool Job::any_running() const {
  for (const auto& c : children_) {
    if (c.running) return true;
  }
  return false;
}

void Job::kill_all(int sig) {
  for (const auto& c : children_) {
    if (!c.running) continue;
    kill(-c.pid, sig);
    kill(c.pid, sig);
    if (sig != SIGKILL) {
      // A stopped rank (SIGSTOP, a frozen peer) only acts on the signal once continued.
      kill(-c.pid, SIGCONT);
      kill(c.pid, SIGCONT);
    }
  }
}

void Job::stop(int sig, const std::string& why) {
  stopping_ = true;
  stopped_at_ = Clock::now();
  int others = 0;
  for (const auto& c : children_) others += c.running ? 1 : 0;
  if (others > 0) {
    std::fprintf(stderr, "titan run: %s; sending %s to the %d remaining rank%s\n", why.c_str(),
                 signal_name(sig).c_str(), others, others == 1 ? "" : "s");
  }
  kill_all(sig);
  kill_at_ = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(kGraceSeconds * 1000));
}

// Writes why this node stops the job into the job's store for the other nodes' ranks (liveness.h)
// on a thread, so that it overlaps the flight-recorder grace; await_publish() bounds the wait.
// Rank 0's store still runs here: its own rank is stopped only after this. Best effort: the
// store (or the network to it) may be what failed, and then the others learn it from their
// collectives' timeouts and diagnoses.
void Job::publish_stop(const std::string& why) {
  if (opts_.nnodes <= 1 || published_.valid() || stopped_elsewhere_) return;
  const std::string text =
      "node " + std::to_string(opts_.node_rank) + " (host " + host_name() + "): " + why;
  const std::string addr = opts_.master_addr;
  const auto port = static_cast<uint16_t>(port_);
  auto done = std::make_shared<std::promise<void>>();
  published_ = done->get_future();
  // c10d logs every failed connection attempt (with a backtrace); here a failure is expected
  // and harmless. This process only supervises (its ranks are new processes), so silencing
  // c10's log below FATAL costs nothing else.
  FLAGS_caffe2_log_level = 3;
  std::thread([text, addr, port, done] {
    try {
      c10d::TCPStoreOptions o;
      o.port = port;
      o.isServer = false;
      o.waitWorkers = false;
      o.timeout = kPublishTimeout;
      c10d::TCPStore store(addr, o);
      store.compareSet(dist::kJobStoppedKey, {}, std::vector<uint8_t>(text.begin(), text.end()));
    } catch (const std::exception&) {
    }
    done->set_value();
  }).detach();
}

void Job::await_publish() {
  if (published_.valid()) published_.wait_for(kPublishTimeout);
}

// Reaps exited children. Several failures seen in one pass are all reported: a crash often makes
// its peers fail within milliseconds, and the pass cannot tell which came first, so the job's
// exit code prefers a rank killed by a signal over one that exited with an error.
void Job::reap() {
  struct Failure {
    int64_t rank;
    std::string what;
    int code;
    bool signaled;
  };
  std::vector<Failure> failures;
  for (auto& c : children_) {
    if (!c.running) continue;
    int status = 0;
    if (waitpid(c.pid, &status, WNOHANG) != c.pid) continue;
    c.running = false;
    pump(c, c.out);  // its last words come before the verdict
    pump(c, c.err);
    if ((WIFEXITED(status) && WEXITSTATUS(status) == 0) || stopping_) continue;
    Failure f{c.rank, "", 0, WIFSIGNALED(status)};
    if (f.signaled) {
      const int sig = WTERMSIG(status);
      f.what = "was killed by " + signal_name(sig) + (WCOREDUMP(status) ? " (core dumped)" : "");
      f.code = 128 + sig;
    } else {
      f.what = "exited with code " + std::to_string(WEXITSTATUS(status));
      f.code = WEXITSTATUS(status);
    }
    f.what = "rank " + std::to_string(c.rank) + " (pid " + std::to_string(c.pid) + ") " + f.what;
    failures.push_back(f);
  }
  if (failures.empty()) return;
  const Failure* first = &failures.front();
  for (const auto& f : failures) {
    std::fprintf(stderr, "titan run: %s\n", f.what.c_str());
    if (f.signaled && !first->signaled) first = &f;
  }
  exit_code_ = first->code;
  publish_stop(first->what);
  // The survivors dump their flight recorders (comm.trace_buf_size) before they are stopped; a
  // stopped (SIGSTOP) rank cannot, and its missing dump is itself the analyzer's clue.
  for (const auto& c : children_) {
    if (c.running) kill(c.pid, SIGUSR1);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(kTraceDumpMs));
  await_publish();
  stop_cause_ = stopped_elsewhere_ ? "another node stopped the job (see the ranks' errors)"
                                   : "rank " + std::to_string(first->rank) + " failed";
  stop(SIGTERM, "stopping the job because " + stop_cause_);
}

int Job::run(const std::vector<std::string>& argv, bool search_path,
             const std::vector<std::vector<std::string>>& envs) {
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;  // no SA_RESTART: poll() returns at once
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);  // a closed terminal or `| head` must not kill the supervisor

  children_.resize(envs.size());
  for (size_t i = 0; i < envs.size(); ++i) {
    children_[i].rank = opts_.node_rank * opts_.nproc_per_node + static_cast<int64_t>(i);
    if (!spawn(children_[i], argv, search_path, envs[i])) {
      std::fprintf(stderr, "titan run: cannot start rank %lld: %s\n",
                   static_cast<long long>(children_[i].rank), std::strerror(errno));
      children_.resize(i);
      exit_code_ = 1;
      stop(SIGTERM, "stopping the job");
      break;
    }
  }

  int handled_signals = 0;
  Clock::time_point drain_until{};
  for (;;) {
    std::vector<pollfd> fds;
    std::vector<std::pair<Child*, Stream*>> owners;
    for (auto& c : children_) {
      for (Stream* s : {&c.out, &c.err}) {
        if (s->fd < 0) continue;
        fds.push_back({s->fd, POLLIN, 0});
        owners.push_back({&c, s});
      }
    }
    const bool running = any_running();
    if (!running && fds.empty()) break;
    if (!running) {
      if (drain_until == Clock::time_point{}) drain_until = Clock::now() + kDrainAfterExit;
      if (Clock::now() >= drain_until) break;
    }
    if (poll(fds.data(), fds.size(), kPollMs) > 0) {
      for (size_t i = 0; i < fds.size(); ++i) {
        if (fds[i].revents != 0) pump(*owners[i].first, *owners[i].second);
      }
    }
    reap();
    if (g_signal_count != handled_signals) {
      handled_signals = g_signal_count;
      const int sig = g_signal;
      if (!stopping_) {
        exit_code_ = 128 + sig;
        stop_cause_ = "titan run received " + signal_name(sig);
        publish_stop(stop_cause_);
        await_publish();
        stop(sig, "received " + signal_name(sig));
      } else if (!killed_) {
        kill_all(SIGKILL);
        killed_ = true;
      }
    }
    if (stopping_ && !killed_ && any_running() && Clock::now() >= kill_at_) {
      std::ostringstream ranks;
      for (const auto& c : children_) {
        if (c.running) ranks << " " << c.rank;
      }
      std::fprintf(stderr, "titan run: rank(s)%s did not stop within %.0f s; sending SIGKILL\n",
                   ranks.str().c_str(), kGraceSeconds);
      kill_all(SIGKILL);
      killed_ = true;
    }
  }
  for (auto& c : children_) {
    for (Stream* s : {&c.out, &c.err}) {
      if (s->fd >= 0) close(s->fd);
    }
  }
  if (stopping_ && !stop_cause_.empty()) {
    const double s = std::chrono::duration<double>(Clock::now() - stopped_at_).count();
    std::fprintf(stderr, "titan run: all ranks stopped %.2f s after %s; exit code %d\n", s,
                 stop_cause_.c_str(), exit_code_);
  }
  return exit_code_;
}

// The parent's environment without the variables that describe a rank, plus this rank's.
std::vector<std::string> child_env(const LaunchOptions& o, int64_t local_rank, int64_t port,
                                   const std::string& threads) {
  static const std::set<std::string> kRankVars = {
      "RANK",        "LOCAL_RANK",  "WORLD_SIZE",      "LOCAL_WORLD_SIZE",
      "GROUP_RANK",  "ROLE_RANK",   "ROLE_WORLD_SIZE", "GROUP_WORLD_SIZE",
      "MASTER_ADDR", "MASTER_PORT", "TITAN_RUN",       "OMP_NUM_THREADS"};
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    const std::string name = entry.substr(0, entry.find('='));
    if (kRankVars.count(name) || name.rfind("TORCHELASTIC_", 0) == 0) continue;
    env.push_back(entry);
  }
  const int64_t rank = o.node_rank * o.nproc_per_node + local_rank;
  env.push_back("RANK=" + std::to_string(rank));
  env.push_back("LOCAL_RANK=" + std::to_string(local_rank));
  env.push_back("WORLD_SIZE=" + std::to_string(o.world_size()));
  env.push_back("LOCAL_WORLD_SIZE=" + std::to_string(o.nproc_per_node));
  env.push_back("GROUP_RANK=" + std::to_string(o.node_rank));
  env.push_back("GROUP_WORLD_SIZE=" + std::to_string(o.nnodes));
  env.push_back("MASTER_ADDR=" + o.master_addr);
  env.push_back("MASTER_PORT=" + std::to_string(port));
  env.push_back("TITAN_RUN=1");
  env.push_back("OMP_NUM_THREADS=" + threads);
  return env;
}

}  // namespace

bool is_titan_command(const std::string& name) {
  static const std::set<std::string> kCommands = {"train",     "inspect", "bench",    "data",
                                                  "tokenizer", "convert", "generate", "selftest"};
  return kCommands.count(name) > 0;
}

LaunchOptions parse_launch_args(const std::vector<std::string>& args) {
  LaunchOptions o;
  size_t i = 0;
  for (; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (arg == "--help" || arg == "-h") {
      o.help = true;
      return o;
    }
    if (arg.rfind("--", 0) != 0) break;  // the command starts
    std::string name = arg.substr(2), value;
    const size_t eq = name.find('=');
    const bool inline_value = eq != std::string::npos;
    if (inline_value) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    for (char& ch : name) ch = ch == '-' ? '_' : ch;
    static const std::set<std::string> kOptions = {"nproc_per_node", "nnodes", "node_rank",
                                                   "master_addr", "master_port"};
    if (!kOptions.count(name)) {
      throw ConfigError(
          message("unknown option '", arg,
                  "' (options: --nproc_per_node, --nnodes, --node_rank, --master_addr, "
                  "--master_port; the command to run follows '--')"));
    }
    if (!inline_value) {
      if (i + 1 >= args.size()) throw ConfigError(message("--", name, " needs a value"));
      value = args[++i];
    }
    if (name == "nproc_per_node") o.nproc_per_node = parse_option_int(name, value, 1, 1024);
    if (name == "nnodes") o.nnodes = parse_option_int(name, value, 1, 1 << 20);
    if (name == "node_rank") o.node_rank = parse_option_int(name, value, 0, 1 << 20);
    if (name == "master_port") o.master_port = parse_option_int(name, value, 0, 65535);
    if (name == "master_addr") {
      if (value.empty()) throw ConfigError("--master_addr is empty");
      o.master_addr = value;
      o.master_addr_set = true;
    }
  }
  o.command.assign(args.begin() + static_cast<std::ptrdiff_t>(i), args.end());
  if (o.command.empty()) {
    throw ConfigError(
        "no command; e.g. `titan run --nproc_per_node 2 -- train "
        "--job.config_file configs/llama3/debug_model.toml`");
  }
  if (o.node_rank >= o.nnodes) {
    throw ConfigError(message("--node_rank ", o.node_rank, " is not below --nnodes ", o.nnodes));
  }
  if (o.nnodes > 1 && !o.master_addr_set) {
    throw ConfigError(message("--nnodes ", o.nnodes,
                              " needs --master_addr (the host of node 0, the same on every node)"));
  }
  return o;
}

std::string launch_usage() {
  std::ostringstream os;
  os << "usage: titan run [--nproc_per_node N] [--nnodes M --node_rank R --master_addr A]\n"
        "                 [--master_port P] -- COMMAND [ARGS...]\n"
        "\n"
        "Starts N local ranks of COMMAND (a titan command such as `train ...`, run by this binary,\n"
        "or any program) and supervises them, like torchrun. Each rank gets RANK, LOCAL_RANK,\n"
        "WORLD_SIZE (= M * N), LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT and\n"
        "OMP_NUM_THREADS (cores / N unless OMP_NUM_THREADS is set; training.num_threads overrides).\n"
        "\n"
        "options:\n"
        "  --nproc_per_node N   ranks on this node (default 1)\n"
        "  --nnodes M           nodes in the job (default 1); run `titan run` once per node\n"
        "  --node_rank R        this node's index, 0..M-1 (default 0)\n"
        "  --master_addr A      host of rank 0's store (default 127.0.0.1; required when M > 1)\n"
        "  --master_port P      its port (default: a free port on one node, 29500 on several)\n"
        "\n"
        "output: every line is prefixed with \"[rank R] \". LOG_RANK (comma list or ranges, e.g.\n"
        "  LOG_RANK=0,2 or 0-3 or all; default 0) selects whose stdout is shown; stderr and\n"
        "  WARNING/ERROR log lines of every rank are always shown.\n"
        "\n"
        "failures: when a rank exits non-zero or is killed, titan run names it, sends SIGTERM to\n"
        "  the other ranks (SIGKILL "
     << kGraceSeconds
     << " s later) and exits with that rank's code (128 + signal when killed).\n"
        "  SIGINT/SIGTERM are forwarded to every rank; ranks die if titan run dies.\n"
        "  comm.init_timeout_seconds bounds the rendezvous, comm.train_timeout_seconds every\n"
        "  collective, so a hung rank ends the job too.\n"
        "\n"
        "check a launch without training (rendezvous, store exchanges, collectives when built):\n"
        "  titan run --nproc_per_node 4 -- selftest [--comm.init_timeout_seconds S]\n"
        "      [--comm.train_timeout_seconds S] [--fail_rank R --fail_mode MODE --fail_at WHEN]\n"
        "  MODE: exception, exit, abort, segv, kill9, hang; WHEN: rendezvous (before joining) or\n"
        "  exchange (after joining, the default). Used by tests/e2e/test_launcher.sh.\n"
        "\n"
        "ranks also start under torchrun, SLURM srun and OpenMPI mpirun without titan run; see\n"
        "docs/launching.md, \"torchrun, SLURM and OpenMPI\".\n";
  return os.str();
}

int launch(const LaunchOptions& opts, const std::string& self_exe, const std::string& log_rank) {
  std::vector<bool> log_ranks = parse_log_ranks(log_rank, opts.world_size());
  const int64_t port = opts.master_port > 0 ? opts.master_port
                       : opts.nnodes == 1   ? free_port()
                                            : 29500;

  std::string threads;
  if (const char* omp = std::getenv("OMP_NUM_THREADS")) {
    threads = omp;
  } else {
    const int64_t cores = std::max<long>(1, sysconf(_SC_NPROCESSORS_ONLN));
    threads = std::to_string(std::max<int64_t>(1, cores / opts.nproc_per_node));
  }

  std::vector<std::string> argv;
  const bool titan_command = is_titan_command(opts.command.front());
  if (titan_command) argv.push_back(self_exe);
  argv.insert(argv.end(), opts.command.begin(), opts.command.end());

  std::vector<std::vector<std::string>> envs;
  for (int64_t local = 0; local < opts.nproc_per_node; ++local) {
    envs.push_back(child_env(opts, local, port, threads));
  }
  Job job(opts, port, std::move(log_ranks));
  return job.run(argv, /*search_path=*/!titan_command, envs);
}

}  // namespace titan
