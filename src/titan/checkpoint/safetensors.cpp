// safetensors reading (mmap) and writing (streamed, fsynced), and CRC32C for checkpoint files.
#include "titan/checkpoint/safetensors.h"

#include "titan/common/check.h"
#include "titan/common/file_io.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace titan::ckpt {

namespace {

struct DtypeName {
  at::ScalarType dtype;
  const char* name;
};

constexpr DtypeName kDtypes[] = {
    {at::kFloat, "F32"}, {at::kBFloat16, "BF16"}, {at::kHalf, "F16"},  {at::kDouble, "F64"},
    {at::kLong, "I64"},  {at::kInt, "I32"},       {at::kShort, "I16"}, {at::kChar, "I8"},
    {at::kByte, "U8"},   {at::kBool, "BOOL"},
};

// ---- CRC32C -------------------------------------------------------------------------------------

struct Crc32cTable {
  uint32_t t[8][256];
  Crc32cTable() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
      t[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; ++i) {
      for (int s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xff];
    }
  }
};

uint32_t crc32c_software(const uint8_t* p, size_t n, uint32_t c) {
  static const Crc32cTable table;
  const auto& t = table.t;
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    w ^= c;
    c = t[7][w & 0xff] ^ t[6][(w >> 8) & 0xff] ^ t[5][(w >> 16) & 0xff] ^ t[4][(w >> 24) & 0xff] ^
        t[3][(w >> 32) & 0xff] ^ t[2][(w >> 40) & 0xff] ^ t[1][(w >> 48) & 0xff] ^ t[0][w >> 56];
    p += 8;
    n -= 8;
  }
  while (n--) c = (c >> 8) ^ t[0][(c ^ *p++) & 0xff];
  return c;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t crc32c_sse42(const uint8_t* p, size_t n, uint32_t c) {
  uint64_t c64 = c;
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    c64 = __builtin_ia32_crc32di(c64, w);
    p += 8;
    n -= 8;
  }
  uint32_t c32 = static_cast<uint32_t>(c64);
  while (n--) c32 = __builtin_ia32_crc32qi(c32, *p++);
  return c32;
}
#endif

}  // namespace

// ---- writing ------------------------------------------------------------------------------------

uint32_t crc32c(const void* bytes, size_t n, uint32_t crc) {
  const auto* p = static_cast<const uint8_t*>(bytes);
  uint32_t c = ~crc;
#if defined(__x86_64__)
  static const bool has_sse42 = __builtin_cpu_supports("sse4.2");
  c = has_sse42 ? crc32c_sse42(p, n, c) : crc32c_software(p, n, c);
#else
  c = crc32c_software(p, n, c);
#endif
  return ~c;
}

std::string safetensors_dtype(at::ScalarType dtype) {
  for (const auto& d : kDtypes) {
    if (d.dtype == dtype) return d.name;
  }
  throw DataError(std::string("safetensors: unsupported dtype ") + c10::toString(dtype));
}

at::ScalarType dtype_from_safetensors(const std::string& name, const std::string& where) {
  for (const auto& d : kDtypes) {
    if (name == d.name) return d.dtype;
  }
  throw DataError(where + ": unsupported safetensors dtype '" + name + "'");
}

uint32_t write_safetensors(const std::string& path,
                           const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                           const std::map<std::string, std::string>& metadata) {
  std::vector<at::Tensor> data;
  data.reserve(tensors.size());
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    TITAN_CHECK(name != "__metadata__" && !header.contains(name),
                "safetensors: duplicate or reserved tensor name '", name, "'");
    at::Tensor t = tensor.detach().to(at::kCPU).contiguous();
    const uint64_t nbytes = static_cast<uint64_t>(t.numel()) * t.element_size();
    header[name] = {{"dtype", safetensors_dtype(t.scalar_type())},
                    {"shape", t.sizes().vec()},
                    {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
    data.push_back(std::move(t));
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // keeps tensor data 8-byte aligned
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw DataError("cannot create '" + path + "': " + std::strerror(errno));
  uint32_t crc = 0;
  try {
    uint8_t len[8];
    const uint64_t n = text.size();
    for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(n >> (8 * i));
    write_all(fd, std::string_view(reinterpret_cast<const char*>(len), 8), path);
    crc = crc32c(len, 8, crc);
    write_all(fd, text, path);
    crc = crc32c(text.data(), text.size(), crc);
    for (const at::Tensor& t : data) {
      const size_t nbytes = static_cast<size_t>(t.numel()) * t.element_size();
      if (nbytes == 0) continue;
      write_all(fd, std::string_view(static_cast<const char*>(t.data_ptr()), nbytes), path);
      crc = crc32c(t.data_ptr(), nbytes, crc);
    }
    if (::fsync(fd) != 0) throw DataError("cannot fsync '" + path + "': " + std::strerror(errno));
  } catch (...) {
    ::close(fd);
    throw;
  }
  close_checked(fd, path);
  return crc;
}

bool json_has_float(const nlohmann::json& j) {
  if (j.is_number_float()) return true;
  if (j.is_structured()) {
    for (const auto& item : j) {
      if (json_has_float(item)) return true;
    }
  }
  return false;
}

// ---- reading ------------------------------------------------------------------------------------

SafetensorsReader::SafetensorsReader(const std::string& path) : path_(path) {
  require_regular_file(path, "safetensors file");  // a FIFO would block the open
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw DataError("cannot open '" + path + "': " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    throw DataError("cannot stat '" + path + "': " + std::strerror(errno));
  }
  size_ = static_cast<uint64_t>(st.st_size);
  if (size_ < 8) {
    ::close(fd);
    throw DataError("'" + path + "' is not a safetensors file: " + std::to_string(size_) +
                    " bytes, shorter than the 8-byte header length (truncated?)");
  }
  void* m = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (m == MAP_FAILED) throw DataError("cannot mmap '" + path + "': " + std::strerror(errno));
  data_ = static_cast<const uint8_t*>(m);

  auto fail = [&](const std::string& why) -> void {
    throw DataError("'" + path + "' is not a valid safetensors file: " + why);
  };
  try {
    uint64_t n = 0;
    for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(data_[i]) << (8 * i);
    if (n > size_ - 8) {
      fail("header length " + std::to_string(n) + " exceeds the file size " +
           std::to_string(size_) + " (truncated?)");
    }
    data_start_ = 8 + n;
    nlohmann::json header;
    try {
      header = nlohmann::json::parse(reinterpret_cast<const char*>(data_ + 8),
                                     reinterpret_cast<const char*>(data_ + 8 + n));
    } catch (const nlohmann::json::exception& e) {
      fail(std::string("header is not valid JSON (") + e.what() + ")");
    }
    if (!header.is_object()) fail("header is not a JSON object");
    // Shapes and offsets are integers; a float there would be cast with undefined behaviour.
    if (json_has_float(header))
      fail("the header holds a non-integer number (shapes and offsets are integers)");
    const uint64_t data_size = size_ - data_start_;
    for (const auto& [name, value] : header.items()) {
      if (name == "__metadata__") {
        if (!value.is_object()) fail("__metadata__ is not an object");
        for (const auto& [k, v] : value.items()) {
          if (!v.is_string()) fail("__metadata__." + k + " is not a string");
          metadata_[k] = v.get<std::string>();
        }
        continue;
      }
      try {
        TensorEntry e;
        e.name = name;
        e.dtype = dtype_from_safetensors(value.at("dtype").get<std::string>(), path);
        e.shape = value.at("shape").get<std::vector<int64_t>>();
        const auto offsets = value.at("data_offsets").get<std::vector<uint64_t>>();
        if (offsets.size() != 2) fail("tensor '" + name + "': data_offsets needs 2 entries");
        e.begin = offsets[0];
        e.end = offsets[1];
        uint64_t want = c10::elementSize(e.dtype);  // bytes; the product must not wrap around
        for (int64_t d : e.shape) {
          if (d < 0) fail("tensor '" + name + "': negative dimension");
          if (__builtin_mul_overflow(want, static_cast<uint64_t>(d), &want)) {
            fail("tensor '" + name + "': shape " + nlohmann::json(e.shape).dump() +
                 " overflows 64-bit byte counts");
          }
        }
        if (e.end < e.begin || e.end - e.begin != want) {
          fail("tensor '" + name + "': data_offsets [" + std::to_string(e.begin) + ", " +
               std::to_string(e.end) + ") do not hold " + std::to_string(want) + " bytes");
        }
        if (e.end > data_size) {
          fail("tensor '" + name + "' ends at byte " + std::to_string(e.end) +
               " of the data section, but the file holds " + std::to_string(data_size) +
               " (truncated?)");
        }
        index_[name] = entries_.size();
        entries_.push_back(std::move(e));
      } catch (const nlohmann::json::exception& ex) {
        fail("tensor '" + name + "': " + ex.what());
      }
    }
    // The tensors tile the data section: in the order of their offsets, each starts where the
    // previous one ends (no overlap, no gap), and the last ends at the end of the file.
    std::vector<const TensorEntry*> by_offset;
    for (const TensorEntry& e : entries_) by_offset.push_back(&e);
    std::sort(by_offset.begin(), by_offset.end(), [](const TensorEntry* a, const TensorEntry* b) {
      return std::make_pair(a->begin, a->end) < std::make_pair(b->begin, b->end);
    });
    uint64_t end = 0;
    std::string previous = "the start of the data section";
    for (const TensorEntry* e : by_offset) {
      if (e->begin != end) {
        fail("tensor '" + e->name + "' starts at byte " + std::to_string(e->begin) + " but " +
             previous + " ends at byte " + std::to_string(end) +
             (e->begin < end ? " (overlapping data_offsets)" : " (a gap in the data section)"));
      }
      end = e->end;
      previous = "tensor '" + e->name + "'";
    }
    if (end != data_size) {
      fail("the tensors end at byte " + std::to_string(end) + " of the data section, which holds " +
           std::to_string(data_size) + " bytes (trailing bytes)");
    }
  } catch (...) {
    ::munmap(const_cast<uint8_t*>(data_), size_);
    data_ = nullptr;
    throw;
  }
}

SafetensorsReader::~SafetensorsReader() {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
}

const TensorEntry* SafetensorsReader::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &entries_[it->second];
}

at::Tensor SafetensorsReader::read(const std::string& name) const {
  const TensorEntry* e = find(name);
  if (e == nullptr) throw DataError("'" + path_ + "' has no tensor '" + name + "'");
  at::Tensor t = at::empty(e->shape, at::TensorOptions().dtype(e->dtype));
  if (e->end > e->begin)
    std::memcpy(t.data_ptr(), data_ + data_start_ + e->begin, e->end - e->begin);
  return t;
}

std::string_view SafetensorsReader::bytes() const {
  return {reinterpret_cast<const char*>(data_), static_cast<size_t>(size_)};
}

}  // namespace titan::ckpt
