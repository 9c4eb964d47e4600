// Gated DeltaNet (see gated_delta_net.h).
#include "titan/models/common/gated_delta_net.h"

#include "titan/common/check.h"
#include "titan/models/common/gated_delta.h"

#include <vector>

namespace titan {
namespace {

// x * rsqrt(sum(x^2) + eps) over the last dimension (FLA's and transformers' l2norm), in float32.
at::Tensor l2_normalize(const at::Tensor& x, double eps = 1e-6) {
  const at::Tensor f = x.to(at::kFloat);
  return f * at::rsqrt(f.square().sum(-1, /*keepdim=*/true) + eps);
}

}  // namespace

GatedDeltaNet::GatedDeltaNet(int64_t dim, const GatedDeltaNetArgs& args,
                             at::ScalarType compute_dtype)
    : args_(args) {
  args_.validate();
  in_proj_qkvz = register_module(
      "in_proj_qkvz",
      std::make_shared<Linear>(dim, 2 * args.key_dim() + 2 * args.value_dim(), compute_dtype));
  in_proj_ba = register_module("in_proj_ba",
                               std::make_shared<Linear>(dim, 2 * args.num_v_heads, compute_dtype));
  conv1d = register_module(
      "conv1d", std::make_shared<Bias>(at::IntArrayRef{args.conv_dim(), 1, args.conv_kernel}));
  dt_bias = register_module("dt_bias", std::make_shared<Bias>(at::IntArrayRef{args.num_v_heads}));
  A_log = register_module("A_log", std::make_shared<Bias>(at::IntArrayRef{args.num_v_heads}));
  norm = register_module("norm", std::make_shared<Bias>(at::IntArrayRef{args.head_v_dim}));
  out_proj =
      register_module("out_proj", std::make_shared<Linear>(args.value_dim(), dim, compute_dtype));
}

at::Tensor causal_depthwise_conv(const at::Tensor& x, const at::Tensor& weight,
                                 const at::Tensor& history, const at::Tensor& document_ids) {
  TITAN_CHECK(
      x.dim() == 3 && weight.dim() == 3 && weight.size(0) == x.size(2) && weight.size(1) == 1,
      "causal_depthwise_conv: x (bs, L, C) and weight (C, 1, K), got ", x.sizes(), " and ",
      weight.sizes());
  const int64_t bs = x.size(0), length = x.size(1), channels = x.size(2), k = weight.size(2);
  // The K - 1 positions before the first: the history, or zeros.
  const at::Tensor before = history.defined() ? history.transpose(1, 2).to(x.scalar_type())
                                              : at::zeros({bs, k - 1, channels}, x.options());
  TITAN_CHECK(before.size(1) == k - 1 && before.size(2) == channels,
              "causal_depthwise_conv: history (bs, C, K - 1), got ", history.sizes());
  const at::Tensor padded = at::cat({before, x}, 1);  // (bs, K - 1 + L, C)
  const at::Tensor w = weight.to(x.scalar_type());
  at::Tensor out;
  for (int64_t i = 0; i < k; ++i) {
    // Tap i reads position t - (K - 1 - i).
    const int64_t back = k - 1 - i;
    at::Tensor tap = padded.narrow(1, i, length);
    if (document_ids.defined() && back > 0) {
      // Positions of an earlier document (or before the sequence, which the first document
      // owns only through `history`, absent in training) read zero.
      const at::Tensor prev = at::cat({at::full({bs, back}, -1, document_ids.options()),
                                       document_ids.narrow(1, 0, length - back)},
                                      1);
      tap = tap * document_ids.eq(prev).unsqueeze(-1).to(x.scalar_type());
    }
    const at::Tensor term = tap * w.select(2, i).squeeze(1);
    out = out.defined() ? out + term : term;
  }
  return out;
}

at::Tensor GatedDeltaNet::forward(const at::Tensor& x, const at::Tensor& document_ids,
                                  LinearAttentionState* state) {
  return hooked(x, [&](const at::Tensor& in) { return compute(in, document_ids, state); });
}

at::Tensor GatedDeltaNet::compute(const at::Tensor& x, const at::Tensor& document_ids,
                                  LinearAttentionState* state) {
  const GatedDeltaNetArgs& a = args_;
  const int64_t bs = x.size(0), length = x.size(1);
  const int64_t nk = a.num_k_heads, nv = a.num_v_heads, dk = a.head_k_dim, dv = a.head_v_dim;
  const int64_t r = nv / nk;  // value heads per key head
  // The grouped projections, per key head: [q (dk), k (dk), v (r dv), z (r dv)] and [b (r), a (r)].
  const at::Tensor qkvz = in_proj_qkvz->forward(x).view({bs, length, nk, 2 * dk + 2 * r * dv});
  const at::Tensor ba = in_proj_ba->forward(x).view({bs, length, nk, 2 * r});
  const std::vector<at::Tensor> parts = qkvz.split_with_sizes({dk, dk, r * dv, r * dv}, 3);
  const at::Tensor z = parts[3].reshape({bs, length, nv, dv});
  const at::Tensor b = ba.narrow(3, 0, r).reshape({bs, length, nv});
  const at::Tensor gate_in = ba.narrow(3, r, r).reshape({bs, length, nv});
  // The convolution over [q k v] (all q heads, all k heads, all v heads), then SiLU.
  const at::Tensor mixed = at::cat(
      {parts[0].reshape({bs, length, a.key_dim()}), parts[1].reshape({bs, length, a.key_dim()}),
       parts[2].reshape({bs, length, a.value_dim()})},
      -1);
  const at::Tensor history = state != nullptr ? state->conv : at::Tensor();
  const at::Tensor conv = at::silu(causal_depthwise_conv(
      mixed, conv1d->weight, history, state != nullptr ? at::Tensor() : document_ids));
  if (state != nullptr) {
    // The last K - 1 inputs, for the next call.
    const at::Tensor before =
        history.defined() ? history.transpose(1, 2).to(mixed.scalar_type())
                          : at::zeros({bs, a.conv_kernel - 1, a.conv_dim()}, mixed.options());
    const at::Tensor all = at::cat({before, mixed}, 1);
    state->conv = all.narrow(1, all.size(1) - (a.conv_kernel - 1), a.conv_kernel - 1)
                      .transpose(1, 2)
                      .contiguous();
  }
  const std::vector<at::Tensor> qkv =
      conv.split_with_sizes({a.key_dim(), a.key_dim(), a.value_dim()}, -1);
  // Each key head serves its r value heads; q and k normalised (the rule scales q by dk^-0.5).
  const at::Tensor q =
      l2_normalize(qkv[0].reshape({bs, length, nk, dk})).repeat_interleave(r, /*dim=*/2);
  const at::Tensor k =
      l2_normalize(qkv[1].reshape({bs, length, nk, dk})).repeat_interleave(r, /*dim=*/2);
  const at::Tensor v = qkv[2].reshape({bs, length, nv, dv}).to(at::kFloat);
  const at::Tensor beta = at::sigmoid(b.to(at::kFloat));
  const at::Tensor g = -at::exp(A_log->weight.to(at::kFloat)) *
                       at::softplus(gate_in.to(at::kFloat) + dt_bias->weight.to(at::kFloat));
  const at::Tensor initial = state != nullptr ? state->recurrent : at::Tensor();
  const GatedDeltaResult rule =
      length == 1 && state != nullptr
          ? gated_delta_recurrent(q, k, v, g, beta, initial)
          : gated_delta_chunked(q, k, v, g, beta, a.chunk, initial,
                                state != nullptr ? at::Tensor() : document_ids);
  if (state != nullptr) state->recurrent = rule.state;
  // The gated RMSNorm per value head: norm(o) * weight * silu(z), in float32.
  const at::Tensor o = rule.out.to(at::kFloat);
  const at::Tensor normed = o * at::rsqrt(o.square().mean(-1, /*keepdim=*/true) + a.norm_eps);
  const at::Tensor gated = normed * norm->weight.to(at::kFloat) * at::silu(z.to(at::kFloat));
  return out_proj->forward(gated.reshape({bs, length, a.value_dim()}).to(x.scalar_type()))
      .to(x.scalar_type());
}

}  // namespace titan
