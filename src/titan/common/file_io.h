// Reading inputs and writing outputs without surprises.
//
// Inputs: only regular files are read. A FIFO named as an input would block the reader forever,
// a device such as /dev/zero would fill memory, so every reader of user files (corpora, token
// shards, tokenizer files, Hugging Face config and weights, the TOML config) checks the kind of
// file first, without opening it, and refuses anything else with a message that says what it is.
//
// Outputs: every write, flush and close is checked, and a failure (a full disk, a quota, a
// closed pipe) throws DataError naming the file and the errno text, so a run never exits 0
// claiming its outputs are there when they are not.
#pragma once

#include <string>
#include <string_view>

namespace titan {

// "" when `path` is a regular file (after following symlinks); otherwise what it is instead, for
// messages: "missing", "a directory", "a FIFO (named pipe)", "a character device", ...
// Never opens the file, so it cannot block.
std::string non_regular_file_kind(const std::string& path);

// Throws DataError unless `path` is a regular file: "<what> '<path>' is a FIFO (named pipe), not a
// regular file. HINT: ...". `what` names the input ("token file", "tokenizer file", ...).
void require_regular_file(const std::string& path, const std::string& what);

// The whole content of the regular file `path`; DataError naming `what`, the path and the errno
// text when it is not a regular file or cannot be opened or read.
std::string read_regular_file(const std::string& path, const std::string& what);

// Writes all of `data` to the open descriptor `fd` (retrying short writes and EINTR); DataError
// "<path>: cannot write: <errno text>" on failure.
void write_all(int fd, std::string_view data, const std::string& path);

// Closes `fd`; DataError "<path>: cannot close: <errno text>" on failure (NFS and quotas report
// write errors only here).
void close_checked(int fd, const std::string& path);

// Replaces `path` with `data` atomically: writes <path>.tmp-<pid> beside it, syncs it and renames
// it over `path`, so readers see the old file or the new one, never a part. DataError with the
// errno text on any failure; the temporary is removed.
void replace_file(const std::string& path, std::string_view data);

// Syncs the file or directory `path` to its device (a directory after a rename in it makes the
// rename durable). DataError with the errno text when it cannot be opened or synced; file systems
// that cannot sync it (EINVAL, EROFS) are not an error.
void fsync_path(const std::string& path, bool directory);

// Flushes standard output; DataError "cannot write standard output: <errno text>" when the flush
// or an earlier write failed (output redirected to a full disk, for example).
void check_stdout_written();

}  // namespace titan
