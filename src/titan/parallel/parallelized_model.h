// The model as training sees it once parallelized: one object that the trainer holds whatever
// parallelisms are active (none, FSDP, HSDP, DDP, TP, PP, their 2D / 3D compositions, and
// activation checkpointing), so the trainer has no branch on which one is. A model's parallelize
// function (ModelSpec::parallelize, e.g. parallelize_llama3) builds it by applying the pieces in
// this fixed order:
//
//   0. pipeline parallelism: splits the model into stages (Model::keep_only); this rank keeps its
//      stages (one, or several for the multi-stage schedules), each a model part, and every later
//      piece applies to each part; a schedule runtime (pipeline.h) runs them;
//   1. tensor / sequence parallelism: slices parameters in place and installs forward hooks; the
//      later pieces see the TP-local tensors;
//   1b. expert parallelism: slices every MoE layer's routed experts over the ep group and swaps
//      in the all-to-all token exchange (expert_parallel.h); FSDP later shards the experts over
//      dp_shard_mod_ep with a second DataParallel instance, the rest as usual;
//   2. context parallelism: every attention layer's inner kernel becomes ring attention over the
//      cp group; forward_backward / evaluate shard the batch along the sequence (and give the
//      model its tokens' positions), FSDP shards over dp_shard x cp, losses average over dp x cp;
//   3. activation checkpointing: a unit runner around transformer blocks;
//   4. FSDP / HSDP / DDP last: the outermost unit runner, so a block's parameters are gathered
//      before it runs and again before its backward recomputes it; it shards what TP left.
//
// A model built on the meta device (ModelBuildOptions::meta) holds shapes only: TP slices the
// shapes, FSDP allocates just this rank's shards, materialize() gives what is left (unsharded
// parameters) storage, and init_weights(seed) fills this rank's pieces with the values a
// one-process build of the same seed holds at their boxes. No rank ever holds the whole model.
//
//   auto pm = parallelize_fn(name)(model, dims, rank, options);   // materializes at the end
//   pm->init_weights(seed);                              // unless loading weights next
//   pm->zero_grad();
//   loss = pm->forward_backward(x, y, scale);    // per micro-batch (a whole schedule under PP)
//   GradNorm n = pm->grad_norm(max_norm);        // over every shard, every group, on the device
//   optimizer.step(lr, n.clip_coef) on pm->params()   // this rank's pieces, with their boxes
#pragma once

#include "titan/common/shard_box.h"
#include "titan/config/job_config.h"
#include "titan/distributed/parallel_dims.h"
#include "titan/models/model.h"
#include "titan/parallel/context_parallel.h"
#include "titan/parallel/grad_norm.h"
#include "titan/parallel/pipeline_layout.h"

#include <ATen/ATen.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace titan {

class TensorParallel;
class ActivationCheckpointing;
class DataParallel;
class PipelineRuntime;

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
  // Context parallelism (dims.cp() > 1): parallelism.context_parallel_load_balancer ("headtail",
  // or "none" / "" for contiguous shards) and context_parallel_rotate_method.
  std::string cp_load_balancer = "headtail";
  std::string cp_rotate_method = "allgather";
  // Pipeline parallelism (dims.pp() > 1): the layout (pp::validate_pipeline) and a builder of
  // another copy of the model as the given one was built (meta device, dtype, converters), for
  // this rank's further stages.
  std::optional<pp::PipelineLayout> pipeline;
  std::function<std::shared_ptr<Model>()> build_model;
  // model.attn_mask_type = "block_causal": packed documents end at this token (the tokenizer's
  // EOS), and attention stays within each document. Absent: causal over the whole sequence.
  std::optional<int64_t> document_end_token;
  // compile.enable with "loss" in compile.components: the head and the loss run as the fused
  // linear + cross-entropy (Model::set_loss_labels; models/common/fused_loss.h).
  bool fused_loss = false;
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
  // Pipeline: the given model keeps this rank's first stage, `build` makes the others.
  void apply_pipeline(const pp::PipelineLayout& layout,
                      const std::function<std::shared_ptr<Model>()>& build, at::Device device);
  void apply_tensor_parallel(bool loss_parallel,
                             const std::vector<std::pair<std::string, int64_t>>& seq_lens);
  // Experts split over the ep group (dims.ep() > 1; a no-op otherwise). After tensor
  // parallelism, before activation checkpointing. ConfigError for a model without MoE layers or
  // expert counts that ep does not divide.
  void apply_expert_parallel();
  // Ring attention in every attention layer over the cp group, for the sequence lengths given
  // (each must divide by 2 x cp with headtail, cp without, and the share by tp).
  void apply_context_parallel(const std::string& load_balancer, const std::string& rotate_method,
                              const std::vector<std::pair<std::string, int64_t>>& seq_lens);
  void apply_activation_checkpointing(const ActivationCheckpointSection& ac);
  // FSDP / HSDP / DDP from the options' param / reduce dtypes, reshard policy, device and float8
  // all-gather settings.
  void apply_data_parallel(const ParallelizeOptions& options);
  // Block-causal attention for training and validation: forward_backward and evaluate give the
  // model the document ids of each batch (document_ids(inputs, end_token), from the whole
  // sequences, before context parallelism shards them). Any time before the first step.
  void apply_block_causal_mask(int64_t end_token);
  // The fused linear + cross-entropy for training and validation: the last stage computes the
  // loss in its head (Model::set_loss_labels) instead of returning logits. ConfigError for a
  // model without it. Any time before the first step.
  void apply_fused_loss();
  // Gives every parameter still on the meta device uninitialized storage on `device` (its
  // current, possibly TP-sliced shape); last, after the pieces above.
  void materialize(at::Device device);

  // Initializes this rank's pieces of every parameter from `seed` (Model::param_init): the
  // values of a one-process model built with the same seed, at each piece's box.
  void init_weights(uint64_t seed);

  // The model (under PP: this rank's first stage).
  Model& model();
  // What the optimizer trains on this rank, part by part in named_parameters() order.
  const std::vector<TrainedParam>& params() const { return params_; }

  // One micro-batch's forward and backward on this rank's batch (tokens and labels (bs, seq)):
  // under PP the whole schedule over the layout's microbatches. Backward runs on the loss times
  // `loss_scale`; the gradients are complete on return (finish_backward is done). Returns the
  // mean loss (detached) on every rank.
  at::Tensor forward_backward(const at::Tensor& inputs, const at::Tensor& labels,
                              double loss_scale);
  // The mean loss of a batch without autograd (validation), on every rank.
  at::Tensor evaluate(const at::Tensor& inputs, const at::Tensor& labels);

  // Mean next-token loss of forward's logits (loss parallel under tensor parallelism).
  at::Tensor loss(const at::Tensor& logits, const at::Tensor& labels) const;
  // Mean of a per-rank value (a 0-d tensor on the device) over the ranks that split the batch
  // (dp_replicate x dp_shard, and cp, whose ranks hold equal shares of the sequences), on the
  // device: nothing is read back to the host.
  at::Tensor batch_mean(const at::Tensor& value) const;

  void zero_grad();
  // Completes the gradients of the last backward (FSDP's reductions). Call after every backward.
  void finish_backward();
  // Sums TP-partial gradients, then the global norm over all shards and groups and the clipping
  // coefficient, both on the device (grad_norm.h); the gradients are not scaled.
  GradNorm grad_norm(double max_norm);
  // grad_norm, then every gradient scaled by the coefficient; returns the norm before clipping
  // (one host read: for tests and tools).
  double clip_grad_norm(double max_norm);

  // Every parameter whole, float32, in host memory (collective: every rank must call). A GPU
  // holds one unit or parameter gathered at a time.
  std::vector<std::pair<std::string, at::Tensor>> gather_full_parameters();
  // Sets this rank's pieces from whole parameters: whole(name) is the (global shape) tensor.
  void load_full_parameters(const std::function<at::Tensor(const std::string&)>& whole);

  // Mixture-of-experts layers, after each optimizer step (collective: every rank): each layer's
  // token counts since the last call, summed over the ranks that split the batch (dp x cp, and
  // tp, whose ranks route their own sequence shards), move the layer's expert bias toward balance
  // (MoE::update_expert_bias) and restart. Returns (layer name, max/mean expert load) for this
  // rank's MoE layers (none for a dense model): the names, and the ratios as one float64 tensor
  // on the device (read it when logging; nothing is read back here).
  struct MoELoads {
    std::vector<std::string> layers;
    at::Tensor max_over_mean;  // (layers) float64
  };
  MoELoads update_moe_load_balance();
  // Buffers that are training state, by name (the MoE layers' expert biases, identical on the
  // ranks that hold the layer), and whether this rank is the one that writes them to checkpoints.
  std::vector<std::pair<std::string, at::Tensor>> state_buffers() const;
  bool writes_state_buffers() const;

  // Whether any collective runs during a step.
  bool communicates() const;
  // Seconds this rank has spent blocked in collectives since construction.
  double comm_wait_seconds() const;
  // One line per applied piece (and FSDP's memory per rank), for the log.
  std::vector<std::string> describe() const;

 private:
  // One model part (the model, or one pipeline stage) with the parallelisms applied to it.
  struct Part;
  void refresh_params();
  bool has_tp() const;
  bool has_dp() const;
  bool has_ep() const;
  const char* shard_group_name() const;  // FSDP's: dp_shard, or dp_shard_cp with cp

  const ParallelDims& dims_;
  int64_t rank_;
  std::vector<std::unique_ptr<Part>> parts_;
  std::unique_ptr<PipelineRuntime> pipeline_;
  bool applied_tp_ = false, applied_ep_ = false, applied_cp_ = false, applied_ac_ = false,
       applied_dp_ = false;
  // Context parallelism: the sequence layout of each sequence length (empty without cp).
  std::map<int64_t, SequenceLayout> cp_layouts_;
  RotateMethod cp_rotate_ = RotateMethod::kAllGather;  // for describe()
  // This rank's share of a batch along the sequence, and the model's token positions.
  std::pair<at::Tensor, at::Tensor> context_shard(const at::Tensor& inputs,
                                                  const at::Tensor& labels);
  // Block-causal attention: the token ending a document (absent: causal). The document ids of a
  // batch (undefined when causal); without PP they are set on the model here, under PP the
  // runtime sets each microbatch's.
  std::optional<int64_t> document_end_token_;
  at::Tensor set_documents(const at::Tensor& inputs);
  bool fused_loss_ = false;
  // Forward of the whole model (no PP) to the mean loss.
  at::Tensor forward_loss(const at::Tensor& inputs, const at::Tensor& labels);
  std::vector<TrainedParam> params_;
  std::vector<size_t> param_part_;  // params_[i] belongs to parts_[param_part_[i]]
};

}  // namespace titan
