// Sequential decoding of gzip and zstd files from access points, so that a reader can jump into
// the middle of a compressed file without decoding it from the start.
//
// gzip: an access point is a deflate block boundary (zlib's Z_BLOCK), saved as the compressed
// byte offset, the bits of the byte before it still to read and the 32 KiB of output before it
// (the dictionary later matches may refer to); decoding resumes there with inflatePrime and
// inflateSetDictionary (the technique of zlib's examples/zran.c). The start of every member of a
// multi-member (concatenated) file is an access point too, needing no window.
// zstd: the format keeps no state that could be saved between blocks through the stable API, so
// the access points are the starts of frames. A file of one frame (what `zstd` writes) has one
// access point, its start; files written by `pzstd` (independent frames of a few MiB) have many.
//
// Errors: corrupt or truncated data is a DataError naming the file and the compressed byte
// offset where decoding stopped. Every loop consumes input or produces output, or ends.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

namespace titan {

enum class Compression { kNone, kGzip, kZstd };

// By the last extension: .gz -> kGzip, .zst/.zstd -> kZstd, otherwise kNone.
Compression compression_of(const std::string& path);

// A place in a compressed file where decoding can start.
struct AccessPoint {
  uint64_t in = 0;           // compressed byte offset
  uint64_t out = 0;          // uncompressed byte offset
  int bits = 0;              // gzip: bits of the byte at in - 1 not yet consumed (0..7)
  bool stream_start = true;  // a gzip member or zstd frame begins at `in` (no window needed)
  std::string window;        // gzip, inside a member: the output's last 32 KiB before `out`
};

class Decompressor {
 public:
  // Decodes `path` from `from` (a point an earlier decoder of the same file marked, or the
  // default: the file's start). Throws DataError when the file cannot be opened.
  static std::unique_ptr<Decompressor> open(const std::string& path, Compression compression,
                                            const AccessPoint& from = {});
  virtual ~Decompressor();

  // Up to n bytes of output; fewer when decoding reached an access point (so the caller may
  // mark it) and 0 only at the end of the data. DataError on corrupt or truncated data.
  virtual size_t read(char* out, size_t n) = 0;
  // Whether the decoder stands at an access point now (after a read()).
  virtual bool at_access_point() const = 0;
  // That access point; call only when at_access_point().
  virtual AccessPoint mark() const = 0;
  // Uncompressed offset of the next byte read() returns.
  uint64_t out_offset() const { return out_; }
  const std::string& path() const { return path_; }

 protected:
  Decompressor(std::string path, const AccessPoint& from);
  // Refills the input buffer at the file position; returns the bytes read (0 at end of file).
  size_t refill();
  // DataError "<path>: <what> at compressed byte offset <offset>. HINT: ...".
  [[noreturn]] void fail(const std::string& what, uint64_t offset) const;

  std::string path_;
  FILE* file_ = nullptr;
  std::unique_ptr<unsigned char[]> buffer_;
  size_t buffer_size_ = 0;
  uint64_t buffer_start_ = 0;  // file offset of buffer_[0]
  uint64_t out_ = 0;
};

}  // namespace titan
