// Ring attention's work per ring step (context_parallel.h): this rank's queries against the keys
// and values of one source rank, pair by pair (query chunk, key chunk) of the sequence layout,
// merged into a running output by log-sum-exp; and the backward of the same pairs given the
// merged output and the global log-sum-exp. The ring (context_parallel.cpp) moves K, V and the
// key gradients between ranks; this file only computes.
//
//   auto fwd = make_pair_forward(kernel, q, n_kv_heads, ctx);
//   for (int step = 0; step < cp; ++step) fwd->add(kv_of(step), source(step));
//   PairForwardResult r = fwd->finish();       // out, and what backward needs
//   auto bwd = make_pair_backward(kernel, q, r.out, r.saved, dout, n_kv_heads, ctx);
//   for (...) dkv_of_source = bwd->add(kv_of(step), source(step));
//   at::Tensor dq = bwd->finish();
//
// Kernels (AttentionKernel, models/common/attention_kernels.h):
//   kNone      the explicit kernel: float32 matmuls on the folded queries (the rep query heads of
//              a kv head as rows), in blocks of at most 1024 x 1024 positions, any mask.
//   kCpuFlash  the diagonal pair causal, pairs below it full; with documents, blocks of at most
//              1024 positions under an additive mask (rows that see no key of a block get
//              log-sum-exp -inf and add nothing, whatever the kernel made of them).
//   kCudaFlash, kEfficient  causal or full pairs (no documents).
#pragma once

#include "titan/models/common/attention_kernels.h"
#include "titan/parallel/context_parallel.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace titan::ring {

// The kernel for q (bs, L, n_heads, hd) and k (bs, L, n_kv, hd), with or without a mask beyond
// the causal one (`documents`: a block-causal, sliding-window or chunked mask), under `requested`:
// kExplicit gives kNone (the explicit kernel); kFused the fused kernel of q's device that takes the
// pairs (CPU: the flash kernel, any mask, where libtorch runs it for these shapes; CUDA, causal
// only: flash for fp16 / bf16 with head_dim a multiple of 8 up to 256, else the memory-efficient
// kernel where libtorch would run it), else kNone; kAuto the fused kernel where it measured faster
// (see the .cpp), else kNone.
AttentionKernel choose_pair_kernel(RingKernel requested, const at::Tensor& q, const at::Tensor& k,
                                   bool documents);

// What a pair walk needs besides the tensors; the referenced objects outlive the walkers.
struct PairContext {
  const SequenceLayout* layout = nullptr;
  int rank = 0;
  at::Tensor docs;       // (bs, seq_len) int64 on q's device, or undefined (causal)
  at::Tensor docs_host;  // the same on the CPU (one counted device read per call)
  RingAttention::Stats* stats = nullptr;
  int64_t window = 0;  // > 0: sliding-window attention over this many positions (gpt-oss)
  int64_t chunk = 0;   // > 0: chunked attention over chunks of this many positions (Llama 4)
  double scale = 0;    // > 0: the scores' scale in place of head_dim^-0.5
  // Whether a window or chunks hide keys the causal mask leaves.
  bool local() const { return window > 0 || chunk > 0; }
};

struct PairForwardResult {
  at::Tensor out;                 // (bs, L, n_heads, hd) contiguous, in q's dtype
  std::vector<at::Tensor> saved;  // the kernel's statistics for backward (log-sum-exp first)
};

class PairForward {
 public:
  virtual ~PairForward() = default;
  // Attends this rank's queries to kv (2, bs, L, n_kv, hd), the keys and values of rank `source`.
  virtual void add(const at::Tensor& kv, int source) = 0;
  virtual PairForwardResult finish() = 0;
};

class PairBackward {
 public:
  virtual ~PairBackward() = default;
  // The float32 gradients (2, bs, n_kv, L, hd) of `source`'s keys and values from this rank's
  // queries.
  virtual at::Tensor add(const at::Tensor& kv, int source) = 0;
  // The gradient of q, (bs, L, n_heads, hd) contiguous in q's dtype.
  virtual at::Tensor finish() = 0;
};

// q (bs, L, n_heads, hd) of this rank, attending to keys and values of n_kv_heads heads.
std::unique_ptr<PairForward> make_pair_forward(AttentionKernel kernel, const at::Tensor& q,
                                               int64_t n_kv_heads, const PairContext& ctx);
// `out` and `saved`: what the forward's finish() returned; dout (bs, L, n_heads, hd).
std::unique_ptr<PairBackward> make_pair_backward(AttentionKernel kernel, const at::Tensor& q,
                                                 const at::Tensor& out,
                                                 const std::vector<at::Tensor>& saved,
                                                 const at::Tensor& dout, int64_t n_kv_heads,
                                                 const PairContext& ctx);

}  // namespace titan::ring
