// Pipeline parallelism's runtime: one rank's stages (model parts holding only their modules, see
// Model::keep_only) and the loop that runs this rank's row of a schedule table
// (pipeline_schedule.h) on them, one training step at a time:
//
//   F(s, m)  stage s forwards microbatch m: its input is the tokens (first stage), the previous
//            stage's output on this rank, or a tensor received from the rank that holds stage
//            s - 1; its output is sent to the rank of stage s + 1 right away (asynchronously), or
//            on the last stage turned into the microbatch's loss.
//   B(s, m)  the stage's backward from its output with the gradient received from stage s + 1
//            (or from the loss); the gradient of its input goes to stage s - 1.
//   I, W     the zero-bubble split of B (schedules with I actions only): I(s, m) runs the
//            backward from the stage's output with weight-gradient deferral active
//            (deferred_grad.h), so each Linear layer computes only the gradient of its input and
//            records its weight GEMM (grad_output^T @ x, float8 as the recipe casts it); the
//            input's gradient leaves for stage s - 1 at once. Gradients of the other weights
//            (norms, embeddings) are computed in I. W(s, m) runs the recorded GEMMs of (s, m), in
//            the order I met them, and frees their operands: no FSDP, each weight's .grad gets its
//            gradient added; FSDP/DDP (DataParallel::defer_weight_grads), each unit's backward in I
//            kept its other gradients and waits, and its reduction starts as soon as W has
//            computed its weights' gradients. I + W cost one B: nothing runs twice (with
//            activation checkpointing the recomputation happens once, in I). The operands
//            (activation and output gradient of every Linear) stay alive from I to W. B actions
//            of the same schedules run the plain backward.
//
// Sends are posted without blocking and completed at the end of the step; a receive blocks until
// its data is there. A schedule that passes validate_pipeline's simulation (same rules: compute
// waits for its inputs, sends do not block) therefore cannot deadlock. Tags name the stage
// boundary, microbatch and direction, so transfers never pair up wrongly; the first transfer over
// a boundary for a given microbatch shape also sends the tensor's shape and dtype. Transfers to a
// higher pp rank travel on one sub-group of the pp ranks and those to a lower rank on another:
// NCCL runs a pair's point-to-point ops in order on one stream, and two ranks that each send to
// the other before receiving (1F1B's steady state: an activation one way, a gradient the other)
// would wait on each other there; with one direction per communicator they cannot. NCCL also
// pairs a rank's k-th send to a peer with the peer's k-th receive from it, whatever the tags, so
// a rank receives from each peer in the order the peer sends (pp::rank_transfers, which
// pp::check_transfer_order proves for every table before a run): an action that needs a message
// first receives what that peer sent before it, and keeps those until their actions run (the
// zero-bubble schedules and DualPipeV use an activation and a same-shaped gradient between two
// ranks in another order than they are sent).
//
// Loss: the last stage computes loss_fn(logits, labels) per microbatch; backward runs on
// loss * loss_scale / n_microbatches, so gradients are those of the mean over microbatches (each
// microbatch has the same number of tokens: the mean over the step's tokens). The step's loss
// (that mean) is broadcast from the last stage's rank, so every rank reports it.
#pragma once

#include "titan/distributed/comm.h"
#include "titan/models/common/deferred_grad.h"
#include "titan/models/model.h"
#include "titan/parallel/device_streams.h"
#include "titan/parallel/pipeline_layout.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace titan {

class PipelineRuntime {
 public:
  struct Stage {
    int64_t id = 0;  // global stage index
    Model* model = nullptr;
  };
  using LossFn = std::function<at::Tensor(const at::Tensor& logits, const at::Tensor& labels)>;

  // `stages`: this rank's stages (layout.rank_stage_ids[group->rank()]), in that order. `group`:
  // the pp group (null only when pp = 1).
  PipelineRuntime(pp::PipelineLayout layout, std::shared_ptr<dist::Group> group,
                  std::vector<Stage> stages, const at::Device& device);
  ~PipelineRuntime();
  PipelineRuntime(const PipelineRuntime&) = delete;
  PipelineRuntime& operator=(const PipelineRuntime&) = delete;

  // One step's forward and backward of this rank's local batch (inputs / labels (bs, seq)),
  // split into the layout's microbatches, as this rank's row of the schedule says. Returns the
  // mean microbatch loss (a float32 scalar on the device), on every rank of the pp group.
  // `context`: the batch's ForwardInputs (its loss_labels unused): the document ids (bs, whole
  // seq; block-causal attention) are split into the same microbatches, each stage's forward gets
  // its microbatch's; positions (seq) go to every forward as they are, positions (bs, seq) of
  // packed samples are split as the documents. `token_factor` > 0: each microbatch's loss is its
  // sum over predicted tokens times token_factor (token_weighted_loss in components/loss.h), the
  // returned value their sum; 0: the mean microbatch loss.
  at::Tensor train_step(const at::Tensor& inputs, const at::Tensor& labels, const LossFn& loss_fn,
                        double loss_scale, const ForwardInputs& context = {},
                        double token_factor = 0);
  // Forward only, without autograd (validation): microbatches of the layout's size (the last may
  // be smaller), each through every stage in order. Returns the token-weighted mean loss on
  // every rank of the pp group.
  at::Tensor evaluate(const at::Tensor& inputs, const at::Tensor& labels, const LossFn& loss_fn,
                      const ForwardInputs& context = {});

  // The fused linear + cross-entropy (ForwardInputs::loss_labels): the last stage's forward gets
  // each microbatch's labels and returns the loss; loss_fn goes unused.
  void set_fused_loss(bool on) { fused_loss_ = on; }
  const pp::PipelineLayout& layout() const { return layout_; }
  // Seconds this rank spent blocked on receives and sends since construction.
  double comm_wait_seconds() const { return clock_->seconds(); }
  // "pipeline: 1F1B over pp 2, stages [0] of 2 on this rank, 4 microbatches of 2"
  std::string describe() const;

  struct StepState;

 private:
  bool is_first(int64_t stage) const { return stage == 0; }
  bool is_last(int64_t stage) const { return stage == layout_.n_stages() - 1; }
  Stage& local(int64_t stage);
  int64_t rank_of(int64_t stage) const { return layout_.stage_rank[stage]; }
  int tag(int64_t boundary, int64_t microbatch, int kind) const;

  // Sends `t` (an activation crossing `boundary` = the sending stage for forwards) to `dst`.
  void send(const at::Tensor& t, int64_t dst, int64_t boundary, int64_t microbatch, int kind,
            const std::vector<int64_t>& key_shape);
  at::Tensor recv_activation(int64_t src, int64_t boundary, int64_t microbatch,
                             const std::vector<int64_t>& key_shape);
  at::Tensor recv_like(const at::Tensor& like, int64_t src, int64_t boundary, int64_t microbatch,
                       int kind);
  // The activation (gradient = false) or gradient crossing `boundary` for microbatch m, from
  // `src`: in a training step, after what `src` sends this rank before it (see the top).
  at::Tensor receive(StepState& st, int64_t src, bool gradient, int64_t boundary, int64_t m);
  void finish_sends();

  void forward(StepState& st, int64_t stage, int64_t m, bool grad);
  void backward(StepState& st, int64_t stage, int64_t m);
  // I(s, m): backward with the weights' gradients deferred; W(s, m): their GEMMs.
  void backward_input(StepState& st, int64_t stage, int64_t m);
  void backward_weight(StepState& st, int64_t stage, int64_t m);
  WeightGradDeferral& deferral(int64_t stage);
  at::Tensor mean_from_last_stage(const at::Tensor& local_mean);

  pp::PipelineLayout layout_;
  std::shared_ptr<dist::Group> group_;
  std::vector<Stage> stages_;
  bool fused_loss_ = false;
  // Per stage (as stages_): the weight-gradient deferral its Linear layers and data parallelism
  // share; null unless the schedule splits backwards into I and W.
  std::vector<std::shared_ptr<WeightGradDeferral>> deferrals_;
  at::Device device_;
  int64_t rank_ = 0;
  std::unique_ptr<WaitClock> clock_;
  struct PendingSend {
    at::Tensor tensor;
    dist::Work work;
  };
  std::vector<PendingSend> sends_;
  // Sub-groups of the pp ranks: transfers to a higher rank, and to a lower rank.
  std::shared_ptr<dist::Group> up_, down_;
  dist::Group& toward(int64_t peer) const { return peer > rank_ ? *up_ : *down_; }
  dist::Group& from(int64_t peer) const { return peer < rank_ ? *up_ : *down_; }
  // Per peer: what it sends this rank in a training step, in its order.
  std::map<int64_t, std::vector<pp::Transfer>> incoming_;
  // Shapes and dtypes already exchanged, by (boundary, direction, microbatch token shape).
  std::map<std::vector<int64_t>, std::pair<std::vector<int64_t>, at::ScalarType>> known_;
};

}  // namespace titan
