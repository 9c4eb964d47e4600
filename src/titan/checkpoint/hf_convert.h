// Conversions between our checkpoints (or a live Model) and Hugging Face model folders, through
// the model's HfAdapter (registry.h) and the folder I/O of hf_folder.h:
//   `titan convert to-hf` -> checkpoint_to_hf,  `titan convert from-hf` -> hf_to_checkpoint,
//   checkpoint.initial_load_in_hf -> load_hf_weights / read_hf_parameters,
//   checkpoint.last_save_in_hf -> save_hf_weights / export_hf.
// Float32 weights go ours -> HF -> ours bit-identically (renames and row permutations only).
#pragma once

#include "titan/checkpoint/checkpoint_files.h"
#include "titan/checkpoint/hf_folder.h"
#include "titan/models/model.h"
#include "titan/models/registry.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace titan::ckpt {

// The parameters of `model` by FQN (tied weights once), sharing storage with the model.
TensorMap model_tensors(const Model& model);

// Copies `tensors` into the parameters of `model` (casting to the parameter dtype). Everything
// is checked before anything is copied: DataError "<source>: ..." naming the first parameter
// that is missing or has another shape, or the first tensor that is no parameter.
void copy_into_model(Model& model, const TensorMap& tensors, const std::string& source);

// Loads the parameters of `model` from a checkpoint one tensor at a time (other entries, such as
// optimizer state, are ignored); DataError naming the checkpoint and the first missing or
// mis-shaped parameter.
void load_checkpoint_parameters(Model& model, const CheckpointReader& reader);

// The model tensors of a checkpoint (the parameters of its state["model"] description, in the
// stored dtype), checked as above.
TensorMap read_model_tensors(const CheckpointReader& reader);

// The model description (registry.h) for an HF folder's config.json, through the adapter of
// its "model_type", fitted to the tensors the folder holds (`tensor_names`, HfAdapter::
// fit_to_tensors). DataError naming `config_path` when the config is unsupported or malformed.
nlohmann::json hf_model_description(const nlohmann::json& config, const std::string& config_path,
                                    const std::vector<std::string>& tensor_names);

// Writes the model of checkpoint `checkpoint_dir` as an HF folder `out_dir` (see
// write_hf_folder for options; tokenizer_path is copied as given, so callers usually pass the
// checkpoint's state["tokenizer_path"]).
// A checkpoint of a LoRA run (its description has a "lora" entry) needs `merge_adapters`: the
// folder then holds W + scaling * B A for each adapted layer (ConfigError otherwise, and for
// merge_adapters without adapters).
void checkpoint_to_hf(const std::string& checkpoint_dir, const std::string& out_dir,
                      const HfWriteOptions& options, bool merge_adapters = false);

// Writes the LoRA adapters of checkpoint `checkpoint_dir` as PEFT folder `out_dir` (which must
// not exist; peft_folder.h). ConfigError for a checkpoint without adapters.
void checkpoint_to_peft(const std::string& checkpoint_dir, const std::string& out_dir);

// Writes HF folder `hf_dir` as a model-only checkpoint step directory `out_dir` (float32 tensors
// under our names; state {"model": description, "tokenizer_path": absolute hf_dir if it holds
// tokenizer files, else "", "model_only": true, "entries": {"model": {}}}, as the checkpoint
// manager writes a model-only save), loadable by checkpoint.initial_load_path and load_model.
// With `adapter_dir` (a PEFT LoRA folder for that model), the checkpoint holds its adapters too
// and its description the LoRA settings.
void hf_to_checkpoint(const std::string& hf_dir, const std::string& out_dir,
                      const std::string& adapter_dir = "");

// checkpoint.initial_load_in_hf: loads the weights of HF folder `hf_dir` into `model`, which was
// built from `model_description`. ConfigError if the folder's config.json describes another
// architecture (naming the differing arguments); DataError for missing or mis-shaped tensors.
void load_hf_weights(Model& model, const nlohmann::json& model_description,
                     const std::string& hf_dir);

// checkpoint.last_save_in_hf: writes the parameters of `model` (built from `model_description`)
// as an HF folder `out_dir` (which must not exist). The parameters may live on any device: they
// are copied to host memory before the adapter renames and reshapes them.
void save_hf_weights(const Model& model, const nlohmann::json& model_description,
                     const std::string& out_dir, const HfWriteOptions& options);

// checkpoint.initial_load_in_hf for a parallelized model: every parameter of a model of
// `model_description`, whole and by FQN, read from HF folder `hf_dir` and checked as
// load_hf_weights does, and its state buffers (moe.h: MoE expert biases, zero where the folder
// has none); each rank then keeps its boxes (ParallelizedModel::load_full_parameters).
TensorMap read_hf_parameters(const std::string& hf_dir, const nlohmann::json& model_description);

// "<folder>/step-<step>-hf": where checkpoint.last_save_in_hf exports the model of step `step`.
std::string hf_export_dir(const std::string& folder, int64_t step);

// checkpoint.last_save_in_hf, called by every rank once all of them have gathered `full` (every
// parameter by FQN, whole: ParallelizedModel::gather_full_parameters, a collective): rank 0
// writes it, as the parameters of a model of `model_description`, as HF folder `dir`, replacing
// an export already there (with a warning); the other ranks return. DataError, before anything is
// written, when `full` lacks a parameter of that model or holds one of another shape. `full` may
// hold CUDA tensors: they are copied into a model on the host, one by one.
void export_hf(const std::string& dir, const std::vector<std::pair<std::string, at::Tensor>>& full,
               const nlohmann::json& model_description, int64_t rank,
               const HfWriteOptions& options);

}  // namespace titan::ckpt
