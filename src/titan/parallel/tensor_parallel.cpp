// Tensor + sequence parallelism (see tensor_parallel.h).
#include "titan/parallel/tensor_parallel.h"

#include "titan/common/check.h"
#include "titan/common/format.h"
#include "titan/components/loss.h"
#include "titan/kernels/cross_entropy.h"
#include "titan/models/common/affine.h"
#include "titan/models/common/attention.h"
#include "titan/models/common/linear.h"
#include "titan/models/common/moe.h"
#include "titan/models/common/savable_ops.h"
#include "titan/parallel/device_streams.h"

#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/custom_function.h>

#include <chrono>
#include <cmath>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>

namespace titan {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Time compute waited for tensor-parallel collectives (see device_streams.h). On the CPU, the
// host time in this thread's waits (autograd runs CPU backward on the thread that called
// backward(), and ranks may be threads of one process in tests); on CUDA, the compute streams'
// stalls, from events, process-wide because autograd runs CUDA backward on a thread of its own.
// Which one goes by the device of the tensors, not the group's: Gloo groups also move CUDA
// tensors in the shared-device test mode.
thread_local WaitClock t_cpu_clock(at::kCPU);
struct CudaClocks {
  std::mutex mutex;
  std::map<c10::DeviceIndex, std::unique_ptr<WaitClock>> by_device;
};
CudaClocks& cuda_clocks() {
  static CudaClocks clocks;
  return clocks;
}

void timed_wait(const at::Tensor& on, dist::Work work) {
  const at::Device device = on.device();
  if (!device.is_cuda()) {
    t_cpu_clock.time([&] { work.wait(); });
    return;
  }
  CudaClocks& c = cuda_clocks();
  std::lock_guard<std::mutex> lock(c.mutex);
  auto& clock = c.by_device[device.index()];
  if (!clock) clock = std::make_unique<WaitClock>(device);
  clock->time([&] { work.wait(); });
}

dist::Group* group_of(AutogradContext* ctx) {
  return reinterpret_cast<dist::Group*>(ctx->saved_data["group"].toInt());
}

// x (bs, s, ...) sharded on dim 1 over the group -> (bs, size * s, ...), in rank order.
at::Tensor all_gather_seq(const at::Tensor& x, dist::Group& g) {
  const int64_t t = g.size();
  std::vector<int64_t> gathered_shape = x.sizes().vec();
  gathered_shape.insert(gathered_shape.begin(), t);
  at::Tensor out = at::empty(gathered_shape, x.options());
  timed_wait(out, g.all_gather_into_tensor(out, x.contiguous()));
  // (t, bs, s, ...) -> (bs, t, s, ...) -> (bs, t * s, ...)
  std::vector<int64_t> shape = x.sizes().vec();
  shape[1] *= t;
  return out.transpose(0, 1).reshape(shape);
}

// x (bs, size * s, ...) holding partial sums -> this rank's (bs, s, ...) of the sum.
at::Tensor reduce_scatter_seq(const at::Tensor& x, dist::Group& g) {
  const int64_t t = g.size();
  TITAN_CHECK(x.size(1) % t == 0, "tensor parallelism: sequence length ", x.size(1),
              " is not divisible by tensor_parallel_degree ", t);
  std::vector<int64_t> split = x.sizes().vec();
  split[1] /= t;
  split.insert(split.begin() + 1, t);                                        // (bs, t, s, ...)
  const at::Tensor by_rank = x.reshape(split).transpose(0, 1).contiguous();  // (t, bs, s, ...)
  std::vector<int64_t> out_shape = x.sizes().vec();
  out_shape[1] /= t;
  at::Tensor out = at::empty(out_shape, x.options());
  timed_wait(out, g.reduce_scatter_tensor(out, by_rank));
  return out;
}

struct AllGatherSeq : public torch::autograd::Function<AllGatherSeq> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, dist::Group* g) {
    ctx->saved_data["group"] = reinterpret_cast<int64_t>(g);
    return all_gather_seq(x, *g);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {reduce_scatter_seq(grads[0], *group_of(ctx)), at::Tensor()};
  }
};

struct ReduceScatterSeq : public torch::autograd::Function<ReduceScatterSeq> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, dist::Group* g) {
    ctx->saved_data["group"] = reinterpret_cast<int64_t>(g);
    // Selective activation checkpointing keeps this result instead of communicating again.
    return savable_result(SavableOp::kReduceScatter, [&] { return reduce_scatter_seq(x, *g); });
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {all_gather_seq(grads[0], *group_of(ctx)), at::Tensor()};
  }
};

// Megatron-LM's pair for whole activations (TpActivations::kWhole): a column-wise layer's input
// passes unchanged and its gradient, partial over the ranks' output features, is all-reduced ...
struct CopyToGroup : public torch::autograd::Function<CopyToGroup> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, dist::Group* g) {
    ctx->saved_data["group"] = reinterpret_cast<int64_t>(g);
    return x.alias();
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    at::Tensor grad = grads[0].contiguous().clone();
    timed_wait(grad, group_of(ctx)->all_reduce(grad, dist::ReduceOp::kSum));
    return {grad, at::Tensor()};
  }
};

// ... and a row-wise layer's partial outputs are all-reduced, their gradient (whole on every
// rank) passing unchanged.
struct AllReduceSum : public torch::autograd::Function<AllReduceSum> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, dist::Group* g) {
    at::Tensor out = x.contiguous().clone();
    timed_wait(out, g->all_reduce(out, dist::ReduceOp::kSum));
    return out;
  }
  static variable_list backward(AutogradContext*, variable_list grads) {
    return {grads[0], at::Tensor()};
  }
};

// Vocab-sharded logits (..., V / t) -> whole logits (..., V); backward keeps this rank's slice
// (every rank computes the same loss from the same whole logits).
struct AllGatherLastDim : public torch::autograd::Function<AllGatherLastDim> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, dist::Group* g) {
    ctx->saved_data["group"] = reinterpret_cast<int64_t>(g);
    const int64_t t = g->size();
    std::vector<int64_t> gathered_shape = x.sizes().vec();
    gathered_shape.insert(gathered_shape.begin(), t);
    at::Tensor out = at::empty(gathered_shape, x.options());
    timed_wait(out, g->all_gather_into_tensor(out, x.contiguous()));
    // (t, ..., v) -> (..., t, v) -> (..., t * v)
    std::vector<int64_t> shape = x.sizes().vec();
    shape.back() *= t;
    return out.movedim(0, -2).reshape(shape);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    dist::Group* g = group_of(ctx);
    const int64_t v = grads[0].size(-1) / g->size();
    return {grads[0].narrow(-1, g->rank() * v, v).contiguous(), at::Tensor()};
  }
};

// Mean cross-entropy over rows of vocab-sharded logits (n, V / t) float32, labels (n) global ids
// (kIgnoreIndex: not predicted).
struct VocabParallelCrossEntropy : public torch::autograd::Function<VocabParallelCrossEntropy> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& logits,
                            const at::Tensor& labels, dist::Group* g, int64_t vocab_start) {
    const int64_t v = logits.size(1);
    at::Tensor max = std::get<0>(logits.max(1)).contiguous();
    timed_wait(max, g->all_reduce(max, dist::ReduceOp::kMax));
    const at::Tensor shifted = logits - max.unsqueeze(1);
    const at::Tensor exp = shifted.exp();
    at::Tensor sum_exp = exp.sum(1).contiguous();
    const at::Tensor local = labels - vocab_start;
    const at::Tensor mine = local.ge(0).logical_and(local.lt(v));
    const at::Tensor index = local.clamp(0, v - 1).unsqueeze(1);
    at::Tensor target =
        shifted.gather(1, index).squeeze(1).masked_fill(mine.logical_not(), 0.0).contiguous();
    // Both sums in one collective: (2, n).
    at::Tensor sums = at::stack({sum_exp, target});
    timed_wait(sums, g->all_reduce(sums, dist::ReduceOp::kSum));
    sum_exp = sums[0];
    target = sums[1];
    // Rows labelled kIgnoreIndex are not predicted: the mean is over the others (0 if none).
    const at::Tensor valid = labels.ne(kernels::kIgnoreIndex).to(at::kFloat);
    const at::Tensor count = valid.sum().clamp_min(1.0);
    const at::Tensor loss = (sum_exp.log() - target).mul(valid).sum().div(count);
    ctx->save_for_backward({exp / sum_exp.unsqueeze(1), index, mine, valid.div(count)});
    return loss;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& probs = saved[0];
    const at::Tensor& index = saved[1];
    const at::Tensor& mine = saved[2];
    const at::Tensor& weight = saved[3];  // 1 / count on predicted rows, 0 elsewhere
    // d mean(loss) / d logits = (softmax - onehot(label)) / count on predicted rows, the one-hot
    // only where it is ours.
    at::Tensor grad = probs.clone();
    grad.scatter_add_(1, index, -mine.to(grad.scalar_type()).unsqueeze(1));
    grad.mul_(weight.unsqueeze(1) * grads[0]);
    return {grad, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

class GatherInputHook : public ForwardHook {
 public:
  explicit GatherInputHook(dist::Group* g) : g_(g) {}
  at::Tensor run(HookedModule&, const at::Tensor& x, const ForwardBody& body) override {
    return body(AllGatherSeq::apply(x, g_));
  }

 private:
  dist::Group* g_;
};

// TpStyle::kReplicated: the module computes the whole sequences on every rank and keeps this
// rank's share; the gather's backward sums the ranks' gradients of each share, and the weights'
// partial gradients (each rank's share of the tokens) are summed with the other replicated ones.
class ReplicatedHook : public ForwardHook {
 public:
  explicit ReplicatedHook(dist::Group* g) : g_(g) {}
  at::Tensor run(HookedModule&, const at::Tensor& x, const ForwardBody& body) override {
    const int64_t local = x.size(1);
    return body(AllGatherSeq::apply(x, g_)).narrow(1, g_->rank() * local, local);
  }

 private:
  dist::Group* g_;
};

class RowwiseHook : public ForwardHook {
 public:
  explicit RowwiseHook(dist::Group* g) : g_(g) {}
  at::Tensor run(HookedModule&, const at::Tensor& x, const ForwardBody& body) override {
    return ReduceScatterSeq::apply(body(x), g_);
  }

 private:
  dist::Group* g_;
};

// The column-wise and row-wise layers of whole activations (see CopyToGroup, AllReduceSum).
class WholeColwiseHook : public ForwardHook {
 public:
  explicit WholeColwiseHook(dist::Group* g) : g_(g) {}
  at::Tensor run(HookedModule&, const at::Tensor& x, const ForwardBody& body) override {
    return body(CopyToGroup::apply(x, g_));
  }

 private:
  dist::Group* g_;
};

// A gathered column-wise layer: its rows' outputs all-gathered (the gradient beyond is whole on
// every rank; backward keeps this rank's slice), its input gradient all-reduced.
class WholeColwiseGatheredHook : public ForwardHook {
 public:
  explicit WholeColwiseGatheredHook(dist::Group* g) : g_(g) {}
  at::Tensor run(HookedModule&, const at::Tensor& x, const ForwardBody& body) override {
    return AllGatherLastDim::apply(body(CopyToGroup::apply(x, g_)), g_);
  }

 private:
  dist::Group* g_;
};

class WholeRowwiseHook : public ForwardHook {
 public:
  explicit WholeRowwiseHook(dist::Group* g) : g_(g) {}
  at::Tensor run(HookedModule&, const at::Tensor& x, const ForwardBody& body) override {
    return AllReduceSum::apply(body(x), g_);
  }

 private:
  dist::Group* g_;
};

// A mixture-of-experts layer whose experts are split over tp: whole sequences in, the partial
// outputs summed and scattered back to sequence shards.
class SplitExpertsHook : public ForwardHook {
 public:
  explicit SplitExpertsHook(dist::Group* g) : g_(g) {}
  at::Tensor run(HookedModule&, const at::Tensor& x, const ForwardBody& body) override {
    return ReduceScatterSeq::apply(body(AllGatherSeq::apply(x, g_)), g_);
  }

 private:
  dist::Group* g_;
};

// Tokens outside this rank's vocabulary rows look up row 0 and are zeroed; the partial sums over
// ranks are reduce-scattered to sequence shards.
class EmbeddingHook : public ForwardHook {
 public:
  EmbeddingHook(dist::Group* g, int64_t start, int64_t rows) : g_(g), start_(start), rows_(rows) {}
  at::Tensor run(HookedModule&, const at::Tensor& tokens, const ForwardBody& body) override {
    const at::Tensor local = tokens - start_;
    const at::Tensor outside = local.lt(0).logical_or(local.ge(rows_));
    const at::Tensor h =
        body(local.masked_fill(outside, 0)).masked_fill(outside.unsqueeze(-1), 0.0);
    return ReduceScatterSeq::apply(h, g_);
  }

 private:
  dist::Group* g_;
  int64_t start_, rows_;
};

class OutputHook : public ForwardHook {
 public:
  OutputHook(dist::Group* g, bool loss_parallel) : g_(g), loss_parallel_(loss_parallel) {}
  at::Tensor run(HookedModule& module, const at::Tensor& x, const ForwardBody& body) override {
    at::Tensor out = body(AllGatherSeq::apply(x, g_));
    // The fused linear + cross-entropy returns the loss, combined over the vocabulary shards.
    const auto* linear = dynamic_cast<const Linear*>(&module);
    if (linear != nullptr && linear->computing_loss()) return out;
    return loss_parallel_ ? out : AllGatherLastDim::apply(out, g_);
  }

 private:
  dist::Group* g_;
  bool loss_parallel_;
};

bool matches(const std::string& pattern, const std::string& name) {
  auto split = [](const std::string& s) {
    std::vector<std::string> parts;
    std::stringstream ss(s);
    std::string part;
    while (std::getline(ss, part, '.')) parts.push_back(part);
    return parts;
  };
  const auto p = split(pattern), n = split(name);
  if (p.size() != n.size()) return false;
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] != "*" && p[i] != n[i]) return false;
  }
  return true;
}

}  // namespace

TensorParallel::TensorParallel(Model& model, std::shared_ptr<dist::Group> group, bool loss_parallel,
                               bool split_experts)
    : model_(model),
      group_(std::move(group)),
      loss_parallel_(loss_parallel),
      activations_(model.tensor_parallel_activations()) {
  TITAN_CHECK(group_ != nullptr, "tensor parallelism needs a tp group");
  const int64_t t = group_->size(), r = group_->rank();
  const std::vector<TpRule> plan = model.tensor_parallel_plan();
  if (plan.empty()) throw ConfigError("this model has no tensor-parallel plan");
  for (const auto& unit : model.units()) {
    if (unit.reused_in_forward) {
      throw ConfigError(message("tensor parallelism does not support tied embeddings (unit '",
                                unit.name,
                                "'); set tie_embeddings = false or tensor_parallel_degree = 1"));
    }
  }
  for (const auto& item : model.named_parameters()) {
    placements_[item.key()] = {ShardBox::whole(item.value().sizes()), /*replicated=*/true};
  }
  const bool whole = activations_ == TpActivations::kWhole;
  at::NoGradGuard no_grad;
  // Splits `layer`'s weight along `dim` into t equal slices and keeps slice r; a packed weight
  // (`parts`: the sizes of the parts it concatenates along dim) keeps slice r of every part.
  auto shard = [&](const std::string& name, WeightLayer& layer, int64_t dim, const char* what,
                   const std::vector<int64_t>& parts = {}) {
    at::Tensor& w = layer.weight;
    const int64_t n = w.size(dim);
    const std::vector<int64_t> sizes = parts.empty() ? std::vector<int64_t>{n} : parts;
    int64_t total = 0;
    for (size_t i = 0; i < sizes.size(); ++i) {
      if (sizes[i] % t != 0) {
        throw ConfigError(message("tensor parallelism: ", name, ".weight has ", sizes[i], " ", what,
                                  sizes.size() > 1 ? message(" in part ", i) : "",
                                  ", not divisible by tensor_parallel_degree ", t, " (", sizes[i],
                                  " % ", t, " = ", sizes[i] % t, ")"));
      }
      total += sizes[i];
    }
    TITAN_CHECK(total == n, "tensor-parallel plan: the parts of ", name, " cover ", total, " of ",
                n, " ", what);
    ParamPlacement& place = placements_.at(name + ".weight");
    place.box = ShardBox::packed_slice(w.sizes(), dim, sizes, r, t);
    place.replicated = false;
    if (place.box.packed()) packed_[name + ".weight"] = {dim, sizes};
    std::vector<int64_t> local = w.sizes().vec();
    local[dim] = n / t;
    w.set_data(place.box.narrow(w, local).clone());
  };
  // A LoRA adapter (linear.h) splits with its layer: a column-wise layer's B by output rows (A
  // stays whole: its gradient is partial over tp, summed like the norms'), a row-wise layer's A
  // by input columns (B whole: it receives the partial sums before the layer's reduction).
  // With whole activations too the whole half's gradient is partial (partial_whole below).
  std::set<std::string> partial_whole;  // replicated, partial gradients under kWhole
  const auto shard_adapter = [&](const std::string& name, WeightLayer* layer, bool colwise,
                                 const std::vector<int64_t>& parts = {}) {
    auto* linear = dynamic_cast<Linear*>(layer);
    if (linear == nullptr || linear->lora_a == nullptr) return;
    if (colwise) {
      shard(name + ".lora_b", *linear->lora_b, 0, "output features", parts);
      partial_whole.insert(name + ".lora_a.weight");
    } else {
      shard(name + ".lora_a", *linear->lora_a, 1, "input features", parts);
      partial_whole.insert(name + ".lora_b.weight");
    }
  };
  // A float8 layer takes its scales over whole operands, as torchao does on DTensors: the split
  // dimension of each (rows, in) input, (out, in) weight and (rows, out) grad_output (float8.h).
  const auto float8_over_group = [this](WeightLayer* layer, std::optional<int64_t> input,
                                        std::optional<int64_t> weight,
                                        std::optional<int64_t> grad_output) {
    auto* linear = dynamic_cast<Linear*>(layer);
    if (linear == nullptr || !linear->float8) return;
    auto tp = std::make_shared<Float8TensorParallel>();
    tp->input_dim = input;
    tp->weight_dim = weight;
    tp->grad_output_dim = grad_output;
    dist::Group* g = group_.get();
    tp->all_reduce_max = [g](const at::Tensor& t) {
      timed_wait(t, g->all_reduce(t, dist::ReduceOp::kMax));
    };
    linear->float8->tp = std::move(tp);
  };
  std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> modules;
  for (const auto& item : model.named_modules()) modules.emplace_back(item.key(), item.value());
  for (const TpRule& rule : plan) {
    TITAN_CHECK(!whole || rule.style == TpStyle::kColwise || rule.style == TpStyle::kRowwise ||
                    rule.style == TpStyle::kColwiseGathered || rule.style == TpStyle::kHeadLocal,
                "tensor-parallel plan: with whole activations only column-wise, row-wise, "
                "gathered column-wise and head-local rules apply (",
                rule.module, ")");
    TITAN_CHECK(whole || rule.style != TpStyle::kColwiseGathered,
                "tensor-parallel plan: gathered column-wise layers need whole activations (",
                rule.module, ")");
    TITAN_CHECK(
        rule.parts.empty() || rule.style == TpStyle::kColwise || rule.style == TpStyle::kRowwise,
        "tensor-parallel plan: parts are for column-wise and row-wise layers (", rule.module, ")");
    bool found = false;
    for (size_t i = 0; i < modules.size(); ++i) {
      const auto& [name, module] = modules[i];
      if (!matches(rule.module, name)) continue;
      found = true;
      auto* hooked = dynamic_cast<HookedModule*>(module.get());
      auto* layer = dynamic_cast<WeightLayer*>(module.get());
      TITAN_CHECK(hooked != nullptr, "tensor-parallel plan: module ", name, " cannot be hooked");
      const bool needs_weight = rule.style != TpStyle::kGatherInput &&
                                rule.style != TpStyle::kReplicated &&
                                rule.style != TpStyle::kHeadLocal;
      TITAN_CHECK(!needs_weight || layer != nullptr, "tensor-parallel plan: module ", name,
                  " has no weight to shard");
      switch (rule.style) {
        case TpStyle::kEmbedding: {
          const int64_t rows = layer->weight.size(0) / t;
          shard(name, *layer, 0, "vocabulary rows");
          install_hook(*hooked, std::make_shared<EmbeddingHook>(group_.get(), r * rows, rows));
          break;
        }
        case TpStyle::kGatherInput:
          if (auto* attention = dynamic_cast<Attention*>(module.get())) {
            const int64_t heads = attention->wq->weight.size(0) / attention->head_dim;
            const int64_t kv_heads = attention->wk->weight.size(0) / attention->head_dim;
            if (heads % t != 0 || kv_heads % t != 0) {
              throw ConfigError(message("tensor parallelism: ", name, " has n_heads ", heads,
                                        " and n_kv_heads ", kv_heads,
                                        "; both must be divisible by tensor_parallel_degree ", t));
            }
          }
          install_hook(*hooked, std::make_shared<GatherInputHook>(group_.get()));
          break;
        case TpStyle::kColwise:
          shard(name, *layer, 0, "output features", rule.parts);
          shard_adapter(name, layer, /*colwise=*/true, rule.parts);
          // A bias follows the output features; a row-wise layer's is added once after the
          // reduction (affine.h), whole.
          if (auto* biased = dynamic_cast<BiasedLinear*>(layer)) {
            shard(name + ".bias", *biased->bias, 0, "output features", rule.parts);
          }
          float8_over_group(layer, std::nullopt, 0, 1);
          if (whole) install_hook(*hooked, std::make_shared<WholeColwiseHook>(group_.get()));
          break;
        case TpStyle::kRowwise:
          shard(name, *layer, 1, "input features", rule.parts);
          shard_adapter(name, layer, /*colwise=*/false, rule.parts);
          float8_over_group(layer, 1, 1, std::nullopt);
          if (whole) {
            install_hook(*hooked, std::make_shared<WholeRowwiseHook>(group_.get()));
          } else {
            install_hook(*hooked, std::make_shared<RowwiseHook>(group_.get()));
          }
          break;
        case TpStyle::kColwiseGathered:
          // The bias is added to the gathered output (affine.h): whole, with a whole gradient.
          shard(name, *layer, 0, "output features");
          shard_adapter(name, layer, /*colwise=*/true);
          float8_over_group(layer, std::nullopt, 0, 1);
          install_hook(*hooked, std::make_shared<WholeColwiseGatheredHook>(group_.get()));
          break;
        case TpStyle::kHeadLocal:
          for (const auto& item : module->named_parameters()) {
            partial_whole.insert(name + "." + item.key());
          }
          break;
        case TpStyle::kSequenceParallel:
          break;  // replicated weight; reduce_replicated_grads sums its partial gradients
        case TpStyle::kReplicated:
          install_hook(*hooked, std::make_shared<ReplicatedHook>(group_.get()));
          break;
        case TpStyle::kOutput:
          vocab_start_ = r * (layer->weight.size(0) / t);
          shard(name, *layer, 0, "vocabulary rows");
          float8_over_group(layer, std::nullopt, 0, 1);
          install_hook(*hooked, std::make_shared<OutputHook>(group_.get(), loss_parallel_));
          if (auto* linear = dynamic_cast<Linear*>(layer)) {
            // The fused loss works on the vocabulary shards with or without loss parallel: the
            // logits it would lay out never exist.
            dist::Group* g = group_.get();
            linear->vocab_shard.start = vocab_start_;
            linear->vocab_shard.all_reduce_sum = [g](at::Tensor& t) {
              timed_wait(t, g->all_reduce(t, dist::ReduceOp::kSum));
            };
            linear->vocab_shard.all_reduce_max = [g](at::Tensor& t) {
              timed_wait(t, g->all_reduce(t, dist::ReduceOp::kMax));
            };
            vocab_sharded_.push_back(linear);
          }
          break;
      }
    }
    TITAN_CHECK(found, "tensor-parallel plan: no module matches '", rule.module, "'");
  }
  // With whole activations a replicated weight sees every token and the whole gradient reaching
  // it; only the head-local ones' and the LoRA adapters' whole halves' are partial.
  for (const auto& [name, place] : placements_) {
    if (whole && place.replicated && partial_whole.count(name) == 0) whole_grads_.insert(name);
  }
  if (!split_experts) {
    count_elements();
    return;
  }
  for (const auto& [name, module] : modules) {
    auto* moe = dynamic_cast<MoE*>(module.get());
    if (moe == nullptr) continue;
    const std::string experts = name + ".experts.";
    shard(experts + "w1", *moe->experts->w1, 1, "hidden features per expert");
    shard(experts + "w3", *moe->experts->w3, 1, "hidden features per expert");
    shard(experts + "w2", *moe->experts->w2, 2, "hidden features per expert");
    // gpt-oss's expert biases: b1 and b3 split with the hidden rows; b2 stays whole and joins the
    // partial sums on the first tp rank only (moe.h).
    if (moe->experts->b1) {
      shard(experts + "b1", *moe->experts->b1, 1, "hidden features per expert");
      shard(experts + "b3", *moe->experts->b3, 1, "hidden features per expert");
      moe->experts->down_bias_here = r == 0;
    }
    // Their LoRA adapters (moe.h) split with them: w1's and w3's B by hidden rows (the A they
    // share stays whole, its gradient summed over tp), w2's A by hidden columns (B whole).
    if (moe->experts->gate_up_adapted()) {
      shard(experts + "w1.lora_b", *moe->experts->w1->lora_b, 1, "hidden features per expert");
      shard(experts + "w3.lora_b", *moe->experts->w3->lora_b, 1, "hidden features per expert");
    }
    if (moe->experts->down_adapted()) {
      shard(experts + "w2.lora_a", *moe->experts->w2->lora_a, 2, "hidden features per expert");
    }
    if (moe->shared_experts) {
      const std::string shared = name + ".shared_experts.";
      FeedForward& ffn = *moe->shared_experts;
      shard(shared + "w1", *ffn.w1, 0, "hidden features");
      shard(shared + "w3", *ffn.w3, 0, "hidden features");
      shard(shared + "w2", *ffn.w2, 1, "hidden features");
      shard_adapter(shared + "w1", ffn.w1.get(), /*colwise=*/true);
      shard_adapter(shared + "w3", ffn.w3.get(), /*colwise=*/true);
      shard_adapter(shared + "w2", ffn.w2.get(), /*colwise=*/false);
      float8_over_group(ffn.w1.get(), std::nullopt, 0, 1);
      float8_over_group(ffn.w3.get(), std::nullopt, 0, 1);
      float8_over_group(ffn.w2.get(), 1, 1, std::nullopt);
    }
    install_hook(*moe, std::make_shared<SplitExpertsHook>(group_.get()));
    ++split_moe_layers_;
  }
  if (split_moe_layers_ == 0) {
    throw ConfigError(message(
        "parallelism.expert_tensor_parallel_degree = ", t,
        " splits the experts of mixture-of-experts layers over tp, and this model has none. "
        "HINT: set it to 1"));
  }
  count_elements();
}

void TensorParallel::count_elements() {
  for (const auto& item : model_.named_parameters()) {
    held_elements_ += item.value().numel();
    int64_t n = 1;
    for (int64_t d : placements_.at(item.key()).box.global_shape) n *= d;
    whole_elements_ += n;
  }
}

void TensorParallel::install_hook(HookedModule& module, std::shared_ptr<ForwardHook> hook) {
  installed_.emplace_back(&module, hook.get());
  module.add_forward_hook(std::move(hook));
}

TensorParallel::~TensorParallel() {
  for (const auto& [module, hook] : installed_) module->remove_forward_hook(hook);
  for (Linear* linear : vocab_sharded_) linear->vocab_shard = VocabShard{};
}

int64_t TensorParallel::size() const { return group_->size(); }
double TensorParallel::comm_wait_seconds() const {
  double total = t_cpu_clock.seconds();
  CudaClocks& c = cuda_clocks();
  std::lock_guard<std::mutex> lock(c.mutex);
  for (auto& [index, clock] : c.by_device) total += clock->seconds();
  return total;
}

at::Tensor TensorParallel::cross_entropy(const at::Tensor& logits, const at::Tensor& labels) const {
  if (!loss_parallel_) {
    return lm_cross_entropy_loss(logits, labels);
  }
  return VocabParallelCrossEntropy::apply(logits.flatten(0, 1).to(at::kFloat), labels.flatten(0, 1),
                                          group_.get(), vocab_start_);
}

void TensorParallel::reduce_replicated_grads(
    const std::vector<std::pair<std::string, at::Tensor>>& grads) const {
  std::vector<at::Tensor> parts;
  for (const auto& [name, g] : grads) {
    if (replicated(name) && whole_grads_.count(name) == 0 && g.defined() && g.numel() > 0) {
      parts.push_back(g);
    }
  }
  if (parts.empty()) return;
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> flat;
  for (const auto& g : parts) flat.push_back(g.reshape({-1}).to(at::kFloat));
  at::Tensor buffer = at::cat(flat);
  timed_wait(buffer, group_->all_reduce(buffer, dist::ReduceOp::kSum));
  int64_t offset = 0;
  for (auto& g : parts) {
    g.copy_(buffer.narrow(0, offset, g.numel()).view(g.sizes()));
    offset += g.numel();
  }
}

at::Tensor TensorParallel::gather_whole(const std::string& param, const at::Tensor& local) const {
  const ParamPlacement& p = placements_.at(param);
  if (p.replicated) return local;
  const int64_t t = size();
  if (const auto it = packed_.find(param); it != packed_.end()) {
    const auto& [dim, parts] = it->second;
    const at::Tensor here = local.to(group_->device()).contiguous();
    std::vector<int64_t> gathered_shape = here.sizes().vec();
    gathered_shape.insert(gathered_shape.begin(), t);
    at::Tensor out = at::empty(gathered_shape, here.options());
    group_->all_gather_into_tensor(out, here).wait();
    at::Tensor whole = at::empty(p.box.global_shape, here.options());
    for (int64_t k = 0; k < t; ++k) {
      const ShardBox box = ShardBox::packed_slice(p.box.global_shape, dim, parts, k, t);
      for (const ShardPiece& piece : box.pieces()) {
        const at::Tensor src = piece.of(out[k]);
        piece.box.narrow(whole, src.sizes()).copy_(src);
      }
    }
    return whole.to(local.device());
  }
  int64_t dim = 0;
  while (local.size(dim) == p.box.global_shape[dim]) ++dim;  // the one split dimension
  std::vector<int64_t> gathered_shape = local.sizes().vec();
  gathered_shape.insert(gathered_shape.begin(), t);
  const at::Tensor here = local.to(group_->device()).contiguous();
  at::Tensor out = at::empty(gathered_shape, here.options());
  group_->all_gather_into_tensor(out, here).wait();
  return at::cat(out.unbind(0), dim).to(local.device());
}

std::string TensorParallel::describe() const {
  int64_t sharded = 0;
  for (const auto& [name, p] : placements_) sharded += p.replicated ? 0 : 1;
  const std::string layout = activations_ == TpActivations::kWhole
                                 ? "whole activations, no sequence parallelism, "
                                 : "sequence parallel, ";
  return "tensor parallel over " + std::to_string(size()) + " ranks (" + layout +
         std::to_string(sharded) + " of " + std::to_string(placements_.size()) +
         " parameters sharded, " + human_count(held_elements_) + " of " +
         human_count(whole_elements_) + " parameter elements per rank" +
         (activations_ == TpActivations::kWhole
              ? std::string()
              : std::string(", loss parallel ") + (loss_parallel_ ? "on" : "off")) +
         (split_moe_layers_ > 0 ? ", experts of " + std::to_string(split_moe_layers_) +
                                      " MoE layers split over tp (whole sequences routed)"
                                : std::string()) +
         ")";
}

}  // namespace titan
