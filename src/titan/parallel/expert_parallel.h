// Expert parallelism (TorchTitan's, expert_tensor_parallel_degree 1): the routed experts of every
// MoE layer are split over the `ep` group, rank j holding experts [j * E / ep, (j + 1) * E / ep),
// and each MoE forward exchanges its routed tokens with the ranks that hold their experts:
//
//   counts   all-to-all of the per-expert token counts (each rank learns how many rows it gets
//            from every peer, for each of its experts)
//   dispatch all-to-all of the routed rows (this rank's rows for rank j's experts go to j)
//   compute  the received rows, regrouped by local expert, through this rank's experts
//   combine  the reverse all-to-all: every row comes back to the rank that routed it
//
// Dispatch and combine are autograd functions whose backward is the conjugate exchange, so the
// router, the experts and everything before them get the gradients of the one-process model.
// Each rank's experts receive the gradient of the tokens of every ep rank; FSDP then shards the
// experts over dp_shard_mod_ep (the ranks holding the same experts) and reduces over it, dividing
// by the whole data-parallel size like every other gradient (DataParallelOptions::grad_divisor).
//
// Parameters keep their names; an expert weight's box is its slice of dim 0, so checkpoints move
// between EP layouts. The router, the shared experts and the rest of the model are untouched.
#pragma once

#include "titan/distributed/comm.h"
#include "titan/models/model.h"
#include "titan/parallel/piece.h"

#include <ATen/ATen.h>

#include <map>
#include <memory>
#include <set>
#include <string>

namespace titan {

class ExpertParallel : public ParallelPiece {
 public:
  // Slices the experts of every MoE layer of `model` (identical on every rank; the meta device is
  // fine) and installs the all-to-all runner. `tp_placements`: tensor parallelism's boxes when it
  // already split the experts' hidden features (expert_tensor_parallel_degree = tp); the experts'
  // boxes then carry both splits. ConfigError when the model has no MoE layer or a layer's expert
  // count does not divide by the group size.
  ExpertParallel(Model& model, std::shared_ptr<dist::Group> group,
                 const std::map<std::string, ParamPlacement>* tp_placements = nullptr);
  ~ExpertParallel() override;
  ExpertParallel(const ExpertParallel&) = delete;
  ExpertParallel& operator=(const ExpertParallel&) = delete;

  // The expert weights ("<layer>.experts.w1.weight", ...) with this rank's boxes.
  const std::map<std::string, ParamPlacement>& placements() const { return placements_; }
  bool holds(const std::string& param) const { return placements_.count(param) != 0; }
  // The expert weight whole along the experts from this rank's slice (collective over the group;
  // a tensor-parallel split stays for TensorParallel::gather_whole).
  at::Tensor gather_whole(const std::string& param, const at::Tensor& local) const;

  dist::Group& group() const { return *group_; }
  // Seconds this rank has spent in the token exchanges (they are synchronous).
  double comm_wait_seconds() const override;
  std::string describe() const override;

  // ParallelPiece: the experts' boxes (their gradients are complete: each rank's experts got
  // the gradients of every ep rank's tokens).
  const std::map<std::string, ParamPlacement>* param_placements() const override {
    return &placements_;
  }
  void gather_whole(NamedTensors& params) const override {
    for (auto& [name, t] : params) {
      if (holds(name)) t = gather_whole(name, t);
    }
  }

  struct Stats;

 private:
  Model& model_;
  std::shared_ptr<dist::Group> group_;
  std::map<std::string, ParamPlacement> placements_;
  std::shared_ptr<Stats> stats_;
  int64_t layers_ = 0, experts_per_rank_ = 0;
};

}  // namespace titan
