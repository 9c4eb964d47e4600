// PEFT adapter folders (what peft's save_pretrained writes and PeftModel.from_pretrained reads):
// adapter_config.json and adapter_model.safetensors, written atomically (a temporary folder
// renamed into place), for LoRA's adapters (models/lora.h).
#pragma once

#include "titan/models/lora.h"
#include "titan/models/registry.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

namespace titan::ckpt {

// "<folder>/step-<step>-peft": where checkpoint.last_save_in_hf writes the adapters of a LoRA run
// (the merged model goes to hf_export_dir).
std::string peft_export_dir(const std::string& folder, int64_t step);

// Writes the adapters of `params` (FQN -> whole tensor; other entries are ignored) for the base
// model of `description` as PEFT folder `dir`, in float32, replacing a folder already there (with
// a warning). DataError when `params` holds no adapters.
void write_peft_adapter(const std::string& dir, const TensorMap& params,
                        const nlohmann::json& description, const LoraSpec& spec);

// A PEFT adapter folder: its settings and its tensors as our adapter parameters (float32).
struct PeftAdapter {
  LoraSpec spec;
  TensorMap params;
};
// Reads PEFT folder `dir` for the base model of `description`: ConfigError for settings titan
// does not train, DataError naming the file for a missing or malformed one.
PeftAdapter read_peft_adapter(const std::string& dir, const nlohmann::json& description);

}  // namespace titan::ckpt
