// Checkpoint step directories: shard files + index.json, written atomically, read back with
// checksums and assembled into any box of any tensor.
#include "titan/checkpoint/checkpoint_files.h"

#include "titan/checkpoint/safetensors.h"
#include "titan/common/check.h"
#include "titan/common/file_io.h"
#include "titan/common/format.h"

#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <unistd.h>

namespace titan::ckpt {

namespace fs = std::filesystem;

namespace {

constexpr const char* kFormat = "titan-checkpoint";
// Version 2 added "checksum" (the index protects itself); version 1 indexes still load.
constexpr int kVersion = 2;
constexpr const char* kChecksumKey = "checksum";

void write_text_file(const std::string& path, const std::string& text) {
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << text;
    out.flush();
    if (!out) throw DataError("cannot write '" + path + "'");
  }
  fsync_path(path, /*directory=*/false);
}

// "<prefix>00042.safetensors": prefix "shard-" for a group of one, "shard-r00003-" for rank 3 of
// a larger one.
std::string shard_name(const std::string& prefix, int64_t i) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%05lld.safetensors", static_cast<long long>(i));
  return prefix + buf;
}

std::string rank_tag(int rank) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "r%05d", rank);
  return buf;
}

std::string fragment_name(int rank) { return "fragment-" + rank_tag(rank) + ".json"; }

// The step in a "step-N" folder name, or -1.
int64_t step_of_dir_name(const std::string& dir) {
  const std::string name = fs::path(dir).lexically_normal().filename().string();
  if (name.rfind("step-", 0) != 0 || name.size() == 5 || name.size() > 23) return -1;
  const std::string digits = name.substr(5);
  if (digits.find_first_not_of("0123456789") != std::string::npos) return -1;
  return std::stoll(digits);
}

std::string box_str(const std::vector<int64_t>& v) { return "[" + join(v) + "]"; }

// Writes `tensors` into `tmp` as "<file_prefix>NNNNN.safetensors" files of about max_shard_bytes
// each and returns their part of the index: {"tensors": {...}, "files": {...}}. Adds the tensor
// bytes written to `bytes_written`.
nlohmann::ordered_json write_tensor_files(const std::string& tmp, const std::string& file_prefix,
                                          const std::vector<SavedTensor>& tensors,
                                          uint64_t max_shard_bytes, uint64_t& bytes_written) {
  nlohmann::ordered_json part;
  part["tensors"] = nlohmann::ordered_json::object();
  part["files"] = nlohmann::ordered_json::object();

  std::vector<std::pair<std::string, at::Tensor>> batch;
  uint64_t batch_bytes = 0;
  int64_t shard = 0;
  auto flush = [&]() {
    if (batch.empty()) return;
    const std::string name = shard_name(file_prefix, shard++);
    const uint32_t crc = write_safetensors(tmp + "/" + name, batch);
    part["files"][name] = {{"bytes", fs::file_size(tmp + "/" + name)}, {"crc32c", crc}};
    bytes_written += batch_bytes;
    batch.clear();
    batch_bytes = 0;
  };
  for (const SavedTensor& t : tensors) {
    TITAN_CHECK(t.local.defined(), "checkpoint tensor '", t.name, "' is undefined");
    TITAN_CHECK(!t.box.packed(), "checkpoint tensor '", t.name,
                "': a packed box is written as its plain pieces (ShardBox::pieces)");
    const std::vector<int64_t> local = t.local.sizes().vec();
    const std::vector<int64_t> global = t.box.global_shape.empty() ? local : t.box.global_shape;
    std::vector<int64_t> offsets = t.box.offsets;
    if (offsets.empty()) offsets.assign(local.size(), 0);
    TITAN_CHECK(global.size() == local.size() && offsets.size() == local.size(),
                "checkpoint tensor '", t.name, "': rank mismatch between local ", box_str(local),
                ", global ", box_str(global), " and offsets ", box_str(offsets));
    const std::string dtype = safetensors_dtype(t.local.scalar_type());
    // Several boxes of one tensor (a process holding more than one shard) get distinct keys.
    const bool whole = local == global;
    std::string key = t.name;
    if (!whole) {
      key += "@";
      for (size_t d = 0; d < offsets.size(); ++d)
        key += (d ? "_" : "") + std::to_string(offsets[d]);
    }
    auto& entry = part["tensors"][t.name];
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
      TITAN_CHECK(existing["offsets"].get<std::vector<int64_t>>() != offsets, "checkpoint tensor '",
                  t.name, "': box ", box_str(offsets), " listed twice");
    }
    entry["shards"].push_back({{"file", shard_name(file_prefix, shard)},
                               {"key", key},
                               {"offsets", offsets},
                               {"lengths", local}});
    batch.emplace_back(key, t.local);
    batch_bytes += nbytes;
  }
  flush();
  return part;
}

nlohmann::ordered_json index_header() {
  nlohmann::ordered_json index;
  index["format"] = kFormat;
  index["version"] = kVersion;
  return index;
}

// CRC32C of the index without its "checksum" field, over the compact dump with keys sorted, so
// the writer's key order and the file's whitespace do not matter and every other byte does.
uint32_t index_checksum(const nlohmann::json& index) {
  nlohmann::json rest = index;
  rest.erase(kChecksumKey);
  const std::string canonical = rest.dump();
  return crc32c(canonical.data(), canonical.size());
}

// Writes `index` (fsynced) with its checksum added as the last field.
void write_index(const std::string& path, nlohmann::ordered_json index) {
  index[kChecksumKey] = index_checksum(nlohmann::json(index));
  write_text_file(path, index.dump(1));
}

}  // namespace

std::string temp_dir_of(const std::string& dir, int64_t nonce) {
  return dir + ".tmp-" + std::to_string(nonce);
}

std::string make_temp_dir(const std::string& dir, int64_t nonce) {
  const std::string tmp = temp_dir_of(dir, nonce);
  std::error_code ec;
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  if (ec) throw DataError("cannot create '" + tmp + "': " + ec.message());
  return tmp;
}

void write_checkpoint(const std::string& dir, const std::vector<SavedTensor>& tensors,
                      const nlohmann::json& state, uint64_t max_shard_bytes) {
  if (fs::exists(dir)) {
    throw DataError("checkpoint directory '" + dir + "' already exists; not overwriting it");
  }
  const std::string tmp = make_temp_dir(dir, ::getpid());
  try {
    write_rank_files(tmp, /*rank=*/0, /*world_size=*/1, tensors, max_shard_bytes);
    merge_rank_fragments(tmp, /*world_size=*/1, state);
    commit_checkpoint_dir(tmp, dir);
  } catch (...) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    throw;
  }
}

uint64_t write_rank_files(const std::string& tmp_dir, int rank, int world_size,
                          const std::vector<SavedTensor>& tensors, uint64_t max_shard_bytes) {
  uint64_t bytes = 0;
  const std::string prefix = world_size == 1 ? "shard-" : "shard-" + rank_tag(rank) + "-";
  nlohmann::ordered_json part =
      write_tensor_files(tmp_dir, prefix, tensors, max_shard_bytes, bytes);
  nlohmann::ordered_json fragment;
  fragment["format"] = "titan-checkpoint-fragment";
  fragment["rank"] = rank;
  fragment["tensors"] = std::move(part["tensors"]);
  fragment["files"] = std::move(part["files"]);
  write_text_file(tmp_dir + "/" + fragment_name(rank), fragment.dump());
  return bytes;
}

namespace {

// One piece of a tensor: the box [offsets, offsets + lengths) and who holds it ("rank 3's box",
// "shard 2 (file f, key k)"), for errors.
struct PieceBox {
  std::string who;
  std::vector<int64_t> offsets, lengths;
};

std::string describe_box(const PieceBox& b) {
  return b.who + " " + box_str(b.offsets) + " + " + box_str(b.lengths);
}

// The element count of `lengths` (each >= 0), or -1 when it overflows int64.
int64_t checked_volume(const std::vector<int64_t>& lengths) {
  int64_t n = 1;
  for (int64_t l : lengths) {
    if (l < 0 || __builtin_mul_overflow(n, l, &n)) return -1;
  }
  return n;
}

bool boxes_overlap(const PieceBox& a, const PieceBox& b) {
  for (size_t d = 0; d < a.offsets.size(); ++d) {
    const int64_t lo = std::max(a.offsets[d], b.offsets[d]);
    const int64_t hi = std::min(a.offsets[d] + a.lengths[d], b.offsets[d] + b.lengths[d]);
    if (hi <= lo) return false;
  }
  return true;  // also for 0-d tensors: two pieces of the same scalar
}

// `boxes` tile `shape` exactly: each inside it, no two overlapping, no element left out.
// DataError starting with `what`, with the hint of an overlap or of a gap, otherwise.
void check_boxes_tile(const std::string& what, const std::vector<int64_t>& shape,
                      std::vector<PieceBox> boxes, const std::string& overlap_hint,
                      const std::string& gap_hint) {
  const int64_t total = checked_volume(shape);
  if (total < 0) {
    throw DataError(what + "shape " + box_str(shape) +
                    " has a negative dimension or more elements than int64 counts");
  }
  for (const PieceBox& b : boxes) {
    bool inside = b.offsets.size() == shape.size() && b.lengths.size() == shape.size();
    // offset + length <= dim without overflow: both are in [0, dim] first.
    for (size_t d = 0; inside && d < shape.size(); ++d) {
      inside = b.offsets[d] >= 0 && b.lengths[d] >= 0 && b.lengths[d] <= shape[d] &&
               b.offsets[d] <= shape[d] - b.lengths[d];
    }
    if (!inside) {
      throw DataError(what + describe_box(b) + " is not inside the tensor " + box_str(shape));
    }
  }
  // Sorted by the start in dim 0, a box can only overlap the boxes that start before it ends.
  if (!shape.empty()) {
    std::stable_sort(boxes.begin(), boxes.end(), [](const PieceBox& a, const PieceBox& b) {
      return a.offsets[0] < b.offsets[0];
    });
  }
  // Inside the tensor and pairwise disjoint, the boxes tile it exactly when their volumes add up.
  int64_t covered = 0;
  for (size_t i = 0; i < boxes.size(); ++i) {
    const int64_t v = checked_volume(boxes[i].lengths);  // <= total: inside the tensor
    if (v == 0) continue;
    covered += v;
    for (size_t j = i + 1; j < boxes.size(); ++j) {
      if (!shape.empty() && boxes[j].offsets[0] >= boxes[i].offsets[0] + boxes[i].lengths[0]) break;
      if (checked_volume(boxes[j].lengths) > 0 && boxes_overlap(boxes[i], boxes[j])) {
        throw DataError(what + describe_box(boxes[i]) + " overlaps " + describe_box(boxes[j]) +
                        ". HINT: " + overlap_hint);
      }
    }
    if (covered > total) break;  // only with overlaps, found above
  }
  if (covered != total) {
    throw DataError(what + "the pieces cover " + std::to_string(covered) + " of its " +
                    std::to_string(total) + " elements, leaving a gap. HINT: " + gap_hint);
  }
}

// Every element of `name` must come from exactly one rank's box.
void check_rank_boxes(const std::string& name, const std::vector<int64_t>& shape,
                      std::vector<PieceBox> boxes) {
  check_boxes_tile("checkpoint tensor '" + name + "' " + box_str(shape) + ": ", shape,
                   std::move(boxes),
                   "every element must be handed over by exactly one rank; a replicated tensor "
                   "by one rank only",
                   "some rank did not hand over its part");
}

}  // namespace

void merge_rank_fragments(const std::string& tmp_dir, int world_size, const nlohmann::json& state) {
  nlohmann::ordered_json tensors = nlohmann::ordered_json::object();
  nlohmann::ordered_json files = nlohmann::ordered_json::object();
  std::map<std::string, std::vector<PieceBox>> boxes;
  std::map<std::string, int> first_rank;  // the rank that listed a tensor first, for errors
  for (int r = 0; r < world_size; ++r) {
    const std::string path = tmp_dir + "/" + fragment_name(r);
    std::ifstream in(path, std::ios::binary);
    if (!in) {
      throw DataError("checkpoint fragment '" + path + "' of rank " + std::to_string(r) +
                      " is missing (did that rank fail to write its shards?)");
    }
    nlohmann::ordered_json fragment;
    try {
      fragment = nlohmann::ordered_json::parse(in);
      if (fragment.at("rank").get<int>() != r) throw DataError(path + ": names another rank");
      for (const auto& [file, info] : fragment.at("files").items()) {
        if (files.contains(file)) throw DataError(path + ": file '" + file + "' listed twice");
        files[file] = info;
      }
      for (const auto& [name, t] : fragment.at("tensors").items()) {
        auto& entry = tensors[name];
        if (entry.is_null()) {
          entry = {{"dtype", t.at("dtype")},
                   {"shape", t.at("shape")},
                   {"shards", nlohmann::ordered_json::array()}};
          first_rank[name] = r;
        } else if (entry["dtype"] != t.at("dtype") || entry["shape"] != t.at("shape")) {
          throw DataError("checkpoint tensor '" + name + "': rank " +
                          std::to_string(first_rank[name]) + " saves it as " +
                          entry["dtype"].get<std::string>() + " " + entry["shape"].dump() +
                          ", rank " + std::to_string(r) + " as " +
                          t.at("dtype").get<std::string>() + " " + t.at("shape").dump() +
                          ". HINT: every rank must agree on a tensor's dtype and global shape");
        }
        for (const auto& shard : t.at("shards")) {
          entry["shards"].push_back(shard);
          boxes[name].push_back({"rank " + std::to_string(r) + "'s box",
                                 shard.at("offsets").get<std::vector<int64_t>>(),
                                 shard.at("lengths").get<std::vector<int64_t>>()});
        }
      }
    } catch (const nlohmann::json::exception& e) {
      throw DataError(path + ": malformed checkpoint fragment: " + e.what());
    }
  }
  for (const auto& [name, entry] : tensors.items()) {
    check_rank_boxes(name, entry["shape"].get<std::vector<int64_t>>(), boxes[name]);
  }
  nlohmann::ordered_json index = index_header();
  index["tensors"] = std::move(tensors);
  index["files"] = std::move(files);
  index["state"] = state;
  write_index(tmp_dir + "/index.json", std::move(index));
  for (int r = 0; r < world_size; ++r) {
    std::error_code ec;
    fs::remove(tmp_dir + "/" + fragment_name(r), ec);
  }
}

void commit_checkpoint_dir(const std::string& tmp_dir, const std::string& dir) {
  std::error_code ec;
  if (fs::exists(dir, ec)) {
    throw DataError("checkpoint directory '" + dir + "' already exists; not overwriting it");
  }
  fsync_path(tmp_dir, /*directory=*/true);
  fs::rename(tmp_dir, dir, ec);
  if (ec) throw DataError("cannot rename '" + tmp_dir + "' to '" + dir + "': " + ec.message());
  const fs::path parent = fs::path(dir).parent_path();
  fsync_path(parent.empty() ? "." : parent.string(), /*directory=*/true);
}

bool is_checkpoint_dir(const std::string& dir) {
  std::error_code ec;
  return fs::is_regular_file(fs::path(dir) / "index.json", ec);
}

namespace {

// The "step-N" directories in `folder` as (N, path), ascending, complete (with index.json) or not.
std::vector<std::pair<int64_t, std::string>> step_named_dirs(const std::string& folder,
                                                             bool complete) {
  std::vector<std::pair<int64_t, std::string>> out;
  std::error_code ec;
  if (!fs::is_directory(folder, ec)) return out;
  for (const auto& entry : fs::directory_iterator(folder, ec)) {
    const int64_t step = step_of_dir_name(entry.path().string());
    if (step < 0 || !entry.is_directory(ec)) continue;
    if (is_checkpoint_dir(entry.path().string()) != complete) continue;
    out.emplace_back(step, entry.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

std::vector<std::pair<int64_t, std::string>> list_step_dirs(const std::string& folder) {
  return step_named_dirs(folder, /*complete=*/true);
}

std::vector<std::pair<int64_t, std::string>> list_incomplete_step_dirs(const std::string& folder) {
  return step_named_dirs(folder, /*complete=*/false);
}

std::string step_dir(const std::string& folder, int64_t step) {
  return (fs::path(folder) / ("step-" + std::to_string(step))).string();
}

// ---- reading ------------------------------------------------------------------------------------

namespace {

// A name the index may use for a file: one path component, no way out of the folder.
bool is_plain_file_name(const std::string& name) {
  return !name.empty() && name != "." && name != ".." &&
         name.find_first_of(std::string("/\\\0", 3)) == std::string::npos;
}

// The folder name, the state's "step" and the train_state entry's "step" must agree: a change to
// one of them (an edit, a bit flip in an unprotected version-1 index) would make a resumed run
// repeat or skip steps and overwrite good checkpoints.
template <typename Fail>
void check_recorded_steps(const std::string& dir, const nlohmann::json& state, const Fail& fail) {
  if (!state.is_object() || !state.contains("step")) return;
  if (!state.at("step").is_number_integer()) fail("the state's step is not an integer");
  const int64_t step = state.at("step").get<int64_t>();
  const int64_t named = step_of_dir_name(dir);
  if (named >= 0 && named != step) {
    fail("the folder is named step-" + std::to_string(named) + " but its state records step " +
         std::to_string(step) + " (renamed or corrupted?)");
  }
  const nlohmann::json* train_state = nullptr;
  if (state.contains("entries") && state.at("entries").is_object() &&
      state.at("entries").contains("train_state")) {
    train_state = &state.at("entries").at("train_state");
  }
  if (train_state != nullptr && train_state->is_object() && train_state->contains("step")) {
    if (!train_state->at("step").is_number_integer()) fail("train_state's step is not an integer");
    const int64_t trained = train_state->at("step").get<int64_t>();
    if (trained != step) {
      fail("train_state records step " + std::to_string(trained) +
           " but the checkpoint is of step " + std::to_string(step) + " (corrupted?)");
    }
  }
}

}  // namespace

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
  // Never opened unless a regular file: a FIFO there would block the reader.
  if (non_regular_file_kind(index_path).rfind("missing", 0) != 0) {
    require_regular_file(index_path, "checkpoint index");
  }
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
    if (!index.is_object() || index.value("format", "") != kFormat) {
      fail("not a titan checkpoint index (format field)");
    }
    for (const char* key : {"version", "files", "tensors", kChecksumKey}) {
      if (index.contains(key) && json_has_float(index.at(key))) {
        fail(std::string("'") + key + "' holds a non-integer number where integers belong");
      }
    }
    const int version = index.value("version", 0);
    if (version != 1 && version != kVersion) {
      fail("unsupported checkpoint version " + index.at("version").dump() + " (this build reads " +
           "1 to " + std::to_string(kVersion) + ")");
    }
    if (version >= 2) {
      if (!index.contains(kChecksumKey)) fail("the index has no checksum (corrupted?)");
      const uint32_t want = index.at(kChecksumKey).get<uint32_t>();
      const uint32_t have = index_checksum(index);
      if (have != want) {
        fail("the index is corrupted: its CRC32C is " + std::to_string(have) + ", " +
             std::to_string(want) + " was recorded when it was written (edited or bit rot?)");
      }
    }
    for (const auto& [file, info] : index.at("files").items()) {
      if (!is_plain_file_name(file)) {
        fail("file name '" + file + "' is not a plain file name inside the checkpoint folder");
      }
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
      std::vector<PieceBox> pieces;
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
        pieces.push_back({"shard " + std::to_string(pieces.size()) + " (file '" + shard.file +
                              "', key '" + shard.key + "')",
                          shard.offsets, shard.lengths});
        e.shards.push_back(std::move(shard));
      }
      // The shards must tile the tensor: an overlap would leave rows of another part unread
      // (uninitialised memory), which counting covered elements alone does not see.
      check_boxes_tile(index_path + ": tensor '" + name + "' " + box_str(e.meta.shape) + ": ",
                       e.meta.shape, std::move(pieces),
                       "every element must come from exactly one shard (a forged or damaged "
                       "index?)",
                       "the index lists too few shards (a forged or damaged index?)");
      impl_->entries.emplace(name, std::move(e));
    }
    state_ = index.value("state", nlohmann::json::object());
    check_recorded_steps(dir, state_, fail);
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
      const int64_t hi = std::min(offsets[d] + lengths[d], shard.offsets[d] + shard.lengths[d]);
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

void CheckpointReader::read_box_into(const std::string& name, const ShardBox& box,
                                     at::Tensor dst) const {
  if (!has(name)) throw DataError("checkpoint '" + dir_ + "' lacks tensor '" + name + "'");
  const TensorMeta& m = meta(name);
  if (m.shape != box.global_shape) {
    throw DataError("checkpoint '" + dir_ + "': tensor '" + name + "' has shape " +
                    box_str(m.shape) + ", the model expects " + box_str(box.global_shape) +
                    " (a different model flavor?)");
  }
  if (dst.numel() == 0) return;
  at::NoGradGuard no_grad;
  for (const ShardPiece& piece : box.pieces()) {
    at::Tensor part = piece.of(dst);
    part.copy_(read_slice(name, piece.box.offsets, part.sizes().vec()));
  }
}

}  // namespace titan::ckpt
