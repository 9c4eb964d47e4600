// Causal GQA self-attention (see attention.h). Training uses libtorch's fused
// scaled_dot_product_attention (flash attention on CPU: O(seqlen) saved statistics instead of the
// probability matrix). The inference path (KV cache) materialises the scores: a decode step has
// one query per head, so the scores are a (n_rep, L) row block per kv head and a fused kernel
// would gain nothing; the query heads that share a kv head are folded into the row dimension, so
// one batched matmul serves all of them without copying K and V n_rep times, and long prompts go
// in query chunks that skip the fully masked part of the score matrix.
#include "titan/models/common/attention.h"

#include "titan/common/check.h"
#include "titan/common/names.h"
#include "titan/common/phase.h"
#include "titan/models/common/savable_ops.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace titan {
namespace {

// Query positions per attention chunk. Smaller chunks skip more of the masked triangle but run
// smaller matmuls; on the 2-core AVX-512 CPU 128 beat 64 and unchunked at seq_len 256 and 512.
constexpr int64_t kQueryChunk = 128;

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

}  // namespace

at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& document_ids) {
  const TraceSpan span("attention");
  const int64_t n_heads = q.size(2);
  const int64_t n_kv_heads = k.size(2);
  TITAN_CHECK(n_kv_heads > 0 && n_heads % n_kv_heads == 0, "n_kv_heads (", n_kv_heads,
              ") must divide n_heads (", n_heads, ")");
  const int64_t n_rep = n_heads / n_kv_heads;
  // Query head h reads kv head h / n_rep: SDPA's enable_gqa does this inside the kernel, with no
  // (bs, n_heads, seqlen, head_dim) copies of K and V.
  at::Tensor mask;  // block-causal: (bs, 1, seqlen, seqlen), true where a query sees a key
  if (document_ids.defined()) {
    const int64_t seqlen = q.size(1);
    TITAN_CHECK(document_ids.dim() == 2 && document_ids.size(0) == q.size(0) &&
                    document_ids.size(1) == seqlen,
                "block-causal attention: document ids must be (bs, seqlen) = (", q.size(0), ", ",
                seqlen, "), got ", document_ids.sizes());
    const at::Tensor docs = document_ids.to(q.device(), at::kLong);
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

at::Tensor document_ids(const at::Tensor& tokens, int64_t end_token) {
  TITAN_CHECK(tokens.dim() == 2, "document_ids: expected tokens (bs, seqlen), got ",
              tokens.sizes());
  const at::Tensor ends = tokens.eq(end_token).to(at::kLong);
  return ends.cumsum(1).sub_(ends);  // ends strictly before each token
}

AttentionMask parse_attention_mask(const std::string& name) {
  if (name == "causal") return AttentionMask::kCausal;
  if (name == "block_causal") return AttentionMask::kBlockCausal;
  throw ConfigError("unknown model.attn_mask_type '" + name + "'" +
                    did_you_mean(likely_name(name, {"causal", "block_causal"})) +
                    " (it is \"causal\" or \"block_causal\")");
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
  // The same row folding as causal_attention: row i * n_rep + r is (new position i, query head
  // g * n_rep + r) of kv head g. (batch, n * n_rep, head_dim)
  const at::Tensor q_rows = q.view({bs, n, n_kv_heads, n_rep, head_dim})
                                .permute({0, 2, 1, 3, 4})
                                .reshape({batch, n * n_rep, head_dim});
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
    const at::Tensor probs = is_reduced_float(scores.scalar_type())
                                 ? at::softmax(scores, -1, at::kFloat).to(scores.scalar_type())
                                 : at::softmax(scores, -1);
    chunks.push_back(at::bmm(probs, v_rows.narrow(1, 0, keys)));
  }
  const at::Tensor out = chunks.size() == 1 ? chunks[0] : at::cat(chunks, 1);
  return out.view({bs, n_kv_heads, n, n_rep, head_dim})
      .permute({0, 2, 1, 3, 4})
      .contiguous()
      .view({bs, n, n_heads, head_dim});
}

Attention::Attention(int64_t dim, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                     at::ScalarType compute_dtype, bool qk_norm, double norm_eps)
    : head_dim(head_dim), compute_dtype(compute_dtype) {
  wq = register_module("wq", std::make_shared<Linear>(dim, n_heads * head_dim, compute_dtype));
  wk = register_module("wk", std::make_shared<Linear>(dim, n_kv_heads * head_dim, compute_dtype));
  wv = register_module("wv", std::make_shared<Linear>(dim, n_kv_heads * head_dim, compute_dtype));
  wo = register_module("wo", std::make_shared<Linear>(n_heads * head_dim, dim, compute_dtype));
  if (qk_norm) {
    q_norm = register_module("q_norm", std::make_shared<RMSNorm>(head_dim, norm_eps));
    k_norm = register_module("k_norm", std::make_shared<RMSNorm>(head_dim, norm_eps));
  }
}

at::Tensor Attention::forward(const at::Tensor& x, const RotaryEmbedding& rope,
                              const at::Tensor& positions, const KVCacheStep* cache,
                              const at::Tensor& document_ids) {
  return hooked(x, [&](const at::Tensor& in) {
    const int64_t bs = in.size(0);
    const int64_t n = in.size(1);
    at::Tensor pos = positions;
    if (cache != nullptr) {
      TITAN_CHECK(cache->start_pos >= 0 && cache->start_pos + n <= cache->max_len, "positions [",
                  cache->start_pos, ", ", cache->start_pos + n, ") do not fit a KV cache of ",
                  cache->max_len, " positions");
      if (!pos.defined()) {
        pos = at::arange(cache->start_pos, cache->start_pos + n,
                         at::TensorOptions(at::kLong).device(in.device()));
      }
    }
    // Cast once for the three projections rather than once per projection.
    const at::Tensor xc = to_compute(in, compute_dtype);
    // -1 heads: the local head count follows the (possibly sharded) weights.
    at::Tensor q = wq->forward(xc).view({bs, n, -1, head_dim});
    at::Tensor k = wk->forward(xc).view({bs, n, -1, head_dim});
    if (q_norm) {
      q = q_norm->forward(q);
      k = k_norm->forward(k);
    }
    q = rope.forward(q, pos);
    k = rope.forward(k, pos);
    const at::Tensor v = wv->forward(xc).view({bs, n, -1, head_dim});  // (bs, n, n_kv, head_dim)
    const at::Tensor out = cache != nullptr ? attend_cached(q, k, v, *cache)
                                            : inner_attention->forward(q, k, v, document_ids);
    return wo->forward(out.view({bs, n, -1}));  // out: (bs, n, n_local_heads, head_dim)
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
  return cached_attention(q, cache.k, cache.v, step.start_pos);  // (bs, n, n_heads, head_dim)
}

}  // namespace titan
