// Context parallelism: sequence layouts and the ring (see context_parallel.h): K and V travel
// around the cp ranks, and the gradients of K and V back to their owners; the attention of each
// step's chunk pairs is ring_attention_pairs.cpp's.
#include "titan/parallel/context_parallel.h"

#include "titan/common/check.h"
#include "titan/common/host_sync.h"
#include "titan/models/common/mla.h"
#include "titan/parallel/ring_attention_pairs.h"

#include <torch/csrc/autograd/custom_function.h>

#include <utility>

namespace titan {

SequenceSharding parse_sequence_sharding(const std::string& name) {
  if (name == "none") return SequenceSharding::kNone;
  if (name == "headtail") return SequenceSharding::kHeadTail;
  throw ConfigError(message("unknown context-parallel sequence sharding '", name,
                            "'. HINT: use \"headtail\" (causal load balancing) or \"none\""));
}

const char* to_string(SequenceSharding sharding) {
  return sharding == SequenceSharding::kHeadTail ? "headtail" : "none";
}

RotateMethod parse_rotate_method(const std::string& name) {
  if (name == "allgather") return RotateMethod::kAllGather;
  if (name == "alltoall") return RotateMethod::kAllToAll;
  throw ConfigError(message("unknown context-parallel rotate method '", name,
                            "'. HINT: use \"allgather\" or \"alltoall\""));
}

const char* to_string(RotateMethod method) {
  return method == RotateMethod::kAllGather ? "allgather" : "alltoall";
}

SequenceLayout SequenceLayout::make(int64_t seq_len, int64_t cp, SequenceSharding sharding) {
  TITAN_CHECK(cp >= 1, "context parallel degree must be >= 1, got ", cp);
  const int64_t n_chunks = sharding == SequenceSharding::kHeadTail ? 2 * cp : cp;
  TITAN_CHECK(seq_len > 0 && seq_len % n_chunks == 0, "context parallelism (", to_string(sharding),
              "): seq_len ", seq_len, " is not divisible by ",
              sharding == SequenceSharding::kHeadTail ? "2 * cp = 2 * " : "cp = ", cp,
              sharding == SequenceSharding::kHeadTail ? " = " + std::to_string(n_chunks) : "",
              " (seq_len % ", n_chunks, " = ", seq_len % n_chunks,
              "). HINT: pick a seq_len that is a multiple of ", n_chunks);
  SequenceLayout layout;
  layout.seq_len = seq_len;
  layout.cp = cp;
  layout.sharding = sharding;
  const int64_t chunk = seq_len / n_chunks;
  for (int64_t r = 0; r < cp; ++r) {
    if (sharding == SequenceSharding::kHeadTail) {
      const int64_t tail = n_chunks - 1 - r;
      layout.ranges.push_back({{r * chunk, (r + 1) * chunk}, {tail * chunk, (tail + 1) * chunk}});
    } else {
      layout.ranges.push_back({{r * chunk, (r + 1) * chunk}});
    }
  }
  return layout;
}

at::Tensor SequenceLayout::positions(int rank, at::Device device) const {
  TITAN_CHECK(rank >= 0 && rank < cp, "rank ", rank, " out of range for cp ", cp);
  std::vector<at::Tensor> parts;
  for (const PositionRange& range : ranges[rank]) {
    parts.push_back(at::arange(range.start, range.end, at::TensorOptions(at::kLong)));
  }
  return at::cat(parts).to(device);
}

at::Tensor shard_sequence(const at::Tensor& x, const SequenceLayout& layout, int rank) {
  TITAN_CHECK(x.dim() >= 2 && x.size(1) == layout.seq_len, "shard_sequence: expected (bs, ",
              layout.seq_len, ", ...), got ", x.sizes());
  TITAN_CHECK(rank >= 0 && rank < layout.cp, "rank ", rank, " out of range for cp ", layout.cp);
  std::vector<at::Tensor> parts;
  for (const PositionRange& range : layout.ranges[rank]) {
    parts.push_back(x.narrow(1, range.start, range.size()));
  }
  return at::cat(parts, 1).contiguous();
}

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr int kTagKV = 0;
constexpr int kTagGrad = 1;

// The hops of a ring over RingGroups: to a higher cp rank on `up`, to a lower one on `down`, so
// that each communicator carries one direction between any two ranks (as the pipeline's).
struct Hops {
  const RingGroups& groups;
  int rank() const { return groups.cp->rank(); }
  int size() const { return groups.cp->size(); }
  int next() const { return (rank() + 1) % size(); }
  int prev() const { return (rank() + size() - 1) % size(); }
  dist::Work send(const at::Tensor& t, int tag) const {
    return (next() > rank() ? *groups.up : *groups.down).send(t, next(), tag);
  }
  dist::Work recv(const at::Tensor& t, int tag) const {
    return (prev() < rank() ? *groups.up : *groups.down).recv(t, prev(), tag);
  }
};

// Every rank's K and V, stacked as kv (2, bs, L, n_kv, hd) in the input dtype, in ring order:
// step s yields source rank (rank - s) mod cp, own first. The transfer for step s + 1 is in
// flight while the caller computes on step s.
class KVSource {
 public:
  KVSource(const RingGroups& groups, RotateMethod method, const at::Tensor& own)
      : hops_{groups}, method_(method), cur_(own) {
    if (hops_.size() == 1) return;
    if (method_ == RotateMethod::kAllGather) {
      std::vector<int64_t> shape = own.sizes().vec();
      shape.insert(shape.begin(), hops_.size());
      gathered_ = at::empty(shape, own.options());  // (cp, 2, bs, L, n_kv, hd)
      gather_ = groups.cp->all_gather_into_tensor(gathered_, own);
    } else {
      other_ = at::empty_like(own);
    }
  }

  int source(int step) const { return (hops_.rank() - step + hops_.size()) % hops_.size(); }

  // The K/V of `step` (0, 1, ... in order); valid until the next call.
  at::Tensor get(int step) {
    if (step == 0 && method_ == RotateMethod::kAllToAll) post(step);
    if (step == 0) return cur_;
    if (method_ == RotateMethod::kAllGather) {
      gather_.wait();
      return gathered_[source(step)];
    }
    recv_.wait();  // into other_
    send_.wait();  // of cur_
    std::swap(cur_, other_);
    post(step);
    return cur_;
  }

 private:
  // Ring: send this step's K/V on to the next rank, receive the next step's from the previous.
  void post(int step) {
    if (step + 1 >= hops_.size()) return;
    send_ = hops_.send(cur_, kTagKV);
    recv_ = hops_.recv(other_, kTagKV);
  }

  Hops hops_;
  RotateMethod method_;
  at::Tensor cur_, other_, gathered_;
  dist::Work gather_, send_, recv_;
};

// Collects the float32 dK/dV contributions (2, bs, n_kv, L, hd) of each step for the chunk of
// KVSource::source(step) and delivers the sum over ranks for this rank's own chunk.
class GradSink {
 public:
  GradSink(const RingGroups& groups, RotateMethod method) : hops_{groups}, method_(method) {}

  void add(int step, int source, at::Tensor contribution) {
    const int cp = hops_.size();
    if (cp == 1) {
      send_buf_ = std::move(contribution);
      return;
    }
    if (method_ == RotateMethod::kAllGather) {
      if (!all_.defined()) {
        std::vector<int64_t> shape = contribution.sizes().vec();
        shape.insert(shape.begin(), cp);
        all_ = at::zeros(shape, contribution.options());
      }
      all_[source].copy_(contribution);
      return;
    }
    // Ring: add the accumulator that the previous rank passed on for this chunk (all earlier
    // ranks' contributions), and pass the sum on; after cp hops each chunk is home.
    if (step > 0) {
      recv_.wait();
      recv_buf_.add_(contribution);
      send_.wait();
      std::swap(send_buf_, recv_buf_);
    } else {
      send_buf_ = std::move(contribution);
      recv_buf_ = at::empty_like(send_buf_);
    }
    send_ = hops_.send(send_buf_, kTagGrad);
    recv_ = hops_.recv(recv_buf_, kTagGrad);
  }

  // This rank's dK/dV (2, bs, n_kv, L, hd) float32, after every step was added.
  at::Tensor finish() {
    if (hops_.size() == 1) return send_buf_;
    if (method_ == RotateMethod::kAllGather) {
      at::Tensor out = at::empty(all_.sizes().slice(1), all_.options());
      hops_.groups.cp->reduce_scatter_tensor(out, all_, dist::ReduceOp::kSum).wait();
      return out;
    }
    recv_.wait();
    send_.wait();
    return recv_buf_;
  }

 private:
  Hops hops_;
  RotateMethod method_;
  at::Tensor all_, send_buf_, recv_buf_;
  dist::Work send_, recv_;
};

// The pair walk's context for one call; the ids on the CPU too, read once per call (the walk
// decides there which blocks documents hide, without a device read per block).
ring::PairContext pair_context(RingAttention* self, const at::Tensor& docs,
                               const at::Tensor& docs_host, int64_t window, int64_t chunk,
                               double scale) {
  ring::PairContext ctx;
  ctx.window = window;
  ctx.chunk = chunk;
  ctx.scale = scale;
  ctx.layout = &self->layout();
  ctx.rank = self->group().rank();
  ctx.docs = docs;
  ctx.docs_host = docs_host;
  ctx.stats = &self->mutable_stats();
  return ctx;
}

at::Tensor saved_tensor(AutogradContext* ctx, const char* key) {
  const auto found = ctx->saved_data.find(key);
  return found != ctx->saved_data.end() ? found->second.toTensor() : at::Tensor();
}

// A kernel's saved log-sum-exp as (bs, L, n_heads) rows, and back: the explicit kernel's is
// folded (bs, n_kv, L * rep), the fused kernels' (bs, n_heads, L).
at::Tensor lse_rows(const at::Tensor& lse, AttentionKernel kernel, int64_t n_heads) {
  if (kernel != AttentionKernel::kNone) return lse.transpose(1, 2);
  const int64_t bs = lse.size(0), n_kv = lse.size(1), rep = n_heads / n_kv;
  return lse.view({bs, n_kv, -1, rep}).permute({0, 2, 1, 3}).reshape({bs, -1, n_heads});
}

at::Tensor lse_from_rows(const at::Tensor& rows, AttentionKernel kernel, int64_t n_kv) {
  if (kernel != AttentionKernel::kNone) return rows.transpose(1, 2).contiguous();
  const int64_t bs = rows.size(0), len = rows.size(1), rep = rows.size(2) / n_kv;
  return rows.view({bs, len, n_kv, rep}).permute({0, 2, 1, 3}).reshape({bs, n_kv, len * rep});
}

struct RingAttentionFunction : public torch::autograd::Function<RingAttentionFunction> {
  // `sinks`: gpt-oss's (n_heads) sink logits (context_parallel.h), or an empty tensor for none
  // (autograd wants a device for every tensor argument).
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, const at::Tensor& sinks,
                            const at::Tensor* docs_or_null, RingAttention* self, int64_t window,
                            int64_t chunk, double scale) {
    // Document ids travel outside the tensor arguments: autograd needs a device for each of
    // those, and causal attention has none.
    const at::Tensor docs = docs_or_null != nullptr ? *docs_or_null : at::Tensor();
    const at::Tensor docs_host = docs.defined() ? to_host(docs) : at::Tensor();
    const AttentionKernel kernel =
        ring::choose_pair_kernel(self->kernel(), q, k, docs.defined() || window > 0 || chunk > 0);
    const ring::PairContext pairs = pair_context(self, docs, docs_host, window, chunk, scale);
    const std::unique_ptr<ring::PairForward> attend =
        ring::make_pair_forward(kernel, q, k.size(2), pairs);
    KVSource kv_source(self->groups(), self->rotate(), at::stack({k, v}).contiguous());
    for (int step = 0; step < self->group().size(); ++step) {
      attend->add(kv_source.get(step), kv_source.source(step));
    }
    ring::PairForwardResult result = attend->finish();
    if (sinks.numel() > 0) {
      const at::Tensor lse = lse_rows(result.saved.at(0), kernel, q.size(2));  // (bs, L, heads)
      const at::Tensor sink = sinks.to(at::kFloat).view({1, 1, -1});
      result.out = (result.out.to(at::kFloat) * at::sigmoid(lse - sink).unsqueeze(-1))
                       .to(result.out.scalar_type())
                       .contiguous();
      result.saved[0] = lse_from_rows(at::logaddexp(lse, sink), kernel, k.size(2));
      ctx->saved_data["sinks"] = sinks;
    }
    ctx->saved_data["window"] = window;
    ctx->saved_data["chunk"] = chunk;
    ctx->saved_data["scale"] = scale;
    variable_list saved{q, k, v, result.out};
    saved.insert(saved.end(), result.saved.begin(), result.saved.end());
    ctx->save_for_backward(saved);
    ctx->saved_data["self"] = reinterpret_cast<int64_t>(self);
    ctx->saved_data["kernel"] = static_cast<int64_t>(kernel);
    if (docs.defined()) {
      ctx->saved_data["docs"] = docs;
      ctx->saved_data["docs_host"] = docs_host;
    }
    return result.out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto* self = reinterpret_cast<RingAttention*>(ctx->saved_data["self"].toInt());
    const auto kernel = static_cast<AttentionKernel>(ctx->saved_data["kernel"].toInt());
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& q = saved[0];
    const at::Tensor& k = saved[1];
    const at::Tensor& v = saved[2];
    const std::vector<at::Tensor> stats(saved.begin() + 4, saved.end());
    const ring::PairContext pairs =
        pair_context(self, saved_tensor(ctx, "docs"), saved_tensor(ctx, "docs_host"),
                     ctx->saved_data["window"].toInt(), ctx->saved_data["chunk"].toInt(),
                     ctx->saved_data["scale"].toDouble());
    const std::unique_ptr<ring::PairBackward> attend =
        ring::make_pair_backward(kernel, q, saved[3], stats, grads[0], k.size(2), pairs);
    KVSource kv_source(self->groups(), self->rotate(), at::stack({k, v}).contiguous());
    GradSink grad_sink(self->groups(), self->rotate());
    for (int step = 0; step < self->group().size(); ++step) {
      const int source = kv_source.source(step);
      grad_sink.add(step, source, attend->add(kv_source.get(step), source));
    }
    // (2, bs, n_kv, L, hd) -> (2, bs, L, n_kv, hd)
    const at::Tensor dkv = grad_sink.finish().permute({0, 1, 3, 2, 4});
    // The sinks' gradient: each sink is a key of value 0 in every query's softmax.
    at::Tensor dsinks;
    const at::Tensor sinks = saved_tensor(ctx, "sinks");
    if (sinks.defined()) {
      const at::Tensor delta = (grads[0].to(at::kFloat) * saved[3].to(at::kFloat)).sum(-1);
      const at::Tensor lse = lse_rows(stats.at(0), kernel, q.size(2));  // with the sinks
      dsinks = (at::exp(sinks.to(at::kFloat).view({1, 1, -1}) - lse) * delta)
                   .sum(at::IntArrayRef{0, 1})
                   .neg()
                   .to(sinks.scalar_type());
    }
    return {attend->finish(),
            dkv[0].to(k.scalar_type()).contiguous(),
            dkv[1].to(v.scalar_type()).contiguous(),
            dsinks,
            at::Tensor(),   // document ids
            at::Tensor(),   // self
            at::Tensor(),   // window
            at::Tensor(),   // chunk
            at::Tensor()};  // scale
  }
};

}  // namespace

const char* to_string(RingKernel kernel) {
  switch (kernel) {
    case RingKernel::kAuto: return "auto";
    case RingKernel::kFused: return "fused";
    case RingKernel::kExplicit: return "explicit";
  }
  return "?";
}

RingGroups RingGroups::split(std::shared_ptr<dist::Group> cp) {
  TITAN_CHECK(cp != nullptr, "RingGroups::split needs the cp group");
  RingGroups groups;
  groups.cp = std::move(cp);
  std::vector<int> all(static_cast<size_t>(groups.cp->size()));
  for (size_t r = 0; r < all.size(); ++r) all[r] = static_cast<int>(r);
  groups.up = groups.cp->new_subgroup(groups.cp->name() + "_up", all);
  groups.down = groups.cp->new_subgroup(groups.cp->name() + "_down", all);
  return groups;
}

RingAttention::RingAttention(RingGroups groups, SequenceLayout layout, RotateMethod rotate,
                             RingKernel kernel)
    : groups_(std::move(groups)), layout_(std::move(layout)), rotate_(rotate), kernel_(kernel) {
  TITAN_CHECK(groups_.cp != nullptr, "RingAttention needs the cp group");
  TITAN_CHECK(layout_.cp == groups_.cp->size(), "RingAttention: the sequence layout is for cp ",
              layout_.cp, " but the group ", groups_.cp->describe(), " has ", groups_.cp->size(),
              " ranks. HINT: make the layout with the cp group's size");
  if (rotate_ == RotateMethod::kAllToAll && groups_.cp->size() > 1) {
    TITAN_CHECK(groups_.up != nullptr && groups_.down != nullptr &&
                    groups_.up->size() == groups_.cp->size() &&
                    groups_.down->size() == groups_.cp->size(),
                "RingAttention (alltoall): the ring's hops need a communicator per direction "
                "over the cp ranks. HINT: pass ParallelDims' cp_up and cp_down groups, or "
                "RingGroups::split(cp)");
  }
}

RingAttention::RingAttention(std::shared_ptr<dist::Group> group, SequenceLayout layout,
                             RotateMethod rotate, RingKernel kernel)
    : RingAttention(rotate == RotateMethod::kAllToAll && group != nullptr && group->size() > 1
                        ? RingGroups::split(group)
                        : RingGroups{group, nullptr, nullptr},
                    std::move(layout), rotate, kernel) {}

at::Tensor RingAttention::forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  const at::Tensor& document_ids) {
  return forward_variant(q, k, v, document_ids, AttentionVariant{});
}

at::Tensor RingAttention::forward_variant(const at::Tensor& q, const at::Tensor& k,
                                          const at::Tensor& v, const at::Tensor& document_ids,
                                          const AttentionVariant& variant) {
  TITAN_CHECK(q.dim() == 4 && k.dim() == 4 && v.sizes() == k.sizes(),
              "RingAttention: expected q (bs, L, n_heads, hd), k and v (bs, L, n_kv_heads, hd), "
              "got ",
              q.sizes(), ", ", k.sizes(), ", ", v.sizes());
  TITAN_CHECK(q.size(0) == k.size(0) && q.size(1) == k.size(1) && q.size(3) == k.size(3),
              "RingAttention: q ", q.sizes(), " and k ", k.sizes(), " disagree");
  TITAN_CHECK(k.size(2) > 0 && q.size(2) % k.size(2) == 0, "n_kv_heads (", k.size(2),
              ") must divide n_heads (", q.size(2), ")");
  TITAN_CHECK(q.size(1) == layout_.local_len(), "RingAttention: local sequence length ", q.size(1),
              " != seq_len / cp = ", layout_.seq_len, " / ", layout_.cp, " = ", layout_.local_len(),
              ". HINT: shard the batch with shard_sequence and this layout");
  TITAN_CHECK(
      !variant.sinks.defined() || (variant.sinks.dim() == 1 && variant.sinks.size(0) == q.size(2)),
      "RingAttention: sinks ", variant.sinks.sizes(), " for ", q.size(2), " heads");
  TITAN_CHECK(variant.window >= 0 && variant.chunk >= 0, "RingAttention: window ", variant.window,
              ", chunk ", variant.chunk);
  at::Tensor docs;
  if (document_ids.defined()) {
    TITAN_CHECK(document_ids.dim() == 2 && document_ids.size(0) == q.size(0) &&
                    document_ids.size(1) == layout_.seq_len,
                "RingAttention: document ids must be (bs, seq_len) = (", q.size(0), ", ",
                layout_.seq_len, ") for the whole sequence, got ", document_ids.sizes());
    docs = document_ids.to(q.device(), at::kLong);
  }
  // Sinks travel as an empty tensor when there are none (autograd wants a device for each).
  const at::Tensor sinks = variant.sinks.defined() ? variant.sinks : at::empty({0}, q.options());
  return RingAttentionFunction::apply(q, k, v, sinks, docs.defined() ? &docs : nullptr, this,
                                      variant.window, variant.chunk, variant.scale);
}

ContextParallelAttention::ContextParallelAttention(
    std::vector<std::shared_ptr<RingAttention>> rings)
    : rings_(std::move(rings)) {
  TITAN_CHECK(!rings_.empty(), "context parallelism: no sequence length to attend over");
}

at::Tensor ContextParallelAttention::forward(const at::Tensor& q, const at::Tensor& k,
                                             const at::Tensor& v, const at::Tensor& document_ids) {
  return ring_for(q).forward(q, k, v, document_ids);
}

at::Tensor ContextParallelAttention::forward_variant(const at::Tensor& q, const at::Tensor& k,
                                                     const at::Tensor& v,
                                                     const at::Tensor& document_ids,
                                                     const AttentionVariant& variant) {
  return ring_for(q).forward_variant(q, k, v, document_ids, variant);
}

RingAttention& ContextParallelAttention::ring_for(const at::Tensor& q) {
  for (const auto& ring : rings_) {
    if (ring->layout().local_len() == q.size(1)) return *ring;
  }
  std::string lengths;
  for (const auto& ring : rings_) {
    lengths += (lengths.empty() ? "" : ", ") + std::to_string(ring->layout().seq_len);
  }
  TITAN_CHECK(false, "context parallelism: a local sequence of ", q.size(1),
              " tokens is no rank's share of the sequence lengths it was set up for (", lengths,
              ")");
  return *rings_.front();  // not reached
}

ContextParallel::ContextParallel(Model& model, const RingGroups& groups, int cp_rank, int64_t tp,
                                 const std::string& load_balancer, const std::string& rotate_method,
                                 const std::vector<std::pair<std::string, int64_t>>& seq_lens)
    : cp_rank_(cp_rank), rotate_(parse_rotate_method(rotate_method)) {
  TITAN_CONFIG_CHECK(load_balancer != "ptrr",
                     "parallelism.context_parallel_load_balancer = \"ptrr\" is not supported (it "
                     "balances flex attention's block masks). HINT: use \"headtail\" (the "
                     "default) or \"none\"");
  const SequenceSharding sharding =
      parse_sequence_sharding(load_balancer.empty() ? "none" : load_balancer);
  const bool headtail = sharding == SequenceSharding::kHeadTail;
  const int64_t cp = groups.cp->size();
  for (const auto& [key, len] : seq_lens) {
    const int64_t chunks = headtail ? 2 * cp : cp;
    TITAN_CONFIG_CHECK(len % (chunks * tp) == 0, key, " ", len, " must be divisible by ",
                       headtail ? "2 x " : "", "cp x tp = ", chunks * tp, " (", key, " % ",
                       chunks * tp, " = ", len % (chunks * tp),
                       "): context parallelism splits the sequence into ", chunks, " chunks",
                       tp > 1 ? ", and sequence parallelism each rank's share into tp" : "",
                       ". HINT: change ", key, " or the degrees");
    layouts_.emplace(len, SequenceLayout::make(len, cp, sharding));
  }
  for (const auto& item : model.named_modules()) {
    // Grouped-query attention and multi-head latent attention (whose q, k and v reach the
    // kernel padded to one head size) share the inner kernel's seam.
    std::shared_ptr<InnerAttention>* inner = nullptr;
    if (auto* attention = dynamic_cast<Attention*>(item.value().get())) {
      inner = &attention->inner_attention;
    } else if (auto* latent = dynamic_cast<MultiHeadLatentAttention*>(item.value().get())) {
      inner = &latent->inner_attention;
    }
    if (inner == nullptr) continue;
    std::vector<std::shared_ptr<RingAttention>> rings;
    for (const auto& [len, layout] : layouts_) {
      rings.push_back(std::make_shared<RingAttention>(groups, layout, rotate_));
    }
    *inner = std::make_shared<ContextParallelAttention>(std::move(rings));
  }
}

std::string ContextParallel::describe() const {
  if (layouts_.empty()) return "";  // set up for no sequence length: nothing to describe
  const SequenceLayout& layout = layouts_.begin()->second;
  return message("context parallelism: ring attention (", to_string(rotate_), ") over cp ",
                 layout.cp, ", ", to_string(layout.sharding),
                 " sequence sharding; FSDP over dp_shard x cp, losses averaged over dp x cp");
}

void ContextParallel::shard_batch(ForwardBatch& batch) const {
  const auto it = layouts_.find(batch.inputs.size(1));
  TITAN_CHECK(it != layouts_.end(), "context parallelism: batches of ", batch.inputs.size(1),
              " tokens per sequence, but it was set up for other lengths");
  const SequenceLayout& layout = it->second;
  // The document ids stay whole: ring attention masks with the whole sequences' ids. Positions
  // the batch gives (bs, seq_len) (packed samples restart at 0) are sharded as the tokens.
  batch.forward.positions = batch.forward.positions.defined()
                                ? shard_sequence(batch.forward.positions, layout, cp_rank_)
                                : layout.positions(cp_rank_, batch.inputs.device());
  batch.inputs = shard_sequence(batch.inputs, layout, cp_rank_);
  batch.labels = shard_sequence(batch.labels, layout, cp_rank_);
}

}  // namespace titan
