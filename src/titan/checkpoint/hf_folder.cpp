// Hugging Face model folders: writing (atomic, optionally sharded) and reading (see hf_folder.h).
#include "titan/checkpoint/hf_folder.h"

#include "titan/checkpoint/checkpoint_files.h"
#include "titan/checkpoint/safetensors.h"
#include "titan/common/check.h"
#include "titan/common/file_io.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <fcntl.h>
#include <filesystem>
#include <set>
#include <system_error>
#include <unistd.h>

namespace titan::ckpt {
namespace fs = std::filesystem;

namespace {

constexpr const char* kConfigFile = "config.json";
// transformers' weight file names; diffusers' models use "diffusion_pytorch_model" instead of
// "model" (HfWriteOptions::weights_name).
std::string single_file(const std::string& stem) { return stem + ".safetensors"; }
std::string index_file(const std::string& stem) { return stem + ".safetensors.index.json"; }

// Tokenizer files a model folder may carry; copied from a tokenizer folder when present.
constexpr const char* kTokenizerFiles[] = {
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "encoder.json",
    "vocab.bpe",
    "tokenizer.model",
};

std::string torch_dtype_name(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat: return "float32";
    case at::kBFloat16: return "bfloat16";
    case at::kHalf: return "float16";
    default:
      throw ConfigError(
          message("Hugging Face export dtype must be float32, bfloat16 or "
                  "float16, got ",
                  c10::toString(dtype)));
  }
}

// "layers.2.x" < "layers.10.x": runs of digits compare as numbers.
bool natural_less(const std::string& a, const std::string& b) {
  size_t i = 0;
  size_t j = 0;
  while (i < a.size() && j < b.size()) {
    if (std::isdigit(static_cast<unsigned char>(a[i])) &&
        std::isdigit(static_cast<unsigned char>(b[j]))) {
      size_t i_end = i;
      size_t j_end = j;
      while (i_end < a.size() && std::isdigit(static_cast<unsigned char>(a[i_end]))) ++i_end;
      while (j_end < b.size() && std::isdigit(static_cast<unsigned char>(b[j_end]))) ++j_end;
      const std::string da = a.substr(i, i_end - i);
      const std::string db = b.substr(j, j_end - j);
      if (da.size() != db.size()) return da.size() < db.size();  // no leading zeros in FQNs
      if (da != db) return da < db;
      i = i_end;
      j = j_end;
    } else {
      if (a[i] != b[j]) return a[i] < b[j];
      ++i;
      ++j;
    }
  }
  return a.size() - i < b.size() - j;
}

void write_text(const std::string& path, const std::string& text) {
  replace_file(path, text);  // checked write, sync and close; the errno text on failure
}

// A titan checkpoint: a step folder whose index.json says "format": "titan-checkpoint", or a
// folder of step-N checkpoints.
bool is_titan_checkpoint(const fs::path& d) {
  std::error_code ec;
  if (!fs::is_regular_file(d / "index.json", ec)) return !list_step_dirs(d.string()).empty();
  try {
    const nlohmann::json index = read_hf_json(d / "index.json");
    return index.is_object() && index.value("format", std::string()) == "titan-checkpoint";
  } catch (const DataError&) {
    return false;
  }
}

void copy_one_file(const fs::path& from, const fs::path& to) {
  std::error_code ec;
  fs::create_directories(to.parent_path(), ec);
  fs::copy_file(from, to, fs::copy_options::overwrite_existing, ec);
  if (ec)
    throw DataError("cannot copy " + from.string() + " to " + to.string() + ": " + ec.message());
  fsync_path(to.string(), /*directory=*/false);
}

// Copies the tokenizer at `source` (a file or a folder) into `dir`.
void copy_tokenizer(const std::string& source, const fs::path& dir) {
  std::error_code ec;
  if (fs::is_directory(source, ec)) {
    bool any = false;
    for (const char* name : kTokenizerFiles) {
      if (fs::is_regular_file(fs::path(source) / name, ec)) {
        copy_one_file(fs::path(source) / name, dir / name);
        any = true;
      }
    }
    const fs::path original = fs::path(source) / "original" / "tokenizer.model";
    if (fs::is_regular_file(original, ec)) {
      copy_one_file(original, dir / "original" / "tokenizer.model");
      any = true;
    }
    if (!any) throw DataError("tokenizer folder " + source + " holds no tokenizer files");
  } else if (fs::is_regular_file(source, ec)) {
    // Our reader takes a single .json file as tokenizer.json and anything else as tiktoken.
    const bool is_json = fs::path(source).extension() == ".json";
    copy_one_file(source, dir / (is_json ? "tokenizer.json" : "tokenizer.model"));
  } else {
    throw DataError("tokenizer path '" + source +
                    "' does not exist. HINT: pass the tokenizer file or folder explicitly");
  }
  // transformers' AutoTokenizer wants a tokenizer_config.json next to a tokenizer.json.
  if (fs::is_regular_file(dir / "tokenizer.json", ec) &&
      !fs::exists(dir / "tokenizer_config.json", ec)) {
    write_text((dir / "tokenizer_config.json").string(),
               nlohmann::json{{"tokenizer_class", "PreTrainedTokenizerFast"}}.dump(2) + "\n");
  }
}

}  // namespace

void write_hf_folder(const std::string& dir, nlohmann::json config, const TensorMap& tensors,
                     const HfWriteOptions& options) {
  std::error_code ec;
  if (fs::exists(dir, ec)) {
    throw ConfigError(message("output folder ", dir, " already exists; remove it or pick another"));
  }
  TITAN_CHECK(!tensors.empty(), "write_hf_folder: no tensors to write to ", dir);
  const std::string dtype_name = torch_dtype_name(options.dtype);  // checks the dtype
  // transformers' configs record the dtype and the token ids; diffusers' model configs neither
  // (diffusers warns about keys its model does not take).
  if (options.weights_name == "model") {
    config["torch_dtype"] = dtype_name;
    if (options.bos_id >= 0) config["bos_token_id"] = options.bos_id;
    if (options.eos_id >= 0) config["eos_token_id"] = options.eos_id;
  }

  const fs::path final_dir = fs::path(dir);
  const fs::path tmp = fs::path(dir + ".tmp-" + std::to_string(::getpid()));
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  if (ec) throw DataError("cannot create " + tmp.string() + ": " + ec.message());

  // Natural order; then greedy shards of at most max_shard_bytes (a larger tensor gets its own).
  std::vector<std::string> names;
  for (const auto& item : tensors) names.push_back(item.first);
  std::sort(names.begin(), names.end(), natural_less);
  std::vector<std::vector<std::pair<std::string, at::Tensor>>> shards(1);
  uint64_t shard_bytes = 0;
  uint64_t total_bytes = 0;
  for (const std::string& name : names) {
    at::Tensor t = tensors.at(name).detach().to(at::kCPU).to(options.dtype).contiguous();
    const uint64_t bytes = static_cast<uint64_t>(t.numel()) * t.element_size();
    if (!shards.back().empty() && shard_bytes + bytes > options.max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().emplace_back(name, t);
    shard_bytes += bytes;
    total_bytes += bytes;
  }

  const std::map<std::string, std::string> metadata = {{"format", "pt"}};
  if (shards.size() == 1) {
    write_safetensors((tmp / single_file(options.weights_name)).string(), shards[0], metadata);
  } else {
    nlohmann::json weight_map = nlohmann::json::object();
    for (size_t i = 0; i < shards.size(); ++i) {
      char file[64];
      std::snprintf(file, sizeof(file), "%s-%05zu-of-%05zu.safetensors",
                    options.weights_name.c_str(), i + 1, shards.size());
      write_safetensors((tmp / file).string(), shards[i], metadata);
      for (const auto& item : shards[i]) weight_map[item.first] = file;
    }
    const nlohmann::json index = {{"metadata", {{"total_size", total_bytes}}},
                                  {"weight_map", weight_map}};
    write_text((tmp / index_file(options.weights_name)).string(), index.dump(2) + "\n");
  }
  write_text((tmp / kConfigFile).string(), config.dump(2) + "\n");
  if (!options.tokenizer_path.empty()) copy_tokenizer(options.tokenizer_path, tmp);

  fsync_path(tmp.string(), /*directory=*/true);
  fs::rename(tmp, final_dir, ec);
  if (ec) throw DataError("cannot rename " + tmp.string() + " to " + dir + ": " + ec.message());
  fsync_path(final_dir.parent_path().empty() ? "." : final_dir.parent_path().string(),
             /*directory=*/true);
}

std::string hf_tokenizer_path(const std::string& dir) {
  std::error_code ec;
  const fs::path d(dir);
  for (const char* name :
       {"tokenizer.json", "spiece.model", "vocab.json", "encoder.json", "tokenizer.model"}) {
    if (fs::is_regular_file(d / name, ec)) return dir;
  }
  if (fs::is_regular_file(d / "original" / "tokenizer.model", ec)) return dir;
  return "";
}

nlohmann::json read_hf_json(const std::filesystem::path& path) {
  const std::string text = read_regular_file(path.string(), "Hugging Face file");
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw DataError(path.string() + ": not valid JSON (" + e.what() + ")");
  }
}

bool is_hf_folder(const std::string& dir) {
  std::error_code ec;
  return fs::is_regular_file(fs::path(dir) / kConfigFile, ec);
}

// ---- reading ------------------------------------------------------------------------------------

struct HfFolderReader::Impl {
  std::vector<std::unique_ptr<SafetensorsReader>> files;
  std::map<std::string, const SafetensorsReader*> where;  // tensor name -> its file
};

HfFolderReader::HfFolderReader(const std::string& dir)
    : dir_(dir), impl_(std::make_unique<Impl>()) {
  std::error_code ec;
  const fs::path d(dir);
  if (!fs::is_directory(d, ec)) throw DataError("Hugging Face folder " + dir + " does not exist");
  if (!fs::exists(d / kConfigFile, ec) && is_titan_checkpoint(d)) {
    throw ConfigError(message(
        "'", dir, "' is a titan checkpoint, not a Hugging Face folder (it has no ", kConfigFile,
        "). HINT: drop checkpoint.initial_load_in_hf to load it as a "
        "titan checkpoint; `titan convert to-hf` turns it into a Hugging Face folder"));
  }
  if (!fs::exists(d / kConfigFile, ec) && fs::exists(d / "model_index.json", ec)) {
    throw ConfigError(message("'", dir, "' is a diffusers pipeline folder (model_index.json); ",
                              "its models are in its subfolders. HINT: point at the model's own "
                              "folder, e.g. ",
                              (d / "transformer").string(), " (FLUX's transformer)"));
  }
  config_ = read_hf_json(d / kConfigFile);
  if (!config_.is_object()) throw DataError((d / kConfigFile).string() + ": not a JSON object");

  // transformers' names, or diffusers' (a model folder of a diffusers pipeline).
  std::string stem = "model";
  if (!fs::exists(d / single_file(stem), ec) && !fs::exists(d / index_file(stem), ec) &&
      (fs::exists(d / single_file("diffusion_pytorch_model"), ec) ||
       fs::exists(d / index_file("diffusion_pytorch_model"), ec))) {
    stem = "diffusion_pytorch_model";
  }
  const std::string single = single_file(stem), index_name = index_file(stem);
  if (fs::is_regular_file(d / index_name, ec)) {
    const fs::path index_path = d / index_name;
    const nlohmann::json index = read_hf_json(index_path);
    if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object()) {
      throw DataError(index_path.string() + ": no \"weight_map\" object");
    }
    std::map<std::string, const SafetensorsReader*> by_file;
    for (const auto& item : index["weight_map"].items()) {
      if (!item.value().is_string()) {
        throw DataError(index_path.string() + ": weight_map[\"" + item.key() +
                        "\"] is not a file name");
      }
      const std::string file = item.value().get<std::string>();
      if (file.find('/') != std::string::npos) {
        throw DataError(index_path.string() + ": shard file '" + file + "' is not in the folder");
      }
      auto it = by_file.find(file);
      if (it == by_file.end()) {
        require_regular_file((d / file).string(), "Hugging Face weight file");
        impl_->files.push_back(std::make_unique<SafetensorsReader>((d / file).string()));
        it = by_file.emplace(file, impl_->files.back().get()).first;
      }
      if (it->second->find(item.key()) == nullptr) {
        throw DataError(it->second->path() + ": lacks tensor '" + item.key() + "' that " +
                        index_path.string() + " places there");
      }
      impl_->where[item.key()] = it->second;
    }
  } else if (fs::is_regular_file(d / single, ec)) {
    impl_->files.push_back(std::make_unique<SafetensorsReader>((d / single).string()));
    for (const TensorEntry& entry : impl_->files.back()->entries()) {
      impl_->where[entry.name] = impl_->files.back().get();
    }
  } else {
    throw DataError("Hugging Face folder " + dir + " has neither " + single + " nor " + index_name +
                    " (PyTorch .bin weights are not supported; re-save them with "
                    "save_pretrained(..., safe_serialization=True))");
  }
}

HfFolderReader::~HfFolderReader() = default;

std::vector<std::string> HfFolderReader::names() const {
  std::vector<std::string> out;
  for (const auto& item : impl_->where) out.push_back(item.first);
  return out;
}

at::Tensor HfFolderReader::read(const std::string& name) const {
  const auto it = impl_->where.find(name);
  if (it == impl_->where.end()) {
    throw DataError("Hugging Face folder " + dir_ + " has no tensor '" + name + "'");
  }
  return it->second->read(name);
}

TensorMap HfFolderReader::read_all(at::ScalarType dtype) const {
  TensorMap out;
  for (const auto& item : impl_->where) {
    at::Tensor t = item.second->read(item.first);
    out.emplace(item.first, dtype == at::ScalarType::Undefined ? t : t.to(dtype));
  }
  return out;
}

std::vector<std::string> HfFolderReader::files() const {
  std::vector<std::string> out;
  for (const auto& f : impl_->files) out.push_back(f->path());
  return out;
}

}  // namespace titan::ckpt
