// Whole parameters of a pipeline-parallel model on every rank, for export (Hugging Face folders,
// tools, tests): each rank holds the stages it runs, whole; stage by stage, the rank that runs a
// stage broadcasts its tensors' names and shapes, then each tensor, over the pipeline group.
//
//   NamedTensors all = gather_stages({{0, whole_of_stage_0}}, layout.stage_rank, pp_group);
#pragma once

#include "titan/distributed/comm.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace titan::ckpt {

// One stage's tensors, whole, in host memory.
struct StageTensors {
  int64_t stage = 0;
  std::vector<std::pair<std::string, at::Tensor>> tensors;
};

// Every stage's tensors in stage order, float32 in host memory, on every rank of `pp`
// (collective). `mine`: the stages this rank runs; `stage_rank[s]`: the pp rank that runs stage
// s. Without a pipeline group (null) `mine` is returned as it is.
std::vector<std::pair<std::string, at::Tensor>> gather_stages(
    const std::vector<StageTensors>& mine, const std::vector<int64_t>& stage_rank, dist::Group* pp);

}  // namespace titan::ckpt
