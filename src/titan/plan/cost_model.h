// The planner's cost model (see the top of planner.h), shared by planner.cpp's search: what the
// planner knows of a model, the share that activation checkpointing recomputes, the pipelines of
// a search validated and simulated once each, and the step time of a valid layout. Internal to
// plan/: `titan plan` and the tests call planner.h.
#pragma once

#include "titan/config/job_config.h"
#include "titan/models/model.h"
#include "titan/plan/pipeline_split.h"
#include "titan/plan/planner.h"

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <tuple>

namespace titan::plan_internal {

constexpr double kGB = 1e9;

// printf-style text of up to three numbers ("%.0f%% of the step computes").
std::string fmt(const char* format, double a, double b = 0, double c = 0);

// What the planner needs of a model beyond ModelStats: the attention and MoE shapes the
// trainer's checks look at.
struct ModelFacts {
  ModelStats stats;  // at (1, seq_len) in the compute dtype
  int64_t n_kv_heads = 0;
  int64_t ffn_dim = 0;
  bool tied = false;
  int64_t num_experts = 0, top_k = 0, moe_layers = 0, expert_hidden = 0;
  double expert_params = 0;
};

ModelFacts model_facts(const JobConfig& config);

// The share of the forward that activation checkpointing `ac` ("none", "full", "op" or every
// k-th block's k) recomputes (see planner.h).
double recompute_share(const std::string& ac, const ModelFacts& m, int64_t seq_len);

struct PipelineSim {
  double makespan_no_comm = 0;  // units of one microbatch-stage forward
  double makespan = 0;          // with the send/recv latency
  double busy = 0;              // the busiest rank's compute
};

// The pipelines of one search, each validated and simulated once: validate_pipeline's layout (or
// why it refuses it) per (pp, schedule, local batch), and the schedule's simulations per
// (layout, recompute, hop latency), which layouts differing only in their data-parallel split
// share.
class PipelineCache {
 public:
  // The layout, or nullptr with the ConfigError's text in *why.
  const pp::PipelineLayout* layout(const JobConfig& config, int64_t n_layers, std::string* why);

  // `layout` (from layout()) run with forward 1, backward 2 + recompute, and comm_units per hop.
  PipelineSim simulate(const pp::PipelineLayout& layout, double recompute, double comm_units);

 private:
  struct Entry {
    std::optional<pp::PipelineLayout> layout;
    std::string rejection;
  };
  std::map<std::tuple<int64_t, std::string, int64_t>, Entry> layouts_;
  std::map<std::tuple<const pp::PipelineLayout*, double, double>, PipelineSim> sims_;
};

// The step time of a valid layout (see the cost model in planner.h), into `out`.
void predict_time(const PlanRequest& request, const ModelFacts& m, const Layout& l,
                  const pp::PipelineLayout* pipeline, PipelineCache& pipelines, Prediction& out);

// One line on what dominates a prediction's step and its memory use.
std::string reasoning(const Prediction& p);

}  // namespace titan::plan_internal
