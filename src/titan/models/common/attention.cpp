// Causal GQA self-attention (see attention.h). Training uses libtorch's fused
// scaled_dot_product_attention (flash attention on CPU: O(seqlen) saved statistics instead of the
// probability matrix); block-causal attention on CUDA the variable-length flash kernel over the
// packed documents, where a dense mask would leave SDPA only its slower masked kernels. The
// inference path (KV cache) materialises the scores: a decode step has one query per head, so the
// scores are a (n_rep, L) row block per kv head and a fused kernel would gain nothing; the query
// heads that share a kv head are folded into the row dimension, so one batched matmul serves all of
// them without copying K and V n_rep times, and long prompts go in query chunks that skip the fully
// masked part of the score matrix. The same algorithm also trains (materialised_causal_attention,
// chosen by compile.enable where it measured faster): an autograd function that keeps the chunks'
// probabilities and differentiates with batched matmuls.
#include "titan/models/common/attention.h"

#include "titan/common/check.h"
#include "titan/common/cpu.h"
#include "titan/common/device.h"
#include "titan/common/host_sync.h"
#include "titan/common/names.h"
#include "titan/common/phase.h"
#include "titan/models/common/savable_ops.h"

#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace titan {
namespace {

constexpr int64_t kQueryChunk = kAttentionQueryChunk;  // attention.h

// x / sqrt(mean(x^2) + eps) over the last dimension, in float32 (or wider), back in x's dtype:
// Llama 4's weightless qk norm.
at::Tensor rms_normalize(const at::Tensor& x, double eps) {
  const at::Tensor wide = x.to(upcast_dtype(x.scalar_type()));
  return (wide * at::rsqrt(wide.pow(2).mean(-1, /*keepdim=*/true) + eps)).to(x.scalar_type());
}

// Additive causal mask for query positions [t0, t1) against keys [0, t1), with each position
// repeated n_rep times (rows ordered (position, rep)): 0 where key <= query, -inf above.
at::Tensor chunk_causal_mask(int64_t t0, int64_t t1, int64_t n_rep,
                             const at::TensorOptions& options) {
  const auto long_options = options.dtype(at::kLong);
  const at::Tensor query_pos =
      at::arange(t0, t1, long_options).repeat_interleave(n_rep).unsqueeze(1);
  const at::Tensor key_pos = at::arange(t1, long_options).unsqueeze(0);
  return at::zeros({(t1 - t0) * n_rep, t1}, options)
      .masked_fill_(key_pos.gt(query_pos), -std::numeric_limits<double>::infinity());
}

// Additive block-causal mask for query positions [t0, t1) against keys [0, t1), rows ordered
// (position, rep) as in chunk_causal_mask: 0 where the key is at or before the query in the same
// document, -inf elsewhere. docs (bs, seqlen) int64 -> (bs, 1, (t1 - t0) * n_rep, t1).
at::Tensor chunk_document_mask(const at::Tensor& docs, int64_t t0, int64_t t1, int64_t n_rep,
                               const at::TensorOptions& options) {
  const auto long_options = options.dtype(at::kLong);
  const at::Tensor query_pos = at::arange(t0, t1, long_options).repeat_interleave(n_rep);
  const at::Tensor key_pos = at::arange(t1, long_options);
  const at::Tensor query_docs = docs.narrow(1, t0, t1 - t0).repeat_interleave(n_rep, 1);
  const at::Tensor hidden = docs.narrow(1, 0, t1)
                                .unsqueeze(1)
                                .ne(query_docs.unsqueeze(2))
                                .logical_or_(key_pos.unsqueeze(0).gt(query_pos.unsqueeze(1)));
  return at::zeros(hidden.sizes(), options)
      .masked_fill_(hidden, -std::numeric_limits<double>::infinity())
      .unsqueeze(1);
}

// Queries with the heads that share a kv head folded into rows: q (bs, seqlen, n_heads, hd) ->
// (bs * n_kv_heads, seqlen * n_rep, hd) in `dtype`, row s * n_rep + r of batch b * n_kv_heads + g
// holding position s of query head g * n_rep + r. One copy (layout and dtype together).
at::Tensor fold_query_heads(const at::Tensor& q, int64_t n_kv_heads, at::ScalarType dtype) {
  const int64_t bs = q.size(0), seqlen = q.size(1), head_dim = q.size(3);
  const int64_t n_rep = q.size(2) / n_kv_heads;
  at::Tensor rows =
      at::empty({bs * n_kv_heads, seqlen * n_rep, head_dim}, q.options().dtype(dtype));
  rows.view({bs, n_kv_heads, seqlen, n_rep, head_dim})
      .copy_(q.reshape({bs, seqlen, n_kv_heads, n_rep, head_dim}).permute({0, 2, 1, 3, 4}));
  return rows;
}

// The inverse: (bs * n_kv_heads, seqlen * n_rep, hd) -> (bs, seqlen, n_heads, hd) in `dtype`,
// contiguous.
at::Tensor unfold_query_heads(const at::Tensor& rows, int64_t bs, int64_t seqlen,
                              int64_t n_kv_heads, at::ScalarType dtype) {
  const int64_t head_dim = rows.size(2);
  const int64_t n_rep = rows.size(1) / seqlen;
  at::Tensor out =
      at::empty({bs, seqlen, n_kv_heads * n_rep, head_dim}, rows.options().dtype(dtype));
  out.view({bs, seqlen, n_kv_heads, n_rep, head_dim})
      .copy_(rows.view({bs, n_kv_heads, seqlen, n_rep, head_dim}).permute({0, 2, 1, 3, 4}));
  return out;
}

// Keys or values per kv head: (bs, seqlen, n_kv_heads, hd) -> (bs * n_kv_heads, seqlen, hd) in
// `dtype` (a copy).
at::Tensor fold_kv_heads(const at::Tensor& t, at::ScalarType dtype) {
  const int64_t bs = t.size(0), seqlen = t.size(1), n_kv_heads = t.size(2), head_dim = t.size(3);
  at::Tensor rows = at::empty({bs * n_kv_heads, seqlen, head_dim}, t.options().dtype(dtype));
  rows.view({bs, n_kv_heads, seqlen, head_dim}).copy_(t.transpose(1, 2));
  return rows;
}

// The inverse: (bs * n_kv_heads, seqlen, hd) -> (bs, seqlen, n_kv_heads, hd) in `dtype`,
// contiguous.
at::Tensor unfold_kv_heads(const at::Tensor& rows, int64_t bs, at::ScalarType dtype) {
  return rows.view({bs, -1, rows.size(1), rows.size(2)})
      .transpose(1, 2)
      .to(dtype, /*non_blocking=*/false, /*copy=*/false, at::MemoryFormat::Contiguous);
}

// softmax over the last dimension with float32 arithmetic, in the scores' dtype (ATen's CPU
// kernel computes a bfloat16 softmax in float32 and rounds once: the numbers of upcasting first,
// 6x faster).
at::Tensor softmax_rows(const at::Tensor& scores) {
  return is_reduced_float(scores.scalar_type()) && !scores.device().is_cpu()
             ? at::softmax(scores, -1, at::kFloat).to(scores.scalar_type())
             : at::softmax(scores, -1);
}

// The document ids of block-causal attention checked against q (bs, seqlen, ...), as int64 on
// q's device.
at::Tensor checked_documents(const at::Tensor& q, const at::Tensor& document_ids) {
  const int64_t seqlen = q.size(1);
  TITAN_CHECK(document_ids.dim() == 2 && document_ids.size(0) == q.size(0) &&
                  document_ids.size(1) == seqlen,
              "block-causal attention: document ids must be (bs, seqlen) = (", q.size(0), ", ",
              seqlen, "), got ", document_ids.sizes());
  return document_ids.to(q.device(), at::kLong);
}

// n_heads / n_kv_heads of q (bs, seqlen, n_heads, hd) and k (bs, seqlen, n_kv_heads, hd).
int64_t query_heads_per_kv_head(const at::Tensor& q, const at::Tensor& k) {
  const int64_t n_heads = q.size(2);
  const int64_t n_kv_heads = k.size(2);
  TITAN_CHECK(n_kv_heads > 0 && n_heads % n_kv_heads == 0, "n_kv_heads (", n_kv_heads,
              ") must divide n_heads (", n_heads, ")");
  return n_heads / n_kv_heads;
}

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Materialised causal attention as an autograd function. Forward, per chunk of query positions
// [t0, t1) (rows = (t1 - t0) * n_rep folded query rows, keys [0, t1)):
//   S = scale * Q K^T + mask, P = softmax(S) (float32 arithmetic, kept for backward), O = P V.
// Backward, per chunk: dV += P^T dO, dP = dO V^T, dS = P * (dP - rowsum(dP * P)) (softmax's
// backward, which needs no O), dQ = scale * dS K, dK += scale * dS^T Q; dK and dV accumulate
// over chunks in float32. Everything runs in the inputs' dtype, except bfloat16 / float16 on a
// CPU without fast bf16 matmuls (fast_bf16_matmul), which runs in float32: the inputs are
// widened as they are folded, and the results rounded once as they are unfolded.
struct MaterialisedAttention : public torch::autograd::Function<MaterialisedAttention> {
  // q (bs, seqlen, n_heads, hd), k and v (bs, seqlen, n_kv_heads, hd); docs null (causal) or
  // (bs, seqlen) int64 on q's device (block-causal). The documents travel as a pointer: autograd
  // wants a device for every tensor argument, and causal attention has none.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, const at::Tensor* docs) {
    const int64_t bs = q.size(0), seqlen = q.size(1), n_kv_heads = k.size(2);
    const int64_t n_rep = q.size(2) / n_kv_heads;
    const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(3)));
    const at::ScalarType dtype = q.scalar_type();
    // The forward runs on the CPU only (CausalAttention::forward).
    const at::ScalarType work = widens_reduced_matmul(dtype, q.device()) ? at::kFloat : dtype;
    const at::TensorOptions options = q.options().dtype(work);
    const at::Tensor q_rows = fold_query_heads(q, n_kv_heads, work);  // (batch, seq * n_rep, hd)
    const at::Tensor k_rows = fold_kv_heads(k, work);                 // (batch, seqlen, hd)
    const at::Tensor v_rows = fold_kv_heads(v, work);
    variable_list saved = {q_rows, k_rows, v_rows};
    std::vector<at::Tensor> outs;
    for (int64_t t0 = 0; t0 < seqlen; t0 += kQueryChunk) {
      const int64_t t1 = std::min(seqlen, t0 + kQueryChunk);
      const int64_t rows = (t1 - t0) * n_rep;
      const at::Tensor q_chunk = q_rows.narrow(1, t0 * n_rep, rows);
      const at::Tensor k_t = k_rows.narrow(1, 0, t1).transpose(1, 2);  // (batch, hd, t1)
      at::Tensor scores;                                               // (batch, rows, t1)
      if (docs == nullptr) {
        scores = at::baddbmm(chunk_causal_mask(t0, t1, n_rep, options), q_chunk, k_t,
                             /*beta=*/1.0, /*alpha=*/scale);
      } else {
        scores = at::bmm(q_chunk, k_t);
        scores.view({bs, n_kv_heads, rows, t1})
            .mul_(scale)
            .add_(chunk_document_mask(*docs, t0, t1, n_rep, options));
      }
      const at::Tensor probs = softmax_rows(scores);
      outs.push_back(at::bmm(probs, v_rows.narrow(1, 0, t1)));  // (batch, rows, hd)
      saved.push_back(probs);
    }
    ctx->save_for_backward(saved);
    ctx->saved_data["bs"] = bs;
    ctx->saved_data["dtype"] = static_cast<int64_t>(dtype);
    return unfold_query_heads(outs.size() == 1 ? outs[0] : at::cat(outs, 1), bs, seqlen, n_kv_heads,
                              dtype);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor& q_rows = saved[0];
    const at::Tensor& k_rows = saved[1];
    const at::Tensor& v_rows = saved[2];
    const int64_t bs = ctx->saved_data["bs"].toInt();
    const auto dtype = static_cast<at::ScalarType>(ctx->saved_data["dtype"].toInt());
    const int64_t batch = k_rows.size(0), seqlen = k_rows.size(1), head_dim = k_rows.size(2);
    const int64_t n_kv_heads = batch / bs;
    const int64_t n_rep = q_rows.size(1) / seqlen;
    const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
    const at::ScalarType work = q_rows.scalar_type();
    const at::Tensor grad_rows = fold_query_heads(grads[0], n_kv_heads, work);
    const int64_t n_chunks = static_cast<int64_t>(saved.size()) - 3;
    std::vector<at::Tensor> grad_q(n_chunks);
    at::Tensor grad_k, grad_v;  // (batch, seqlen, hd), float32 for reduced floats
    // Last chunk first: it reaches every key, so its products start the sums.
    for (int64_t c = n_chunks - 1; c >= 0; --c) {
      const int64_t t0 = c * kQueryChunk;
      const int64_t t1 = std::min(seqlen, t0 + kQueryChunk);
      const int64_t rows = (t1 - t0) * n_rep;
      const at::Tensor& probs = saved[3 + c];  // (batch, rows, t1)
      const at::Tensor grad_out = grad_rows.narrow(1, t0 * n_rep, rows);
      const at::Tensor grad_probs = at::bmm(grad_out, v_rows.narrow(1, 0, t1).transpose(1, 2));
      const at::Tensor grad_scores = at::_softmax_backward_data(grad_probs, probs, -1, work);
      grad_q[c] = at::bmm(grad_scores, k_rows.narrow(1, 0, t1));
      const at::Tensor dv = at::bmm(probs.transpose(1, 2), grad_out);  // (batch, t1, hd)
      const at::Tensor dk =
          at::bmm(grad_scores.transpose(1, 2), q_rows.narrow(1, t0 * n_rep, rows));
      if (c == n_chunks - 1) {
        grad_v = dv.to(upcast_dtype(work));
        grad_k = dk.to(upcast_dtype(work));
      } else {
        grad_v.narrow(1, 0, t1).add_(dv);
        grad_k.narrow(1, 0, t1).add_(dk);
      }
    }
    const at::Tensor dq = n_chunks == 1 ? grad_q[0] : at::cat(grad_q, 1);
    return {unfold_query_heads(dq.mul_(scale), bs, seqlen, n_kv_heads, dtype),
            unfold_kv_heads(grad_k.mul_(scale), bs, dtype), unfold_kv_heads(grad_v, bs, dtype),
            at::Tensor()};
  }
};

// Whether the variable-length flash kernel takes these q (bs, seqlen, n_heads, hd) and k: CUDA,
// fp16 / bf16, head_dim a multiple of 8 up to 256 (no padding here), and libtorch's flash kernel
// takes the causal attention of these shapes (hardware, the user's SDPA switches). SDPA's own
// choice may be cuDNN (libtorch 2.9+ on sm90), which has no variable-length entry here.
bool varlen_flash_fits(const at::Tensor& q, const at::Tensor& k) {
  const at::ScalarType dtype = q.scalar_type();
  const int64_t head_dim = q.size(3);
  if (!q.is_cuda() || (dtype != at::kHalf && dtype != at::kBFloat16) || head_dim % 8 != 0 ||
      head_dim > 256) {
    return false;
  }
  return cuda_flash_attention_fits(q.transpose(1, 2), k.transpose(1, 2));
}

// The packing of the ids this thread packed last: every layer of a model attends with the same
// ids tensor (so do checkpointed blocks when recomputed), so the packing's one device read
// happens once per batch and thread, not once per layer. The held ids keep their identity from
// being reused by another tensor.
struct PackingMemo {
  at::Tensor ids;
  int64_t version = -1;
  DocumentPacking packing;
};
thread_local PackingMemo t_packing;

const DocumentPacking& packing_of(const at::Tensor& ids) {
  if (!t_packing.ids.is_same(ids) || t_packing.version != ids._version()) {
    t_packing = {ids, ids._version(), pack_documents(ids)};
  }
  return t_packing.packing;
}

// Block-causal attention through the variable-length flash kernel: each document one causal
// sequence of the packed rows. q (bs, seqlen, n_heads, hd), k and v (bs, seqlen, n_kv, hd).
at::Tensor varlen_document_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                     const at::Tensor& docs) {
  const DocumentPacking& packing = packing_of(docs);
  AttentionCall call;
  call.kernel = AttentionKernel::kVarlenFlash;
  call.causal = true;
  call.cu_seqlens = packing.cu_seqlens;
  call.max_seqlen = packing.max_seqlen;
  const int64_t rows = q.size(0) * q.size(1);
  const at::Tensor out = savable_attention(
      call, q.reshape({rows, q.size(2), q.size(3)}), k.reshape({rows, k.size(2), k.size(3)}),
      v.reshape({rows, v.size(2), v.size(3)}));  // (rows, n_heads, hd)
  return out.reshape(q.sizes());
}

}  // namespace

DocumentPacking pack_documents(const at::Tensor& document_ids) {
  TITAN_CHECK(document_ids.dim() == 2 && document_ids.numel() > 0,
              "pack_documents: expected document ids (bs, seqlen), got ", document_ids.sizes());
  const int64_t bs = document_ids.size(0), seqlen = document_ids.size(1);
  const int64_t total = bs * seqlen;
  const at::Tensor ids = document_ids.to(at::kLong);
  const auto long_options = ids.options();
  // Where a document starts: every row's first token, and wherever the id changes.
  at::Tensor starts = at::ones({bs, seqlen}, long_options.dtype(at::kBool));
  if (seqlen > 1) {
    starts.narrow(1, 1, seqlen - 1)
        .copy_(ids.narrow(1, 1, seqlen - 1).ne(ids.narrow(1, 0, seqlen - 1)));
  }
  const at::Tensor flat = starts.view({total});
  const at::Tensor position = at::arange(total, long_options);
  const at::Tensor doc = flat.cumsum(0).sub_(1);  // each token's document, in packed order
  // Each document's first position into slot `doc`; every other token into a slot of its own
  // past bs * seqlen, so that no slot is written twice; slot n_docs keeps the total.
  at::Tensor slots = at::full({2 * total + 1}, total, long_options.dtype(at::kInt));
  slots.scatter_(0, at::where(flat, doc, position + (total + 1)), position.to(at::kInt));
  // A token's offset in its document: its position minus its document's first position.
  const at::Tensor first = std::get<0>(at::where(flat, position, 0).cummax(0));
  const at::Tensor counts = at::stack({doc[total - 1] + 1, (position - first).max() + 1});
  const at::Tensor host = to_host(counts);  // the one device read
  DocumentPacking p;
  p.n_docs = host[0].item<int64_t>();
  p.max_seqlen = host[1].item<int64_t>();
  p.cu_seqlens = slots.narrow(0, 0, p.n_docs + 1);
  return p;
}

at::Tensor sink_window_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 int64_t q_start, const AttentionVariant& variant,
                                 const at::Tensor& document_ids) {
  const at::Tensor& sinks = variant.sinks;
  const int64_t window = variant.window, chunk = variant.chunk;
  TITAN_CHECK(window >= 0 && chunk >= 0, "sink_window_attention: window ", window, ", chunk ",
              chunk);
  const TraceSpan span("attention");
  TITAN_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && k.sizes() == v.sizes() &&
                  q.size(0) == k.size(0) && q.size(3) == k.size(3),
              "sink_window_attention: q ", q.sizes(), ", k ", k.sizes(), ", v ", v.sizes(),
              " are not (bs, n, n_heads, head_dim) and (bs, n_kv_heads, positions, head_dim)");
  const int64_t bs = q.size(0), n = q.size(1), n_heads = q.size(2), head_dim = q.size(3);
  const int64_t n_kv_heads = k.size(1);
  const int64_t end = q_start + n;
  TITAN_CHECK(n_kv_heads > 0 && n_heads % n_kv_heads == 0, "n_kv_heads (", n_kv_heads,
              ") must divide n_heads (", n_heads, ")");
  TITAN_CHECK(q_start >= 0 && k.size(2) >= end, "sink_window_attention: keys hold ", k.size(2),
              " positions, queries reach ", end);
  TITAN_CHECK(!sinks.defined() || (sinks.dim() == 1 && sinks.size(0) == n_heads),
              "sink_window_attention: sinks ", sinks.sizes(), " for ", n_heads, " heads");
  TITAN_CHECK(!document_ids.defined() || (document_ids.dim() == 2 && document_ids.size(0) == bs &&
                                          document_ids.size(1) >= end),
              "sink_window_attention: document ids ", document_ids.sizes(), " for ", bs,
              " sequences of ", end, " positions");
  const int64_t n_rep = n_heads / n_kv_heads;
  const double scale =
      variant.scale > 0 ? variant.scale : 1.0 / std::sqrt(static_cast<double>(head_dim));
  // The products in float32 where the CPU has no fast 16-bit GEMMs (widens_reduced_matmul), the
  // softmax in float32 (or wider) always.
  const at::ScalarType mm =
      widens_reduced_matmul(q.scalar_type(), q.device()) ? at::kFloat : q.scalar_type();
  const at::ScalarType wide = upcast_dtype(q.scalar_type());
  // Query heads grouped under their kv head: (bs, n_kv, n_rep, n, hd); keys (bs, n_kv, 1, L, hd).
  const at::Tensor qg =
      q.to(mm).reshape({bs, n, n_kv_heads, n_rep, head_dim}).permute({0, 2, 3, 1, 4});
  const at::Tensor kg = k.to(mm).unsqueeze(2);
  const at::Tensor vg = v.to(mm).unsqueeze(2);
  const at::Tensor sink_logits =
      sinks.defined() ? sinks.to(wide).view({1, n_kv_heads, n_rep, 1, 1}) : at::Tensor();
  const auto long_options = q.options().dtype(at::kLong);
  std::vector<at::Tensor> chunks;
  for (int64_t t0 = 0; t0 < n; t0 += kQueryChunk) {
    const int64_t t1 = std::min(n, t0 + kQueryChunk);
    const int64_t rows = t1 - t0;
    const int64_t p0 = q_start + t0, p1 = q_start + t1;  // the chunk's positions
    // The first key any query of the chunk may see.
    const int64_t k0 = first_visible_key(p0, window, chunk);
    const int64_t keys = p1 - k0;
    at::Tensor scores = at::matmul(qg.narrow(3, t0, rows), kg.narrow(3, k0, keys).transpose(-1, -2))
                            .to(wide)
                            .mul_(scale);  // (bs, n_kv, n_rep, rows, keys)
    const at::Tensor query_pos = at::arange(p0, p1, long_options).unsqueeze(1);
    const at::Tensor key_pos = at::arange(k0, p1, long_options).unsqueeze(0);
    at::Tensor hidden = key_pos.gt(query_pos);  // (rows, keys)
    if (window > 0) hidden.logical_or_((query_pos - key_pos).ge(window));
    if (chunk > 0) hidden.logical_or_(key_pos.lt(query_pos.div(chunk, "floor").mul(chunk)));
    if (document_ids.defined()) {
      const at::Tensor query_docs = document_ids.narrow(1, p0, rows).unsqueeze(2);
      const at::Tensor key_docs = document_ids.narrow(1, k0, keys).unsqueeze(1);
      hidden = key_docs.ne(query_docs).logical_or_(hidden.unsqueeze(0));  // (bs, rows, keys)
      hidden = hidden.view({bs, 1, 1, rows, keys});
    } else {
      hidden = hidden.view({1, 1, 1, rows, keys});
    }
    scores = scores.masked_fill(hidden, -std::numeric_limits<double>::infinity());
    if (sink_logits.defined()) {
      scores = at::cat({scores, sink_logits.expand({bs, n_kv_heads, n_rep, rows, 1})}, -1);
    }
    at::Tensor probs = scores.softmax(-1);
    if (sink_logits.defined()) probs = probs.narrow(-1, 0, keys);
    chunks.push_back(at::matmul(probs.to(mm), vg.narrow(3, k0, keys)));  // (.., rows, hd)
  }
  const at::Tensor out = chunks.size() == 1 ? chunks[0] : at::cat(chunks, 3);
  return out.permute({0, 3, 1, 2, 4})
      .reshape({bs, n, n_heads, head_dim})
      .to(v.scalar_type())
      .contiguous();
}

at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& document_ids) {
  // On a CPU without fast bf16 GEMMs SDPA's 16-bit kernel multiplies in ATen's generic loop
  // (5.4x slower than its float32 kernel at seq 256 there, materialised_attention_is_faster's
  // numbers): it runs in float32 on the rounded inputs, and the output is rounded once, as the
  // Linear layers do (widens_reduced_matmul).
  if (widens_reduced_matmul(q.scalar_type(), q.device())) {
    const at::ScalarType dtype = q.scalar_type();
    return causal_attention(q.to(at::kFloat), k.to(at::kFloat), v.to(at::kFloat), document_ids)
        .to(dtype);
  }
  const TraceSpan span("attention");
  const int64_t n_rep = query_heads_per_kv_head(q, k);
  // Query head h reads kv head h / n_rep: SDPA's enable_gqa does this inside the kernel, with no
  // (bs, n_heads, seqlen, head_dim) copies of K and V.
  at::Tensor mask;  // block-causal: (bs, 1, seqlen, seqlen), true where a query sees a key
  if (document_ids.defined()) {
    const int64_t seqlen = q.size(1);
    const at::Tensor docs = checked_documents(q, document_ids);
    if (varlen_flash_fits(q, k)) return varlen_document_attention(q, k, v, docs);
    const at::Tensor causal =
        at::ones({seqlen, seqlen}, at::TensorOptions(at::kBool).device(q.device())).tril();
    mask = docs.unsqueeze(2).eq(docs.unsqueeze(1)).logical_and_(causal).unsqueeze(1);
  }
  // SDPA, whose output selective activation checkpointing may keep (savable_ops.h).
  const at::Tensor out =
      savable_causal_sdpa(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                          /*enable_gqa=*/n_rep > 1, mask);  // (bs, n_heads, seqlen, head_dim)
  return out.transpose(1, 2).contiguous();
}

at::Tensor materialised_causal_attention(const at::Tensor& q, const at::Tensor& k,
                                         const at::Tensor& v, const at::Tensor& document_ids) {
  const TraceSpan span("attention");
  query_heads_per_kv_head(q, k);
  if (!document_ids.defined()) return MaterialisedAttention::apply(q, k, v, nullptr);
  const at::Tensor docs = checked_documents(q, document_ids);
  return MaterialisedAttention::apply(q, k, v, &docs);
}

bool materialised_attention_is_faster(at::ScalarType dtype, int64_t seqlen) {
  // bench/attention_bench: forward + backward, 8 heads, 4 kv heads, head_dim 64, 4,096 tokens
  // per step, 2 threads; ms of SDPA's flash kernel (enable_gqa) / ours, at seq 256, 512, 1024,
  // 2048:
  //   2-core AMD EPYC, AVX2 (no fast bf16 matmuls; ours computes bf16 in float32):
  //     float32   385 / 481, 678 / 705, 859 / 1174, 1591 / 2461  (0.64-0.96x: SDPA)
  //     bfloat16  2095 / 479, 4011 / 864, 5563 / 1431, 9203 / 3101  (3.0-4.6x: ours)
  //   2-core AVX-512 (docs/speed.md's table, the same algorithm composed of ATen ops, in bf16):
  //     float32   57.7 / 57.2, 82.7 / 94.9, 114.1 / 147.6, 226.2 / 238.2  (at best equal: SDPA)
  //     bfloat16  68.3 / 40.1, 95.1 / 63.7, 104.7 / 116.3, 169.5 / 221.9  (ours up to 512)
  // Beyond 2048 nothing was measured, and the kept probabilities (seqlen^2 / 2 per head) grow.
  // Without fast bf16 GEMMs SDPA runs bf16 in float32 (causal_attention), where it beats ours.
  return dtype == at::kBFloat16 && cpu_has_fast_bf16_matmul() && seqlen <= 512;
}

at::Tensor CausalAttention::forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                    const at::Tensor& document_ids) {
  if (fused && q.device().is_cpu() && materialised_attention_is_faster(q.scalar_type(), q.size(1)))
    return materialised_causal_attention(q, k, v, document_ids);
  return causal_attention(q, k, v, document_ids);
}

at::Tensor InnerAttention::forward_variant(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                           const at::Tensor&, const AttentionVariant&) {
  TITAN_CHECK(false, "this attention kernel computes no sinks, sliding windows, chunks or ",
              "scales of its own (gpt-oss's and Llama 4's attention)");
  return {};
}

at::Tensor CausalAttention::forward_variant(const at::Tensor& q, const at::Tensor& k,
                                            const at::Tensor& v, const at::Tensor& document_ids,
                                            const AttentionVariant& variant) {
  return sink_window_attention(q, k.transpose(1, 2), v.transpose(1, 2), /*q_start=*/0, variant,
                               document_ids);
}

at::Tensor document_ids(const at::Tensor& tokens, int64_t end_token) {
  TITAN_CHECK(tokens.dim() == 2, "document_ids: expected tokens (bs, seqlen), got ",
              tokens.sizes());
  const at::Tensor ends = tokens.eq(end_token).to(at::kLong);
  return ends.cumsum(1).sub_(ends);  // ends strictly before each token
}

AttentionMask parse_attention_mask(const std::string& name) {
  if (name == "causal") return AttentionMask::kCausal;
  if (name == "block_causal") return AttentionMask::kBlockCausal;
  throw ConfigError(message("unknown model.attn_mask_type '", name, "'",
                            did_you_mean(likely_name(name, {"causal", "block_causal"})),
                            " (it is \"causal\" or \"block_causal\")"));
}

at::Tensor cached_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            int64_t start_pos) {
  const int64_t bs = q.size(0);
  const int64_t n = q.size(1);
  const int64_t n_heads = q.size(2);
  const int64_t head_dim = q.size(3);
  const int64_t n_kv_heads = k.size(1);
  const int64_t end = start_pos + n;
  TITAN_CHECK(n_kv_heads > 0 && n_heads % n_kv_heads == 0, "n_kv_heads (", n_kv_heads,
              ") must divide n_heads (", n_heads, ")");
  TITAN_CHECK(k.size(2) >= end && v.size(2) >= end, "the cache holds ", k.size(2),
              " positions, attention needs ", end);
  const int64_t n_rep = n_heads / n_kv_heads;
  const int64_t batch = bs * n_kv_heads;
  const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
  // Row i * n_rep + r is (new position i, query head g * n_rep + r) of kv head g.
  const at::Tensor q_rows =
      fold_query_heads(q, n_kv_heads, q.scalar_type());  // (batch, n * n_rep, head_dim)
  // Views into the cache buffers, no copies: (bs, n_kv_heads, end, head_dim) merges its first two
  // dimensions because each head's block is max_len positions long.
  const at::Tensor k_rows = k.narrow(2, 0, end).reshape({batch, end, head_dim});
  const at::Tensor v_rows = v.narrow(2, 0, end).reshape({batch, end, head_dim});
  std::vector<at::Tensor> chunks;
  // Chunked like training so that a long prompt never materialises all (n, end) scores at once.
  for (int64_t t0 = 0; t0 < n; t0 += kQueryChunk) {
    const int64_t t1 = std::min(n, t0 + kQueryChunk);
    const int64_t keys = start_pos + t1;  // queries up to position start_pos + t1 - 1
    const at::Tensor q_chunk = q_rows.narrow(1, t0 * n_rep, (t1 - t0) * n_rep);
    const at::Tensor k_t = k_rows.narrow(1, 0, keys).transpose(1, 2);  // (batch, hd, keys)
    at::Tensor scores;  // (batch, (t1 - t0) * n_rep, keys)
    if (t1 - t0 == 1) {
      // One new position sees every cached key: no mask (the usual decode step).
      scores = at::bmm(q_chunk, k_t).mul_(scale);
    } else {
      const at::Tensor mask = chunk_causal_mask(start_pos + t0, keys, n_rep, q.options());
      scores = at::baddbmm(mask, q_chunk, k_t, /*beta=*/1.0, /*alpha=*/scale);
    }
    // float32 softmax, probabilities back in the compute dtype as in training.
    chunks.push_back(at::bmm(softmax_rows(scores), v_rows.narrow(1, 0, keys)));
  }
  return unfold_query_heads(chunks.size() == 1 ? chunks[0] : at::cat(chunks, 1), bs, n, n_kv_heads,
                            v.scalar_type());
}

Attention::Attention(int64_t dim, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                     at::ScalarType compute_dtype, bool qk_norm, double norm_eps,
                     const AttentionExtras& extras)
    : extras(extras), head_dim(head_dim), compute_dtype(compute_dtype) {
  TITAN_CHECK(!(extras.output_gate && extras.bias), "attention: output_gate with biases");
  TITAN_CHECK(extras.rope_dim >= 0 && extras.rope_dim <= head_dim && extras.rope_dim % 2 == 0,
              "attention: rope_dim ", extras.rope_dim, " must be even and at most head_dim ",
              head_dim);
  const int64_t q_rows = n_heads * head_dim * (extras.output_gate ? 2 : 1);
  wq = register_module("wq", std::make_shared<Linear>(dim, q_rows, compute_dtype));
  wk = register_module("wk", std::make_shared<Linear>(dim, n_kv_heads * head_dim, compute_dtype));
  wv = register_module("wv", std::make_shared<Linear>(dim, n_kv_heads * head_dim, compute_dtype));
  wo = register_module("wo", std::make_shared<Linear>(n_heads * head_dim, dim, compute_dtype));
  if (qk_norm) {
    q_norm = register_module(
        "q_norm", std::make_shared<RMSNorm>(head_dim, norm_eps, extras.zero_centered_norm));
    k_norm = register_module(
        "k_norm", std::make_shared<RMSNorm>(head_dim, norm_eps, extras.zero_centered_norm));
  }
  if (extras.bias) {
    bq = register_module("bq", std::make_shared<Bias>(at::IntArrayRef{n_heads * head_dim}));
    bk = register_module("bk", std::make_shared<Bias>(at::IntArrayRef{n_kv_heads * head_dim}));
    bv = register_module("bv", std::make_shared<Bias>(at::IntArrayRef{n_kv_heads * head_dim}));
    bo = register_module("bo", std::make_shared<Bias>(at::IntArrayRef{dim}));
  }
  if (extras.sinks) {
    sinks = register_module("sinks", std::make_shared<Bias>(at::IntArrayRef{n_heads}));
  }
}

AttentionVariant Attention::variant() const {
  return AttentionVariant{sinks ? sinks->weight : at::Tensor(), extras.window, softmax_scale(),
                          extras.chunk};
}

double Attention::softmax_scale() const {
  return extras.softmax_scale > 0 ? extras.softmax_scale
                                  : 1.0 / std::sqrt(static_cast<double>(head_dim));
}

at::Tensor Attention::forward(const at::Tensor& x, const RotaryEmbedding& rope,
                              const at::Tensor& positions, const KVCacheStep* cache,
                              const at::Tensor& document_ids) {
  return hooked(x, [&](const at::Tensor& in) {
    const int64_t bs = in.size(0);
    const int64_t n = in.size(1);
    if (cache != nullptr) {
      TITAN_CHECK(cache->start_pos >= 0 && cache->start_pos + n <= cache->max_len, "positions [",
                  cache->start_pos, ", ", cache->start_pos + n, ") do not fit a KV cache of ",
                  cache->max_len, " positions");
    }
    // Cast once for the three projections rather than once per projection.
    const at::Tensor xc = to_compute(in, compute_dtype);
    // -1 heads: the local head count follows the (possibly sharded) weights.
    at::Tensor q, k, v;
    if (packed_qkv.intact()) {  // inference (prepare_for_inference): one product for the three
      const std::vector<at::Tensor> qkv = packed_qkv.forward(xc);
      q = qkv[0];
      k = qkv[1].view({bs, n, -1, head_dim});
      v = qkv[2].view({bs, n, -1, head_dim});
    } else {
      q = wq->forward(xc);
      k = wk->forward(xc).view({bs, n, -1, head_dim});
      v = wv->forward(xc).view({bs, n, -1, head_dim});  // (bs, n, n_kv, head_dim)
    }
    at::Tensor gate;  // (bs, n, n_heads * head_dim) with output_gate
    if (extras.output_gate) {
      const at::Tensor both = q.view({bs, n, -1, 2 * head_dim});
      gate = both.narrow(-1, head_dim, head_dim).reshape({bs, n, -1});
      q = both.narrow(-1, 0, head_dim);
    } else {
      q = q.view({bs, n, -1, head_dim});
    }
    if (bq) {
      q = q + to_compute(bq->weight, compute_dtype).view({-1, head_dim});
      k = k + to_compute(bk->weight, compute_dtype).view({-1, head_dim});
      v = v + to_compute(bv->weight, compute_dtype).view({-1, head_dim});
    }
    if (q_norm) {
      q = q_norm->forward(q);
      k = k_norm->forward(k);
    }
    // Partial RoPE rotates the first rope_dim dimensions of each head and keeps the rest.
    const int64_t rotated = extras.rope_dim > 0 ? extras.rope_dim : head_dim;
    const auto rotate = [&](const at::Tensor& t) {
      const at::Tensor part = rotated < head_dim ? t.narrow(-1, 0, rotated) : t;
      const at::Tensor turned = cache != nullptr && !positions.defined()
                                    ? rope.forward_from(part, cache->start_pos)
                                    : rope.forward(part, positions);
      return rotated < head_dim ? at::cat({turned, t.narrow(-1, rotated, head_dim - rotated)}, -1)
                                : turned;
    };
    if (extras.rope) {  // else a NoPE layer (Llama 4): no rotation
      q = rotate(q);
      k = rotate(k);
    }
    if (extras.l2_qk_norm) {
      q = rms_normalize(q, extras.l2_norm_eps);
      k = rms_normalize(k, extras.l2_norm_eps);
    }
    if (extras.temperature_floor > 0) {
      at::Tensor pos = positions;  // (n) or (bs, n)
      if (!pos.defined()) {
        const int64_t start = cache != nullptr ? cache->start_pos : 0;
        pos = at::arange(start, start + n, q.options().dtype(at::kLong));
      }
      // (n, 1, 1) or (bs, n, 1, 1) float32 factors.
      const at::Tensor scales = at::log1p(at::floor((pos.to(q.device(), at::kFloat) + 1.0) /
                                                    static_cast<double>(extras.temperature_floor)))
                                    .mul_(extras.temperature_scale)
                                    .add_(1.0)
                                    .unsqueeze(-1)
                                    .unsqueeze(-1);
      q = (q.to(upcast_dtype(q.scalar_type())) * scales).to(q.scalar_type());
    }
    at::Tensor out;  // (bs, n, n_local_heads, head_dim)
    if (cache != nullptr) {
      out = attend_cached(q, k, v, *cache);
    } else if (extras.own_kernel()) {
      out = inner_attention->forward_variant(q, k, v, document_ids, variant());
    } else {
      out = inner_attention->forward(q, k, v, document_ids);
    }
    at::Tensor flat = out.view({bs, n, -1});
    if (gate.defined()) flat = flat * at::sigmoid(gate);
    const at::Tensor projected = wo->forward(flat);
    return bo ? projected + to_compute(bo->weight, compute_dtype) : projected;
  });
}

at::Tensor Attention::attend_cached(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                    const KVCacheStep& step) {
  LayerKVCache& cache = *step.cache;
  const int64_t bs = q.size(0);
  const int64_t n = q.size(1);
  const bool fits = cache.k.defined() && cache.k.size(0) == bs && cache.k.size(1) == k.size(2) &&
                    cache.k.size(2) == step.max_len && cache.k.scalar_type() == k.scalar_type();
  if (!fits) {
    TITAN_CHECK(step.start_pos == 0, "the KV cache does not match this input (batch ", bs,
                ", kv heads ", k.size(2), ", ", k.scalar_type(),
                ") past position 0. HINT: start a new sequence at start_pos 0");
    cache.k = at::empty({bs, k.size(2), step.max_len, head_dim}, k.options());
    cache.v = at::empty({bs, v.size(2), step.max_len, head_dim}, v.options());
  }
  cache.k.narrow(2, step.start_pos, n).copy_(k.transpose(1, 2));
  cache.v.narrow(2, step.start_pos, n).copy_(v.transpose(1, 2));
  if (extras.own_kernel()) {
    return sink_window_attention(q, cache.k, cache.v, step.start_pos, variant());
  }
  return cached_attention(q, cache.k, cache.v, step.start_pos);  // (bs, n, n_heads, head_dim)
}

}  // namespace titan
