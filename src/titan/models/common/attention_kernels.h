// ATen's fused attention kernels called directly, forward and backward, each forward returning
// what its backward needs (the output, the float32 log-sum-exp and the kernel's other results):
// the seam for keeping a kernel's results (per-op selective activation checkpointing,
// savable_ops.h), for merging partial results by log-sum-exp (ring attention,
// parallel/ring_attention_pairs.h), and for the variable-length flash kernel of packed documents
// (attention.h), which scaled_dot_product_attention does not reach.
//
//   AttentionCall call{AttentionKernel::kCudaFlash};               // causal, default scale
//   AttentionResults r = attention_forward(call, q, k, v);         // r.out, r.lse
//   auto [dq, dk, dv] = attention_backward(call, dout, q, k, v, r);
//
// Dropout is always 0.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <optional>
#include <tuple>
#include <vector>

namespace titan {

enum class AttentionKernel {
  kNone,         // none of these (SDPA's math backend and the rest): recompute / explicit
  kCpuFlash,     // _scaled_dot_product_flash_attention_for_cpu (any additive mask, GQA)
  kCudaFlash,    // _scaled_dot_product_flash_attention (no mask, GQA, head_dim % 8 == 0)
  kEfficient,    // _scaled_dot_product_efficient_attention (additive bias; K, V repeated for GQA)
  kCudnn,        // _scaled_dot_product_cudnn_attention (no mask here; GQA where SDPA chose it)
  kVarlenFlash,  // _flash_attention_forward over packed sequences (cumulative lengths), GQA
};
const char* attention_kernel_name(AttentionKernel kernel);

// The arguments of a call besides q, k and v.
struct AttentionCall {
  AttentionKernel kernel = AttentionKernel::kNone;
  bool causal = true;  // top-left aligned: query i sees keys <= i (lq == lk here)
  // Additive, in q's dtype, broadcasting to (bs, heads, lq, lk) (kCpuFlash, kEfficient); with it
  // `causal` is usually false.
  std::optional<at::Tensor> mask;
  std::optional<double> scale;  // default 1 / sqrt(head_dim)
  // kVarlenFlash: (n + 1) int32 starts of the n sequences in the packed rows, and a bound on
  // their lengths.
  at::Tensor cu_seqlens;
  int64_t max_seqlen = 0;
};

struct AttentionResults {
  at::Tensor out;               // shaped as q, in q's dtype
  at::Tensor lse;               // float32 log-sum-exp of each query row, as the kernel lays it out
  std::vector<at::Tensor> aux;  // the kernel's other results its backward takes (may be undefined)

  // [out, lse, aux...] and back (what activation checkpointing keeps).
  std::vector<at::Tensor> to_vector() const;
  static AttentionResults from_vector(std::vector<at::Tensor> kept);
};
// How many tensors to_vector() holds for `kernel`.
size_t attention_results_size(AttentionKernel kernel);

// q (bs, heads, lq, hd), k and v (bs, kv_heads, lk, hd) as scaled_dot_product_attention takes
// them (any strides with a unit last one); kVarlenFlash: q (total, heads, hd), k and v
// (total, kv_heads, hd), the rows of every sequence one after the other.
AttentionResults attention_forward(const AttentionCall& call, const at::Tensor& q,
                                   const at::Tensor& k, const at::Tensor& v);

// The gradients of q, k and v for the output gradient `dout` (shaped as the output), given the
// forward's results. `results.lse` may be another forward's (ring attention passes the merged
// log-sum-exp with the merged output): for kEfficient it is (bs, heads, lq) or the kernel's own
// padding of it.
std::tuple<at::Tensor, at::Tensor, at::Tensor> attention_backward(
    const AttentionCall& call, const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
    const at::Tensor& v, const AttentionResults& results);

// The log-sum-exp of a kEfficient forward (bs, heads, rows padded to 32) cut to its rows.
at::Tensor efficient_lse_rows(const at::Tensor& lse, int64_t rows);

}  // namespace titan
