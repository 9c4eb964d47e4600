// Multi-head latent attention (see mla.h).
#include "titan/models/common/mla.h"

#include "titan/common/check.h"

#include <algorithm>
#include <cmath>

namespace titan {
namespace {

// t (..., d) zero-padded to (..., width).
at::Tensor pad_last(const at::Tensor& t, int64_t width) {
  const int64_t d = t.size(-1);
  return d == width ? t : at::constant_pad_nd(t, {0, width - d});
}

}  // namespace

double mla_softmax_scale(const MlaArgs& args) {
  const double m = yarn_mscale(args.yarn.factor, args.mscale);
  return m * m / std::sqrt(static_cast<double>(args.qk_head_dim()));
}

MultiHeadLatentAttention::MultiHeadLatentAttention(int64_t dim, int64_t n_heads,
                                                   const MlaArgs& args,
                                                   at::ScalarType compute_dtype)
    : args(args), compute_dtype(compute_dtype) {
  const int64_t qk = args.qk_head_dim();
  if (args.q_lora_rank == 0) {
    wq = register_module("wq", std::make_shared<Linear>(dim, n_heads * qk, compute_dtype));
  } else {
    wq_a = register_module("wq_a", std::make_shared<Linear>(dim, args.q_lora_rank, compute_dtype));
    q_norm = register_module("q_norm", std::make_shared<RMSNorm>(args.q_lora_rank, args.norm_eps));
    wq_b = register_module("wq_b",
                           std::make_shared<Linear>(args.q_lora_rank, n_heads * qk, compute_dtype));
  }
  wkv_a = register_module(
      "wkv_a",
      std::make_shared<Linear>(dim, args.kv_lora_rank + args.qk_rope_head_dim, compute_dtype));
  kv_norm = register_module("kv_norm", std::make_shared<RMSNorm>(args.kv_lora_rank, args.norm_eps));
  wkv_b = register_module(
      "wkv_b",
      std::make_shared<Linear>(args.kv_lora_rank,
                               n_heads * (args.qk_nope_head_dim + args.v_head_dim), compute_dtype));
  wo = register_module("wo",
                       std::make_shared<Linear>(n_heads * args.v_head_dim, dim, compute_dtype));
}

at::Tensor MultiHeadLatentAttention::forward(const at::Tensor& x, const RotaryEmbedding& rope,
                                             const at::Tensor& positions, const KVCacheStep* cache,
                                             const at::Tensor& document_ids) {
  return hooked(x, [&](const at::Tensor& in) {
    const int64_t bs = in.size(0);
    const int64_t n = in.size(1);
    const int64_t nope = args.qk_nope_head_dim, rot = args.qk_rope_head_dim;
    const int64_t qk = args.qk_head_dim(), vd = args.v_head_dim;
    if (cache != nullptr) {
      TITAN_CHECK(cache->start_pos >= 0 && cache->start_pos + n <= cache->max_len, "positions [",
                  cache->start_pos, ", ", cache->start_pos + n, ") do not fit a KV cache of ",
                  cache->max_len, " positions");
    }
    // With a cache and no positions: [start_pos, start_pos + n).
    const auto rotate = [&](const at::Tensor& t) {
      return cache != nullptr && !positions.defined() ? rope.forward_from(t, cache->start_pos)
                                                      : rope.forward(t, positions);
    };
    const at::Tensor xc = to_compute(in, compute_dtype);
    // -1 heads: the local head count follows the (possibly sharded) weights.
    const at::Tensor q = (wq ? wq->forward(xc) : wq_b->forward(q_norm->forward(wq_a->forward(xc))))
                             .view({bs, n, -1, qk});  // (bs, n, heads, qk)
    const at::Tensor kv = wkv_a->forward(xc);         // (bs, n, kv_lora + rope)
    // The rotary key, one "head" that every query head reads: (bs, n, 1, rope).
    const at::Tensor k_pe = rotate(kv.narrow(-1, args.kv_lora_rank, rot).unsqueeze(2));
    const at::Tensor q_pe = rotate(q.narrow(-1, nope, rot));
    const at::Tensor kvb = wkv_b->forward(kv_norm->forward(kv.narrow(-1, 0, args.kv_lora_rank)))
                               .view({bs, n, -1, nope + vd});  // (bs, n, heads, nope + v)
    const int64_t heads = kvb.size(2);
    // One head size for q, k and v (zero padding changes no score and no output column), and
    // the softmax scale folded into q: the kernel scales by width^-0.5.
    const int64_t width = std::max(qk, vd);
    const double q_scale = mla_softmax_scale(args) * std::sqrt(static_cast<double>(width));
    at::Tensor q_full = at::cat({q.narrow(-1, 0, nope), q_pe}, -1);
    if (q_scale != 1.0) q_full = q_full * q_scale;
    q_full = pad_last(q_full, width);
    const at::Tensor k =
        pad_last(at::cat({kvb.narrow(-1, 0, nope), k_pe.expand({bs, n, heads, rot})}, -1), width);
    const at::Tensor v = pad_last(kvb.narrow(-1, nope, vd), width);
    at::Tensor out;  // (bs, n, heads, width)
    if (cache == nullptr) {
      out = inner_attention->forward(q_full, k, v, document_ids);
    } else {
      LayerKVCache& layer = *cache->cache;
      const bool fits = layer.k.defined() && layer.k.size(0) == bs && layer.k.size(1) == heads &&
                        layer.k.size(2) == cache->max_len && layer.k.size(3) == width &&
                        layer.k.scalar_type() == k.scalar_type();
      if (!fits) {
        TITAN_CHECK(cache->start_pos == 0, "the KV cache does not match this input (batch ", bs,
                    ", heads ", heads, ", ", k.scalar_type(),
                    ") past position 0. HINT: start a new sequence at start_pos 0");
        layer.k = at::empty({bs, heads, cache->max_len, width}, k.options());
        layer.v = at::empty({bs, heads, cache->max_len, width}, v.options());
      }
      layer.k.narrow(2, cache->start_pos, n).copy_(k.transpose(1, 2));
      layer.v.narrow(2, cache->start_pos, n).copy_(v.transpose(1, 2));
      out = cached_attention(q_full.to(k.scalar_type()), layer.k, layer.v, cache->start_pos);
    }
    return wo->forward(out.narrow(-1, 0, vd).reshape({bs, n, heads * vd}));
  });
}

}  // namespace titan
