// Ring attention's pair kernels (see ring_attention_pairs.h).
//
// The explicit kernel's float32 working tensors: queries are folded by kv head, q (bs, L,
// n_heads, hd) becoming (bs, n_kv, L * rep, hd) with row t * rep + r holding position t of query
// head g * rep + r, so one batched matmul per kv head serves the rep query heads that share it,
// and a query block [a, b) is the contiguous rows [a * rep, b * rep). Keys and values are
// (bs, n_kv, L, hd). Scores of a block pair are (bs, n_kv, lq * rep, lk), viewed as
// (bs, n_kv, lq, rep, lk) to apply a (bs or 1, 1, lq, 1, lk) mask.
//
// The fused kernels take (bs, heads, l, hd) views of the (bs, L, heads, hd) tensors (no copies);
// their running output is float32 (bs, L, n_heads, hd) and the log-sum-exp (bs, n_heads, L).
#include "titan/parallel/ring_attention_pairs.h"

#include "titan/common/check.h"
#include "titan/common/cpu.h"
#include "titan/common/device.h"

#include <ATen/SDPBackend.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <utility>

namespace titan::ring {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// Positions per side of the blocks a chunk pair is cut into where a mask must be materialised
// (the explicit kernel; documents): a block's float32 scores or mask are bs * heads * kBlock^2 * 4
// bytes at most (32 MiB for 8 heads) whatever the sequence, and blocks above the causal diagonal
// or between two documents are skipped. Fused causal pairs go whole.
constexpr int64_t kBlock = 1024;

// ---- The walk over a step's pairs ----------------------------------------------------------

// Which part of a (query block, key block) pair the mask keeps.
struct PairMask {
  enum Kind { kHidden, kAll, kPartial } kind = kAll;
  // kPartial without documents: a block on the causal diagonal (same positions on both sides).
  bool causal = false;
  at::Tensor keep;  // kPartial: (bs or 1, lq, lk) bool on the queries' device
};

PairMask pair_mask(const PositionRange& qr, const PositionRange& kr, const PairContext& ctx,
                   at::Device device) {
  PairMask m;
  const int64_t window = ctx.window, chunk = ctx.chunk;
  // Every key after every query, (sliding window) too old for every query, or (chunks) in a chunk
  // before every query's (keys at or before the queries: a later key is hidden by causality).
  if (qr.end - 1 < kr.start || (window > 0 && qr.start - (kr.end - 1) >= window) ||
      (chunk > 0 && (kr.end - 1) / chunk < qr.start / chunk)) {
    m.kind = PairMask::kHidden;
    return m;
  }
  const bool causal_all = kr.end - 1 <= qr.start;  // every key is at or before every query
  const bool window_all = window <= 0 || (qr.end - 1) - kr.start < window;  // none too old
  // Every key and query in one chunk.
  const bool chunk_all =
      chunk <= 0 || std::min(kr.start, qr.start) / chunk == (std::max(kr.end, qr.end) - 1) / chunk;
  const bool local_all = window_all && chunk_all;
  const auto positions = [](const PositionRange& r, at::Device on) {
    return at::arange(r.start, r.end, at::TensorOptions(at::kLong).device(on));
  };
  // Where key position <= query position and, with a window or chunks, within them: (lq, lk)
  // bool.
  const auto visible = [&](at::Device on) {
    const at::Tensor qp = positions(qr, on).unsqueeze(1), kp = positions(kr, on).unsqueeze(0);
    at::Tensor keep = kp.le(qp);
    if (window > 0) keep.logical_and_((qp - kp).lt(window));
    if (chunk > 0) keep.logical_and_(qp.div(chunk, "floor").eq(kp.div(chunk, "floor")));
    return keep;
  };
  if (!ctx.docs.defined() && (window > 0 || chunk > 0)) {
    if (causal_all && local_all) return m;  // kAll
    m.kind = PairMask::kPartial;            // an additive mask for the fused kernels (not causal)
    m.keep = visible(device).unsqueeze(0);
    return m;
  }
  if (!ctx.docs.defined()) {
    if (causal_all) return m;  // kAll
    // Chunks are equal and blocks cut alike from their starts: a partly visible block pair is
    // one block against itself.
    TITAN_CHECK(qr.start == kr.start && qr.end == kr.end, "ring attention: block [", qr.start, ", ",
                qr.end, ") meets keys [", kr.start, ", ", kr.end, ") off the diagonal");
    m.kind = PairMask::kPartial;
    m.causal = true;
    m.keep = positions(kr, device).unsqueeze(0).le(positions(qr, device).unsqueeze(1)).unsqueeze(0);
    return m;
  }
  // Documents: decided on the host copy of the ids, so that telling hidden blocks apart costs no
  // device read per block.
  const at::Tensor& docs = ctx.docs_host;
  at::Tensor keep = docs.narrow(1, qr.start, qr.size())
                        .unsqueeze(2)
                        .eq(docs.narrow(1, kr.start, kr.size()).unsqueeze(1));  // (bs, lq, lk)
  if (!causal_all || !local_all) keep.logical_and_(visible(at::kCPU));
  if (!keep.any().item<bool>()) {
    m.kind = PairMask::kHidden;
    return m;
  }
  if (keep.all().item<bool>()) return m;  // kAll: one document, every key visible
  m.kind = PairMask::kPartial;
  m.keep = keep.to(device);
  return m;
}

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

// Every (query block, key block) pair of this rank's queries against `source`'s keys: the chunk
// pairs of the layout, each cut into blocks of at most `block` positions per side. body(q0, lq,
// k0, lk, mask) gets local offsets and lengths.
template <typename Body>
void for_each_pair(const PairContext& ctx, int source, int64_t block, at::Device device,
                   const Body& body) {
  const auto& q_ranges = ctx.layout->ranges[ctx.rank];
  const auto& k_ranges = ctx.layout->ranges[source];
  const std::vector<int64_t> q_off = local_offsets(q_ranges);
  const std::vector<int64_t> k_off = local_offsets(k_ranges);
  for (size_t i = 0; i < q_ranges.size(); ++i) {
    for (size_t j = 0; j < k_ranges.size(); ++j) {
      const PositionRange& qr = q_ranges[i];
      const PositionRange& kr = k_ranges[j];
      for (int64_t qa = 0; qa < qr.size(); qa += block) {
        const PositionRange qb{qr.start + qa, std::min(qr.end, qr.start + qa + block)};
        for (int64_t ka = 0; ka < kr.size(); ka += block) {
          const PositionRange kb{kr.start + ka, std::min(kr.end, kr.start + ka + block)};
          const PairMask mask = pair_mask(qb, kb, ctx, device);
          if (mask.kind == PairMask::kHidden) {
            ++ctx.stats->skipped_pairs;
            continue;
          }
          ++ctx.stats->computed_pairs;
          body(q_off[i] + qa, qb.size(), k_off[j] + ka, kb.size(), mask);
        }
      }
    }
  }
}

// -inf (a row that sees no key yet) -> 0, so that exp(x - lse) is 0 rather than NaN.
at::Tensor finite_or_zero(const at::Tensor& lse) { return lse.masked_fill(lse.isneginf(), 0.0); }

// Online softmax: out = (out e^lse + pair e^lse_pair) / e^(lse + lse_pair), lse updated. out and
// lse are float32 views of the running result; out_pair (.., rows, hd) any floating dtype (a
// temporary: it may be scaled in place), lse_pair (.., rows) float32.
void merge_into(at::Tensor out, at::Tensor lse, const at::Tensor& out_pair,
                const at::Tensor& lse_pair) {
  const at::Tensor new_lse = at::logaddexp(lse, lse_pair);
  const at::Tensor base = finite_or_zero(new_lse);
  out.mul_((lse - base).exp_().unsqueeze(-1))
      .add_(out_pair.to(at::kFloat).mul_((lse_pair - base).exp_().unsqueeze(-1)));
  lse.copy_(new_lse);
}

// ---- Explicit float32 blocks -----------------------------------------------------------------

struct Geometry {
  int64_t bs, len, n_heads, n_kv, rep, head_dim;
  double scale;
};

// The scores' scale: the context's, else head_dim^-0.5.
double scale_of(const PairContext& ctx, const at::Tensor& q) {
  return ctx.scale > 0 ? ctx.scale : 1.0 / std::sqrt(static_cast<double>(q.size(3)));
}

Geometry geometry_of(const at::Tensor& q, int64_t n_kv) {
  Geometry g{};
  g.bs = q.size(0);
  g.len = q.size(1);
  g.n_heads = q.size(2);
  g.n_kv = n_kv;
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

// kv (2, bs, L, n_kv, hd) -> k, v (bs, n_kv, L, hd) float32.
std::pair<at::Tensor, at::Tensor> fold_kv(const at::Tensor& kv) {
  const at::Tensor f = kv.to(at::kFloat).permute({0, 1, 3, 2, 4}).contiguous();
  return {f[0], f[1]};
}

// Scaled, masked scores of query rows q_blk (bs, n_kv, lq * rep, hd) against k_blk
// (bs, n_kv, lk, hd): (bs, n_kv, lq * rep, lk) float32.
at::Tensor pair_scores(const at::Tensor& q_blk, const at::Tensor& k_blk, const PairMask& mask,
                       const Geometry& g) {
  at::Tensor s = at::matmul(q_blk, k_blk.transpose(-1, -2)).mul_(g.scale);
  if (mask.kind == PairMask::kPartial) {
    const int64_t lq = q_blk.size(2) / g.rep;
    const at::Tensor hidden = mask.keep.logical_not().view({-1, 1, lq, 1, k_blk.size(2)});
    s.view({g.bs, g.n_kv, lq, g.rep, k_blk.size(2)}).masked_fill_(hidden, kNegInf);
  }
  return s;
}

class ExplicitForward final : public PairForward {
 public:
  ExplicitForward(const at::Tensor& q, int64_t n_kv, const PairContext& ctx)
      : ctx_(ctx), g_(geometry_of(q, n_kv)), dtype_(q.scalar_type()), device_(q.device()) {
    g_.scale = scale_of(ctx, q);
    q_f_ = fold_queries(q, g_);
    out_f_ = at::zeros_like(q_f_);
    lse_ = at::full({g_.bs, g_.n_kv, g_.len * g_.rep}, kNegInf, q_f_.options());
  }

  void add(const at::Tensor& kv, int source) override {
    const auto [k_f, v_f] = fold_kv(kv);
    const int64_t rep = g_.rep;
    for_each_pair(
        ctx_, source, kBlock, device_,
        [&](int64_t q0, int64_t lq, int64_t k0, int64_t lk, const PairMask& mask) {
          const at::Tensor s =
              pair_scores(q_f_.narrow(2, q0 * rep, lq * rep), k_f.narrow(2, k0, lk), mask, g_);
          const at::Tensor lse_pair = at::logsumexp(s, -1);  // (bs, n_kv, lq * rep)
          const at::Tensor p = (s - finite_or_zero(lse_pair).unsqueeze(-1)).exp_();
          merge_into(out_f_.narrow(2, q0 * rep, lq * rep), lse_.narrow(2, q0 * rep, lq * rep),
                     at::matmul(p, v_f.narrow(2, k0, lk)), lse_pair);
        });
  }

  PairForwardResult finish() override { return {unfold_queries(out_f_, g_, dtype_), {lse_}}; }

 private:
  const PairContext& ctx_;
  Geometry g_;
  at::ScalarType dtype_;
  at::Device device_;
  at::Tensor q_f_, out_f_, lse_;  // folded (see the top); lse (bs, n_kv, L * rep)
};

class ExplicitBackward final : public PairBackward {
 public:
  ExplicitBackward(const at::Tensor& q, const at::Tensor& out, const at::Tensor& lse,
                   const at::Tensor& dout, int64_t n_kv, const PairContext& ctx)
      : ctx_(ctx),
        g_(geometry_of(q, n_kv)),
        dtype_(q.scalar_type()),
        device_(q.device()),
        lse_(lse) {
    g_.scale = scale_of(ctx, q);
    q_f_ = fold_queries(q, g_);
    dout_f_ = fold_queries(dout.contiguous(), g_);
    // delta = rowsum(dO * O): the softmax backward's per-row term, over the whole key range.
    delta_ = (dout_f_ * fold_queries(out, g_)).sum(-1);  // (bs, n_kv, L * rep)
    dq_f_ = at::zeros_like(q_f_);
  }

  at::Tensor add(const at::Tensor& kv, int source) override {
    const auto [k_f, v_f] = fold_kv(kv);
    const int64_t rep = g_.rep;
    at::Tensor dkv = at::zeros({2, g_.bs, g_.n_kv, g_.len, g_.head_dim}, q_f_.options());
    for_each_pair(ctx_, source, kBlock, device_,
                  [&](int64_t q0, int64_t lq, int64_t k0, int64_t lk, const PairMask& mask) {
                    const at::Tensor q_blk = q_f_.narrow(2, q0 * rep, lq * rep);
                    const at::Tensor k_blk = k_f.narrow(2, k0, lk);
                    const at::Tensor dout_blk = dout_f_.narrow(2, q0 * rep, lq * rep);
                    // p with the final statistics: the probabilities of the whole softmax.
                    const at::Tensor p = pair_scores(q_blk, k_blk, mask, g_)
                                             .sub_(lse_.narrow(2, q0 * rep, lq * rep).unsqueeze(-1))
                                             .exp_();  // (bs, n_kv, lq * rep, lk)
                    dkv[1].narrow(2, k0, lk).add_(at::matmul(p.transpose(-1, -2), dout_blk));
                    const at::Tensor ds =
                        at::matmul(dout_blk, v_f.narrow(2, k0, lk).transpose(-1, -2))
                            .sub_(delta_.narrow(2, q0 * rep, lq * rep).unsqueeze(-1))
                            .mul_(p)
                            .mul_(g_.scale);
                    dq_f_.narrow(2, q0 * rep, lq * rep).add_(at::matmul(ds, k_blk));
                    dkv[0].narrow(2, k0, lk).add_(at::matmul(ds.transpose(-1, -2), q_blk));
                  });
    return dkv;
  }

  at::Tensor finish() override { return unfold_queries(dq_f_, g_, dtype_); }

 private:
  const PairContext& ctx_;
  Geometry g_;
  at::ScalarType dtype_;
  at::Device device_;
  at::Tensor lse_, q_f_, dout_f_, delta_, dq_f_;
};

// ---- ATen's fused kernels ------------------------------------------------------------------

// A partly visible pair's mask for the kernel: nothing for a causal diagonal block (the kernel's
// is_causal), else additive (bs or 1, 1, lq, lk) in `dtype`, 0 where kept and -inf elsewhere.
std::optional<at::Tensor> kernel_mask(const PairMask& mask, at::ScalarType dtype) {
  if (mask.kind != PairMask::kPartial || mask.causal) return std::nullopt;
  return at::zeros(mask.keep.sizes(), mask.keep.options().dtype(dtype))
      .masked_fill_(mask.keep.logical_not(), kNegInf)
      .unsqueeze(1);
}

// The dtype the fused kernel computes in: bf16 goes through float32 on CPUs whose bf16 GEMMs are
// slow (cpu.h), as titan's other attention kernels do.
at::ScalarType work_dtype(AttentionKernel kernel, const at::Tensor& q) {
  return kernel == AttentionKernel::kCpuFlash && widens_reduced_matmul(q.scalar_type(), q.device())
             ? at::kFloat
             : q.scalar_type();
}

// Blocks the fused walk cuts pairs into: whole chunks when no mask is materialised.
int64_t fused_block(const PairContext& ctx) {
  return ctx.docs.defined() || ctx.local() ? kBlock : ctx.layout->local_len();
}

// The call of a pair: causal on a diagonal block, else full or under the block's mask.
AttentionCall pair_call(AttentionKernel kernel, const PairMask& mask, at::ScalarType dtype,
                        double scale) {
  AttentionCall call;
  call.kernel = kernel;
  call.causal = mask.causal;
  call.mask = kernel_mask(mask, dtype);
  call.scale = scale;
  return call;
}

class FusedForward final : public PairForward {
 public:
  FusedForward(AttentionKernel kernel, const at::Tensor& q, const PairContext& ctx)
      : kernel_(kernel), ctx_(ctx), dtype_(q.scalar_type()), work_(work_dtype(kernel, q)) {
    q_ = q.to(work_);
    const auto f32 = q.options().dtype(at::kFloat);
    out_ = at::zeros(q.sizes(), f32);
    lse_ = at::full({q.size(0), q.size(2), q.size(1)}, kNegInf, f32);
    scale_ = scale_of(ctx, q);
  }

  void add(const at::Tensor& kv_in, int source) override {
    const at::Tensor kv = kv_in.to(work_);  // (2, bs, L, n_kv, hd)
    for_each_pair(
        ctx_, source, fused_block(ctx_), q_.device(),
        [&](int64_t q0, int64_t lq, int64_t k0, int64_t lk, const PairMask& mask) {
          const AttentionCall call = pair_call(kernel_, mask, work_, scale_);
          AttentionResults r = attention_forward(call, q_.narrow(1, q0, lq).transpose(1, 2),
                                                 kv[0].narrow(1, k0, lk).transpose(1, 2),
                                                 kv[1].narrow(1, k0, lk).transpose(1, 2));
          ++ctx_.stats->fused_pairs;
          if (aux_.empty()) aux_ = r.aux;
          at::Tensor lse = kernel_ == AttentionKernel::kEfficient ? efficient_lse_rows(r.lse, lq)
                                                                  : r.lse;  // (bs, heads, lq)
          at::Tensor out = r.out;
          if (call.mask) {
            // Rows that see no key of this block: whatever the kernel made of them (0 or NaN),
            // they add nothing.
            const at::Tensor unseen = mask.keep.any(-1).logical_not().unsqueeze(1);  // (., 1, lq)
            lse = lse.masked_fill(unseen, kNegInf);
            out = out.masked_fill(unseen.unsqueeze(-1), 0.0);
          }
          merge_into(out_.narrow(1, q0, lq).transpose(1, 2), lse_.narrow(2, q0, lq), out, lse);
        });
  }

  PairForwardResult finish() override {
    std::vector<at::Tensor> saved{lse_};
    saved.insert(saved.end(), aux_.begin(), aux_.end());
    return {out_.to(dtype_).contiguous(), saved};
  }

 private:
  AttentionKernel kernel_;
  const PairContext& ctx_;
  at::ScalarType dtype_, work_;
  double scale_ = 1;
  at::Tensor q_;                 // (bs, L, n_heads, hd) in the work dtype
  at::Tensor out_;               // (bs, L, n_heads, hd) float32
  at::Tensor lse_;               // (bs, n_heads, L) float32
  std::vector<at::Tensor> aux_;  // the first pair's random state, for the kernel's backward
};

class FusedBackward final : public PairBackward {
 public:
  FusedBackward(AttentionKernel kernel, const at::Tensor& q, const at::Tensor& out,
                const std::vector<at::Tensor>& saved, const at::Tensor& dout, int64_t n_kv,
                const PairContext& ctx)
      : kernel_(kernel),
        ctx_(ctx),
        dtype_(q.scalar_type()),
        work_(work_dtype(kernel, q)),
        n_kv_(n_kv),
        lse_(saved.at(0)),
        aux_(saved.begin() + 1, saved.end()) {
    q_ = q.to(work_);
    out_ = out.to(work_);
    dout_ = dout.to(work_).contiguous();
    dq_ = at::zeros(q.sizes(), q.options().dtype(at::kFloat));
    scale_ = scale_of(ctx, q);
  }

  at::Tensor add(const at::Tensor& kv_in, int source) override {
    const at::Tensor kv = kv_in.to(work_);
    const int64_t bs = q_.size(0), len = q_.size(1), head_dim = q_.size(3);
    at::Tensor dkv = at::zeros({2, bs, n_kv_, len, head_dim}, dq_.options());
    for_each_pair(
        ctx_, source, fused_block(ctx_), q_.device(),
        [&](int64_t q0, int64_t lq, int64_t k0, int64_t lk, const PairMask& mask) {
          const auto rows = [&](const at::Tensor& t) {
            return t.narrow(1, q0, lq).transpose(1, 2);
          };
          // The merged output and the global log-sum-exp: the pair's probabilities are those of
          // the whole softmax, and the kernel's rowsum(dO * O) is the whole row's.
          const AttentionResults merged{rows(out_), lse_.narrow(2, q0, lq).contiguous(), aux_};
          auto [dq, dk, dv] =
              attention_backward(pair_call(kernel_, mask, work_, scale_), rows(dout_), rows(q_),
                                 kv[0].narrow(1, k0, lk).transpose(1, 2),
                                 kv[1].narrow(1, k0, lk).transpose(1, 2), merged);
          ++ctx_.stats->fused_pairs;
          rows(dq_).add_(dq);
          dkv[0].narrow(2, k0, lk).add_(dk);
          dkv[1].narrow(2, k0, lk).add_(dv);
        });
    return dkv;
  }

  at::Tensor finish() override { return dq_.to(dtype_).contiguous(); }

 private:
  AttentionKernel kernel_;
  const PairContext& ctx_;
  at::ScalarType dtype_, work_;
  int64_t n_kv_;
  double scale_ = 1;
  at::Tensor lse_;
  std::vector<at::Tensor> aux_;
  at::Tensor q_, out_, dout_;  // (bs, L, n_heads, hd) in the work dtype
  at::Tensor dq_;              // float32
};

// The fused kernel of q's device that takes these pairs, or kNone.
AttentionKernel fused_kernel_for(const at::Tensor& q, const at::Tensor& k, bool documents) {
  const int64_t head_dim = q.size(3);
  const at::ScalarType dtype = q.scalar_type();
  if (q.device().is_cpu()) {
    // Whether libtorch runs its CPU flash kernel for these shapes (grouped-query heads, head
    // dim, dtype): asked with placeholders of the work dtype's (bs, heads, L, hd) shapes.
    const auto options = q.options().dtype(work_dtype(AttentionKernel::kCpuFlash, q));
    const at::Tensor qp = at::empty({q.size(0), q.size(2), q.size(1), head_dim}, options);
    const at::Tensor kp = at::empty({k.size(0), k.size(2), k.size(1), head_dim}, options);
    const int64_t backend =
        at::_fused_sdp_choice(qp, kp, kp, /*attn_mask=*/std::nullopt, /*dropout_p=*/0.0,
                              /*is_causal=*/true, /*scale=*/std::nullopt,
                              /*enable_gqa=*/q.size(2) != k.size(2));
    return backend == static_cast<int64_t>(at::SDPBackend::flash_attention)
               ? AttentionKernel::kCpuFlash
               : AttentionKernel::kNone;
  }
  // CUDA: no fused kernel takes an arbitrary mask with grouped-query heads and returns the
  // log-sum-exp, so documents stay explicit (without CP, attention.cpp runs them through the
  // variable-length flash kernel instead).
  if (!q.is_cuda() || documents) return AttentionKernel::kNone;
  // A multi-head pair of this dtype and head dim: the flash kernel where libtorch's takes it
  // (asked of the kernel, under the user's switches: SDPA itself prefers cuDNN on sm90 from
  // libtorch 2.9), else the memory-efficient one where SDPA would run that.
  const at::Tensor qh = q.transpose(1, 2);
  const bool half = dtype == at::kHalf || dtype == at::kBFloat16;
  const bool flash_shape = half && head_dim % 8 == 0 && head_dim <= 256;
  if (flash_shape && cuda_flash_attention_fits(qh, qh)) return AttentionKernel::kCudaFlash;
  const int64_t backend =
      at::_fused_sdp_choice(qh, qh, qh, /*attn_mask=*/std::nullopt, /*dropout_p=*/0.0,
                            /*is_causal=*/true, /*scale=*/std::nullopt, /*enable_gqa=*/false);
  if (backend == static_cast<int64_t>(at::SDPBackend::efficient_attention)) {
    return AttentionKernel::kEfficient;
  }
  return AttentionKernel::kNone;
}

}  // namespace

AttentionKernel choose_pair_kernel(RingKernel requested, const at::Tensor& q, const at::Tensor& k,
                                   bool documents) {
  if (requested == RingKernel::kExplicit) return AttentionKernel::kNone;
  // kAuto: the fused kernel wherever one takes the pairs. bench/ring_bench (forward + backward,
  // 8 heads, 4 kv heads, head_dim 32, batch 1, 2 threads; a 2-core AVX-512 machine busy with
  // other builds, two runs) explicit / fused at seq 2048 and 8192, cp 1 and 2:
  //   float32 causal 1.8-8.8x, block-causal 1.4-5.3x; bf16 causal 0.9-6.2x, block-causal
  //   1.9-4.2x (bf16 runs the CPU flash kernel in bf16 here, in float32 on CPUs without fast
  //   bf16 GEMMs; the explicit kernel always computes in float32).
  // No CPU case was slower beyond the noise (the one 0.9x, bf16 cp 2 seq 2048, was 1.5x in the
  // other run). On CUDA nothing was measured: the flash and memory-efficient kernels are those
  // one-process attention runs, against float32 matmuls that materialise the scores.
  return fused_kernel_for(q, k, documents);
}

std::unique_ptr<PairForward> make_pair_forward(AttentionKernel kernel, const at::Tensor& q,
                                               int64_t n_kv_heads, const PairContext& ctx) {
  if (kernel == AttentionKernel::kNone) {
    return std::make_unique<ExplicitForward>(q, n_kv_heads, ctx);
  }
  return std::make_unique<FusedForward>(kernel, q, ctx);
}

std::unique_ptr<PairBackward> make_pair_backward(AttentionKernel kernel, const at::Tensor& q,
                                                 const at::Tensor& out,
                                                 const std::vector<at::Tensor>& saved,
                                                 const at::Tensor& dout, int64_t n_kv_heads,
                                                 const PairContext& ctx) {
  if (kernel == AttentionKernel::kNone) {
    return std::make_unique<ExplicitBackward>(q, out, saved.at(0), dout, n_kv_heads, ctx);
  }
  return std::make_unique<FusedBackward>(kernel, q, out, saved, dout, n_kv_heads, ctx);
}

}  // namespace titan::ring
