// Checkpoint step directories: shard files + index.json, written atomically, read back with
// checksums and assembled into any box of any tensor.
#include "titan/checkpoint/checkpoint_files.h"

#include "titan/checkpoint/safetensors.h"
#include "titan/common/check.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <fcntl.h>
#include <unistd.h>

namespace titan::ckpt {

namespace fs = std::filesystem;

namespace {

constexpr const char* kFormat = "titan-checkpoint";
constexpr int kVersion = 1;

void fsync_path(const std::string& path, bool directory) {
  const int fd = ::open(path.c_str(), (directory ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
  if (fd < 0) throw DataError("cannot open '" + path + "' to fsync: " + std::strerror(errno));
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) throw DataError("cannot fsync '" + path + "': " + std::strerror(errno));
}

void write_text_file(const std::string& path, const std::string& text) {
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << text;
    out.flush();
    if (!out) throw DataError("cannot write '" + path + "'");
  }
  fsync_path(path, /*directory=*/false);
}

std::string shard_name(int64_t i) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "shard-%05lld.safetensors", static_cast<long long>(i));
  return buf;
}

std::string box_str(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

}  // namespace

void write_checkpoint(const std::string& dir, const std::vector<SavedTensor>& tensors,
                      const nlohmann::json& state, uint64_t max_shard_bytes) {
  if (fs::exists(dir)) {
    throw DataError("checkpoint directory '" + dir + "' already exists; not overwriting it");
  }
  const std::string tmp = dir + ".tmp-" + std::to_string(::getpid());
  std::error_code ec;
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  if (ec) throw DataError("cannot create '" + tmp + "': " + ec.message());

  nlohmann::ordered_json index;
  index["format"] = kFormat;
  index["version"] = kVersion;
  index["tensors"] = nlohmann::ordered_json::object();
  index["files"] = nlohmann::ordered_json::object();

  std::vector<std::pair<std::string, at::Tensor>> batch;
  uint64_t batch_bytes = 0;
  int64_t shard = 0;
  auto flush = [&]() {
    if (batch.empty()) return;
    const std::string name = shard_name(shard++);
    const uint32_t crc = write_safetensors(tmp + "/" + name, batch);
    index["files"][name] = {{"bytes", fs::file_size(tmp + "/" + name)}, {"crc32c", crc}};
    batch.clear();
    batch_bytes = 0;
  };
  for (const SavedTensor& t : tensors) {
    TITAN_CHECK(t.local.defined(), "checkpoint tensor '", t.name, "' is undefined");
    const std::vector<int64_t> local = t.local.sizes().vec();
    const std::vector<int64_t> global = t.global_shape.empty() ? local : t.global_shape;
    std::vector<int64_t> offsets = t.offsets;
    if (offsets.empty()) offsets.assign(local.size(), 0);
    TITAN_CHECK(global.size() == local.size() && offsets.size() == local.size(),
                "checkpoint tensor '", t.name, "': rank mismatch between local ",
                box_str(local), ", global ", box_str(global), " and offsets ", box_str(offsets));
    const std::string dtype = safetensors_dtype(t.local.scalar_type());
    // Several boxes of one tensor (a process holding more than one shard) get distinct keys.
    const bool whole = local == global;
    std::string key = t.name;
    if (!whole) {
      key += "@";
      for (size_t d = 0; d < offsets.size(); ++d) key += (d ? "_" : "") + std::to_string(offsets[d]);
    }
    auto& entry = index["tensors"][t.name];
    if (entry.is_null()) {
      entry = {{"dtype", dtype}, {"shape", global}, {"shards", nlohmann::ordered_json::array()}};
    } else {
      TITAN_CHECK(!whole && entry["dtype"].get<std::string>() == dtype &&
                      entry["shape"].get<std::vector<int64_t>>() == global,
                  "checkpoint tensor '", t.name,
                  "' is listed twice with overlapping boxes or a different dtype/shape");
    }
    const uint64_t nbytes = static_cast<uint64_t>(t.local.numel()) * t.local.element_size();
    if (batch_bytes > 0 && batch_bytes + nbytes > max_shard_bytes) flush();
    for (const auto& existing : entry["shards"]) {
      TITAN_CHECK(existing["offsets"].get<std::vector<int64_t>>() != offsets,
                  "checkpoint tensor '", t.name, "': box ", box_str(offsets), " listed twice");
    }
    entry["shards"].push_back(
        {{"file", shard_name(shard)}, {"key", key}, {"offsets", offsets}, {"lengths", local}});
    batch.emplace_back(key, t.local);
    batch_bytes += nbytes;
  }
  flush();
  index["state"] = state;
  write_text_file(tmp + "/index.json", index.dump(1));
  fsync_path(tmp, /*directory=*/true);
  fs::rename(tmp, dir, ec);
  if (ec) throw DataError("cannot rename '" + tmp + "' to '" + dir + "': " + ec.message());
  const fs::path parent = fs::path(dir).parent_path();
  fsync_path(parent.empty() ? "." : parent.string(), /*directory=*/true);
}

bool is_checkpoint_dir(const std::string& dir) {
  std::error_code ec;
  return fs::is_regular_file(fs::path(dir) / "index.json", ec);
}

std::vector<std::pair<int64_t, std::string>> list_step_dirs(const std::string& folder) {
  std::vector<std::pair<int64_t, std::string>> out;
  std::error_code ec;
  if (!fs::is_directory(folder, ec)) return out;
  for (const auto& entry : fs::directory_iterator(folder, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("step-", 0) != 0 || name.size() == 5) continue;
    const std::string digits = name.substr(5);
    if (digits.find_first_not_of("0123456789") != std::string::npos || digits.size() > 18) continue;
    if (!is_checkpoint_dir(entry.path().string())) continue;
    out.emplace_back(std::stoll(digits), entry.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string step_dir(const std::string& folder, int64_t step) {
  return (fs::path(folder) / ("step-" + std::to_string(step))).string();
}

// ---- reading ------------------------------------------------------------------------------------

struct CheckpointReader::Impl {
  struct Shard {
    std::string file;
    std::string key;
    std::vector<int64_t> offsets, lengths;
  };
  struct Entry {
    TensorMeta meta;
    std::vector<Shard> shards;
  };
  std::map<std::string, Entry> entries;
  std::map<std::string, std::unique_ptr<SafetensorsReader>> files;
  mutable std::mutex mu;

  const SafetensorsReader& file(const std::string& dir, const std::string& name) {
    std::lock_guard<std::mutex> lock(mu);
    auto& slot = files[name];
    if (!slot) slot = std::make_unique<SafetensorsReader>(dir + "/" + name);
    return *slot;
  }
};

CheckpointReader::CheckpointReader(const std::string& dir, bool verify)
    : dir_(dir), impl_(std::make_unique<Impl>()) {
  const std::string index_path = dir + "/index.json";
  std::ifstream in(index_path, std::ios::binary);
  if (!in) {
    throw DataError("'" + dir + "' is not a checkpoint: " + index_path + " is missing");
  }
  nlohmann::json index;
  try {
    index = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw DataError(index_path + ": not valid JSON (truncated or corrupted?): " + e.what());
  }
  auto fail = [&](const std::string& why) -> void { throw DataError(index_path + ": " + why); };
  try {
    if (index.value("format", "") != kFormat) fail("not a titan checkpoint index (format field)");
    if (index.value("version", 0) != kVersion) {
      fail("unsupported checkpoint version " + index.at("version").dump() + " (this build reads " +
           std::to_string(kVersion) + ")");
    }
    for (const auto& [file, info] : index.at("files").items()) {
      const std::string path = dir + "/" + file;
      std::error_code ec;
      const uint64_t want = info.at("bytes").get<uint64_t>();
      const uint64_t have = fs::file_size(path, ec);
      if (ec) throw DataError("checkpoint file '" + path + "' is missing: " + ec.message());
      if (have != want) {
        throw DataError("checkpoint file '" + path + "' has " + std::to_string(have) +
                        " bytes, the index says " + std::to_string(want) + " (truncated?)");
      }
      if (verify) {
        const SafetensorsReader& reader = impl_->file(dir, file);
        const std::string_view bytes = reader.bytes();
        const uint32_t crc = crc32c(bytes.data(), bytes.size());
        if (crc != info.at("crc32c").get<uint32_t>()) {
          throw DataError("checkpoint file '" + path + "' is corrupted: CRC32C " +
                          std::to_string(crc) + " != " + info.at("crc32c").dump() +
                          " recorded in the index");
        }
      }
    }
    for (const auto& [name, value] : index.at("tensors").items()) {
      Impl::Entry e;
      e.meta.dtype = dtype_from_safetensors(value.at("dtype").get<std::string>(), index_path);
      e.meta.shape = value.at("shape").get<std::vector<int64_t>>();
      for (const auto& s : value.at("shards")) {
        Impl::Shard shard{s.at("file").get<std::string>(), s.at("key").get<std::string>(),
                          s.at("offsets").get<std::vector<int64_t>>(),
                          s.at("lengths").get<std::vector<int64_t>>()};
        if (!index.at("files").contains(shard.file)) {
          fail("tensor '" + name + "' names file '" + shard.file + "', which the index lacks");
        }
        if (shard.offsets.size() != e.meta.shape.size() ||
            shard.lengths.size() != e.meta.shape.size()) {
          fail("tensor '" + name + "': shard box rank differs from the tensor's");
        }
        for (size_t d = 0; d < e.meta.shape.size(); ++d) {
          if (shard.offsets[d] < 0 || shard.lengths[d] < 0 ||
              shard.offsets[d] + shard.lengths[d] > e.meta.shape[d]) {
            fail("tensor '" + name + "': shard box " + box_str(shard.offsets) + " + " +
                 box_str(shard.lengths) + " exceeds shape " + box_str(e.meta.shape));
          }
        }
        e.shards.push_back(std::move(shard));
      }
      impl_->entries.emplace(name, std::move(e));
    }
    state_ = index.value("state", nlohmann::json::object());
  } catch (const nlohmann::json::exception& e) {
    fail(std::string("malformed index: ") + e.what());
  }
}

CheckpointReader::~CheckpointReader() = default;

std::vector<std::string> CheckpointReader::names() const {
  std::vector<std::string> out;
  for (const auto& [name, e] : impl_->entries) out.push_back(name);
  return out;
}

bool CheckpointReader::has(const std::string& name) const {
  return impl_->entries.count(name) != 0;
}

const TensorMeta& CheckpointReader::meta(const std::string& name) const {
  auto it = impl_->entries.find(name);
  if (it == impl_->entries.end()) {
    throw DataError("checkpoint '" + dir_ + "' has no tensor '" + name + "'");
  }
  return it->second.meta;
}

at::Tensor CheckpointReader::read(const std::string& name) const {
  const TensorMeta& m = meta(name);
  return read_slice(name, std::vector<int64_t>(m.shape.size(), 0), m.shape);
}

at::Tensor CheckpointReader::read_slice(const std::string& name,
                                        const std::vector<int64_t>& offsets,
                                        const std::vector<int64_t>& lengths) const {
  const TensorMeta& m = meta(name);
  const auto& entry = impl_->entries.at(name);
  const size_t rank = m.shape.size();
  TITAN_CHECK(offsets.size() == rank && lengths.size() == rank, "read_slice of '", name,
              "': box rank ", offsets.size(), " != tensor rank ", rank);
  at::Tensor out = at::empty(lengths, at::TensorOptions().dtype(m.dtype));
  int64_t covered = 0;
  for (const auto& shard : entry.shards) {
    // Intersect the requested box with the shard's box, dimension by dimension.
    std::vector<int64_t> lo(rank), len(rank);
    bool empty = false;
    for (size_t d = 0; d < rank; ++d) {
      lo[d] = std::max(offsets[d], shard.offsets[d]);
      const int64_t hi =
          std::min(offsets[d] + lengths[d], shard.offsets[d] + shard.lengths[d]);
      len[d] = hi - lo[d];
      if (len[d] <= 0) empty = true;
    }
    if (empty && rank > 0) continue;
    const SafetensorsReader& file = const_cast<Impl&>(*impl_).file(dir_, shard.file);
    at::Tensor src = file.read(shard.key);
    if (src.sizes().vec() != shard.lengths || src.scalar_type() != m.dtype) {
      throw DataError("checkpoint file '" + file.path() + "': tensor '" + shard.key +
                      "' does not match the index (shape or dtype)");
    }
    at::Tensor dst = out;
    for (size_t d = 0; d < rank; ++d) {
      src = src.narrow(static_cast<int64_t>(d), lo[d] - shard.offsets[d], len[d]);
      dst = dst.narrow(static_cast<int64_t>(d), lo[d] - offsets[d], len[d]);
    }
    dst.copy_(src);
    covered += dst.numel();
  }
  if (covered != out.numel()) {
    throw DataError("checkpoint '" + dir_ + "': the shards of '" + name + "' cover " +
                    std::to_string(covered) + " of the " + std::to_string(out.numel()) +
                    " elements requested at " + box_str(offsets) + " + " + box_str(lengths));
  }
  return out;
}

}  // namespace titan::ckpt
