// Loading a model for inference or conversion from either of the two places weights live:
//   - a titan checkpoint: a step directory (index.json), or a checkpoint folder holding
//     step-N directories (the latest complete one is taken);
//   - a Hugging Face model folder (config.json + model.safetensors or its sharded index).
#pragma once

#include "titan/models/model.h"

#include <ATen/ATen.h>

#include <memory>
#include <string>

namespace titan::ckpt {

struct LoadedModel {
  std::shared_ptr<Model> model;  // weights loaded, float32 parameters
  std::string model_name;        // registry name, e.g. "llama3"
  std::string flavor;            // registered flavor, or a description for HF-derived dims
  std::string tokenizer_path;    // tokenizer files for this model ("" = built-in byte tokenizer)
  std::string source;            // the directory the weights came from
  // The training run's job config as TOML, when the checkpoint records it ("" otherwise: Hugging
  // Face folders, older checkpoints).
  std::string job_config_toml;
};

// Builds and loads the model found at `path`. `max_seq_len` sizes the RoPE table.
// Throws ConfigError when `path` is neither kind, DataError for corrupt files.
LoadedModel load_model(const std::string& path, at::ScalarType compute_dtype, int64_t max_seq_len);

}  // namespace titan::ckpt
