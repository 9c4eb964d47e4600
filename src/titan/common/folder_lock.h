// An exclusive lock on a folder for the lifetime of one run: two `titan train` on one dump
// folder would delete each other's unfinished checkpoints and interleave metrics rows.
//
// The lock is an flock(2) on "<folder>/.titan.lock", which the kernel releases when the process
// ends in any way (kill -9 included), so a stale file never blocks the next run. The file holds
// the holder's pid, host and start time, which the refusal names. Within one process the lock is
// shared: a second FolderLock on the same folder (tests that run trainers one after the other
// while the first still exists) succeeds.
#pragma once

#include <memory>
#include <string>

namespace titan {

class FolderLock {
 public:
  // Creates `folder` if needed and locks it, or throws ConfigError naming the holder (pid, host,
  // since when) and `what` (e.g. "job.dump_folder"); DataError when the folder or the lock file
  // cannot be created.
  static std::unique_ptr<FolderLock> acquire(const std::string& folder, const std::string& what);
  ~FolderLock();  // releases the lock when this process's last FolderLock on the folder goes
  FolderLock(const FolderLock&) = delete;
  FolderLock& operator=(const FolderLock&) = delete;

  const std::string& path() const { return path_; }

  struct LockedFile;  // the open, locked file, shared by this process's locks on one folder

 private:
  FolderLock(std::string path, std::shared_ptr<LockedFile> file)
      : path_(std::move(path)), file_(std::move(file)) {}
  std::string path_;
  std::shared_ptr<LockedFile> file_;
};

// "pid 1234 on host node-3": this process.
std::string process_description();

}  // namespace titan
