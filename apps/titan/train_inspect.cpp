// `titan train` and `titan inspect`.
#include "commands.h"

#include "titan/common/cpu.h"
#include "titan/common/format.h"
#include "titan/common/logging.h"
#include "titan/components/training_dtype.h"
#include "titan/config/config_manager.h"
#include "titan/distributed/init.h"
#include "titan/distributed/parallel_dims.h"
#include "titan/models/registry.h"
#include "titan/plan/memory_estimate.h"
#include "titan/plan/memory_options.h"
#include "titan/trainer/memory_check.h"
#include "titan/trainer/trainer.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <optional>

namespace titan {

bool maybe_print_help(const std::string& command, const std::vector<std::string>& args) {
  const bool wants = std::any_of(args.begin(), args.end(),
                                 [](const std::string& a) { return a == "--help" || a == "-h"; });
  if (!wants) return false;
  std::fputs(render_help(command).c_str(), stdout);
  if (command == "train" || command == "inspect") {
    std::printf("\nmodels and flavors:\n");
    for (const auto& name : registered_models()) {
      const ModelSpec& spec = get_model_spec(name);
      for (const auto& flavor : spec.flavors) {
        std::printf("  %s %-14s %s\n", name.c_str(), flavor.c_str(),
                    spec.describe_flavor(flavor).c_str());
      }
    }
  }
  return true;
}

int run_train(const std::vector<std::string>& args) {
  JobConfig config = parse_job_config(args);
  // Sizes that cannot fit fail here, on every rank alike, before anything is allocated.
  const LaunchEnv env = detect_launch_env();
  check_training_memory(config, env, machine_memory_bytes(), training_device_memory(config, env));
  // Joins the job when launched with several ranks (titan run, torchrun, srun, mpirun).
  DistributedContext dist = init_distributed(config.comm);
  if (config.job.print_config && dist.rank() == 0) {
    std::fputs(render_config_toml(config).c_str(), stdout);
  }
  log_info("job: ", config.job.description, " (config ",
           config.job.config_file.empty() ? "defaults" : config.job.config_file, ")");
  const CommSection comm = config.comm;
  {
    Trainer trainer(std::move(config), &dist);
    // After the trainer holds the dump folder, as TorchTitan writes it at start-up.
    if (dist.rank() == 0) {
      const std::string saved = save_config_file(trainer.config());
      if (!saved.empty()) log_info("config saved to ", saved, " (job.save_config_file)");
    }
    trainer.train();
  }
  finalize_distributed(dist, comm);  // leave together: rank 0 hosts the store
  return 0;
}

static std::string gib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%8.3f GiB", bytes / (1024.0 * 1024.0 * 1024.0));
  return buf;
}

int run_inspect(const std::vector<std::string>& args) {
  JobConfig config = parse_job_config(args);
  if (config.job.print_config) std::fputs(render_config_toml(config).c_str(), stdout);
  const ModelSpec& spec = get_model_spec(config.model.name);
  check_flavor(spec, config.model.flavor);
  if (spec.objective != ModelObjective::kNextToken) {
    throw ConfigError(message(
        "titan inspect's memory model is a text decoder's; the ",
        spec.objective == ModelObjective::kFlowMatching ? "flow-matching" : "vision-language",
        " model '", spec.name, "' (", config.model.flavor, ": ",
        spec.describe_flavor(config.model.flavor), ", ",
        with_commas(spec.describe(config.model.flavor, 1, 1, at::kFloat).n_params),
        " parameters) has none yet"));
  }
  const auto& t = config.training;
  const at::ScalarType dtype = training_compute_dtype(t);
  const ModelStats s = spec.describe(config.model.flavor, t.local_batch_size, t.seq_len, dtype);
  const double flops = s.flops_per_token(t.seq_len);

  std::printf("model            %s %s: %s\n", config.model.name.c_str(),
              config.model.flavor.c_str(), spec.describe_flavor(config.model.flavor).c_str());
  std::printf("parameters       %s total, %s non-embedding", with_commas(s.n_params).c_str(),
              with_commas(s.n_params - s.n_embedding_params).c_str());
  if (s.active_params() != s.n_params) {
    std::printf(", %s active per token (MoE: the chosen experts)",
                with_commas(s.active_params()).c_str());
  }
  std::printf("\n");
  // Sliding-window layers count their window's keys instead of T (ModelStats::flops_per_token).
  const std::string attention =
      s.n_window_layers == 0 ? std::string("12*L*H*head_dim*T")
                             : message("12*H*head_dim*(", s.n_layers - s.n_window_layers, "*T + ",
                                       s.n_window_layers, "*min(T, ", s.attention_window, "))");
  std::printf("FLOPs per token  %.4g (seq_len %lld; 6*(N%s - N_emb) + %s)\n", flops,
              (long long)t.seq_len, s.active_params() != s.n_params ? "_active" : "",
              attention.c_str());
  std::printf("FLOPs per step   %.4g per rank (local_batch_size %lld x seq_len %lld)\n",
              flops * static_cast<double>(t.local_batch_size * t.seq_len),
              (long long)t.local_batch_size, (long long)t.seq_len);
  // The layout: the degrees over WORLD_SIZE ranks when it is set (dp_shard -1 takes the rest),
  // else over their product.
  const ParallelDegrees degrees = ParallelDegrees::from_config(config.parallelism);
  int64_t world = degrees.dp_replicate * std::max<int64_t>(1, degrees.dp_shard) * degrees.cp *
                  degrees.tp * degrees.pp;
  if (const char* text = std::getenv("WORLD_SIZE"); text != nullptr && *text != '\0') {
    const std::optional<int64_t> n = parse_int64(text);
    if (!n || *n < 1) {
      throw ConfigError(message("WORLD_SIZE must be a positive integer, got '", text, "'"));
    }
    world = *n;
  }
  const ParallelDims dims = ParallelDims::planned(degrees, world);
  // FSDP shards parameters, gradients and optimizer state over dp_shard x cp, tensor
  // parallelism over tp and pipeline stages over pp; sequence parallelism splits activations
  // over tp, and a pipeline stage keeps only its schedule's microbatches in flight.
  const int64_t param_shards = dims.dp_shard() * dims.cp() * dims.tp() * dims.pp();
  std::printf("layout           %s\n", dims.describe().c_str());
  const MemoryEstimate memory =
      estimate_training_memory(spec, config.model.flavor, t.local_batch_size, t.seq_len, dtype,
                               training_memory_options(config, param_shards));
  std::printf("memory per rank (training step, %lld rank%s, %s compute):\n", (long long)world,
              world == 1 ? "" : "s", at::toString(dtype));
  int width = 23;
  for (const MemoryEstimate::Part& part : memory.parts) {
    width = std::max(width, static_cast<int>(part.name.size()));
  }
  for (const MemoryEstimate::Part& part : memory.parts) {
    std::printf("  %-*s %s%s\n", width, part.name.c_str(), gib(part.bytes).c_str(),
                part.name.rfind("activations", 0) == 0
                    ? ("  (local_batch_size " + std::to_string(t.local_batch_size) + ", seq_len " +
                       std::to_string(t.seq_len) + ")")
                          .c_str()
                    : "");
  }
  std::printf("  %-*s %s  (this machine: %s; `titan train` refuses above %gx)\n", width, "total",
              gib(memory.total()).c_str(), gib(machine_memory_bytes()).c_str(),
              kMemoryRefuseFactor);
  return 0;
}

}  // namespace titan
