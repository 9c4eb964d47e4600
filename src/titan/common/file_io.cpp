// Checked file input and output; see file_io.h.
#include "titan/common/file_io.h"

#include "titan/common/check.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace titan {

namespace {

std::string errno_text(int err) { return std::strerror(err); }

std::string kind_of(mode_t mode) {
  if (S_ISREG(mode)) return "";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a file";
}

[[noreturn]] void throw_not_regular(const std::string& path, const std::string& what,
                                    const std::string& kind) {
  if (kind.rfind("missing", 0) == 0) {
    throw DataError(what + " '" + path + "' is " + kind);
  }
  throw DataError(what + " '" + path + "' is " + kind + ", not a regular file; inputs are read " +
                  "whole or memory-mapped. HINT: write the data to a file and name that file");
}

}  // namespace

std::string non_regular_file_kind(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return "missing (" + errno_text(errno) + ")";
  return kind_of(st.st_mode);
}

void require_regular_file(const std::string& path, const std::string& what) {
  const std::string kind = non_regular_file_kind(path);
  if (!kind.empty()) throw_not_regular(path, what, kind);
}

std::string read_regular_file(const std::string& path, const std::string& what) {
  require_regular_file(path, what);
  // O_NONBLOCK: should the path turn into a FIFO after the check, open() still returns at once.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw DataError(what + " '" + path + "': cannot open: " + errno_text(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw_not_regular(path, what, kind_of(st.st_mode));
  }
  std::string data;
  data.reserve(static_cast<size_t>(st.st_size));
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      throw DataError(what + " '" + path + "': read error: " + errno_text(err));
    }
    data.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return data;
}

void write_all(int fd, std::string_view data, const std::string& path) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw DataError(path + ": cannot write: " + errno_text(errno) +
                      ". HINT: check the free space and quota of that file system");
    }
    done += static_cast<size_t>(n);
  }
}

void close_checked(int fd, const std::string& path) {
  if (::close(fd) != 0) {
    throw DataError(path + ": cannot close: " + errno_text(errno) +
                    ". HINT: check the free space and quota of that file system");
  }
}

void replace_file(const std::string& path, std::string_view data) {
  const std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw DataError(tmp + ": cannot create: " + errno_text(errno));
  try {
    try {
      write_all(fd, data, tmp);
      // Special files (a test's /dev/full) cannot be synced: EINVAL there is not a lost write.
      if (::fsync(fd) != 0 && errno != EINVAL && errno != EROFS) {
        throw DataError(tmp + ": cannot sync: " + errno_text(errno));
      }
    } catch (...) {
      ::close(fd);
      throw;
    }
    close_checked(fd, tmp);
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
      throw DataError(path + ": cannot replace it with " + tmp + ": " + errno_text(errno));
    }
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
}

void fsync_path(const std::string& path, bool directory) {
  const int fd = ::open(path.c_str(), (directory ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
  if (fd < 0) throw DataError(path + ": cannot open to sync: " + errno_text(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0 && err != EINVAL && err != EROFS) {
    throw DataError(path + ": cannot sync: " + errno_text(err));
  }
}

void check_stdout_written() {
  if (std::fflush(stdout) != 0) {
    throw DataError("cannot write standard output: " + errno_text(errno) +
                    ". HINT: check where standard output goes (a full disk?)");
  }
  if (std::ferror(stdout)) {
    throw DataError(
        "cannot write standard output: a write failed earlier. HINT: check where "
        "standard output goes (a full disk?)");
  }
}

}  // namespace titan
