// gzip (zlib) and zstd (libzstd) decoders that start at access points; see compressed_stream.h.
#include "titan/components/data/compressed_stream.h"

#include "titan/common/check.h"
#include "titan/common/file_io.h"

#include <zlib.h>
#include <zstd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>

namespace titan {

namespace {

constexpr size_t kInputBufferBytes = 64 * 1024;
constexpr uInt kWindowBytes = 32 * 1024;  // deflate's largest distance
constexpr int kGzipWindowBits = 15 + 16;  // a gzip wrapper, 32 KiB window
constexpr int kRawWindowBits = -15;       // raw deflate, 32 KiB window
constexpr size_t kGzipTrailerBytes = 8;   // CRC-32 and ISIZE after each member's deflate data

// Inflate from a deflate block boundary or a member start. Inside a member resumed at a block
// boundary the decoder runs in raw mode up to the member's end (the member's CRC is not checked
// then: it covers bytes before the access point; the pass that marked the point checked it),
// then skips the trailer and continues in gzip mode over the following members.
class GzipDecompressor final : public Decompressor {
 public:
  GzipDecompressor(const std::string& path, const AccessPoint& from) : Decompressor(path, from) {
    s_.next_in = buffer_.get();
    if (from.stream_start) {
      if (inflateInit2(&s_, kGzipWindowBits) != Z_OK) fail("cannot start zlib", from.in);
      initialized_ = true;
      seek(from.in);
      member_boundary_ = true;
      return;
    }
    if (inflateInit2(&s_, kRawWindowBits) != Z_OK) fail("cannot start zlib", from.in);
    initialized_ = true;
    raw_ = true;
    member_boundary_ = false;
    if (from.bits > 0) {
      seek(from.in - 1);
      const int byte = std::fgetc(file_);
      if (byte == EOF) fail("the file shrank since it was indexed", from.in - 1);
      buffer_start_ = from.in;
      if (inflatePrime(&s_, from.bits, byte >> (8 - from.bits)) != Z_OK) {
        fail("cannot resume decoding (inflatePrime)", from.in);
      }
    } else {
      seek(from.in);
    }
    if (inflateSetDictionary(&s_, reinterpret_cast<const Bytef*>(from.window.data()),
                             static_cast<uInt>(from.window.size())) != Z_OK) {
      fail("cannot resume decoding (inflateSetDictionary)", from.in);
    }
  }

  ~GzipDecompressor() override {
    if (initialized_) inflateEnd(&s_);
  }

  size_t read(char* out, size_t n) override {
    at_point_ = false;
    s_.next_out = reinterpret_cast<Bytef*>(out);
    s_.avail_out = static_cast<uInt>(std::min<size_t>(n, 1u << 30));
    const uInt capacity = s_.avail_out;
    int stalls = 0;
    while (s_.avail_out > 0) {
      if (s_.avail_in == 0 && !load()) {
        if (member_boundary_) break;  // the end of the data, between members
        fail("truncated: the file ends inside a gzip member", in_offset());
      }
      const uInt in_before = s_.avail_in;
      const uInt out_before = s_.avail_out;
      const int ret = inflate(&s_, Z_BLOCK);
      if (ret == Z_NEED_DICT || ret == Z_DATA_ERROR || ret == Z_MEM_ERROR ||
          ret == Z_STREAM_ERROR) {
        fail(
            std::string("corrupt gzip data (zlib: ") + (s_.msg != nullptr ? s_.msg : "error") + ")",
            in_offset());
      }
      const bool progress = s_.avail_in != in_before || s_.avail_out != out_before;
      if (s_.avail_in != in_before) member_boundary_ = false;
      const bool produced = s_.avail_out != capacity;
      if (ret == Z_STREAM_END) {
        end_member();
        if (produced) {
          at_point_ = true;
          break;
        }
        continue;
      }
      // Just after a block's end (bit 128) that was not the member's last block (bit 64).
      if ((s_.data_type & 128) != 0 && (s_.data_type & 64) == 0 && produced) {
        at_point_ = true;
        break;
      }
      // zlib reports Z_BUF_ERROR when it can do nothing; with input and output space that
      // cannot last, but a loop must never depend on it.
      stalls = progress ? 0 : stalls + 1;
      if (stalls > 2) fail("the gzip decoder makes no progress", in_offset());
    }
    const size_t got = capacity - s_.avail_out;
    out_ += got;
    return got;
  }

  bool at_access_point() const override { return at_point_; }

  AccessPoint mark() const override {
    TITAN_CHECK(at_point_, "Decompressor::mark: not at an access point");
    AccessPoint point;
    point.in = in_offset();
    point.out = out_;
    if (member_boundary_) {
      return point;  // a member starts here
    }
    point.stream_start = false;
    point.bits = s_.data_type & 7;
    point.window.resize(kWindowBytes);
    uInt length = kWindowBytes;
    // inflateGetDictionary only reads the stream (and checks that its state belongs to this very
    // z_stream, so a copy will not do).
    if (inflateGetDictionary(const_cast<z_stream*>(&s_),
                             reinterpret_cast<Bytef*>(point.window.data()), &length) != Z_OK) {
      fail("cannot save the decoder's window", point.in);
    }
    point.window.resize(length);
    return point;
  }

 private:
  uint64_t in_offset() const {
    return buffer_start_ + static_cast<uint64_t>(s_.next_in - buffer_.get());
  }

  void seek(uint64_t offset) {
    if (fseeko(file_, static_cast<off_t>(offset), SEEK_SET) != 0) {
      fail("cannot seek", offset);
    }
    buffer_start_ = offset;
    buffer_size_ = 0;
  }

  // Makes input available; false at the end of the file.
  bool load() {
    const size_t got = refill();
    s_.next_in = buffer_.get();
    s_.avail_in = static_cast<uInt>(got);
    return got > 0;
  }

  // After a member's deflate data: past its trailer when resumed in raw mode, then ready for the
  // next member's header.
  void end_member() {
    if (raw_) {
      size_t skip = kGzipTrailerBytes;
      while (skip > 0) {
        if (s_.avail_in == 0 && !load()) {
          fail("truncated: the file ends inside a gzip trailer", in_offset());
        }
        const size_t step = std::min<size_t>(skip, s_.avail_in);
        s_.next_in += step;
        s_.avail_in -= static_cast<uInt>(step);
        skip -= step;
      }
      if (inflateReset2(&s_, kGzipWindowBits) != Z_OK) fail("cannot reset zlib", in_offset());
      raw_ = false;
    } else if (inflateReset(&s_) != Z_OK) {
      fail("cannot reset zlib", in_offset());
    }
    member_boundary_ = true;
  }

  z_stream s_{};
  bool initialized_ = false;
  bool raw_ = false;
  bool at_point_ = false;
  bool member_boundary_ = true;  // no byte of a member consumed since the last one ended
};

// Decodes zstd frames one after another; frame starts are the access points.
class ZstdDecompressor final : public Decompressor {
 public:
  ZstdDecompressor(const std::string& path, const AccessPoint& from) : Decompressor(path, from) {
    TITAN_CHECK(from.stream_start, "zstd files resume only at frame starts");
    ctx_ = ZSTD_createDCtx();
    if (ctx_ == nullptr) fail("cannot start zstd", from.in);
    if (fseeko(file_, static_cast<off_t>(from.in), SEEK_SET) != 0) fail("cannot seek", from.in);
    buffer_start_ = from.in;
  }

  ~ZstdDecompressor() override { ZSTD_freeDCtx(ctx_); }

  size_t read(char* out, size_t n) override {
    at_point_ = false;
    ZSTD_outBuffer output{out, n, 0};
    int stalls = 0;
    while (output.pos < output.size) {
      bool input_ended = false;
      if (input_.pos == input_.size) {
        const size_t got = refill();
        input_ = ZSTD_inBuffer{buffer_.get(), got, 0};
        input_ended = got == 0;
        if (input_ended && frame_done_) break;  // the end of the data, between frames
      }
      const size_t in_before = input_.pos;
      const size_t out_before = output.pos;
      const size_t ret = ZSTD_decompressStream(ctx_, &output, &input_);
      if (ZSTD_isError(ret)) {
        fail(std::string("corrupt zstd data (zstd: ") + ZSTD_getErrorName(ret) + ")", in_offset());
      }
      const bool progress = input_.pos != in_before || output.pos != out_before;
      if (progress || ret == 0) frame_done_ = ret == 0;
      if (input_ended && !progress && !frame_done_) {
        fail("truncated: the file ends inside a zstd frame", in_offset());
      }
      if (ret == 0 && output.pos > 0) {
        at_point_ = true;
        break;
      }
      stalls = progress ? 0 : stalls + 1;
      if (stalls > 2) fail("the zstd decoder makes no progress", in_offset());
    }
    out_ += output.pos;
    return output.pos;
  }

  bool at_access_point() const override { return at_point_; }

  AccessPoint mark() const override {
    TITAN_CHECK(at_point_, "Decompressor::mark: not at an access point");
    AccessPoint point;
    point.in = in_offset();
    point.out = out_;
    return point;
  }

 private:
  uint64_t in_offset() const { return buffer_start_ + input_.pos; }

  ZSTD_DCtx* ctx_ = nullptr;
  ZSTD_inBuffer input_{nullptr, 0, 0};
  bool at_point_ = false;
  bool frame_done_ = true;  // between frames (or at the start)
};

}  // namespace

Compression compression_of(const std::string& path) {
  std::string ext = std::filesystem::path(path).extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (ext == ".gz") return Compression::kGzip;
  if (ext == ".zst" || ext == ".zstd") return Compression::kZstd;
  return Compression::kNone;
}

Decompressor::Decompressor(std::string path, const AccessPoint& from)
    : path_(std::move(path)), out_(from.out) {
  require_regular_file(path_, "dataset file");
  file_ = std::fopen(path_.c_str(), "rb");
  if (file_ == nullptr) {
    const int err = errno;
    throw DataError(message("cannot read ", path_, ": ", std::strerror(err)));
  }
  buffer_.reset(new unsigned char[kInputBufferBytes]);
}

Decompressor::~Decompressor() {
  if (file_ != nullptr) std::fclose(file_);
}

size_t Decompressor::refill() {
  buffer_start_ += buffer_size_;
  buffer_size_ = std::fread(buffer_.get(), 1, kInputBufferBytes, file_);
  if (buffer_size_ == 0 && std::ferror(file_)) {
    const int err = errno;
    fail(std::string("cannot read: ") + std::strerror(err), buffer_start_);
  }
  return buffer_size_;
}

void Decompressor::fail(const std::string& what, uint64_t offset) const {
  throw DataError(message(path_, ": ", what, " at compressed byte offset ", offset,
                          ". HINT: the file is damaged or incomplete; test it with `gzip -t` or "
                          "`zstd -t`, and download or compress it again"));
}

std::unique_ptr<Decompressor> Decompressor::open(const std::string& path, Compression compression,
                                                 const AccessPoint& from) {
  switch (compression) {
    case Compression::kGzip: return std::make_unique<GzipDecompressor>(path, from);
    case Compression::kZstd: return std::make_unique<ZstdDecompressor>(path, from);
    case Compression::kNone: break;
  }
  TITAN_CHECK(false, "Decompressor::open: ", path, " is not compressed");
  return nullptr;
}

}  // namespace titan
