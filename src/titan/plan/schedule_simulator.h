// The pipeline schedule simulator (planning, not runtime): runs a schedule table under its data
// dependencies, to refuse a table that deadlocks before any rank runs it, and to measure a
// schedule's bubble (idle) fraction and makespan under a cost model for `titan plan` and
// `titan pipeline-schedule`.
#pragma once

#include "titan/parallel/pipeline_schedule.h"

#include <cstdint>
#include <vector>

namespace titan::pp {

// Time units per action in the simulator.
struct ActionCosts {
  double forward = 1;
  double full_backward = 2;
  double backward_input = 1;
  double backward_weight = 1;
  double comm = 0;  // latency from a send (or a cross-rank producer) to its consumer
};

struct SimulationResult {
  double makespan = 0;       // when the last rank finishes
  std::vector<double> busy;  // per rank: time computing
  std::vector<double> idle;  // per rank: makespan - busy
  int64_t n_actions = 0;     // actions run (idle steps not counted)
  // Idle share of all ranks' time: sum(idle) / (ranks * makespan); (p - 1) / (m + p - 1) for
  // GPipe and 1F1B when a backward costs twice a forward.
  double bubble_fraction() const;
};

// Runs every rank's actions in table order (idle steps skipped, as PyTorch's runtime does), each
// starting when its rank is free and its inputs exist: F(s, m) after F(s-1, m); B / I(s, m) after
// F(s, m) and B / I(s+1, m); W(s, m) after I(s, m). In a table with sends and receives a compute
// fed from another rank waits for its posted RECV, which completes `comm` after the peer's SEND;
// receives are posted without blocking, as PyTorch's runtime does. Throws ConfigError on a
// deadlock, naming each stuck rank's action and what it waits for, with the table.
SimulationResult simulate_schedule(const ScheduleTable& table, const ActionCosts& costs = {});

}  // namespace titan::pp
