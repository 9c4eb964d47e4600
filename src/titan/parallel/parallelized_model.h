// The model as training sees it once parallelized: one object that the trainer holds whatever
// parallelisms are active (none, FSDP, HSDP, DDP, TP, PP, their 2D / 3D compositions, and
// activation checkpointing), so the trainer has no branch on which one is. A parallelize function
// (parallelize.h) builds it by applying the pieces in this fixed order; pipeline parallelism
// splits the model into parts, and each part holds the later pieces as a stack (piece.h), in
// apply order, that every question (zero_grad, finish_backward, the gradient norm, whole
// parameters, the log) walks without knowing which pieces it holds:
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
#include "titan/models/common/linear.h"
#include "titan/models/common/moe.h"
#include "titan/models/model.h"
#include "titan/parallel/grad_norm.h"
#include "titan/parallel/piece.h"
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

class PipelineRuntime;

// The model as training runs it, made by parallelize on every part before the parallelisms
// (TorchTitan converts the model before parallelize and compiles inside it): full bf16
// parameters (training.dtype), model.converters (float8 linears), and compile's kernels.
struct ModelPreparation {
  TrainingSection training;
  int64_t world_size = 1;  // full bf16 training is one process for now
  std::string layout;      // the parallelism, for that refusal
  ModelSection model;      // converters, print_after_conversion
  Float8LinearSection float8;
  LoraSection lora;  // with "lora" in model.converters
  CompileSection compile;
  at::ScalarType compute_dtype = at::kFloat;
  int64_t seq_len = 0;                    // the kernels' log names the paths for it
  MXLinearSection mx;                     // with "quantize.linear.mx" in model.converters
  QuantizeSection::GroupedMM grouped_mm;  // with "quantize.grouped_mm.*" in model.converters
};

// What parallelize needs besides the model and the mesh (narrow settings, not the job config).
struct ParallelizeOptions {
  // Absent: the parts train as built.
  std::optional<ModelPreparation> prepare;
  at::ScalarType param_dtype = at::kFloat;   // training.mixed_precision_param
  at::ScalarType reduce_dtype = at::kFloat;  // training.mixed_precision_reduce
  std::string fsdp_reshard_after_forward = "default";
  int64_t fsdp_prefetch_units = 1;  // DataParallelOptions::prefetch
  bool loss_parallel = true;        // !parallelism.disable_loss_parallel
  ActivationCheckpointSection activation_checkpoint;
  // Sequence lengths the model will run at, with the keys that set them (sequence parallelism
  // splits the sequence, so they must divide by the tensor-parallel degree).
  std::vector<std::pair<std::string, int64_t>> seq_lens;
  // Where the parameters of a model built on the meta device get their storage.
  at::Device device = at::kCPU;
  // quantize.linear.float8.enable_fsdp_float8_all_gather / precompute_float8_dynamic_scale_for_fsdp
  // (DataParallelOptions::float8_all_gather): they act on the layers the float8 converter
  // converted (none: inert, as in TorchTitan when the converter is off).
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
  // linear + cross-entropy (ForwardInputs::loss_labels; models/common/fused_loss.h).
  bool fused_loss = false;
  // QLoRA (lora.quantize_base): data parallelism leaves the frozen linear weights of the blocks
  // (nf4_candidates in linear.h) to each rank whole (or as tensor parallelism split them), so
  // that they can be held in NF4 after the base is loaded (quantize_frozen_base).
  bool keep_frozen_block_linears = false;
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
  // Not trained (a base weight under LoRA): no gradient, no optimizer state; checkpoints still
  // hold it.
  bool frozen = false;
  // A weight matrix (models/common/linear.h matrix_parameters), what Muon orthogonalizes.
  bool matrix = false;
};

// What a batch of packed samples (chat fine-tuning) carries besides tokens and labels.
struct PackedBatch {
  // (bs, seq) int64 RoPE positions, restarting at 0 with each sample; undefined: 0 .. seq - 1.
  at::Tensor positions;
  // (bs, seq) int64 sample of every token: attention stays within a sample (block-causal);
  // undefined: from model.attn_mask_type (set_block_causal_mask).
  at::Tensor document_ids;
  // > 0: the loss is the batch's sum over its predicted tokens times this (token_weighted_loss in
  // components/loss.h; the trainer's global-batch token mean); 0: the mean over them.
  double token_factor = 0;
  // What conditions a model that is not a token decoder (ForwardInputs::conditioning: FLUX's
  // text features, timesteps, positions), this rank's rows.
  std::map<std::string, at::Tensor> conditioning;
};

class ParallelizedModel {
 public:
  // `dims` (with its groups built when the world has more than one rank) must outlive this.
  ParallelizedModel(std::shared_ptr<Model> model, const ParallelDims& dims, int64_t rank);
  ~ParallelizedModel();
  ParallelizedModel(const ParallelizedModel&) = delete;
  ParallelizedModel& operator=(const ParallelizedModel&) = delete;

  // The stack, as a parallelize function (parallelize.h) builds it in the order documented
  // above. Each step is announced first (advance), and refused after a later one.
  enum class Step { kNone, kPipeline, kTensor, kExpert, kContext, kCheckpoint, kData };
  void advance(Step step, const char* order);
  // Pipeline parallelism (apply_pp): this rank's stages (stage id, model; the first is the model
  // given to the constructor), each a part, run by `runtime`. Without it the model is the part.
  void set_pipeline(std::vector<std::pair<int64_t, std::shared_ptr<Model>>> stages,
                    std::unique_ptr<PipelineRuntime> runtime);
  bool pipelined() const { return pipeline_ != nullptr; }
  const ParallelDims& dims() const { return dims_; }
  int64_t rank() const { return rank_; }
  size_t n_parts() const { return parts_.size(); }
  Model& part_model(size_t part);
  std::shared_ptr<Model> shared_model() const;  // part 0's
  // `part`'s pieces, in apply order; and `piece` on top of them (null: nothing).
  std::vector<ParallelPiece*> pieces(size_t part) const;
  void add_piece(size_t part, std::unique_ptr<ParallelPiece> piece);
  // Every parameter's box on this rank as `part`'s pieces left it (a later piece's entry wins).
  // `owners` (optional): the piece whose entry each is.
  std::map<std::string, ParamPlacement> placements(
      size_t part, std::map<std::string, const ParallelPiece*>* owners = nullptr) const;
  // Block-causal attention for training and validation: forward_backward and evaluate give the
  // model the document ids of each batch (document_ids(inputs, end_token), from the whole
  // sequences, before context parallelism shards them). Any time before the first step.
  void set_block_causal_mask(int64_t end_token) { document_end_token_ = end_token; }
  // The fused linear + cross-entropy for training and validation: the last stage computes the
  // loss in its head (ForwardInputs::loss_labels) instead of returning logits. ConfigError for a
  // model without it. Any time before the first step.
  void set_fused_loss();
  // Auxiliary losses (ForwardInputs::auxiliary_losses: multi-token prediction's "mtp_loss"):
  // training runs backward on loss + weight x (the mean of the forward's `name` entries). A model
  // that reports a loss without a weight is an error. Any time before the first step.
  void set_auxiliary_loss_weight(const std::string& name, double weight) {
    auxiliary_weights_[name] = weight;
  }
  // The auxiliary losses of the last forward_backward, by name, each the mean of its entries
  // (detached, this rank's, not token-weighted; under PP none): for the metrics.
  const std::map<std::string, at::Tensor>& auxiliary_losses() const { return auxiliary_; }
  // Gives every parameter still on the meta device uninitialized storage on `device` (its
  // current, possibly TP-sliced shape); last, after the pieces.
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
  // With `packing`, see PackedBatch.
  at::Tensor forward_backward(const at::Tensor& inputs, const at::Tensor& labels, double loss_scale,
                              const PackedBatch& packing = {});
  // The mean loss of a batch without autograd (validation), on every rank.
  at::Tensor evaluate(const at::Tensor& inputs, const at::Tensor& labels,
                      const PackedBatch& packing = {});

  // Mean next-token loss of forward's logits (loss parallel under tensor parallelism); with
  // floating-point labels (a regression target) the mean squared error.
  at::Tensor loss(const at::Tensor& logits, const at::Tensor& labels) const;
  // Mean of a per-rank value (a 0-d tensor on the device) over the ranks that split the batch
  // (dp_replicate x dp_shard, and cp, whose ranks hold equal shares of the sequences), on the
  // device: nothing is read back to the host.
  at::Tensor batch_mean(const at::Tensor& value) const;
  // batch_mean, issued: the collective runs while the caller goes on (the training step's
  // gradient norm and optimizer step, so that a link's latency is paid once for both); the
  // returned function waits for it and returns the mean. Call it once.
  std::function<at::Tensor()> batch_mean_async(const at::Tensor& value) const;

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
  // holds one unit or parameter gathered at a time; under PP every stage's parameters reach every
  // rank (checkpoint/stage_gather.h). With state_buffers, the state buffers too (MoE expert
  // biases, whole on every rank that holds their layer): a model as exports write it.
  std::vector<std::pair<std::string, at::Tensor>> gather_full_parameters(
      bool state_buffers = false);
  // Sets this rank's pieces from whole parameters: whole(name) is the (global shape) tensor, or
  // an undefined tensor to keep the parameter as it is.
  void load_full_parameters(const std::function<at::Tensor(const std::string&)>& whole);

  // QLoRA: the frozen linear weights of the blocks to NF4 (quantize_frozen_nf4 on every part,
  // after their values are loaded); they leave params(), so checkpoints and the optimizer no
  // longer see them. One rank without parallel pieces only, for now (a clear error otherwise).
  Nf4Quantized quantize_frozen_base(const kernels::Nf4Options& options = {});

  // Mixture-of-experts layers, after each optimizer step (collective: every rank): load
  // balancing (balance_expert_loads in models/common/moe.h) with each layer's token counts
  // summed over the ranks that split the batch (dp x cp, and tp, whose ranks route their own
  // sequence shards). Nothing for a dense model.
  MoELoads update_moe_load_balance();
  // Buffers that are training state, by name (state_buffers in models/common/moe.h), and whether
  // this rank is the one that writes them to checkpoints.
  std::vector<std::pair<std::string, at::Tensor>> state_buffers() const;
  bool writes_state_buffers() const;

  // Whether any collective runs during a step.
  bool communicates() const;
  // Seconds this rank has spent blocked in collectives since construction.
  double comm_wait_seconds() const;
  // One line per applied piece (and FSDP's memory per rank), for the log.
  std::vector<std::string> describe() const;

 private:
  // One model part (the model, or one pipeline stage) with its pieces, in apply order.
  struct Part;
  void refresh_params();
  std::vector<ParallelPiece*> all_pieces() const;  // of every part, in order
  // The models of every part.
  std::vector<torch::nn::Module*> models() const;
  // The batch as this rank's model parts take it (document ids from the whole sequences, then
  // each piece's share: context parallelism's).
  ForwardBatch prepare(const at::Tensor& inputs, const at::Tensor& labels,
                       const PackedBatch& packing) const;
  // `value` all-reduced over dims' group `group` (on its device), back on value's device.
  at::Tensor reduce_over(const char* group, const at::Tensor& value, dist::ReduceOp op) const;
  // Forward of the whole model (no PP) to the mean loss (token_weighted_loss with a factor), and
  // what backward runs on: the loss, or with `auxiliary` the loss plus the model's auxiliary
  // losses by their weights (left in `auxiliary`, detached, by name).
  std::pair<at::Tensor, at::Tensor> forward_loss(
      const ForwardBatch& batch, double token_factor = 0,
      std::map<std::string, at::Tensor>* auxiliary = nullptr);

  const ParallelDims& dims_;
  int64_t rank_;
  std::vector<std::unique_ptr<Part>> parts_;
  std::unique_ptr<PipelineRuntime> pipeline_;
  Step applied_ = Step::kNone;
  // Block-causal attention: the token ending a document (absent: causal).
  std::optional<int64_t> document_end_token_;
  bool fused_loss_ = false;
  std::map<std::string, double> auxiliary_weights_;
  std::map<std::string, at::Tensor> auxiliary_;  // of the last forward_backward
  std::vector<TrainedParam> params_;
  std::vector<size_t> param_part_;                 // params_[i] belongs to parts_[param_part_[i]]
  std::vector<const ParallelPiece*> param_owner_;  // the piece that placed params_[i], or null
};

}  // namespace titan
