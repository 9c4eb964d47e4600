// The memory options every memory estimate of a job shares (see memory_options.h).
#include "titan/plan/memory_options.h"

#include "titan/common/check.h"
#include "titan/components/training_dtype.h"
#include "titan/models/lora.h"
#include "titan/models/registry.h"
#include "titan/parallel/activation_checkpoint.h"

#include <algorithm>
#include <optional>

namespace titan {

double muon_share(const JobConfig& config) {
  // The token embedding and the output head take AdamW (norms and biases too, a rounding
  // error next to them); the rest are Muon's matrices.
  const ModelStats s =
      get_model_spec(config.model.name)
          .describe(config.model.flavor, 1, 1, training_compute_dtype(config.training));
  if (s.n_params <= 0) return 0;
  const double adamw = std::min<double>(
      static_cast<double>(s.n_params),
      static_cast<double>(s.n_embedding_params) + static_cast<double>(s.vocab_size * s.dim));
  return 1.0 - adamw / static_cast<double>(s.n_params);
}

MemoryOptions training_memory_options(const JobConfig& config, int64_t param_shards) {
  const ParallelismSection& p = config.parallelism;
  std::optional<pp::PipelineLayout> pipeline;
  if (p.pipeline_parallel_degree > 1) {
    const ModelSpec& spec = get_model_spec(config.model.name);
    const int64_t n_layers =
        spec.describe(config.model.flavor, 1, 1, training_compute_dtype(config.training)).n_layers;
    pipeline = pp::validate_pipeline(p, n_layers, config.training.local_batch_size);
  }
  return training_memory_options(config, param_shards, pipeline ? &*pipeline : nullptr);
}

MemoryOptions training_memory_options(const JobConfig& config, int64_t param_shards,
                                      const pp::PipelineLayout* pipeline) {
  const ParallelismSection& p = config.parallelism;
  MemoryOptions o;
  o.param_shards = param_shards;
  const int64_t pp = std::max<int64_t>(1, p.pipeline_parallel_degree);
  // A pipeline stage holds 1/pp of the layers (bf16 copies and activations).
  o.activation_shards = p.tensor_parallel_degree * pp;
  // Context parallelism: each rank holds seq_len / cp tokens of every sequence.
  o.sequence_shards = std::max<int64_t>(1, p.context_parallel_degree);
  const AcPolicy ac = ac_policy(config.activation_checkpoint);
  o.ac_every = ac.every;
  o.ac_per_op = ac.per_op;
  o.bf16_state = config.training.dtype == "bfloat16";
  o.bf16_optimizer_state = config.optimizer.state_dtype == "bfloat16";
  if (config.optimizer.name == "Muon") o.muon_share = muon_share(config);
  if (lora_enabled(config.model)) {
    o.trained_params = lora_trained_params(config.model, config.lora);
    o.nf4_base_params = qlora_base_params(config.model, config.lora);
    // The adapters are matrices: all of them Muon's.
    if (config.optimizer.name == "Muon") o.muon_share = 1;
  }
  // Routed experts: each ep rank holds its own, each split over tp when etp = tp; FSDP then
  // shards them over the rest (dp_shard_mod_ep), so a rank holds 1 / param_shards of them, except
  // where the tp ranks all hold the same whole experts (tp > 1, no ep, etp 1).
  const int64_t tp = std::max<int64_t>(1, p.tensor_parallel_degree);
  const int64_t ep = std::max<int64_t>(1, p.expert_parallel_degree);
  const int64_t etp = std::max<int64_t>(1, p.expert_tensor_parallel_degree);
  o.expert_shards = pp * ep * etp;
  o.expert_param_shards =
      ep == 1 && etp < tp ? std::max<int64_t>(1, param_shards / tp) : param_shards;
  // data_parallel.cpp: "never" keeps the units gathered, and so does "default" under PP.
  o.fsdp_keeps_gathered = p.fsdp_reshard_after_forward == "never" ||
                          (pp > 1 && p.fsdp_reshard_after_forward == "default");
  o.fsdp_prefetch_units = p.fsdp_prefetch_units;
  if (pp > 1) {
    // The stage keeps the microbatches its schedule has in flight (1F1B: pp at the first
    // stage; GPipe: all of them).
    TITAN_CHECK(pipeline != nullptr, "training_memory_options: pp ", pp, " without its pipeline");
    const double peak =
        pipeline->peak_microbatches > 0
            ? pipeline->peak_microbatches
            : pipeline_peak_microbatches(pipeline->table, pipeline->stages_per_rank);
    o.pipeline_sequences_in_flight = peak * static_cast<double>(pipeline->microbatch_size);
  }
  return o;
}

double pipeline_peak_microbatches(const pp::ScheduleTable& table, int64_t stages_per_rank) {
  int64_t peak = 0;
  for (const auto& rank : table) {
    int64_t held = 0;
    const auto count = [&](const pp::Action& a) {
      if (a.kind == pp::ActionKind::kForward) ++held;
      if (a.kind == pp::ActionKind::kFullBackward || a.kind == pp::ActionKind::kBackwardInput) {
        --held;
      }
    };
    for (const pp::Slot& slot : rank) {
      if (!slot) continue;
      // DualPipeV's overlapped pair: the forward's activations exist while the backward runs.
      if (slot->kind == pp::ActionKind::kOverlapForwardBackward) {
        for (const pp::Action& sub : slot->sub_actions) count(sub);
        peak = std::max(peak, held + 1);
        continue;
      }
      count(*slot);
      peak = std::max(peak, held);
    }
  }
  return static_cast<double>(peak) / static_cast<double>(std::max<int64_t>(1, stages_per_rank));
}

}  // namespace titan
