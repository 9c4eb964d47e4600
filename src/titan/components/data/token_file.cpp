// Token file reading (mmap) and writing; the format is described in token_file.h. Integers are
// copied with memcpy (the offsets need not be 8-byte aligned) on a little-endian host.
#include "titan/components/data/token_file.h"

#include "titan/common/check.h"
#include "titan/common/file_io.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace titan {

namespace {

template <typename T>
T load(const unsigned char* p) {
  T value;
  std::memcpy(&value, p, sizeof(T));
  return value;
}

}  // namespace

TokenFileReader::TokenFileReader(const std::string& path) : path_(path) {
  const auto fail = [&](const std::string& what) {
    throw DataError("token file " + path_ + ": " + what +
                    ". HINT: regenerate it with `titan data prepare`");
  };
  require_regular_file(path, "token file");  // a FIFO would block open(), a device mmap()
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) {
    throw DataError("cannot open token file " + path + ": " + std::strerror(errno));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    throw DataError("cannot stat token file " + path + ": " + std::strerror(err));
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ < static_cast<size_t>(kTokenFileHeaderBytes)) {
    ::close(fd);
    fail("truncated: " + std::to_string(size_) + " bytes, shorter than the " +
         std::to_string(kTokenFileHeaderBytes) + "-byte header");
  }
  void* mapped = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);  // the mapping keeps the file
  if (mapped == MAP_FAILED) {
    throw DataError("cannot mmap token file " + path + ": " + std::strerror(errno));
  }
  data_ = static_cast<const unsigned char*>(mapped);
  try {
    if (std::memcmp(data_, kTokenFileMagic, sizeof(kTokenFileMagic)) != 0) {
      fail("bad magic at byte 0 (expected \"TITANTOK\"); not a titan token file");
    }
    const auto version = load<uint32_t>(data_ + 8);
    if (version != kTokenFileVersion) {
      fail("unsupported version " + std::to_string(version) + " at byte 8 (this build reads " +
           std::to_string(kTokenFileVersion) + ")");
    }
    width_ = load<uint32_t>(data_ + 12);
    if (width_ != 2 && width_ != 4) {
      fail("token width " + std::to_string(width_) + " at byte 12 is neither 2 nor 4");
    }
    const auto vocab = load<uint64_t>(data_ + 16);
    const auto tokens = load<uint64_t>(data_ + 24);
    const auto docs = load<uint64_t>(data_ + 32);
    if (vocab == 0 || vocab > (uint64_t{1} << (8 * width_))) {
      fail("vocab_size " + std::to_string(vocab) + " at byte 16 does not fit " +
           std::to_string(width_) + "-byte ids");
    }
    // Bound the counts before multiplying so a corrupt header cannot overflow the arithmetic.
    if (tokens > size_ || docs > size_) {
      fail("header counts (" + std::to_string(tokens) + " tokens, " + std::to_string(docs) +
           " documents) exceed the file size " + std::to_string(size_));
    }
    const uint64_t expected = kTokenFileHeaderBytes + tokens * width_ + (docs + 1) * 8;
    if (size_ != expected) {
      fail(std::string(size_ < expected ? "truncated" : "has trailing bytes") + ": " +
           std::to_string(size_) + " bytes, but the header (" + std::to_string(tokens) +
           " tokens, " + std::to_string(docs) + " documents) needs " + std::to_string(expected));
    }
    vocab_size_ = static_cast<int64_t>(vocab);
    num_tokens_ = static_cast<int64_t>(tokens);
    num_documents_ = static_cast<int64_t>(docs);
    tokens_ = data_ + kTokenFileHeaderBytes;
    offsets_ = tokens_ + tokens * width_;
    uint64_t prev = 0;
    for (int64_t i = 0; i <= num_documents_; ++i) {
      const uint64_t o = offset(i);
      const bool bad =
          (i == 0 && o != 0) || o < prev || o > tokens || (i == num_documents_ && o != tokens);
      if (bad) {
        fail("document offset " + std::to_string(i) + " = " + std::to_string(o) + " at byte " +
             std::to_string((offsets_ - data_) + 8 * i) + " is out of order or out of range");
      }
      prev = o;
    }
    check_ids();
  } catch (...) {
    ::munmap(const_cast<unsigned char*>(data_), size_);
    throw;
  }
}

TokenFileReader::~TokenFileReader() {
  if (data_ != nullptr) {
    ::munmap(const_cast<unsigned char*>(data_), size_);
  }
}

uint64_t TokenFileReader::offset(int64_t i) const { return load<uint64_t>(offsets_ + 8 * i); }

namespace {

// The index of the first id >= vocab among n little-endian ids of type T at p, or n. The common
// case (none) is one vectorizable pass for the largest id.
template <typename T>
int64_t first_id_at_or_above(const unsigned char* p, int64_t n, uint64_t vocab) {
  constexpr int64_t kBlock = 1 << 16;
  for (int64_t start = 0; start < n; start += kBlock) {
    const int64_t end = std::min(n, start + kBlock);
    T largest = 0;
    for (int64_t t = start; t < end; ++t) largest = std::max(largest, load<T>(p + t * sizeof(T)));
    if (largest < vocab) continue;
    for (int64_t t = start; t < end; ++t) {
      if (load<T>(p + t * sizeof(T)) >= vocab) return t;
    }
  }
  return n;
}

}  // namespace

void TokenFileReader::check_ids() const {
  const auto vocab = static_cast<uint64_t>(vocab_size_);
  const int64_t bad = width_ == 2 ? first_id_at_or_above<uint16_t>(tokens_, num_tokens_, vocab)
                                  : first_id_at_or_above<uint32_t>(tokens_, num_tokens_, vocab);
  if (bad == num_tokens_) return;
  // Its document: the last whose offset is at or before it.
  int64_t lo = 0, hi = num_documents_;
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    (offset(mid) <= static_cast<uint64_t>(bad) ? lo : hi) = mid;
  }
  const unsigned char* p = tokens_ + bad * width_;
  const int64_t id = width_ == 2 ? load<uint16_t>(p) : load<uint32_t>(p);
  throw DataError("token file " + path_ + ": token id " + std::to_string(id) + " at byte " +
                  std::to_string(p - data_) + " (document " + std::to_string(lo) +
                  ") is >= the file's vocab_size " + std::to_string(vocab_size_) +
                  ". HINT: the file is corrupt; regenerate it with `titan data prepare`");
}

std::vector<int64_t> TokenFileReader::document(int64_t i) const {
  TITAN_CHECK(i >= 0 && i < num_documents_, "token file ", path_, ": document ", i,
              " out of range [0, ", num_documents_, ")");
  const uint64_t begin = offset(i);
  const uint64_t end = offset(i + 1);
  std::vector<int64_t> ids(end - begin);
  for (uint64_t t = begin; t < end; ++t) {
    const unsigned char* p = tokens_ + t * width_;
    const int64_t id = width_ == 2 ? load<uint16_t>(p) : load<uint32_t>(p);
    if (id >= vocab_size_) {
      throw DataError("token file " + path_ + ": token id " + std::to_string(id) + " at byte " +
                      std::to_string(p - data_) + " (document " + std::to_string(i) +
                      ") is >= the file's vocab_size " + std::to_string(vocab_size_) +
                      ". HINT: the file is corrupt; regenerate it with `titan data prepare`");
    }
    ids[t - begin] = id;
  }
  return ids;
}

TokenFileWriter::TokenFileWriter(const std::string& path, int64_t vocab_size)
    : path_(path), vocab_size_(vocab_size), width_(vocab_size <= 65536 ? 2 : 4) {
  TITAN_CHECK(vocab_size >= 1 && vocab_size <= (int64_t{1} << 32),
              "TokenFileWriter: vocab_size must be in [1, 2^32], got ", vocab_size);
  file_ = std::fopen(path.c_str(), "wb");
  if (file_ == nullptr) {
    throw DataError("cannot create token file " + path + ": " + std::strerror(errno));
  }
  const std::vector<unsigned char> header(kTokenFileHeaderBytes, 0);
  write(header.data(), header.size());  // rewritten by finish()
}

TokenFileWriter::~TokenFileWriter() {
  if (file_ != nullptr) {
    std::fclose(file_);
  }
}

void TokenFileWriter::write(const void* data, size_t bytes) {
  if (bytes > 0 && std::fwrite(data, 1, bytes, file_) != bytes) {
    throw DataError("cannot write token file " + path_ + ": " + std::strerror(errno));
  }
}

void TokenFileWriter::add_document(const std::vector<int64_t>& ids) {
  TITAN_CHECK(!finished_, "TokenFileWriter: add_document after finish");
  std::vector<unsigned char> bytes(ids.size() * width_);
  for (size_t t = 0; t < ids.size(); ++t) {
    TITAN_CHECK(ids[t] >= 0 && ids[t] < vocab_size_, "TokenFileWriter: id ", ids[t],
                " outside [0, ", vocab_size_, ")");
    if (width_ == 2) {
      const auto v = static_cast<uint16_t>(ids[t]);
      std::memcpy(bytes.data() + 2 * t, &v, 2);
    } else {
      const auto v = static_cast<uint32_t>(ids[t]);
      std::memcpy(bytes.data() + 4 * t, &v, 4);
    }
  }
  write(bytes.data(), bytes.size());
  offsets_.push_back(offsets_.back() + static_cast<int64_t>(ids.size()));
}

void TokenFileWriter::finish() {
  TITAN_CHECK(!finished_, "TokenFileWriter: finish called twice");
  for (int64_t o : offsets_) {
    const auto v = static_cast<uint64_t>(o);
    write(&v, 8);
  }
  unsigned char header[kTokenFileHeaderBytes];
  std::memcpy(header, kTokenFileMagic, 8);
  const uint32_t version = kTokenFileVersion;
  const auto width = static_cast<uint32_t>(width_);
  const auto vocab = static_cast<uint64_t>(vocab_size_);
  const auto tokens = static_cast<uint64_t>(num_tokens());
  const auto docs = static_cast<uint64_t>(num_documents());
  std::memcpy(header + 8, &version, 4);
  std::memcpy(header + 12, &width, 4);
  std::memcpy(header + 16, &vocab, 8);
  std::memcpy(header + 24, &tokens, 8);
  std::memcpy(header + 32, &docs, 8);
  // Buffered writes fail here at the latest (a full disk): report them as writes, with errno.
  if (std::fflush(file_) != 0) {
    throw DataError("cannot write token file " + path_ + ": " + std::strerror(errno));
  }
  if (std::fseek(file_, 0, SEEK_SET) != 0) {
    throw DataError("cannot seek in token file " + path_ + ": " + std::strerror(errno));
  }
  write(header, sizeof(header));
  const int rc = std::fclose(file_);
  file_ = nullptr;
  if (rc != 0) {
    throw DataError("cannot close token file " + path_ + ": " + std::strerror(errno));
  }
  finished_ = true;
}

}  // namespace titan
