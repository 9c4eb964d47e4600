// Hugging Face model folders, as transformers' save_pretrained writes them:
//   config.json
//   model.safetensors                                     all weights, or when larger than
//   model-00001-of-0000N.safetensors ...                  max_shard_bytes, shards plus
//   model.safetensors.index.json                          {"metadata": {"total_size": bytes},
//                                                          "weight_map": {name: shard file}}
//   tokenizer files (tokenizer.json, tokenizer_config.json, tokenizer.model, ...)
// This file only moves named tensors and JSON; names and layouts are the model's HF adapter's
// business (registry.h), and hf_convert.h ties the two together.
#pragma once

#include "titan/models/registry.h"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace titan::ckpt {

struct HfWriteOptions {
  at::ScalarType dtype = at::kFloat;      // dtype of every weight (float32, bfloat16, float16)
  uint64_t max_shard_bytes = 5ull << 30;  // transformers' default "5GB": above it, shards
  std::string tokenizer_path;             // tokenizer file or folder to copy; "" copies nothing
  int64_t bos_id = -1;                    // config.json bos_token_id / eos_token_id; -1: omitted
  int64_t eos_id = -1;
  // The weight files' stem: "model" (transformers), "diffusion_pytorch_model" (diffusers).
  std::string weights_name = "model";
};

// Writes `config` (plus torch_dtype and the token ids) and `tensors` (HF names) as an HF folder
// at `dir`, atomically: everything goes into "<dir>.tmp-<pid>", which is renamed to `dir` once
// complete. `dir` must not exist (ConfigError). Tensors are written in natural name order
// (layer 2 before layer 10) and shards are filled greedily up to max_shard_bytes.
void write_hf_folder(const std::string& dir, nlohmann::json config, const TensorMap& tensors,
                     const HfWriteOptions& options);

// The tokenizer files of an HF folder that our tokenizer reader understands, or "" when it has
// none (then the model uses the built-in byte tokenizer).
std::string hf_tokenizer_path(const std::string& dir);

// True if `dir` holds a config.json.
bool is_hf_folder(const std::string& dir);

// A JSON file of a Hugging Face / diffusers folder (config.json, model_index.json, an index);
// DataError naming the file when it cannot be read or is not JSON.
nlohmann::json read_hf_json(const std::filesystem::path& path);

// Reads an HF folder: config.json and the weights (single file or sharded; transformers' or
// diffusers' file names). Files are mapped,
// tensors copied out on read. DataError naming the file for anything missing or corrupt.
class HfFolderReader {
 public:
  explicit HfFolderReader(const std::string& dir);
  ~HfFolderReader();

  const std::string& dir() const { return dir_; }
  const nlohmann::json& config() const { return config_; }
  std::vector<std::string> names() const;  // sorted
  at::Tensor read(const std::string& name) const;
  // Every tensor, converted to `dtype` (at::kFloat by default; the stored dtype if Undefined).
  TensorMap read_all(at::ScalarType dtype = at::kFloat) const;
  // The shard files (one for an unsharded folder).
  std::vector<std::string> files() const;

 private:
  struct Impl;
  std::string dir_;
  nlohmann::json config_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace titan::ckpt
