// The settings of a job's memory estimate (estimate_training_memory, plan/memory_estimate.h)
// from its config: the one mapping that `titan train`'s start-up check, `titan inspect` and
// `titan plan` (planner.h) share, so the three never disagree.
#pragma once

#include "titan/config/job_config.h"
#include "titan/parallel/pipeline_schedule.h"
#include "titan/plan/memory_estimate.h"
#include "titan/plan/pipeline_split.h"

#include <cstdint>

namespace titan {

// The estimate's settings for `config` (activation checkpointing, training.dtype, its tp, pp, cp
// and ep degrees, the pipeline schedule's microbatches in flight) with parameters sharded over
// `param_shards` ranks (world_size / dp_replicate): the one mapping `titan train`'s start-up
// check, `titan inspect` and `titan plan` share. Throws the trainer's ConfigError for a pipeline
// it would refuse.
MemoryOptions training_memory_options(const JobConfig& config, int64_t param_shards);
// The same with the config's pipeline already validated (pp::validate_pipeline; nullptr without
// pipeline parallelism), as the planner holds it.
MemoryOptions training_memory_options(const JobConfig& config, int64_t param_shards,
                                      const pp::PipelineLayout* pipeline);

// Under optimizer.name = "Muon": the share of the model's parameters that are Muon's matrices
// (all but the token embedding and the output head), MemoryOptions::muon_share.
double muon_share(const JobConfig& config);

// The most microbatches whose activations one pp rank holds at once in `table` (a forward
// adds its microbatch, the backward that consumes it, B or I, removes it), over all ranks, in
// whole-rank units: a stage holds 1 / stages_per_rank of its rank's layers.
double pipeline_peak_microbatches(const pp::ScheduleTable& table, int64_t stages_per_rank);

}  // namespace titan
