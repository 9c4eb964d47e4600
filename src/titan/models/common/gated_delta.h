// The gated delta rule (Gated DeltaNet, Qwen3-Next's linear attention): per head a recurrent
// state S (k_head_dim x v_head_dim), decayed by exp(g_t) and corrected toward each new key/value
// pair at rate beta_t,
//
//   S_t = exp(g_t) S_{t-1} + k_t (beta_t (v_t - S'_t^T k_t))^T,   S'_t = exp(g_t) S_{t-1}
//   o_t = S_t^T (q_t / sqrt(k_head_dim))
//
// computed token by token (gated_delta_recurrent: generation, and the reference) or in chunks of
// the sequence (gated_delta_chunked: training), where a chunk's updates are condensed by the UT
// transform into triangular solves and matmuls and only the state crosses chunk borders. Both
// compute in float32 (or float64 for float64 inputs), are differentiable through ATen's
// autograd, and return the output in q's dtype. Shapes: q and k (bs, L, H, dk) (heads already
// matched to v's), v (bs, L, H, dv), g (<= 0) and beta (bs, L, H); the state (bs, H, dk, dv).
// transformers' torch_recurrent_gated_delta_rule and torch_chunk_gated_delta_rule (Qwen3-Next)
// compute the same (tests/e2e/test_gated_delta_reference.sh).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace titan {

struct GatedDeltaResult {
  at::Tensor out;    // (bs, L, H, dv) in q's dtype
  at::Tensor state;  // (bs, H, dk, dv) float32 (or float64): the state after the last token
};

// `state`: the state before the first token (undefined: zeros). `document_ids` (bs, L) int64
// (packed documents): the state restarts from zero at every position whose document differs
// from the previous position's (the first position continues `state`).
GatedDeltaResult gated_delta_recurrent(const at::Tensor& q, const at::Tensor& k,
                                       const at::Tensor& v, const at::Tensor& g,
                                       const at::Tensor& beta, const at::Tensor& state = {},
                                       const at::Tensor& document_ids = {});

// The same in chunks of `chunk` positions (the sequence padded to a multiple of it). With
// documents, the chunk's pairs meet only within a document, the state before the chunk reaches
// only the tokens before the chunk's first document start, and the state after it holds the
// chunk's last document only.
GatedDeltaResult gated_delta_chunked(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                     const at::Tensor& g, const at::Tensor& beta,
                                     int64_t chunk = 64, const at::Tensor& state = {},
                                     const at::Tensor& document_ids = {});

}  // namespace titan
