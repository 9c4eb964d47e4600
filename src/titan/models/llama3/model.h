// The Llama 3 decoder: tok_embeddings -> layers -> norm -> output. Module and parameter names
// match TorchTitan's (tok_embeddings.weight, layers.0.attention.wq.weight, ...,
// layers.0.feed_forward.w1.weight, layers.0.attention_norm.weight, norm.weight, output.weight)
// because checkpoints and parallelism plans address parameters by these names. The model holds
// no parallelism code; plans act on the public submodules below.
#pragma once

#include "titan/models/common/attention.h"
#include "titan/models/common/feed_forward.h"
#include "titan/models/common/gated_delta_net.h"
#include "titan/models/common/linear.h"
#include "titan/models/common/mla.h"
#include "titan/models/common/moe.h"
#include "titan/models/common/norms.h"
#include "titan/models/common/rope.h"
#include "titan/models/llama3/args.h"
#include "titan/models/model.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace titan::llama3 {

// h = x + attention(attention_norm(x)); out = h + feed_forward(ffn_norm(h)), with an MoE in
// place of the feed-forward in MoE layers and multi-head latent attention in place of GQA in
// MLA models.
class TransformerBlock : public torch::nn::Module {
 public:
  TransformerBlock(int64_t layer_id, const Llama3Args& args, at::ScalarType compute_dtype);

  // x (bs, seqlen, dim) -> (bs, seqlen, dim), in x's dtype. `positions`, `cache` and
  // `document_ids` as in Attention::forward (training: no cache; incremental inference: the cache
  // step).
  at::Tensor forward(const at::Tensor& x, const RotaryEmbedding& rope,
                     const at::Tensor& positions = {}, const KVCacheStep* cache = nullptr,
                     const at::Tensor& document_ids = {});
  // TorchTitan's init of the parameter `name` (relative to the block): norms ones;
  // wq/wk/wv/w1 (and MLA's wq_a/wq_b/wkv_a/wkv_b) trunc_normal(0.02); wo/w2/w3
  // trunc_normal(weight_init_std).
  ParamInit param_init(const std::string& name) const;

  std::shared_ptr<Attention> attention;  // null with MLA (args.mla) or linear attention
  // Qwen3-Next's linear attention layers (args.is_linear_attention_layer), registered as
  // "linear_attention"; null in the others.
  std::shared_ptr<GatedDeltaNet> linear_attention;
  // Multi-head latent attention, registered as "attention" too (DeepSeek-V3); null without MLA.
  std::shared_ptr<MultiHeadLatentAttention> latent_attention;
  std::shared_ptr<FeedForward> feed_forward;  // null in an MoE block
  std::shared_ptr<MoE> moe;                   // null in a dense block
  std::shared_ptr<RMSNorm> attention_norm;
  std::shared_ptr<RMSNorm> ffn_norm;
  int64_t layer_id;        // index in the whole model (the N of layers.N)
  double weight_init_std;  // 0.02 / sqrt(2 * (layer_id + 1)) with depth_init, else / sqrt(2 L)

 private:
  Llama3Args args_;  // the model's (for the inits that depend on it)
};

// One multi-token prediction depth (DeepSeek-V3's MTP module; Llama3Args::num_mtp_layers):
//   h_k = norm(block(eh_proj([enorm(e), hnorm(h_{k-1})])))
// with e the embedding of the token `depth` positions ahead and h_{k-1} the previous depth's
// h (for depth 1 the main model's last hidden state after its final norm, what transformers'
// MtpModel and vLLM read). h_k goes through the model's output head (without its norm) to the
// logits of the token depth + 1 positions ahead, and on to the next depth (as transformers'
// MtpModel chains them).
class MtpModule : public torch::nn::Module {
 public:
  MtpModule(int64_t depth, const Llama3Args& args, at::ScalarType compute_dtype);
  // x = [e, h_{k-1}] (bs, seqlen, 2 dim) in the residual dtype -> h_k (bs, seqlen, dim) in x's
  // dtype; `positions` and `document_ids` as in TransformerBlock::forward.
  at::Tensor forward(const at::Tensor& x, const RotaryEmbedding& rope, const at::Tensor& positions,
                     const at::Tensor& document_ids);

  std::shared_ptr<RMSNorm> enorm;
  std::shared_ptr<RMSNorm> hnorm;
  std::shared_ptr<Linear> eh_proj;          // 2 dim -> dim
  std::shared_ptr<TransformerBlock> block;  // layer id args.mtp_layer_id(depth)
  std::shared_ptr<RMSNorm> norm;            // before the shared head
};

// The targets of multi-token prediction depth `depth` (>= 1): position t predicts
// targets[t + depth] (the token depth + 1 ahead), -100 (not predicted) where t + depth is past
// the sequence or, with document ids (bs, seqlen), in another document than t.
at::Tensor mtp_targets(const at::Tensor& targets, const at::Tensor& document_ids, int64_t depth);

// The whole decoder, or one pipeline stage of it (keep_only). With tie_embeddings there is no
// `output` module: the head multiplies by tok_embeddings.weight, and the shared tensor is listed
// once by parameters().
class Transformer : public Model {
 public:
  // Parameters are allocated (on the thread's parameter device, see ParamDeviceGuard) but not
  // initialized; call init_weights(seed) (build() in the spec does).
  Transformer(const Llama3Args& args, at::ScalarType compute_dtype = at::kFloat);

  // tokens (bs, seqlen) int64 -> logits (bs, seqlen, vocab), float32 (float64 if the
  // parameters were cast to float64). A stage without tok_embeddings takes the hidden state
  // (bs, seqlen, dim) in the residual dtype (what embed and the blocks return); one without the
  // head returns it.
  // Multi-token prediction (num_mtp_layers > 0, whole models): given ForwardInputs::targets and
  // auxiliary_losses, forward also runs the depths after the head and appends each depth's mean
  // cross-entropy as an AuxiliaryLoss "mtp_loss" (the fused loss when the head computes one).
  at::Tensor run_forward(const at::Tensor& tokens, const ForwardInputs& inputs) override;
  using Model::forward;
  // tokens (bs, n) -> logits (bs, n, vocab) for positions [start_pos, start_pos + n); see Model.
  // Whole models only.
  at::Tensor forward_cached(const at::Tensor& tokens, KVCache& cache, int64_t start_pos) override;
  // Defined for every parameter of the whole model, present in this stage or not.
  ParamInit param_init(const std::string& name) const override;
  // The whole model's numbers, also on a pipeline stage (the trainer reports model size and MFU
  // for the model, not for one stage).
  ModelStats stats(int64_t batch, int64_t seq_len) const override;
  // tok_embeddings, layers.0 .. layers.{L-1}, "norm, output" (TorchTitan's FSDP units), those
  // present in this stage, then mtp.0 .. (multi-token prediction). With tied embeddings the
  // head's weight is the embedding's, so the first unit also holds the final norm and runs
  // twice per forward; with multi-token prediction the embedding and the head run once more per
  // depth.
  std::vector<ModelUnit> units() const override;
  // TorchTitan's Llama plan (tp_plan.cpp): sequence-parallel norms, column-wise wq/wk/wv/w1/w3,
  // row-wise wo/w2, row-wise embedding, column-wise output with loss parallel; rules for present
  // modules only (tensor parallelism rejects a rule that matches nothing).
  std::vector<TpRule> tensor_parallel_plan() const override;
  // Multi-head latent attention's heads (grouped-query attention checks its own).
  std::vector<std::pair<std::string, int64_t>> tp_split_counts() const override;
  // See Model::keep_only. Removed modules are unregistered and their members set to null;
  // `layers` keeps the present blocks in order (TransformerBlock::layer_id is the global index)
  // and `rope` (buffers only) stays. With tie_embeddings only the whole model can be kept:
  // ConfigError otherwise, as TorchTitan rejects weight tying with pipeline parallelism.
  std::vector<std::string> stage_modules() const override;
  void keep_modules(const std::set<std::string>& kept) override;
  bool is_first_stage() const override { return tok_embeddings != nullptr; }
  bool is_last_stage() const override { return norm != nullptr; }
  bool supports_fused_loss() const override { return true; }
  std::vector<at::Tensor> mtp_logits(const at::Tensor& tokens) override;
  // Multi-token prediction does not compose with pipeline, tensor or context parallelism yet.
  std::string refuses(const std::string& parallelism) const override;

  // The stages of forward, for callers that run layers themselves (pipeline stages,
  // activation checkpointing). embed: (bs, seqlen) -> h (bs, seqlen, dim) in the residual dtype;
  // head: h -> logits as forward returns them.
  at::Tensor embed(const at::Tensor& tokens);
  // The final norm and the output projection: logits, or with `labels` the fused loss.
  at::Tensor head(const at::Tensor& h, const at::Tensor& labels);

  const Llama3Args& args() const { return args_; }
  at::ScalarType compute_dtype() const { return compute_dtype_; }

  std::shared_ptr<Embedding> tok_embeddings;              // null in a stage without it
  std::shared_ptr<RotaryEmbedding> rope;                  // buffers rope.cos / rope.sin (derived)
  std::vector<std::shared_ptr<TransformerBlock>> layers;  // registered as layers.<layer_id>
  std::shared_ptr<RMSNorm> norm;                          // null in a stage without the head
  std::shared_ptr<Linear> output;  // null when tie_embeddings or in a stage without the head
  std::vector<std::shared_ptr<MtpModule>> mtp;  // registered as mtp.<depth - 1>

 protected:
  // The first units of forward up to the embedded tokens, in the residual dtype: unit `unit`
  // embeds them (advancing `unit` past what ran). A model that embeds more than tokens (the
  // vision-language model: images in place of placeholder tokens) runs its own units here first
  // and reports where the embedding's unit is (embedding_unit) for the head's and the
  // multi-token prediction's reuse of it.
  virtual at::Tensor embed_units(const at::Tensor& tokens, const ForwardInputs& inputs,
                                 int64_t& unit);
  virtual int64_t embedding_unit() const { return 0; }
  // forward_cached from the embedded tokens h (bs, n, dim) in the residual dtype, without
  // autograd.
  at::Tensor forward_cached_embedded(const at::Tensor& h, KVCache& cache, int64_t start_pos);

 private:
  // Whether this instance holds every module (not a pipeline stage).
  bool is_whole() const;

  // The head without the final norm: hn -> logits, or the fused loss against `labels`.
  at::Tensor project(const at::Tensor& hn, const at::Tensor& labels);

  Llama3Args args_;
  at::ScalarType compute_dtype_;
  std::shared_ptr<torch::nn::Module> layer_list_;  // the "layers" container
};

}  // namespace titan::llama3
