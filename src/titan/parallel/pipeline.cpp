// Pipeline parallelism's runtime (see pipeline.h).
#include "titan/parallel/pipeline.h"

#include "titan/common/check.h"
#include "titan/common/host_sync.h"
#include "titan/common/phase.h"
#include "titan/components/loss.h"
#include "titan/models/common/linear.h"
#include "titan/parallel/data_parallel.h"

#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <sstream>
#include <tuple>
#include <utility>

namespace titan {

namespace {

// What a transfer carries (part of its tag).
constexpr int kActivation = 0;
constexpr int kGradient = 1;
constexpr int kHeader = 2;
// Microbatches per boundary in the tag space: far more than any schedule runs.
constexpr int64_t kTagStride = 1 << 16;
// A header: ndim, up to 6 sizes, dtype.
constexpr int64_t kHeaderLen = 8;
constexpr int64_t kMaxDims = kHeaderLen - 2;

using Key = std::pair<int64_t, int64_t>;  // (stage, microbatch)

bool splits_backward(const std::vector<pp::Slot>& row) {
  for (const pp::Slot& slot : row) {
    if (!slot) continue;
    if (slot->kind == pp::ActionKind::kBackwardInput) return true;
    for (const pp::Action& sub : slot->sub_actions) {
      if (sub.kind == pp::ActionKind::kBackwardInput) return true;
    }
  }
  return false;
}

// Points the Linear layers of `model` and its data parallelism at `deferral` (null: detaches).
void attach_deferral(Model& model, const std::shared_ptr<WeightGradDeferral>& deferral) {
  for (const auto& module : model.modules(/*include_self=*/false)) {
    if (auto* linear = dynamic_cast<Linear*>(module.get())) linear->deferral = deferral;
  }
  for (UnitRunner* runner : model.unit_runners()) {
    if (auto* dp = dynamic_cast<DataParallel*>(runner)) dp->defer_weight_grads(deferral);
  }
}

at::Tensor take(std::map<Key, at::Tensor>& from, const Key& key, const char* what) {
  auto it = from.find(key);
  TITAN_CHECK(it != from.end(), "pipeline runtime: no ", what, " for stage ", key.first,
              " microbatch ", key.second,
              " (the schedule runs an action before the one it depends on)");
  at::Tensor t = std::move(it->second);
  from.erase(it);
  return t;
}

}  // namespace

struct PipelineRuntime::StepState {
  std::vector<at::Tensor> tokens, labels;  // per microbatch
  std::vector<at::Tensor> documents;       // per microbatch (block-causal attention), or none
  at::Tensor positions;                    // the tokens' (context parallelism), or undefined
  std::vector<at::Tensor> row_positions;   // per microbatch (packed samples), or none
  const LossFn* loss_fn = nullptr;
  double scale = 1.0;                    // on each microbatch's loss
  double token_factor = 0;               // > 0: token_weighted_loss (see train_step)
  std::map<Key, at::Tensor> input;       // a stage's input leaf (not the first stage's)
  std::map<Key, at::Tensor> output;      // a stage's output with its graph (last: scaled loss)
  std::map<Key, at::Tensor> grad_input;  // for the previous stage on this rank
  std::map<Key, std::unique_ptr<DeferredGrads>> deferred;  // I done, W not yet
  std::vector<at::Tensor> losses;  // per microbatch, on the last stage's rank
  // Training: receives follow each peer's send order (PipelineRuntime::receive).
  bool in_send_order = false;
  std::map<int64_t, size_t> received;  // per peer: its messages received so far
  // Received before the action that uses them, by (gradient, boundary, microbatch).
  std::map<std::tuple<bool, int64_t, int64_t>, at::Tensor> early;
};

PipelineRuntime::PipelineRuntime(pp::PipelineLayout layout, std::shared_ptr<dist::Group> group,
                                 std::vector<Stage> stages, const at::Device& device)
    : layout_(std::move(layout)),
      group_(std::move(group)),
      stages_(std::move(stages)),
      device_(device),
      clock_(std::make_unique<WaitClock>(device)) {
  rank_ = group_ ? group_->rank() : 0;
  TITAN_CHECK(layout_.pp == (group_ ? group_->size() : 1), "pipeline runtime: layout for pp ",
              layout_.pp, " on a group of ", group_ ? group_->size() : 1);
  const std::vector<int64_t>& mine = layout_.rank_stage_ids.at(rank_);
  TITAN_CHECK(stages_.size() == mine.size(), "pipeline runtime: rank ", rank_, " holds ",
              mine.size(), " stages, given ", stages_.size());
  for (size_t i = 0; i < mine.size(); ++i) {
    TITAN_CHECK(stages_[i].id == mine[i] && stages_[i].model != nullptr, "pipeline runtime: stage ",
                i, " of rank ", rank_, " should be stage ", mine[i]);
  }
  deferrals_.resize(stages_.size());
  if (splits_backward(layout_.table.at(rank_))) {
    for (size_t i = 0; i < stages_.size(); ++i) {
      deferrals_[i] = std::make_shared<WeightGradDeferral>();
      attach_deferral(*stages_[i].model, deferrals_[i]);
    }
  }
  if (layout_.pp > 1) {
    std::vector<int> all(static_cast<size_t>(layout_.pp));
    for (size_t r = 0; r < all.size(); ++r) all[r] = static_cast<int>(r);
    up_ = group_->new_subgroup("pp_up", all);
    down_ = group_->new_subgroup("pp_down", all);
  }
  for (int64_t peer = 0; peer < layout_.pp; ++peer) {
    if (peer == rank_) continue;
    for (pp::Transfer& t : pp::rank_transfers(layout_.table, peer, layout_.stage_rank)) {
      if (t.send && t.peer == rank_) incoming_[peer].push_back(std::move(t));
    }
  }
}

PipelineRuntime::~PipelineRuntime() {
  for (size_t i = 0; i < stages_.size(); ++i) {
    if (deferrals_[i]) attach_deferral(*stages_[i].model, nullptr);
  }
}

WeightGradDeferral& PipelineRuntime::deferral(int64_t stage) {
  const size_t i = static_cast<size_t>(&local(stage) - stages_.data());
  TITAN_CHECK(deferrals_[i] != nullptr, "pipeline runtime: stage ", stage,
              " runs an I action, but its rank's schedule row has none");
  return *deferrals_[i];
}

PipelineRuntime::Stage& PipelineRuntime::local(int64_t stage) {
  for (Stage& s : stages_) {
    if (s.id == stage) return s;
  }
  TITAN_CHECK(false, "pipeline runtime: rank ", rank_, " was given an action of stage ", stage,
              ", which rank ", rank_of(stage), " holds");
  return stages_[0];
}

int PipelineRuntime::tag(int64_t boundary, int64_t microbatch, int kind) const {
  TITAN_CHECK(microbatch < kTagStride, "pipeline runtime: microbatch ", microbatch,
              " past the tag space");
  return static_cast<int>((boundary * kTagStride + microbatch) * 4 + kind);
}

void PipelineRuntime::send(const at::Tensor& t, int64_t dst, int64_t boundary, int64_t microbatch,
                           int kind, const std::vector<int64_t>& key_shape) {
  const int peer = static_cast<int>(dst);
  if (kind == kActivation) {
    std::vector<int64_t> key{boundary, kind};
    key.insert(key.end(), key_shape.begin(), key_shape.end());
    if (known_.find(key) == known_.end()) {
      TITAN_CHECK(t.dim() <= kMaxDims, "pipeline runtime: activations of ", t.dim(),
                  " dims cannot cross stages (at most ", kMaxDims, ")");
      at::Tensor header = at::zeros({kHeaderLen}, at::TensorOptions(at::kLong).device(device_));
      std::vector<int64_t> values{t.dim()};
      for (int64_t d : t.sizes()) values.push_back(d);
      values.resize(kHeaderLen - 1, 0);
      values.push_back(static_cast<int64_t>(t.scalar_type()));
      header.copy_(at::tensor(values, at::kLong));
      sends_.push_back(
          {header, toward(dst).send(header, peer, tag(boundary, microbatch, kHeader))});
      known_[key] = {t.sizes().vec(), t.scalar_type()};
    }
  }
  const at::Tensor data = t.contiguous();
  sends_.push_back({data, toward(dst).send(data, peer, tag(boundary, microbatch, kind))});
}

at::Tensor PipelineRuntime::recv_activation(int64_t src, int64_t boundary, int64_t microbatch,
                                            const std::vector<int64_t>& key_shape) {
  const int peer = static_cast<int>(src);
  std::vector<int64_t> key{boundary, kActivation};
  key.insert(key.end(), key_shape.begin(), key_shape.end());
  auto it = known_.find(key);
  if (it == known_.end()) {
    at::Tensor header = at::zeros({kHeaderLen}, at::TensorOptions(at::kLong).device(device_));
    dist::Work work = from(src).recv(header, peer, tag(boundary, microbatch, kHeader));
    clock_->time([&] { work.wait(); });
    const at::Tensor host = to_host(header);  // once per shape: later ones reuse it
    const int64_t* h = host.data_ptr<int64_t>();
    TITAN_CHECK(h[0] >= 0 && h[0] <= kMaxDims, "pipeline runtime: bad activation header from rank ",
                src, " (", h[0], " dims)");
    std::vector<int64_t> shape(h + 1, h + 1 + h[0]);
    it = known_.emplace(key, std::make_pair(shape, static_cast<at::ScalarType>(h[kHeaderLen - 1])))
             .first;
  }
  at::Tensor t =
      at::empty(it->second.first, at::TensorOptions().dtype(it->second.second).device(device_));
  dist::Work work = from(src).recv(t, peer, tag(boundary, microbatch, kActivation));
  clock_->time([&] { work.wait(); });
  return t;
}

at::Tensor PipelineRuntime::recv_like(const at::Tensor& like, int64_t src, int64_t boundary,
                                      int64_t microbatch, int kind) {
  at::Tensor t = at::empty(like.sizes(), like.options().device(device_));
  dist::Work work = from(src).recv(t, static_cast<int>(src), tag(boundary, microbatch, kind));
  clock_->time([&] { work.wait(); });
  return t;
}

at::Tensor PipelineRuntime::receive(StepState& st, int64_t src, bool gradient, int64_t boundary,
                                    int64_t m) {
  const auto recv = [&](bool grad, int64_t b, int64_t mb) {
    if (!grad) return recv_activation(src, b, mb, st.tokens.at(mb).sizes().vec());
    auto out = st.output.find({b, mb});
    TITAN_CHECK(out != st.output.end(), "pipeline runtime: rank ", rank_,
                " receives the gradient for stage ", b, " microbatch ", mb,
                " before that stage's forward ran");
    return recv_like(out->second, src, b, mb, kGradient);
  };
  if (!st.in_send_order) return recv(gradient, boundary, m);
  const auto key = std::make_tuple(gradient, boundary, m);
  auto kept = st.early.find(key);
  if (kept != st.early.end()) {
    at::Tensor t = std::move(kept->second);
    st.early.erase(kept);
    return t;
  }
  const std::vector<pp::Transfer>& sent = incoming_[src];
  size_t& next = st.received[src];
  while (true) {
    TITAN_CHECK(next < sent.size(), "pipeline runtime: rank ", rank_, " waits for ",
                (gradient ? "a gradient" : "an activation"), " of boundary ", boundary,
                " microbatch ", m, " from rank ", src, ", which its schedule row does not send");
    const pp::Transfer& t = sent[next++];
    at::Tensor got = recv(t.gradient, t.boundary, t.microbatch);
    if (std::make_tuple(t.gradient, t.boundary, t.microbatch) == key) return got;
    st.early[std::make_tuple(t.gradient, t.boundary, t.microbatch)] = std::move(got);
  }
}

void PipelineRuntime::finish_sends() {
  for (PendingSend& s : sends_) clock_->time([&] { s.work.wait(); });
  sends_.clear();
}

void PipelineRuntime::forward(StepState& st, int64_t stage, int64_t m, bool grad) {
  Stage& s = local(stage);
  const Key key{stage, m};
  const std::vector<int64_t> key_shape = st.tokens[m].sizes().vec();
  at::Tensor in;
  if (is_first(stage)) {
    in = st.tokens[m];
  } else {
    at::Tensor prev = rank_of(stage - 1) == rank_
                          ? st.output.at({stage - 1, m})
                          : receive(st, rank_of(stage - 1), /*gradient=*/false, stage - 1, m);
    if (grad) {
      in = prev.detach().requires_grad_(true);
      st.input[key] = in;
    } else {
      in = prev;
      if (rank_of(stage - 1) == rank_) st.output.erase({stage - 1, m});
    }
  }
  // Block-causal attention: this microbatch's documents; the fused loss: its labels.
  ForwardInputs inputs;
  inputs.positions = st.row_positions.empty() ? st.positions : st.row_positions[m];
  if (!st.documents.empty()) inputs.document_ids = st.documents[m];
  const bool fused_loss = fused_loss_ && is_last(stage);
  if (fused_loss) inputs.loss_labels = st.labels[m];
  at::Tensor out = s.model->forward(in, inputs);
  if (is_last(stage)) {
    at::Tensor loss = fused_loss ? out : (*st.loss_fn)(out, st.labels[m]);
    if (st.token_factor > 0) loss = token_weighted_loss(loss, st.labels[m], st.token_factor);
    st.losses[m] = loss.detach();
    if (grad) st.output[key] = loss * st.scale;
    return;
  }
  const int64_t next = rank_of(stage + 1);
  if (next != rank_) send(out.detach(), next, stage, m, kActivation, key_shape);
  if (grad || next == rank_) st.output[key] = out;
}

void PipelineRuntime::backward(StepState& st, int64_t stage, int64_t m) {
  const Key key{stage, m};
  at::Tensor grad_out;  // undefined for the last stage: its output is the (scaled) loss
  if (!is_last(stage)) {
    if (rank_of(stage + 1) == rank_) {
      grad_out = take(st.grad_input, {stage + 1, m}, "gradient from the next stage");
    } else {
      grad_out = receive(st, rank_of(stage + 1), /*gradient=*/true, stage, m);
    }
  }
  const std::vector<at::Tensor> grads =
      grad_out.defined() ? std::vector<at::Tensor>{grad_out} : std::vector<at::Tensor>{};
  const bool has_input = !is_first(stage);
  const auto deliver = [&](const at::Tensor& g) {
    TITAN_CHECK(g.defined(), "pipeline runtime: stage ", stage,
                "'s input received no gradient (is the stage's output independent of it?)");
    if (rank_of(stage - 1) == rank_) {
      st.grad_input[key] = g;
    } else {
      send(g, rank_of(stage - 1), stage - 1, m, kGradient, {});
    }
  };
  const at::Tensor out = take(st.output, key, "output");
  // A first stage with nothing to train (LoRA's frozen embedding alone) has no graph.
  if (!out.requires_grad() && !has_input) return;
  torch::autograd::backward({out}, grads);
  if (has_input) deliver(take(st.input, key, "input").grad());
}

void PipelineRuntime::backward_input(StepState& st, int64_t stage, int64_t m) {
  std::unique_ptr<DeferredGrads>& into = st.deferred[{stage, m}];
  TITAN_CHECK(into == nullptr, "pipeline runtime: a second I for stage ", stage, " microbatch ", m);
  into = std::make_unique<DeferredGrads>();
  WeightGradDeferral::Scope collect(deferral(stage), into.get());
  backward(st, stage, m);
}

void PipelineRuntime::backward_weight(StepState& st, int64_t stage, int64_t m) {
  auto it = st.deferred.find({stage, m});
  TITAN_CHECK(it != st.deferred.end(), "pipeline runtime: W for stage ", stage, " microbatch ", m,
              " runs before its I (backward for the input)");
  std::unique_ptr<DeferredGrads> deferred = std::move(it->second);
  st.deferred.erase(it);
  deferred->run();
}

at::Tensor PipelineRuntime::mean_from_last_stage(const at::Tensor& local_mean) {
  at::Tensor t = local_mean.to(at::kFloat).reshape({1}).contiguous();
  if (group_ && layout_.pp > 1) {
    dist::Work work = group_->broadcast(t, static_cast<int>(rank_of(layout_.n_stages() - 1)));
    clock_->time([&] { work.wait(); });
  }
  return t.reshape({});
}

at::Tensor PipelineRuntime::train_step(const at::Tensor& inputs, const at::Tensor& labels,
                                       const LossFn& loss_fn, double loss_scale,
                                       const ForwardInputs& context, double token_factor) {
  const int64_t n = layout_.n_microbatches;
  TITAN_CHECK(inputs.size(0) == n * layout_.microbatch_size, "pipeline: the local batch of ",
              inputs.size(0), " sequences is not ", n,
              " microbatches x pipeline_parallel_microbatch_size ", layout_.microbatch_size);
  StepState st;
  st.tokens = inputs.chunk(n, 0);
  st.labels = labels.chunk(n, 0);
  if (context.document_ids.defined()) st.documents = context.document_ids.chunk(n, 0);
  if (context.positions.dim() == 2) {
    st.row_positions = context.positions.chunk(n, 0);
  } else {
    st.positions = context.positions;
  }
  st.loss_fn = &loss_fn;
  st.scale = loss_scale / static_cast<double>(n);
  // Each microbatch's sum over its predicted tokens, times n to undo the mean over microbatches.
  st.token_factor = token_factor * static_cast<double>(n);
  st.losses.resize(n);
  st.in_send_order = true;
  for (size_t i = 0; i < stages_.size(); ++i) {
    // Data parallelism is applied after the runtime is built: attach it on every step.
    if (deferrals_[i]) attach_deferral(*stages_[i].model, deferrals_[i]);
  }
  const auto run = [&](const pp::Action& a) {
    const bool fwd = a.kind == pp::ActionKind::kForward;
    const PhaseScope phase(fwd ? Phase::kForward : Phase::kBackward, fwd ? "forward" : "backward",
                           a.str());
    switch (a.kind) {
      case pp::ActionKind::kForward: forward(st, a.stage, a.microbatch, /*grad=*/true); break;
      case pp::ActionKind::kFullBackward: backward(st, a.stage, a.microbatch); break;
      case pp::ActionKind::kBackwardInput: backward_input(st, a.stage, a.microbatch); break;
      case pp::ActionKind::kBackwardWeight: backward_weight(st, a.stage, a.microbatch); break;
      default:
        TITAN_CHECK(false, "pipeline runtime: cannot run action ", a.str(),
                    " (tables hold compute actions; sends and receives are implied)");
    }
  };
  for (const pp::Slot& slot : layout_.table.at(rank_)) {
    if (!slot) continue;
    if (slot->kind == pp::ActionKind::kOverlapForwardBackward) {
      for (const pp::Action& sub : slot->sub_actions) run(sub);
    } else {
      run(*slot);
    }
  }
  finish_sends();
  TITAN_CHECK(
      st.output.empty() && st.input.empty() && st.grad_input.empty() && st.deferred.empty() &&
          st.early.empty(),
      "pipeline runtime: rank ", rank_,
      "'s schedule left work undone (a forward without its backward, or an I without its W)");
  at::Tensor mean = at::zeros({}, at::TensorOptions(at::kFloat).device(device_));
  if (rank_of(layout_.n_stages() - 1) == rank_) {
    for (const at::Tensor& l : st.losses) mean = mean + l.to(at::kFloat);
    mean = mean / static_cast<double>(n);
  }
  return mean_from_last_stage(mean);
}

at::Tensor PipelineRuntime::evaluate(const at::Tensor& inputs, const at::Tensor& labels,
                                     const LossFn& loss_fn, const ForwardInputs& context) {
  at::NoGradGuard no_grad;
  StepState st;
  st.tokens = inputs.split(layout_.microbatch_size, 0);
  st.labels = labels.split(layout_.microbatch_size, 0);
  if (context.document_ids.defined()) {
    st.documents = context.document_ids.split(layout_.microbatch_size, 0);
  }
  if (context.positions.dim() == 2) {
    st.row_positions = context.positions.split(layout_.microbatch_size, 0);
  } else {
    st.positions = context.positions;
  }
  st.loss_fn = &loss_fn;
  const int64_t n = static_cast<int64_t>(st.tokens.size());
  st.losses.resize(n);
  for (int64_t m = 0; m < n; ++m) {
    for (const Stage& s : stages_) forward(st, s.id, m, /*grad=*/false);
  }
  finish_sends();
  at::Tensor mean = at::zeros({}, at::TensorOptions(at::kFloat).device(device_));
  if (rank_of(layout_.n_stages() - 1) == rank_) {
    // Weighted by sequences: the last microbatch may be smaller.
    for (int64_t m = 0; m < n; ++m) {
      mean = mean + st.losses[m].to(at::kFloat) * static_cast<double>(st.tokens[m].size(0));
    }
    mean = mean / static_cast<double>(inputs.size(0));
  }
  return mean_from_last_stage(mean);
}

std::string PipelineRuntime::describe() const {
  std::ostringstream os;
  os << "pipeline: " << pp::schedule_name(layout_.schedule)
     << (layout_.from_csv ? " (table from pipeline_parallel_schedule_csv)" : "") << " over pp "
     << layout_.pp << ", " << layout_.n_stages() << " stages placed "
     << pp::placement_name(layout_.placement) << "-style; this rank: stage";
  const std::vector<int64_t>& mine = layout_.rank_stage_ids.at(rank_);
  os << (mine.size() > 1 ? "s " : " ");
  for (size_t i = 0; i < mine.size(); ++i) {
    os << (i ? ", " : "") << mine[i] << " (";
    const std::vector<std::string>& fqns = layout_.module_fqns.at(mine[i]);
    os << fqns.front();
    if (fqns.size() > 1) os << " .. " << fqns.back();
    os << ")";
  }
  os << "; " << layout_.n_microbatches << " microbatches of " << layout_.microbatch_size;
  return os.str();
}

}  // namespace titan
