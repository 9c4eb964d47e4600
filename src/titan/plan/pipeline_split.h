// How a Llama model splits into pipeline stages, as TorchTitan's pipeline_llm does
// (torchtitan/distributed/pipeline_parallel.py, v0.2.2): the stage count (one per rank for GPipe /
// 1F1B; otherwise ceil((layers + first + last weights) / layers_per_stage), or two per rank), the
// module FQNs of each stage (tok_embeddings, layers.i, norm + output, with the first and last
// stages counting the embedding and the output as `*_less_layers` layers), or an explicit
// module_fqns_per_model_part checked against the model; the stage placement (loop or V) and the
// microbatch count. Pure arithmetic: no model, no communication; every error shows its numbers.
// The layout it returns (parallel/pipeline_layout.h) is what the runtime is built from; a table
// that would deadlock is refused here (plan/schedule_simulator.h), before any rank runs it.
#pragma once

#include "titan/config/job_config.h"
#include "titan/parallel/pipeline_layout.h"
#include "titan/parallel/pipeline_schedule.h"

#include <cstdint>
#include <string>
#include <vector>

namespace titan::pp {

// Stages per rank for `kind` (TorchTitan's rule): with layers_per_stage > 0,
// ceil((n_layers + first_less + last_less) / layers_per_stage) stages, which must be a multiple of
// pp, one per rank for GPipe / 1F1B, at least two for the others (exactly two for V schedules);
// with layers_per_stage = -1, one per rank for GPipe / 1F1B and two for the others.
int64_t pipeline_stages_per_rank(ScheduleKind kind, int64_t pp, int64_t n_layers,
                                 int64_t layers_per_stage, int64_t first_less, int64_t last_less);

// TorchTitan's generate_llm_fqn_per_model_part: n_layers + input_weight + output_weight
// "effective" layers spread evenly over n_stages (earlier stages take the remainder); stage 0 holds
// tok_embeddings and input_weight fewer layers, the last stage output_weight fewer layers and
// norm + output. One stage holds the whole model.
std::vector<std::vector<std::string>> generate_llm_fqns_per_stage(int64_t n_stages,
                                                                  int64_t n_layers,
                                                                  int64_t input_weight,
                                                                  int64_t output_weight);

// Checks an explicit module_fqns_per_model_part against a Llama of n_layers: n_stages non-empty
// parts that list tok_embeddings, layers.0 .. layers.{n_layers-1}, norm, output each exactly once,
// in that order. Throws ConfigError naming the part and the module.
void check_module_fqns(const std::vector<std::vector<std::string>>& parts, int64_t n_layers,
                       int64_t n_stages);

// local_batch_size / microbatch_size, which must divide; ConfigError with the arithmetic.
int64_t pipeline_microbatches(int64_t local_batch_size, int64_t microbatch_size);

// Validates the pipeline keys of `parallelism` for a model of n_layers trained with
// local_batch_size sequences per rank, and returns the layout: schedule (ConfigError with the
// nearest name when unknown), stages, per-stage FQNs, placement, microbatches, and the schedule
// table (generated, or loaded from pipeline_parallel_schedule_csv and checked to run every stage
// on the rank the placement puts it, each microbatch once). Also simulates the table so a CSV that
// deadlocks fails here. Needs pipeline_parallel_degree >= 1; with 1 the layout is one stage.
PipelineLayout validate_pipeline(const ParallelismSection& parallelism, int64_t n_layers,
                                 int64_t local_batch_size);

}  // namespace titan::pp
