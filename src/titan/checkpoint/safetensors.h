// The safetensors file format: an 8-byte little-endian header length N, N bytes of JSON
// ({"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
// "__metadata__": {"key": "string value"}}), then the raw little-endian tensor bytes. Used for
// our checkpoint shards and for Hugging Face model folders, which use the same layout.
#pragma once

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace titan::ckpt {

// "F32", "BF16", "F16", "F64", "I64", "I32", "I16", "I8", "U8", "BOOL".
std::string safetensors_dtype(at::ScalarType dtype);
// The inverse; throws DataError naming `where` for an unsupported name.
at::ScalarType dtype_from_safetensors(const std::string& name, const std::string& where);

struct TensorEntry {
  std::string name;
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // byte range in the data section
  uint64_t end = 0;
};

// Writes `tensors` (any strides; written contiguous in their own dtype, in the given order) and
// `metadata` to `path`, then fsyncs it. Not atomic by itself: callers write into a temporary
// directory and rename it (see checkpoint_files.h). Returns the CRC32C of the whole file.
uint32_t write_safetensors(const std::string& path,
                           const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                           const std::map<std::string, std::string>& metadata = {});

// A read-only, memory-mapped safetensors file. The constructor validates the header (JSON,
// offsets inside the file, sizes that match dtype x shape) and throws DataError naming the file
// and what is wrong.
class SafetensorsReader {
 public:
  explicit SafetensorsReader(const std::string& path);
  ~SafetensorsReader();
  SafetensorsReader(const SafetensorsReader&) = delete;
  SafetensorsReader& operator=(const SafetensorsReader&) = delete;

  const std::string& path() const { return path_; }
  const std::vector<TensorEntry>& entries() const { return entries_; }
  const TensorEntry* find(const std::string& name) const;  // null if absent
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // An owning copy of tensor `name` (DataError naming the file if absent).
  at::Tensor read(const std::string& name) const;
  // The whole file's bytes (for checksums).
  std::string_view bytes() const;

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;  // mmap of the whole file
  uint64_t size_ = 0;
  uint64_t data_start_ = 0;  // 8 + header length
  std::vector<TensorEntry> entries_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// CRC32C (Castagnoli) of `bytes`, continuing from `crc` (0 to start). SSE4.2 when available.
uint32_t crc32c(const void* bytes, size_t n, uint32_t crc = 0);

// Whether `j` holds a floating-point number anywhere. Shapes, offsets, sizes and checksums of
// safetensors headers and checkpoint indexes must be integers: converting a float that does not
// fit the integer type is undefined behaviour, so such input is refused before any conversion.
bool json_has_float(const nlohmann::json& j);

}  // namespace titan::ckpt
