// training.dtype: "float32" (the default) keeps float32 parameters, gradients and optimizer
// states, with matmuls in training.mixed_precision_param; "bfloat16" is TorchTitan's full bf16
// training: parameters, gradients and AdamW states in bfloat16, no float32 copy. RoPE tables,
// norms' statistics and the logits stay float32 (the model code keeps them so).
#pragma once

#include "titan/config/job_config.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <string>

namespace titan {

// The dtype matmuls run in: bfloat16 under training.dtype = "bfloat16" (the parameters are
// bf16), else training.mixed_precision_param.
at::ScalarType training_compute_dtype(const TrainingSection& training);

// Casts `model`'s parameters in place to training.dtype (a no-op for float32); buffers such as
// the RoPE tables stay as they are. Full bf16 training is single-process for now: with
// `world_size` > 1 it throws ConfigError "training.dtype = "bfloat16" is not supported yet with
// <parallelism>" (`parallelism` describes the layout).
void apply_training_dtype(torch::nn::Module& model, const TrainingSection& training,
                          int64_t world_size, const std::string& parallelism);

}  // namespace titan
