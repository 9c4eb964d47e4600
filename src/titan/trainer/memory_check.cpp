// check_training_memory (see memory_check.h).
#include "titan/trainer/memory_check.h"

#include "titan/common/device.h"
#include "titan/common/format.h"
#include "titan/components/training_dtype.h"
#include "titan/plan/memory_options.h"

#include <algorithm>

namespace titan {

double training_device_memory(const JobConfig& config, const LaunchEnv& env) {
  // The trainer's own rule (resolve_device): a setting it would refuse is refused here, the same
  // way. Ranks that share a GPU (the shared-device test mode) share its memory.
  const int64_t devices = config.training.device == "cpu" ? 0 : cuda_device_count();
  const at::Device device =
      resolve_device(config.training.device, env.local_rank, env.local_world_size, devices,
                     "training.device", shared_device_mode());
  if (!device.is_cuda()) return 0;
  return static_cast<double>(device_info(device).total_memory) /
         static_cast<double>(ranks_per_device(env.local_rank, env.local_world_size, devices));
}

void check_training_memory(const JobConfig& config, const LaunchEnv& env, double available_bytes,
                           double device_bytes) {
  const ModelSpec& spec = get_model_spec(config.model.name);
  check_flavor(spec, config.model.flavor);
  const ParallelismSection& p = config.parallelism;
  const int64_t param_shards =
      std::max<int64_t>(1, env.world_size / p.data_parallel_replicate_degree);
  const at::ScalarType dtype = training_compute_dtype(config.training);
  const int64_t local_ranks = std::max<int64_t>(1, env.local_world_size);

  struct Sizes {
    const char* section;
    int64_t batch, seq_len;
  };
  std::vector<Sizes> runs = {
      {"training", config.training.local_batch_size, config.training.seq_len}};
  if (config.validation.enable) {
    runs.push_back({"validation", config.validation.local_batch_size, config.validation.seq_len});
  }
  for (const Sizes& run : runs) {
    const MemoryEstimate need =
        estimate_training_memory(spec, config.model.flavor, run.batch, run.seq_len, dtype,
                                 training_memory_options(config, param_shards));
    const std::string section = run.section;
    const std::string sizes = section + ".local_batch_size " + std::to_string(run.batch) + " x " +
                              section + ".seq_len " + std::to_string(run.seq_len);
    std::string what =
        "training " + config.model.name + " " + config.model.flavor + " with " + sizes;
    if (device_bytes > 0) {
      what += " (per rank, on its own GPU)";
    } else if (local_ranks > 1) {
      what += " (per rank; " + std::to_string(local_ranks) + " ranks share this machine)";
    }
    const std::string hint =
        need.token_bytes() >= need.total() / 2
            ? "lower " + section + ".local_batch_size or " + section + ".seq_len"
            : "use a smaller model.flavor than '" + config.model.flavor +
                  "', or shard it over more ranks (parallelism.data_parallel_shard_degree)";
    if (device_bytes > 0) {
      check_fits_in_memory(need, device_bytes, what, hint, "the GPU");
    } else {
      check_fits_in_memory(need, available_bytes / static_cast<double>(local_ranks), what, hint);
    }
  }
}

}  // namespace titan
