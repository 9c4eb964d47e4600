// The gated delta rule, token by token and in chunks (see gated_delta.h).
#include "titan/models/common/gated_delta.h"

#include "titan/common/check.h"

#include <cmath>
#include <limits>
#include <vector>

namespace titan {
namespace {

// The inputs as (bs, H, L, d) (g and beta (bs, H, L)) in the working dtype, q scaled.
struct Heads {
  at::Tensor q, k, v, g, beta;
};

Heads heads_first(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                  const at::Tensor& g, const at::Tensor& beta) {
  TITAN_CHECK(q.dim() == 4 && k.sizes() == q.sizes() && v.dim() == 4 &&
                  v.sizes().slice(0, 3) == q.sizes().slice(0, 3) && g.dim() == 3 &&
                  g.sizes() == q.sizes().slice(0, 3) && beta.sizes() == g.sizes(),
              "gated delta rule: expected q and k (bs, L, H, dk), v (bs, L, H, dv), g and beta "
              "(bs, L, H); got q ",
              q.sizes(), ", k ", k.sizes(), ", v ", v.sizes(), ", g ", g.sizes(), ", beta ",
              beta.sizes());
  const at::ScalarType wide = q.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const auto first = [&](const at::Tensor& t) { return t.transpose(1, 2).to(wide).contiguous(); };
  Heads h;
  h.q = first(q) / std::sqrt(static_cast<double>(q.size(3)));
  h.k = first(k);
  h.v = first(v);
  h.g = first(g);
  h.beta = first(beta);
  return h;
}

// Where the state restarts: (bs, L) bool, true at positions whose document differs from the
// previous position's (never at 0); undefined without documents.
at::Tensor restarts(const at::Tensor& document_ids, const at::Tensor& q) {
  if (!document_ids.defined()) return {};
  TITAN_CHECK(document_ids.dim() == 2 && document_ids.size(0) == q.size(0) &&
                  document_ids.size(1) == q.size(1),
              "gated delta rule: document ids ", document_ids.sizes(), " for (bs, L) = (",
              q.size(0), ", ", q.size(1), ")");
  const at::Tensor docs = document_ids.to(q.device(), at::kLong);
  at::Tensor out = at::zeros_like(docs, docs.options().dtype(at::kBool));
  if (docs.size(1) > 1) {
    out.narrow(1, 1, docs.size(1) - 1)
        .copy_(docs.narrow(1, 1, docs.size(1) - 1).ne(docs.narrow(1, 0, docs.size(1) - 1)));
  }
  return out;
}

at::Tensor initial_state(const Heads& h, const at::Tensor& state) {
  const int64_t bs = h.q.size(0), heads = h.q.size(1), dk = h.q.size(3), dv = h.v.size(3);
  if (!state.defined()) return at::zeros({bs, heads, dk, dv}, h.v.options());
  TITAN_CHECK(state.sizes() == at::IntArrayRef({bs, heads, dk, dv}), "gated delta rule: state ",
              state.sizes(), " for (bs, H, dk, dv) = (", bs, ", ", heads, ", ", dk, ", ", dv, ")");
  return state.to(h.v.scalar_type());
}

}  // namespace

GatedDeltaResult gated_delta_recurrent(const at::Tensor& q, const at::Tensor& k,
                                       const at::Tensor& v, const at::Tensor& g,
                                       const at::Tensor& beta, const at::Tensor& state,
                                       const at::Tensor& document_ids) {
  const Heads h = heads_first(q, k, v, g, beta);
  const at::Tensor restart = restarts(document_ids, q);  // (bs, L)
  at::Tensor s = initial_state(h, state);                // (bs, H, dk, dv)
  std::vector<at::Tensor> outs;
  for (int64_t t = 0; t < h.q.size(2); ++t) {
    const at::Tensor kt = h.k.select(2, t).unsqueeze(-1);  // (bs, H, dk, 1)
    s = s * h.g.select(2, t).exp().unsqueeze(-1).unsqueeze(-1);
    if (restart.defined()) {  // a new document: the state starts over
      s = s * restart.select(1, t).logical_not().to(s.scalar_type()).view({-1, 1, 1, 1});
    }
    // What the decayed state predicts for k_t, and the correction toward v_t.
    const at::Tensor predicted = (s * kt).sum(-2);  // (bs, H, dv)
    const at::Tensor delta = (h.v.select(2, t) - predicted) * h.beta.select(2, t).unsqueeze(-1);
    s = s + kt * delta.unsqueeze(-2);
    outs.push_back((s * h.q.select(2, t).unsqueeze(-1)).sum(-2));  // (bs, H, dv)
  }
  const at::Tensor out = at::stack(outs, 1);  // (bs, L, H, dv)
  return {out.to(q.scalar_type()).contiguous(), s};
}

GatedDeltaResult gated_delta_chunked(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                     const at::Tensor& g, const at::Tensor& beta, int64_t chunk,
                                     const at::Tensor& state, const at::Tensor& document_ids) {
  TITAN_CHECK(chunk > 0, "gated delta rule: chunk ", chunk);
  Heads h = heads_first(q, k, v, g, beta);
  const int64_t bs = h.q.size(0), heads = h.q.size(1), len = h.q.size(2);
  const int64_t pad = (chunk - len % chunk) % chunk, n = (len + pad) / chunk;
  // Zero padding after the end: a zero key and beta leave the state as it is, g = 0 undecayed.
  const auto padded = [&](const at::Tensor& t) {
    if (pad == 0) return t;
    std::vector<int64_t> shape(t.sizes().begin(), t.sizes().end());
    shape[2] = pad;
    return at::cat({t, at::zeros(shape, t.options())}, 2);
  };
  const auto chunked = [&](const at::Tensor& t) {  // (bs, H, n, C, d) or (bs, H, n, C)
    std::vector<int64_t> shape = {bs, heads, n, chunk};
    if (t.dim() == 4) shape.push_back(t.size(3));
    return padded(t).reshape(shape);
  };
  const at::Tensor qc = chunked(h.q), kc = chunked(h.k), vc = chunked(h.v);
  const at::Tensor gc = chunked(h.g), bc = chunked(h.beta);
  const at::Tensor k_beta = kc * bc.unsqueeze(-1), v_beta = vc * bc.unsqueeze(-1);
  // Log decay from the chunk's start through position i, and between positions j <= i.
  const at::Tensor cum = gc.cumsum(-1);  // (bs, H, n, C)
  const at::Tensor later = at::ones({chunk, chunk}, at::TensorOptions(at::kBool)).triu(1);
  at::Tensor pair_decay =
      (cum.unsqueeze(-1) - cum.unsqueeze(-2))
          .masked_fill(later.to(cum.device()), -std::numeric_limits<double>::infinity())
          .exp();  // (.., C, C): exp(cum_i - cum_j) for j <= i, else 0
  // Documents: within a chunk, segment s of a position counts the restarts up to it; a position
  // carries the state from before the chunk while s = 0, and the state after the chunk holds the
  // last segment only.
  at::Tensor carries, in_last;  // (bs, 1, n, C) in the working dtype
  if (const at::Tensor restart = restarts(document_ids, q); restart.defined()) {
    const at::Tensor segment = at::cat({restart, at::zeros({bs, pad}, restart.options())}, 1)
                                   .to(at::kLong)
                                   .view({bs, 1, n, chunk})
                                   .cumsum(-1);
    pair_decay = pair_decay * segment.unsqueeze(-1).eq(segment.unsqueeze(-2)).to(cum.scalar_type());
    carries = segment.eq(0).to(cum.scalar_type());
    in_last = segment.eq(segment.narrow(-1, chunk - 1, 1)).to(cum.scalar_type());
  }
  // The UT transform: (I + strictly-lower(beta K K^T decay)) X = B, for the chunk's corrected
  // values and its decayed keys' reads of the state.
  const at::Tensor system = at::matmul(k_beta, kc.transpose(-1, -2)) * pair_decay;
  const at::Tensor values =
      at::linalg_solve_triangular(system, v_beta, /*upper=*/false, /*left=*/true,
                                  /*unitriangular=*/true);
  // exp(cum) of the positions that see the state from before the chunk, else 0.
  const at::Tensor from_start = carries.defined() ? cum.exp() * carries : cum.exp();
  const at::Tensor reads =
      at::linalg_solve_triangular(system, k_beta * from_start.unsqueeze(-1), /*upper=*/false,
                                  /*left=*/true, /*unitriangular=*/true);
  const at::Tensor within = at::matmul(qc, kc.transpose(-1, -2)) * pair_decay;  // (.., C, C)
  const at::Tensor q_decayed = qc * from_start.unsqueeze(-1);
  const at::Tensor last = cum.narrow(-1, chunk - 1, 1);  // (bs, H, n, 1)
  at::Tensor to_end = (last - cum).exp();
  at::Tensor chunk_decay = last.exp();  // (bs, H, n, 1)
  if (in_last.defined()) {
    to_end = to_end * in_last;
    chunk_decay = chunk_decay * carries.narrow(-1, chunk - 1, 1);
  }
  const at::Tensor k_to_end = kc * to_end.unsqueeze(-1);
  chunk_decay = chunk_decay.unsqueeze(-1);  // (bs, H, n, 1, 1)
  at::Tensor s = initial_state(h, state);
  std::vector<at::Tensor> outs;
  for (int64_t i = 0; i < n; ++i) {
    // The chunk's values less what the state before it predicts, then its output: the state's
    // read plus the chunk's own causal part.
    const at::Tensor v_new = values.select(2, i) - at::matmul(reads.select(2, i), s);
    outs.push_back(at::matmul(q_decayed.select(2, i), s) + at::matmul(within.select(2, i), v_new));
    s = s * chunk_decay.select(2, i) + at::matmul(k_to_end.select(2, i).transpose(-1, -2), v_new);
  }
  const at::Tensor out = at::cat(outs, 2).narrow(2, 0, len).transpose(1, 2);  // (bs, L, H, dv)
  return {out.to(q.scalar_type()).contiguous(), s};
}

}  // namespace titan
