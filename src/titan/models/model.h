// What the trainer knows about a model: an nn::Module that maps token ids to logits, plus the
// numbers (parameter counts, FLOPs, activation memory) that can be computed without allocating
// it. Models register themselves in the registry (registry.h); the trainer never names a model.
// Inference (titan generate) additionally runs models incrementally over a KV cache.
#pragma once

#include "titan/common/check.h"
#include "titan/models/common/init.h"
#include "titan/models/common/kv_cache.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace titan {

// Sizes that describe a model configuration analytically (no weights allocated).
struct ModelStats {
  int64_t n_params = 0;            // all trainable parameters (tied weights counted once)
  int64_t n_embedding_params = 0;  // token embedding parameters
  // Parameters one token uses (mixture of experts: the chosen experts only); 0: n_params.
  int64_t n_active_params = 0;
  int64_t n_layers = 0;
  int64_t n_heads = 0;
  int64_t head_dim = 0;
  int64_t dim = 0;
  int64_t vocab_size = 0;
  // Sliding-window layers (gpt-oss): n_window_layers of the n_layers attend over at most
  // attention_window keys, which flops_per_token counts instead of seq_len.
  int64_t n_window_layers = 0;
  int64_t attention_window = 0;
  // Multi-token prediction depths (DeepSeek-V3): each one block more (in the parameters) that
  // attends over seq_len keys, and one more pass through the output head per token, which
  // flops_per_token counts.
  int64_t n_mtp_layers = 0;
  int64_t active_params() const { return n_active_params > 0 ? n_active_params : n_params; }
  // TorchTitan's formula: 6 * (active params - n_embedding_params) + 12 * L * H * head_dim *
  // seq_len (plus the multi-token prediction depths' attention and head passes).
  double flops_per_token(int64_t seq_len) const;
  // Bytes of activations kept for backward by one training micro-batch of (batch, seq_len) tokens
  // when matmuls run in `compute_dtype` (an estimate; attention scores are materialised on CPU).
  int64_t activation_bytes = 0;
  // Parts of activation_bytes, for activation checkpointing estimates: what one transformer
  // block keeps, its input alone (what a fully checkpointed block keeps), and what selective
  // per-op checkpointing keeps of it (input included).
  int64_t block_activation_bytes = 0;
  int64_t block_input_bytes = 0;
  int64_t block_op_kept_bytes = 0;
};

// Options that apply when building a model instance.
struct ModelBuildOptions {
  int64_t max_seq_len = 2048;                 // RoPE table length (training.seq_len)
  at::ScalarType compute_dtype = at::kFloat;  // matmul dtype; parameters stay float32
  uint64_t seed = 0;                          // of the initial weights (debug.seed)
  // Parameters on the meta device: shapes only, no memory, not initialized (buffers such as
  // RoPE tables are real). parallelize then gives each rank storage for its pieces only, and
  // ParallelizedModel::init_weights(seed) fills them with the values build() would have.
  bool meta = false;
};

// A group of parameters that a parallelism treats as one piece (an FSDP unit: all-gathered
// together before the piece runs, reduce-scattered together after its backward).
struct ModelUnit {
  std::string name;                 // "tok_embeddings", "layers.0", "norm, output"
  std::vector<std::string> params;  // parameter FQNs, each in exactly one unit
  // The unit runs more than once per forward (e.g. tied embeddings: lookup and head), so its
  // parameters must stay gathered until the forward is over.
  bool reused_in_forward = false;
  // The unit's transformer block index (0-based, in the whole model: layers.N of a pipeline stage
  // is block N), -1 for other units (embeddings, head). Activation checkpointing wraps blocks only.
  int64_t block = -1;
};

// Tensor parallelism plan (data, applied by src/titan/parallel/tensor_parallel.h), TorchTitan's
// vocabulary. Activations between layers are sequence-sharded (bs, seqlen / tp, dim), or whole
// (TpActivations::kWhole).
enum class TpStyle {
  kEmbedding,         // weight rows (vocab) sharded; masked lookup, output reduce-scattered on seq
  kGatherInput,       // the module's input is all-gathered on seq (attention, feed-forward)
  kColwise,           // weight rows (output features) sharded; no communication
  kRowwise,           // weight columns (input features) sharded; output reduce-scattered on seq
  kSequenceParallel,  // weight replicated; runs on the sequence shard (norms)
  kOutput,            // input all-gathered on seq, weight rows (vocab) sharded: vocab-sharded
                      // logits for loss parallel (or all-gathered without it)
  kReplicated,        // the whole module on every rank: input all-gathered on seq, output cut
                      // back to the rank's sequence shard; weights replicated (Qwen3-Next's
                      // linear attention, whose recurrence needs whole sequences)
  kHeadLocal,         // weight replicated; runs on this rank's heads (the q/k norms of an
                      // attention whose projections are split): its gradient is partial over tp
  kColwiseGathered,   // weight rows sharded, the whole input in, the output all-gathered on the
                      // feature dim (TpActivations::kWhole: a layer whose weight is large and
                      // whose output small, FLUX's modulations); a bias stays whole
};
struct TpRule {
  std::string module;  // FQN; "*" matches one component ("layers.*.attention.wq")
  TpStyle style;
  // A packed layer (kColwise, kRowwise): the sizes of the parts its weight concatenates along
  // the split dimension (FLUX's fused q, k, v rows), each split over tp on its own, so every
  // rank holds the same slice of every part. Empty: one part.
  std::vector<int64_t> parts = {};
};
// How activations lie between the layers of a tensor-parallel model.
enum class TpActivations {
  // (bs, seqlen / tp, dim): sequence parallelism (TorchTitan's plans). Replicated weights run on
  // the rank's share of the tokens, so all their gradients are partial over tp.
  kSequenceSharded,
  // Whole on every rank (Megatron-LM without sequence parallelism): a column-wise layer takes
  // the whole input (its input gradient all-reduced), a row-wise layer's output is all-reduced;
  // replicated weights compute whole gradients, except kHeadLocal ones. Only kColwise, kRowwise,
  // kColwiseGathered and kHeadLocal rules apply.
  kWhole,
};

// One unit of forward as a function of its input (token ids for the first unit, the hidden
// state after). It owns what it needs (captures by value): a runner may call it again later,
// e.g. activation checkpointing recomputes a unit during backward.
using UnitFn = std::function<at::Tensor(const at::Tensor&)>;

// Acts around a model's units. Models call Model::run_unit for each unit of forward; the runners
// installed on the model form a chain, and each gets the unit's input and `next` (the rest of the
// chain, then the unit itself), so a parallelism can act before and after a unit (gather its
// parameters, wrap its output with backward hooks, checkpoint it) without the model knowing.
//
// Chain order: the runner added last runs outermost. parallelize applies activation checkpointing
// before FSDP, so FSDP gathers a unit's parameters before the checkpointed unit runs, and keeps
// them gathered while its backward recomputes it.
class UnitRunner {
 public:
  virtual ~UnitRunner() = default;
  // Around every Model::forward (one per call, also per pipeline microbatch): a runner that
  // tracks a forward's units (FSDP: which are gathered, which unit runs how often) starts over
  // at begin_forward and may release what only that forward needed at end_forward. A unit may
  // run more than once in a forward (ModelUnit::reused_in_forward), as often as the forward
  // needs (multi-token prediction reruns the embedding and the head once per depth).
  virtual void begin_forward() {}
  virtual void end_forward() {}
  // Runs unit `index` (a position in Model::units()) on `input`, calling `next` (possibly again
  // later, see UnitFn), and returns its output.
  virtual at::Tensor run(int64_t index, const at::Tensor& input, const UnitFn& next) = 0;
};

// One auxiliary loss of a forward (ForwardInputs::auxiliary_losses): a 0-d float32 mean
// cross-entropy over the predicted tokens of `labels` (-100: not predicted), differentiable. The
// caller weighs the losses of one `name` (their mean over the forward's entries, e.g. over
// multi-token prediction's depths) into what backward runs on, and logs that mean by name.
struct AuxiliaryLoss {
  std::string name;  // "mtp_loss"
  at::Tensor value;
  at::Tensor labels;  // (bs, seqlen) int64: the targets `value` averages over
};

// What a forward needs besides its tokens, given by whoever runs it (the parallelized model, a
// pipeline stage's microbatch, a test). Every field may be undefined, the default.
struct ForwardInputs {
  // The positions (seqlen) int64 of the tokens, for the rotary embedding: context parallelism
  // hands each rank a subset of the sequence (parallel/context_parallel.h). Undefined:
  // 0 .. seqlen - 1.
  at::Tensor positions;
  // The document of every token of the whole sequences the tokens belong to, (bs, seqlen) int64
  // (document_ids() in models/common/attention.h): attention is then block-causal
  // (model.attn_mask_type = "block_causal"). Under context parallelism forward receives a share
  // of each sequence and these still cover the whole of it. Undefined: causal.
  at::Tensor document_ids;
  // The fused linear + cross-entropy (Model::supports_fused_loss): the targets of the tokens,
  // (bs, seqlen) int64. A model that holds its head then returns the mean cross-entropy of its
  // logits against them, a 0-d float32 tensor, without materialising the logits. Undefined:
  // logits.
  at::Tensor loss_labels;
  // Auxiliary training objectives (multi-token prediction): the next-token targets of the tokens,
  // (bs, seqlen) int64 as the loss takes them (-100: not predicted), and where forward appends the
  // auxiliary losses it computes from them. Either undefined / null: none are computed (inference,
  // validation).
  at::Tensor targets;
  std::vector<AuxiliaryLoss>* auxiliary_losses = nullptr;
  // What conditions a model that is not a token decoder, by name: a diffusion transformer's
  // text features, positions and timesteps (models/flux/model.h lists FLUX's). A token decoder
  // ignores it; a model that needs an entry refuses a forward without it, naming the entry.
  std::map<std::string, at::Tensor> conditioning;
};

// A trainable decoder: forward(tokens (bs, seqlen) int64) -> logits (bs, seqlen, vocab) float32.
// A pipeline stage (keep_only) holds a contiguous run of the modules instead: a stage without the
// embedding takes the previous stage's hidden state, one without the head returns its own.
class Model : public torch::nn::Module {
 public:
  // The whole model, or a first stage: tokens (bs, seqlen) int64. A later stage: the previous
  // stage's output (bs, seqlen, dim), floating point in the dtype that stage returned.
  // Returns logits (bs, seqlen, vocab) float32, or from a stage without the head its hidden state
  // (bs, seqlen, dim), in the model's residual dtype (llama3: the compute dtype when that is
  // bf16/fp16, else the parameters' dtype).
  // `inputs`: what else this forward needs (ForwardInputs; empty: positions 0 .. seqlen - 1,
  // causal attention, logits out).
  // Runs run_forward between the runners' begin_forward and end_forward.
  at::Tensor forward(const at::Tensor& tokens, const ForwardInputs& inputs);
  at::Tensor forward(const at::Tensor& tokens) { return forward(tokens, ForwardInputs{}); }
  // How parameter `name` (an FQN of named_parameters()) starts out; its values then depend only
  // on the seed, the name and the position (init.h), never on how the model is split.
  virtual ParamInit param_init(const std::string& name) const = 0;
  // How parameter `name` starts out in this instance: what a converter that added it set
  // (set_param_init: LoRA's adapters), else param_init(name). Initializers call this one.
  ParamInit initial_value(const std::string& name) const;
  // Sets how parameter `name` (one a converter added) starts out.
  void set_param_init(const std::string& name, const ParamInit& init) { added_inits_[name] = init; }
  // (Re-)initializes every parameter in place: initial_value with `seed`.
  void init_weights(uint64_t seed);
  virtual ModelStats stats(int64_t batch, int64_t seq_len) const = 0;

  // The units of forward, in the order forward first runs them; together they hold every
  // parameter once.
  virtual std::vector<ModelUnit> units() const = 0;
  // How tensor parallelism shards this model (empty: not supported).
  virtual std::vector<TpRule> tensor_parallel_plan() const { return {}; }
  virtual TpActivations tensor_parallel_activations() const {
    return TpActivations::kSequenceSharded;
  }
  // Counts that tensor parallelism splits whole beyond what the plan's own layers check (e.g.
  // the heads of multi-head latent attention), by name: each must divide by the tp degree.
  virtual std::vector<std::pair<std::string, int64_t>> tp_split_counts() const { return {}; }

  // Pipeline parallelism (TorchTitan's pipeline_module_split): makes this instance one stage by
  // keeping the named top-level modules and removing the rest. `modules` is one part of
  // TorchTitan's module_fqns_per_model_part (a contiguous run of tok_embeddings, layers.N, norm,
  // output, in model order; norm and output together); parameter names stay global
  // (layers.2.attention.wq.weight), so checkpoints load across layouts. Afterwards
  // named_parameters(), units(), tensor_parallel_plan() and forward cover only what is kept.
  // Call before parallelize. ConfigError on a bad list (unknown, removed, repeated, out of order,
  // not contiguous: checked here for every model) or for a model that cannot be split (one whose
  // stage_modules() is empty, the default).
  void keep_only(const std::vector<std::string>& modules);
  // Whether forward takes token ids (the model holds its embedding) and whether it returns logits
  // (it holds its head). Both true for a whole model; a pipeline runtime asks them of each stage.
  virtual bool is_first_stage() const { return true; }
  virtual bool is_last_stage() const { return true; }
  // Adds `runner` as the outermost of the chain that forward's units run through (see
  // UnitRunner). The runner must stay alive until removed.
  void add_unit_runner(UnitRunner* runner);
  // Takes `runner` out of the chain (no-op if absent).
  void remove_unit_runner(UnitRunner* runner);
  const std::vector<UnitRunner*>& unit_runners() const { return runners_; }

  // Multi-token prediction's logits without autograd (whole models): one (bs, seqlen, vocab)
  // float32 tensor per depth k, position t predicting token t + k + 1 (the last k positions
  // read wrapped tokens and mean nothing); empty for a model without prediction depths.
  virtual std::vector<at::Tensor> mtp_logits(const at::Tensor& tokens) { return {}; }

  // Why this model cannot (yet) be split by `parallelism` ("pipeline", "tensor", "context"), or
  // empty when it can; parallelize refuses with the reason (a ConfigError) before applying it.
  virtual std::string refuses(const std::string& parallelism) const { return {}; }

  // The fused linear + cross-entropy (compile.components "loss", models/common/fused_loss.h):
  // whether a forward given ForwardInputs::loss_labels returns the loss instead of logits.
  virtual bool supports_fused_loss() const { return false; }

  // Incremental inference without autograd: tokens (bs, n) int64 are positions
  // [start_pos, start_pos + n) of sequences whose positions [0, start_pos) are already in
  // `cache` (start_pos <= cache.length; a smaller start_pos rewinds). Returns their logits
  // (bs, n, vocab) as forward() would compute them for the whole sequence, and leaves
  // cache.length = start_pos + n. A model without a cached path says so.
  virtual at::Tensor forward_cached(const at::Tensor& tokens, KVCache& cache, int64_t start_pos) {
    TITAN_CHECK(false,
                "this model has no KV-cache inference path. HINT: generate without the "
                "cache (--no_kv_cache)");
    return {};
  }
  // The first step of incremental inference for a prompt that comes with conditioning (the
  // vision-language model's images, ForwardInputs::conditioning's entries for the prompt): the
  // prompt's logits at positions [0, n), the cache filled; later steps are forward_cached. A model
  // that takes no conditioning refuses entries; without entries this is forward_cached(tokens,
  // cache, 0).
  virtual at::Tensor prefill_cached(const at::Tensor& tokens,
                                    const std::map<std::string, at::Tensor>& conditioning,
                                    KVCache& cache);

 protected:
  // Pipeline stages: the top-level modules this instance holds, in model order (empty: the model
  // cannot be split), and the model's own part of keep_only, given a list that passed the
  // generic checks: its own rules (ConfigError), then the removal of what is not kept.
  virtual std::vector<std::string> stage_modules() const { return {}; }
  virtual void keep_modules(const std::set<std::string>& kept) {}

  // The model's forward (see forward), which calls run_unit for each unit.
  virtual at::Tensor run_forward(const at::Tensor& tokens, const ForwardInputs& inputs) = 0;

  // Forward implementations call this for each unit: fn(input) through the runner chain.
  at::Tensor run_unit(int64_t index, const at::Tensor& input, const UnitFn& fn) const;

 private:
  std::vector<UnitRunner*> runners_;  // innermost first
  std::map<std::string, ParamInit> added_inits_;
};

}  // namespace titan
