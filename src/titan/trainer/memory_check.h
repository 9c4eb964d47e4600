// Start-up memory check of a training job: the estimate of memory_estimate.h for the configured
// model and sizes against this machine's memory, so that `training.seq_len 1e9` or
// `training.local_batch_size 1e8` fail before anything is allocated, naming the key.
#pragma once

#include "titan/config/job_config.h"
#include "titan/distributed/launch_env.h"
#include "titan/plan/memory_estimate.h"

namespace titan {

// Throws ConfigError when the per-rank estimate (training step, and the validation forward when
// enabled) of every rank on this node together exceeds kMemoryRefuseFactor x `available_bytes`
// (machine_memory_bytes() in the app; 0 never refuses). Weights, gradients and optimizer state
// count as sharded over world_size / dp_replicate ranks, activations over the tensor-parallel
// degree (the options of training_memory_options, plan/memory_options.h). With `device_bytes` > 0
// (the rank's own GPU, training_device_memory) each rank is held against that instead.
void check_training_memory(const JobConfig& config, const LaunchEnv& env, double available_bytes,
                           double device_bytes = 0);

// The memory of the CUDA device this rank will train on (training.device and LOCAL_RANK, by
// resolve_device, whose ConfigError it throws), divided among the ranks that share it in the
// shared-device test mode, or 0 when it trains on the CPU. Selects nothing.
double training_device_memory(const JobConfig& config, const LaunchEnv& env);

}  // namespace titan
