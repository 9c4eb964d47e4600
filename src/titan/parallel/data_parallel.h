// Data parallelism: FSDP (ZeRO-3), HSDP and DDP in one engine, applied to a Model through its
// units (Model::units(): the token embedding, each transformer block, the final norm + output).
//
//   DataParallel dp(model, options);     // shards the model's parameters and frees the full ones
//   loss = loss_fn(model.forward(x));    // each unit: all-gather its parameters, run, reshard
//   loss.backward();                     // each unit: re-gather if resharded, backward,
//                                        // reduce-scatter its gradients (async)
//   dp.finish_backward();                // wait for the reductions; shard grads are now set
//   clip_grad_norm(grads, max_norm, {dp.norm_group()}); optimizer.step();   // on dp.params()
//
// Sharding (FSDP2's per-parameter Shard(0)): over the shard group of N ranks, each parameter of
// R rows is cut into N chunks of ceil(R / N) rows; rank r holds rows [r * c, min(R, (r + 1) * c))
// (possibly none) as a float32 master shard. A unit's shards live in one flat buffer, so its
// all-gather and reduce-scatter are one collective each:
//   - forward: before a unit runs, its shards are cast to the parameter dtype
//     (training.mixed_precision_param) and all-gathered; the unsharded parameters are installed in
//     the model's layers (parameter_slots) through an autograd function whose backward is the
//     unit's gradient reduction. While unit i runs, unit i + 1's all-gather is in flight.
//   - reshard after forward (parallelism.fsdp_reshard_after_forward): the unsharded storage is
//     freed, and re-gathered when the unit's backward begins (a hook on the unit's output, which
//     also prefetches the unit before it). "default" reshards every unit but the last, whose
//     backward comes right away; "never" keeps them gathered until their backward.
//   - backward: once a unit's gradients are complete they are reduce-scattered in the reduce
//     dtype (training.mixed_precision_reduce, float32), asynchronously, overlapping the backward
//     of the units before it; with a replicate group (HSDP) the result is then all-reduced across
//     replicas. Sums are divided by the data-parallel size, so gradients are those of the mean
//     loss over the global batch. Gradient accumulation adds each micro-batch's reduced shard.
//   - DDP (shard group of 1, replicate group > 1): the same units act as gradient buckets; each is
//     all-reduced asynchronously as soon as its backward is done. Parameters stay whole.
//   - deferred weight gradients (defer_weight_grads, the pipeline's zero-bubble split): a unit's
//     backward during an I step keeps the gradients it got (norms, embeddings) and waits; the W
//     step hands it the Linear weights' gradients, and then its reduction starts as usual.
//   - float8 all-gather (options.float8_all_gather): float8 Linear weights travel as float8
//     bytes, cast on the shards with a scale over the whole weight (torchao's FSDP float8
//     all-gather); the unsharded weight in the param dtype holds their dequantized values.
#pragma once

#include "titan/common/shard_box.h"
#include "titan/distributed/comm.h"
#include "titan/models/common/deferred_grad.h"
#include "titan/models/model.h"
#include "titan/parallel/grad_norm.h"
#include "titan/parallel/piece.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace titan {

struct DataParallelOptions {
  std::shared_ptr<dist::Group> shard_group;       // parameters are sharded over it (null: 1 rank)
  std::shared_ptr<dist::Group> replicate_group;   // gradients are all-reduced over it (null: 1)
  at::ScalarType param_dtype = at::kFloat;        // unsharded parameters, all-gather
  at::ScalarType reduce_dtype = at::kFloat;       // gradient reduce-scatter / all-reduce
  std::string reshard_after_forward = "default";  // default | always | never
  // Units whose all-gather starts ahead of use (forward: the next ones; backward: the previous
  // ones), overlapping their latency with this unit's compute; 0: none.
  int64_t prefetch = 1;
  // The model's parameters are these boxes of larger ones (2D: FSDP over tensor-parallel shards).
  std::map<std::string, ParamPlacement> placements;
  // Where shards live when the model's parameters are on the meta device (shapes only): the
  // shards are then allocated but not filled; the caller initializes them (params()).
  at::Device device = at::kCPU;
  // quantize.linear.float8.enable_fsdp_float8_all_gather: the weights of float8 Linear layers
  // (tensorwise recipe) are cast to float8 on each rank's shard, with one scale per weight from
  // the maximum over all its shards, and all-gathered as float8 bytes; the layer computes with
  // the gathered float8 weight (Linear::float8_weight). Sharded units only (no effect without a
  // shard group). precompute_float8_dynamic_scale_for_fsdp: the scales of every such weight are
  // computed at the start of each forward with one all-reduce, instead of one per unit.
  bool float8_all_gather = false;
  bool float8_precompute_scales = false;
  // The parameters this instance takes (null: all). Two instances can split one model's
  // parameters, each with its own groups (expert parallelism: the experts over dp_shard_mod_ep,
  // the rest over dp_shard); both join the unit-runner chain, and units without parameters of
  // theirs pass through.
  std::function<bool(const std::string&)> param_filter;
  // Reduced gradients are divided by this (0: shard group size x replicate group size, the
  // data-parallel ranks when the groups span them; expert parallelism's instance gives the whole
  // data-parallel size, its ep ranks having summed their tokens' gradients already).
  double grad_divisor = 0;
  // What describe() calls the parameters ("" for all of them; e.g. "experts").
  std::string label;
  // Whether the gradient norm sums over the shard group (ParallelPiece::norm_group): not for an
  // instance whose shard group lies within the other pieces' groups (the experts').
  bool norm_over_shard_group = true;
};

// "memory per rank: parameters 1.2 MiB + gradients ... ; largest gathered unit ..." over the FSDP
// instances among `pieces` (a rank's, of every part; `stages`: they are pipeline stages), or ""
// when none shards parameters.
std::string describe_memory(const std::vector<const ParallelPiece*>& pieces, bool stages);

class DataParallel : public UnitRunner, public ParallelPiece {
 public:
  // Shards `model` (whose parameters must be identical on every rank, e.g. same seed) and adds
  // itself to the model's unit-runner chain (outermost). The model must outlive this object.
  DataParallel(Model& model, DataParallelOptions options);
  ~DataParallel() override;
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  at::Tensor run(int64_t index, const at::Tensor& input, const UnitFn& next) override;
  void begin_forward() override;
  void end_forward() override;

  // The pipeline's zero-bubble split (pipeline.h): while `deferral` collects, a unit's backward
  // adds itself to the collecting DeferredGrads as the consumer of its weights' deferred
  // gradients, with the gradients it got kept aside; once the W step has computed them all, the
  // unit's gradients are reduced as after a plain backward. Null: reduce at once (the default).
  void defer_weight_grads(std::shared_ptr<WeightGradDeferral> deferral);

  // Completes the gradient reductions of the last backward and adds them to the shards'
  // gradients (params()[i].local.grad()). Call after every backward.
  void finish_backward() override;
  // Drops the accumulated gradients.
  void zero_grad() override;

  // The shards, one per parameter, in the model's named_parameters() order.
  const std::vector<ShardedParam>& params() const { return params_; }

  // Every parameter as the model holds it (whole, or its tensor-parallel box), float32, in host
  // memory: a GPU holds one unit gathered at a time (collective over the shard group).
  std::vector<std::pair<std::string, at::Tensor>> gather_full_parameters();
  // Sets the shards from whole parameters: full(name) returns the whole (global_shape) tensor.
  void load_full_parameters(const std::function<at::Tensor(const std::string&)>& full);

  DataParallelMemory memory() const override;
  // Seconds this rank has spent blocked waiting for collectives (the communication that compute
  // did not hide), since construction.
  double comm_wait_seconds() const override;
  // "FSDP over dp_shard 2 (12 units, reshard_after_forward default, param bf16, reduce fp32)"
  std::string describe() const override;

  // ParallelPiece: the shards are the trained tensors.
  const std::vector<ShardedParam>* shards() const override { return &params_; }
  dist::Group* norm_group() const override;
  void gather_held(std::map<std::string, at::Tensor>& held) override;
  void load_whole(const std::function<at::Tensor(const std::string&)>& whole) override {
    load_full_parameters(whole);
  }

  struct Impl;

 private:
  Model& model_;
  std::unique_ptr<Impl> impl_;
  std::vector<ShardedParam> params_;
};

}  // namespace titan
