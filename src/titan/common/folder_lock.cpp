// FolderLock: flock on "<folder>/.titan.lock", holder recorded in the file.
#include "titan/common/folder_lock.h"

#include "titan/common/check.h"
#include "titan/common/cpu.h"

#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <fcntl.h>
#include <filesystem>
#include <map>
#include <mutex>
#include <sys/file.h>
#include <unistd.h>

namespace titan {

namespace {

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S UTC", &tm);
  return buf;
}

// The holder line written by the process that holds the lock ("" if unreadable).
std::string read_holder(int fd) {
  char buf[512];
  const ssize_t n = ::pread(fd, buf, sizeof(buf) - 1, 0);
  if (n <= 0) return "";
  std::string text(buf, static_cast<size_t>(n));
  while (!text.empty() && (text.back() == '\n' || text.back() == '\0')) text.pop_back();
  return text;
}

}  // namespace

struct FolderLock::LockedFile {
  int fd = -1;
  ~LockedFile() {
    if (fd >= 0) ::close(fd);  // releases the flock; the file stays (removing it would race)
  }
};

namespace {

// This process's locks by lock-file path, so that a second FolderLock on a folder shares the first.
std::mutex locks_mu;
std::map<std::string, std::weak_ptr<FolderLock::LockedFile>>& held_locks() {
  static std::map<std::string, std::weak_ptr<FolderLock::LockedFile>> held;
  return held;
}

}  // namespace

std::string process_description() {
  return "pid " + std::to_string(::getpid()) + " on host " + host_name();
}

std::unique_ptr<FolderLock> FolderLock::acquire(const std::string& folder,
                                                const std::string& what) {
  if (folder.empty())
    throw ConfigError(message(what, " is empty. HINT: name a folder for the run's outputs"));
  std::error_code ec;
  std::filesystem::create_directories(folder, ec);
  if (ec) throw DataError("cannot create " + what + " '" + folder + "': " + ec.message());
  const std::string path = (std::filesystem::weakly_canonical(folder, ec) / ".titan.lock").string();
  std::lock_guard<std::mutex> guard(locks_mu);
  if (auto held = held_locks()[path].lock())
    return std::unique_ptr<FolderLock>(new FolderLock(path, held));
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    throw DataError("cannot create the lock file '" + path + "': " + std::strerror(errno));
  }
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    const std::string holder = read_holder(fd);
    ::close(fd);
    if (err == EWOULDBLOCK) {
      throw ConfigError(
          message(what, " '", folder, "' is in use by another run (",
                  (holder.empty() ? "holder unknown" : holder), ", lock file ", path,
                  "). HINT: wait for it to finish, stop it, or give this run another ", what));
    }
    throw DataError("cannot lock '" + path + "': " + std::strerror(err));
  }
  const std::string line = process_description() + ", since " + utc_now() + "\n";
  if (::ftruncate(fd, 0) != 0 ||
      ::pwrite(fd, line.data(), line.size(), 0) != static_cast<ssize_t>(line.size())) {
    const int err = errno;
    ::close(fd);
    throw DataError("cannot write the lock file '" + path + "': " + std::strerror(err));
  }
  auto file = std::make_shared<LockedFile>();
  file->fd = fd;
  held_locks()[path] = file;
  return std::unique_ptr<FolderLock>(new FolderLock(path, std::move(file)));
}

FolderLock::~FolderLock() = default;

}  // namespace titan
