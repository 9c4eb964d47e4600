// What a pipeline runtime is built from: the schedule, the stages' module FQNs, where each stage
// runs and the microbatches. Made and checked from the config by pp::validate_pipeline
// (plan/pipeline_split.h); the runtime (pipeline.h, parallelized_model.h) only reads it.
#pragma once

#include "titan/parallel/pipeline_schedule.h"

#include <cstdint>
#include <string>
#include <vector>

namespace titan::pp {

// Everything a pipeline run needs to know before building stages.
struct PipelineLayout {
  ScheduleKind schedule = ScheduleKind::k1F1B;
  StagePlacement placement = StagePlacement::kLoop;
  int64_t pp = 1;
  int64_t stages_per_rank = 1;
  int64_t n_microbatches = 1;
  int64_t microbatch_size = 1;
  std::vector<std::vector<std::string>> module_fqns;  // per stage, in model order
  std::vector<int64_t> stage_rank;                    // stage -> pp rank
  std::vector<std::vector<int64_t>> rank_stage_ids;   // pp rank -> its stages, ascending
  bool from_csv = false;  // the table comes from pipeline_parallel_schedule_csv
  ScheduleTable table;    // compute-only table every rank runs
  // The most microbatches a stage holds in flight (pipeline_peak_microbatches in
  // memory_options.h); 0 until someone computes it (the planner, once per layout).
  double peak_microbatches = 0;

  int64_t n_stages() const { return pp * stages_per_rank; }
};

}  // namespace titan::pp
