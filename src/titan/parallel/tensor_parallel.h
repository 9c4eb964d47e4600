// Tensor + sequence parallelism (Megatron-style, TorchTitan's plan) applied to an unmodified model:
// the model's plan (Model::tensor_parallel_plan) says how each layer is split over the `tp` group,
// this file slices the parameters and installs forward hooks (HookedModule) that move
// activations between layouts with conjugate autograd ops:
//
//   all-gather on seq   <->  reduce-scatter on seq   (module inputs / row-wise outputs)
//   reduce-scatter      <->  all-gather
//
// Between layers activations are sequence-sharded, (bs, seqlen / tp, dim): norms run on the shard
// (their replicated weights receive partial gradients, summed over tp by
// reduce_replicated_grads). Attention and the feed-forward all-gather their input on seq, run
// column-wise projections on local heads / hidden features, and reduce-scatter the row-wise
// output projection back to sequence shards. The embedding holds a vocabulary slice (masked
// lookup + reduce-scatter) and the output projection a vocabulary slice of the logits; with loss
// parallel the cross-entropy runs on those vocab-sharded logits (max, sum of exponentials and
// target logit all-reduced), without it the logits are all-gathered first.
//
// Mixture-of-experts layers (found by type, whatever the plan) run on each rank's sequence shard
// with whole, replicated experts by default (their router and expert gradients are partial over
// tp and summed like the norms'). With split_experts (parallelism.expert_tensor_parallel_degree =
// tp) each MoE layer all-gathers its input on seq, so every tp rank routes the whole sequences the
// same way, and holds a slice of every expert's hidden features (routed experts w1 / w3 by rows,
// w2 by columns; the shared experts likewise); the partial outputs are reduce-scattered back to
// sequence shards.
//
// A model may keep activations whole between layers instead (Model::tensor_parallel_activations,
// Megatron-LM without sequence parallelism: FLUX, whose double blocks cut the joint sequence into
// its text and image streams): column-wise layers take the whole input and all-reduce its
// gradient, row-wise layers all-reduce their output, and everything else runs whole on every rank
// with whole gradients, except the head-local q/k norms. Biased layers split their bias with the
// output features (column-wise) or add it once after the reduction (row-wise). A packed layer
// (TpRule::parts: FLUX's fused q, k, v rows, its single block's [q, k, v, MLP] and [attention,
// MLP]) keeps the same slice of every part, a packed ShardBox.
//
// Parameters keep their names; each rank holds a box of every sharded parameter (placements()),
// so checkpoints load into any layout. FSDP composes on top (2D): it shards the TP-local tensors.
#pragma once

#include "titan/distributed/comm.h"
#include "titan/models/common/linear.h"
#include "titan/models/model.h"
#include "titan/parallel/piece.h"

#include <ATen/ATen.h>

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

namespace titan {

class TensorParallel : public ParallelPiece {
 public:
  // Slices `model`'s parameters (identical on every rank) and installs the hooks. Throws
  // ConfigError when the plan is empty, a split does not divide (heads, kv heads, hidden, vocab),
  // or embeddings are tied.
  TensorParallel(Model& model, std::shared_ptr<dist::Group> group, bool loss_parallel,
                 bool split_experts = false);
  ~TensorParallel() override;

  // Mean next-token cross-entropy of the model's output (vocab-sharded logits with loss parallel,
  // whole logits without), equal to lm_cross_entropy_loss on the whole logits.
  at::Tensor cross_entropy(const at::Tensor& logits, const at::Tensor& labels) const override;
  // Sequence-sharded models end in a vocabulary-sharded head; whole activations end whole.
  bool splits_logits() const override { return activations_ == TpActivations::kSequenceSharded; }

  const std::map<std::string, ParamPlacement>& placements() const { return placements_; }
  bool replicated(const std::string& param) const { return placements_.at(param).replicated; }
  // Sums the partial gradients of replicated parameters over the group (in place; undefined ones
  // are skipped, consistently on every rank; whole ones, see TpActivations::kWhole, are left).
  // `grads`: (parameter name, gradient tensor).
  void reduce_replicated_grads(const std::vector<std::pair<std::string, at::Tensor>>& grads) const;

  dist::Group& group() const { return *group_; }
  int64_t size() const;
  bool loss_parallel() const { return loss_parallel_; }
  std::string describe() const override;
  // Seconds the calling thread has spent blocked in tensor-parallel collectives (they are
  // synchronous: activations are needed right away).
  double comm_wait_seconds() const override;
  // The whole parameter from this rank's box `local` (collective over the group), on local's
  // device (gathered on the group's device).
  at::Tensor gather_whole(const std::string& param, const at::Tensor& local) const;

  // ParallelPiece: every parameter's box; the replicated ones' gradients are partial over tp.
  const std::map<std::string, ParamPlacement>* param_placements() const override {
    return &placements_;
  }
  void reduce_partial_grads(const NamedTensors& grads) override { reduce_replicated_grads(grads); }
  dist::Group* norm_group() const override { return group_.get(); }
  void gather_whole(NamedTensors& params) const override {
    for (auto& [name, t] : params) t = gather_whole(name, t);  // replicated: t itself
  }

 private:
  Model& model_;
  std::shared_ptr<dist::Group> group_;
  bool loss_parallel_;
  TpActivations activations_;
  int64_t split_moe_layers_ = 0;
  int64_t held_elements_ = 0, whole_elements_ = 0;  // of the parameters, after the split
  int64_t vocab_start_ = 0;  // first vocabulary id of this rank's output slice
  std::map<std::string, ParamPlacement> placements_;
  // Packed parameters: the split dimension and the sizes of the parts along it.
  std::map<std::string, std::pair<int64_t, std::vector<int64_t>>> packed_;
  // Replicated parameters whose gradients are whole on every rank (not summed).
  std::set<std::string> whole_grads_;
  // The hooks this object added, removed again by the destructor.
  std::vector<std::pair<HookedModule*, const ForwardHook*>> installed_;
  std::vector<Linear*> vocab_sharded_;  // heads whose vocab_shard this instance set

  void install_hook(HookedModule& module, std::shared_ptr<ForwardHook> hook);
  void count_elements();
};

}  // namespace titan
