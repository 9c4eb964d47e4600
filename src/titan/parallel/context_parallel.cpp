// Context parallelism: sequence layouts and ring attention (see context_parallel.h).
//
// Layout of the float32 working tensors. Queries are folded by kv head: q (bs, L, n_heads, hd)
// becomes (bs, n_kv, L * rep, hd) with row t * rep + r holding position t of query head
// g * rep + r, so one batched matmul per kv head serves the rep query heads that share it, and a
// query chunk [a, b) is the contiguous rows [a * rep, b * rep). Keys and values are
// (bs, n_kv, L, hd). Scores of a chunk pair are (bs, n_kv, lq * rep, lk), viewed as
// (bs, n_kv, lq, rep, lk) to apply a (bs or 1, 1, lq, 1, lk) mask.
#include "titan/parallel/context_parallel.h"

#include "titan/common/check.h"

#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

namespace titan {

SequenceSharding parse_sequence_sharding(const std::string& name) {
  if (name == "none") return SequenceSharding::kNone;
  if (name == "headtail") return SequenceSharding::kHeadTail;
  throw ConfigError("unknown context-parallel sequence sharding '" + name +
                    "'. HINT: use \"headtail\" (causal load balancing) or \"none\"");
}

const char* to_string(SequenceSharding sharding) {
  return sharding == SequenceSharding::kHeadTail ? "headtail" : "none";
}

RotateMethod parse_rotate_method(const std::string& name) {
  if (name == "allgather") return RotateMethod::kAllGather;
  if (name == "alltoall") return RotateMethod::kAllToAll;
  throw ConfigError("unknown context-parallel rotate method '" + name +
                    "'. HINT: use \"allgather\" or \"alltoall\"");
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

constexpr double kNegInf = -std::numeric_limits<double>::infinity();
constexpr int kTagKV = 0;
constexpr int kTagGrad = 1;

struct Geometry {
  int64_t bs, len, n_heads, n_kv, rep, head_dim;
  double scale;
};

Geometry geometry_of(const at::Tensor& q, const at::Tensor& k) {
  Geometry g{};
  g.bs = q.size(0);
  g.len = q.size(1);
  g.n_heads = q.size(2);
  g.n_kv = k.size(2);
  g.head_dim = q.size(3);
  g.rep = g.n_heads / g.n_kv;
  g.scale = 1.0 / std::sqrt(static_cast<double>(g.head_dim));
  return g;
}

// (bs, L, n_heads, hd) -> (bs, n_kv, L * rep, hd) float32.
at::Tensor fold_queries(const at::Tensor& q, const Geometry& g) {
  return q.to(at::kFloat)
      .view({g.bs, g.len, g.n_kv, g.rep, g.head_dim})
      .permute({0, 2, 1, 3, 4})
      .reshape({g.bs, g.n_kv, g.len * g.rep, g.head_dim});
}

// The inverse: (bs, n_kv, L * rep, hd) -> (bs, L, n_heads, hd) contiguous in `dtype`.
at::Tensor unfold_queries(const at::Tensor& x, const Geometry& g, at::ScalarType dtype) {
  return x.view({g.bs, g.n_kv, g.len, g.rep, g.head_dim})
      .permute({0, 2, 1, 3, 4})
      .reshape({g.bs, g.len, g.n_heads, g.head_dim})
      .to(dtype)
      .contiguous();
}

// Which part of a (query chunk, key chunk) pair the mask keeps.
struct PairMask {
  enum Kind { kHidden, kAll, kPartial } kind = kAll;
  at::Tensor keep;  // kPartial: (bs or 1, 1, lq, 1, lk) bool
};

// Causal by global position; with `docs` (bs, seq_len) also within the same document.
PairMask pair_mask(const PositionRange& qr, const PositionRange& kr, const at::Tensor& docs,
                   at::Device device) {
  PairMask m;
  if (qr.end - 1 < kr.start) {  // every key is after every query
    m.kind = PairMask::kHidden;
    return m;
  }
  const bool causal_all = kr.end - 1 <= qr.start;  // every key is at or before every query
  const auto long_options = at::TensorOptions(at::kLong).device(device);
  at::Tensor keep;  // (bs or 1, lq, lk)
  if (!causal_all) {
    const at::Tensor qpos = at::arange(qr.start, qr.end, long_options).unsqueeze(1);
    const at::Tensor kpos = at::arange(kr.start, kr.end, long_options).unsqueeze(0);
    keep = kpos.le(qpos).unsqueeze(0);
  }
  if (docs.defined()) {
    const at::Tensor same = docs.narrow(1, qr.start, qr.size())
                                .unsqueeze(2)
                                .eq(docs.narrow(1, kr.start, kr.size()).unsqueeze(1));
    keep = keep.defined() ? keep.logical_and(same) : same;
    // One host sync per pair: documents may make a causally visible pair entirely hidden.
    if (!keep.any().item<bool>()) {
      m.kind = PairMask::kHidden;
      return m;
    }
  }
  if (!keep.defined()) return m;  // kAll
  m.kind = PairMask::kPartial;
  m.keep = keep.view({keep.size(0), 1, qr.size(), 1, kr.size()});
  return m;
}

// Scaled, masked scores of query rows q_blk (bs, n_kv, lq * rep, hd) against k_blk
// (bs, n_kv, lk, hd): (bs, n_kv, lq * rep, lk) float32.
at::Tensor pair_scores(const at::Tensor& q_blk, const at::Tensor& k_blk, const PairMask& mask,
                       const Geometry& g) {
  at::Tensor s = at::matmul(q_blk, k_blk.transpose(-1, -2)).mul_(g.scale);
  if (mask.kind == PairMask::kPartial) {
    const int64_t lq = q_blk.size(2) / g.rep;
    s.view({g.bs, g.n_kv, lq, g.rep, k_blk.size(2)}).masked_fill_(mask.keep.logical_not(), kNegInf);
  }
  return s;
}

// -inf (a row that sees no key yet) -> 0, so that exp(x - lse) is 0 rather than NaN.
at::Tensor finite_or_zero(const at::Tensor& lse) { return lse.masked_fill(lse.isneginf(), 0.0); }

// Offsets of a rank's chunks in its local sequence.
std::vector<int64_t> local_offsets(const std::vector<PositionRange>& ranges) {
  std::vector<int64_t> offsets;
  int64_t at = 0;
  for (const PositionRange& r : ranges) {
    offsets.push_back(at);
    at += r.size();
  }
  return offsets;
}

// Every rank's K and V, stacked as kv (2, bs, L, n_kv, hd) in the input dtype, in ring order:
// step s yields source rank (rank - s) mod cp, own first. The transfer for step s + 1 is in
// flight while the caller computes on step s.
class KVSource {
 public:
  KVSource(dist::Group& g, RotateMethod method, const at::Tensor& own)
      : g_(g), method_(method), cur_(own) {
    if (g_.size() == 1) return;
    if (method_ == RotateMethod::kAllGather) {
      std::vector<int64_t> shape = own.sizes().vec();
      shape.insert(shape.begin(), g_.size());
      gathered_ = at::empty(shape, own.options());  // (cp, 2, bs, L, n_kv, hd)
      gather_ = g_.all_gather_into_tensor(gathered_, own);
    } else {
      other_ = at::empty_like(own);
    }
  }

  int source(int step) const { return (g_.rank() - step + g_.size()) % g_.size(); }

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
    if (step + 1 >= g_.size()) return;
    send_ = g_.send(cur_, (g_.rank() + 1) % g_.size(), kTagKV);
    recv_ = g_.recv(other_, (g_.rank() + g_.size() - 1) % g_.size(), kTagKV);
  }

  dist::Group& g_;
  RotateMethod method_;
  at::Tensor cur_, other_, gathered_;
  dist::Work gather_, send_, recv_;
};

// Collects the float32 dK/dV contributions (2, bs, n_kv, L, hd) of each step for the chunk of
// KVSource::source(step) and delivers the sum over ranks for this rank's own chunk.
class GradSink {
 public:
  GradSink(dist::Group& g, RotateMethod method) : g_(g), method_(method) {}

  void add(int step, int source, at::Tensor contribution) {
    const int cp = g_.size();
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
    send_ = g_.send(send_buf_, (g_.rank() + 1) % cp, kTagGrad);
    recv_ = g_.recv(recv_buf_, (g_.rank() + cp - 1) % cp, kTagGrad);
  }

  // This rank's dK/dV (2, bs, n_kv, L, hd) float32, after every step was added.
  at::Tensor finish() {
    if (g_.size() == 1) return send_buf_;
    if (method_ == RotateMethod::kAllGather) {
      at::Tensor out = at::empty(all_.sizes().slice(1), all_.options());
      g_.reduce_scatter_tensor(out, all_, dist::ReduceOp::kSum).wait();
      return out;
    }
    recv_.wait();
    send_.wait();
    return recv_buf_;
  }

 private:
  dist::Group& g_;
  RotateMethod method_;
  at::Tensor all_, send_buf_, recv_buf_;
  dist::Work send_, recv_;
};

// kv (2, bs, L, n_kv, hd) -> k, v (bs, n_kv, L, hd) float32.
std::pair<at::Tensor, at::Tensor> fold_kv(const at::Tensor& kv) {
  const at::Tensor f = kv.to(at::kFloat).permute({0, 1, 3, 2, 4}).contiguous();
  return {f[0], f[1]};
}

// Positions per side of the blocks a chunk pair is computed in: a block's float32 scores are
// bs * n_heads * kBlock^2 * 4 bytes (32 MiB for 8 heads), whatever the sequence length, and the
// blocks above the causal diagonal (or between two documents) are skipped.
constexpr int64_t kBlock = 1024;

// The shared walk over every (query block, key block) pair of one step: the chunk pairs of the
// layout, each cut into blocks of at most kBlock positions per side.
template <typename Body>
void for_each_pair(const SequenceLayout& layout, int rank, int source, const at::Tensor& docs,
                   at::Device device, RingAttention::Stats& stats, const Body& body) {
  const auto& q_ranges = layout.ranges[rank];
  const auto& k_ranges = layout.ranges[source];
  const std::vector<int64_t> q_off = local_offsets(q_ranges);
  const std::vector<int64_t> k_off = local_offsets(k_ranges);
  for (size_t i = 0; i < q_ranges.size(); ++i) {
    for (size_t j = 0; j < k_ranges.size(); ++j) {
      const PositionRange& qr = q_ranges[i];
      const PositionRange& kr = k_ranges[j];
      for (int64_t qa = 0; qa < qr.size(); qa += kBlock) {
        const PositionRange qb{qr.start + qa, std::min(qr.end, qr.start + qa + kBlock)};
        for (int64_t ka = 0; ka < kr.size(); ka += kBlock) {
          const PositionRange kb{kr.start + ka, std::min(kr.end, kr.start + ka + kBlock)};
          const PairMask mask = pair_mask(qb, kb, docs, device);
          if (mask.kind == PairMask::kHidden) {
            ++stats.skipped_pairs;
            continue;
          }
          ++stats.computed_pairs;
          body(q_off[i] + qa, qb.size(), k_off[j] + ka, kb.size(), mask);
        }
      }
    }
  }
}

struct RingAttentionFunction : public torch::autograd::Function<RingAttentionFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, const at::Tensor* docs_or_null,
                            RingAttention* self) {
    // Document ids travel outside the tensor arguments: autograd needs a device for each of
    // those, and causal attention has none.
    const at::Tensor docs = docs_or_null != nullptr ? *docs_or_null : at::Tensor();
    dist::Group& group = self->group();
    const Geometry g = geometry_of(q, k);
    const at::Tensor q_f = fold_queries(q, g);  // (bs, n_kv, L * rep, hd)
    at::Tensor out_f = at::zeros_like(q_f);
    at::Tensor lse = at::full({g.bs, g.n_kv, g.len * g.rep}, kNegInf, q_f.options());
    KVSource kv_source(group, self->rotate(), at::stack({k, v}).contiguous());
    for (int step = 0; step < group.size(); ++step) {
      const int source = kv_source.source(step);
      const auto [k_f, v_f] = fold_kv(kv_source.get(step));
      for_each_pair(self->layout(), group.rank(), source, docs, q.device(), self->mutable_stats(),
                    [&](int64_t q0, int64_t lq, int64_t k0, int64_t lk, const PairMask& mask) {
                      const at::Tensor s = pair_scores(q_f.narrow(2, q0 * g.rep, lq * g.rep),
                                                       k_f.narrow(2, k0, lk), mask, g);
                      const at::Tensor lse_pair = at::logsumexp(s, -1);  // (bs, n_kv, lq * rep)
                      const at::Tensor p = (s - finite_or_zero(lse_pair).unsqueeze(-1)).exp_();
                      const at::Tensor out_pair = at::matmul(p, v_f.narrow(2, k0, lk));
                      // Online softmax: out = (out e^lse + out_pair e^lse_pair) / e^new_lse.
                      at::Tensor out_rows = out_f.narrow(2, q0 * g.rep, lq * g.rep);
                      at::Tensor lse_rows = lse.narrow(2, q0 * g.rep, lq * g.rep);
                      const at::Tensor new_lse = at::logaddexp(lse_rows, lse_pair);
                      const at::Tensor base = finite_or_zero(new_lse);
                      out_rows.mul_((lse_rows - base).exp_().unsqueeze(-1))
                          .add_(out_pair.mul_((lse_pair - base).exp_().unsqueeze(-1)));
                      lse_rows.copy_(new_lse);
                    });
    }
    const at::Tensor out = unfold_queries(out_f, g, v.scalar_type());
    ctx->save_for_backward({q, k, v, out, lse});
    ctx->saved_data["self"] = reinterpret_cast<int64_t>(self);
    if (docs.defined()) ctx->saved_data["docs"] = docs;
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto* self = reinterpret_cast<RingAttention*>(ctx->saved_data["self"].toInt());
    dist::Group& group = self->group();
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& q = saved[0];
    const at::Tensor& k = saved[1];
    const at::Tensor& v = saved[2];
    const at::Tensor& lse = saved[4];  // (bs, n_kv, L * rep) float32
    const auto found = ctx->saved_data.find("docs");
    const at::Tensor docs =
        found != ctx->saved_data.end() ? found->second.toTensor() : at::Tensor();
    const Geometry g = geometry_of(q, k);
    const at::Tensor q_f = fold_queries(q, g);
    const at::Tensor dout_f = fold_queries(grads[0].contiguous(), g);
    // delta = rowsum(dO * O): the softmax backward's per-row term, over the whole key range.
    const at::Tensor delta = (dout_f * fold_queries(saved[3], g)).sum(-1);  // (bs, n_kv, L * rep)
    at::Tensor dq_f = at::zeros_like(q_f);
    KVSource kv_source(group, self->rotate(), at::stack({k, v}).contiguous());
    GradSink grad_sink(group, self->rotate());
    for (int step = 0; step < group.size(); ++step) {
      const int source = kv_source.source(step);
      const auto [k_f, v_f] = fold_kv(kv_source.get(step));
      at::Tensor dkv = at::zeros({2, g.bs, g.n_kv, g.len, g.head_dim}, q_f.options());
      for_each_pair(
          self->layout(), group.rank(), source, docs, q.device(), self->mutable_stats(),
          [&](int64_t q0, int64_t lq, int64_t k0, int64_t lk, const PairMask& mask) {
            const at::Tensor q_blk = q_f.narrow(2, q0 * g.rep, lq * g.rep);
            const at::Tensor k_blk = k_f.narrow(2, k0, lk);
            const at::Tensor v_blk = v_f.narrow(2, k0, lk);
            const at::Tensor dout_blk = dout_f.narrow(2, q0 * g.rep, lq * g.rep);
            // p with the final statistics: the probabilities of the whole softmax.
            const at::Tensor p = pair_scores(q_blk, k_blk, mask, g)
                                     .sub_(lse.narrow(2, q0 * g.rep, lq * g.rep).unsqueeze(-1))
                                     .exp_();  // (bs, n_kv, lq * rep, lk)
            dkv[1].narrow(2, k0, lk).add_(at::matmul(p.transpose(-1, -2), dout_blk));
            const at::Tensor ds = at::matmul(dout_blk, v_blk.transpose(-1, -2))
                                      .sub_(delta.narrow(2, q0 * g.rep, lq * g.rep).unsqueeze(-1))
                                      .mul_(p)
                                      .mul_(g.scale);
            dq_f.narrow(2, q0 * g.rep, lq * g.rep).add_(at::matmul(ds, k_blk));
            dkv[0].narrow(2, k0, lk).add_(at::matmul(ds.transpose(-1, -2), q_blk));
          });
      grad_sink.add(step, source, dkv);
    }
    // (2, bs, n_kv, L, hd) -> (2, bs, L, n_kv, hd)
    const at::Tensor dkv = grad_sink.finish().permute({0, 1, 3, 2, 4});
    return {unfold_queries(dq_f, g, q.scalar_type()), dkv[0].to(k.scalar_type()).contiguous(),
            dkv[1].to(v.scalar_type()).contiguous(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

RingAttention::RingAttention(std::shared_ptr<dist::Group> group, SequenceLayout layout,
                             RotateMethod rotate)
    : group_(std::move(group)), layout_(std::move(layout)), rotate_(rotate) {
  TITAN_CHECK(group_ != nullptr, "RingAttention needs the cp group");
  TITAN_CHECK(layout_.cp == group_->size(), "RingAttention: the sequence layout is for cp ",
              layout_.cp, " but the group ", group_->describe(), " has ", group_->size(),
              " ranks. HINT: make the layout with the cp group's size");
}

at::Tensor RingAttention::forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  const at::Tensor& document_ids) {
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
  at::Tensor docs;
  if (document_ids.defined()) {
    TITAN_CHECK(document_ids.dim() == 2 && document_ids.size(0) == q.size(0) &&
                    document_ids.size(1) == layout_.seq_len,
                "RingAttention: document ids must be (bs, seq_len) = (", q.size(0), ", ",
                layout_.seq_len, ") for the whole sequence, got ", document_ids.sizes());
    docs = document_ids.to(q.device(), at::kLong);
  }
  return RingAttentionFunction::apply(q, k, v, docs.defined() ? &docs : nullptr, this);
}

ContextParallelAttention::ContextParallelAttention(
    std::vector<std::shared_ptr<RingAttention>> rings)
    : rings_(std::move(rings)) {
  TITAN_CHECK(!rings_.empty(), "context parallelism: no sequence length to attend over");
}

at::Tensor ContextParallelAttention::forward(const at::Tensor& q, const at::Tensor& k,
                                             const at::Tensor& v, const at::Tensor& document_ids) {
  for (const auto& ring : rings_) {
    if (ring->layout().local_len() == q.size(1)) return ring->forward(q, k, v, document_ids);
  }
  std::string lengths;
  for (const auto& ring : rings_) {
    lengths += (lengths.empty() ? "" : ", ") + std::to_string(ring->layout().seq_len);
  }
  TITAN_CHECK(false, "context parallelism: a local sequence of ", q.size(1),
              " tokens is no rank's share of the sequence lengths it was set up for (", lengths,
              ")");
  return {};
}

}  // namespace titan
