// The model as training sees it once parallelized: one object that the trainer holds whatever
// parallelisms are active (none, FSDP, HSDP, DDP, TP, 2D, and activation checkpointing), so the
// trainer has no branch on which one is. A model's parallelize function (ModelSpec::parallelize,
// e.g. parallelize_llama3) builds it by applying the pieces in this fixed order:
//
//   1. tensor / sequence parallelism: slices parameters in place and installs forward hooks; the
//      later pieces see the TP-local tensors;
//   2. context parallelism (later): swaps the inner attention kernel;
//   3. activation checkpointing: a unit runner around transformer blocks;
//   4. FSDP / HSDP / DDP last: the outermost unit runner, so a block's parameters are gathered
//      before it runs and again before its backward recomputes it; it shards what TP left.
//
// A model built on the meta device (ModelBuildOptions::meta) holds shapes only: TP slices the
// shapes, FSDP allocates just this rank's shards, materialize() gives what is left (unsharded
// parameters) storage, and init_weights(seed) fills this rank's pieces with the values a
// one-process build of the same seed holds at their boxes. No rank ever holds the whole model.
//
//   auto pm = spec.parallelize(model, dims, options);   // materializes at the end
//   pm->init_weights(seed);                              // unless loading weights next
//   pm->zero_grad();
//   loss = pm->loss(pm->model().forward(x), y);  (loss * scale).backward();
//   pm->finish_backward();                       // after every backward
//   norm = pm->clip_grad_norm(max_norm);         // over every shard, every group
//   optimizer.step() on pm->params()             // this rank's pieces, with their boxes
#pragma once

#include "titan/common/shard_box.h"
#include "titan/config/job_config.h"
#include "titan/distributed/parallel_dims.h"
#include "titan/models/model.h"

#include <ATen/ATen.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace titan {

class TensorParallel;
class ActivationCheckpointing;
class DataParallel;

// What parallelize needs besides the model and the mesh (narrow settings, not the job config).
struct ParallelizeOptions {
  at::ScalarType param_dtype = at::kFloat;   // training.mixed_precision_param
  at::ScalarType reduce_dtype = at::kFloat;  // training.mixed_precision_reduce
  std::string fsdp_reshard_after_forward = "default";
  bool loss_parallel = true;  // !parallelism.disable_loss_parallel
  ActivationCheckpointSection activation_checkpoint;
  // Sequence lengths the model will run at, with the keys that set them (sequence parallelism
  // splits the sequence, so they must divide by the tensor-parallel degree).
  std::vector<std::pair<std::string, int64_t>> seq_lens;
  // Where the parameters of a model built on the meta device get their storage.
  at::Device device = at::kCPU;
  // quantize.linear.float8.enable_fsdp_float8_all_gather / precompute_float8_dynamic_scale_for_fsdp
  // with the float8 converter on (DataParallelOptions::float8_all_gather).
  bool fsdp_float8_all_gather = false;
  bool fsdp_float8_precompute_scales = false;
};

// A parameter as this rank trains it: the tensor the optimizer updates (the whole parameter,
// a TP box, an FSDP row block of either) and where it sits in the whole parameter.
struct TrainedParam {
  std::string name;
  at::Tensor local;  // float32 leaf; its .grad() is complete after finish_backward()
  ShardBox box;
  // Whether this rank writes the box in checkpoints: not where another rank holds the same box
  // (data-parallel replicas, TP-replicated parameters on tp ranks > 0).
  bool writer = true;
  // Ranks of the TP group hold the same tensor (weights 1/tp in the global norm).
  bool tp_replicated = false;
};

class ParallelizedModel {
 public:
  // `dims` (with its groups built when the world has more than one rank) must outlive this.
  ParallelizedModel(std::shared_ptr<Model> model, const ParallelDims& dims, int64_t rank);
  ~ParallelizedModel();
  ParallelizedModel(const ParallelizedModel&) = delete;
  ParallelizedModel& operator=(const ParallelizedModel&) = delete;

  // The pieces, applied by a parallelize function in the order documented above. Each refuses
  // to run out of order. ConfigError for layouts the model cannot take (e.g. heads not divisible).
  void apply_tensor_parallel(bool loss_parallel,
                             const std::vector<std::pair<std::string, int64_t>>& seq_lens);
  void apply_activation_checkpointing(const ActivationCheckpointSection& ac);
  // FSDP / HSDP / DDP from the options' param / reduce dtypes, reshard policy, device and float8
  // all-gather settings.
  void apply_data_parallel(const ParallelizeOptions& options);
  // Gives every parameter still on the meta device uninitialized storage on `device` (its
  // current, possibly TP-sliced shape); last, after the pieces above.
  void materialize(at::Device device);

  // Initializes this rank's pieces of every parameter from `seed` (Model::param_init): the
  // values of a one-process model built with the same seed, at each piece's box.
  void init_weights(uint64_t seed);

  Model& model() { return *model_; }
  // What the optimizer trains on this rank, in the model's named_parameters() order.
  const std::vector<TrainedParam>& params() const { return params_; }

  // Mean next-token loss of forward's logits (loss parallel under tensor parallelism).
  at::Tensor loss(const at::Tensor& logits, const at::Tensor& labels) const;
  // Mean of a per-rank value over the ranks that split the batch (dp_replicate x dp_shard).
  double batch_mean(double value) const;

  void zero_grad();
  // Completes the gradients of the last backward (FSDP's reductions). Call after every backward.
  void finish_backward();
  // Sums TP-partial gradients, then clips every gradient by the global norm (over all shards and
  // groups); returns the norm before clipping.
  double clip_grad_norm(double max_norm);

  // Every parameter whole, float32, in host memory (collective: every rank must call). A GPU
  // holds one unit or parameter gathered at a time.
  std::vector<std::pair<std::string, at::Tensor>> gather_full_parameters();
  // Sets this rank's pieces from whole parameters: whole(name) is the (global shape) tensor.
  void load_full_parameters(const std::function<at::Tensor(const std::string&)>& whole);

  // Whether any collective runs during a step.
  bool communicates() const;
  // Seconds this rank has spent blocked in collectives since construction.
  double comm_wait_seconds() const;
  // One line per applied piece (and FSDP's memory per rank), for the log.
  std::vector<std::string> describe() const;

 private:
  void refresh_params();

  std::shared_ptr<Model> model_;
  const ParallelDims& dims_;
  int64_t rank_;
  std::unique_ptr<TensorParallel> tp_;
  std::unique_ptr<ActivationCheckpointing> ac_;
  std::unique_ptr<DataParallel> dp_;
  std::vector<TrainedParam> params_;
};

// The generic decoder parallelize (the order above), for models whose plan is their
// tensor_parallel_plan() and units(): what parallelize_llama3 does.
std::unique_ptr<ParallelizedModel> parallelize_decoder(std::shared_ptr<Model> model,
                                                       const ParallelDims& dims, int64_t rank,
                                                       const ParallelizeOptions& options);

}  // namespace titan
