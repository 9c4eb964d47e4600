// Ops whose results a recomputing runner may keep instead of computing them again: the seam for
// per-op selective activation checkpointing (TorchTitan's selective_ac_option = "op", which keeps
// the outputs of matmuls, attention and tensor-parallel reduce-scatters and recomputes the
// cheap elementwise work around them: norms, RoPE, SiLU, casts).
//
// Model code calls savable_linear / savable_causal_sdpa at those points, and tensor parallelism
// computes its reduce-scatter through savable_result; with no OpSaver on the calling thread they
// are the plain ops. Activation checkpointing (src/titan/parallel/activation_checkpoint.h)
// installs a saver while a checkpointed block runs forward, which keeps some results (the saver
// decides which, in program order), and again while backward recomputes the block, which then
// takes those results in the same order instead of computing them. A taken result is wired into
// autograd through the op's own backward (for a matmul grad @ W and grad^T @ x; for attention
// the fused kernel's backward from the kept output, log-sum-exp and random state), so gradients
// are those of the op computed afresh.
//
// Attention is kept where libtorch runs one of the kernels of TorchTitan's save list for op-SAC
// (_scaled_dot_product_flash_attention, _scaled_dot_product_efficient_attention,
// _scaled_dot_product_cudnn_attention) or the CPU flash kernel, and for titan's variable-length
// flash attention of packed documents; SDPA's math backend (whose backward needs the
// probabilities it does not return) is recomputed (kept_attention_kernel).
#pragma once

#include "titan/models/common/attention_kernels.h"

#include <ATen/ATen.h>

#include <functional>
#include <vector>

namespace titan {

enum class SavableOp {
  kMatmul,         // x @ w^T
  kAttention,      // a fused attention kernel (kept_attention_kernel)
  kReduceScatter,  // tensor parallelism's reduce-scatter of a row-wise projection's output
};
const char* savable_op_name(SavableOp op);

// A per-thread policy (see the top of this file). Each savable op asks keeps() once, in program
// order; when it answers true the op either computes its results and hands them to keep()
// (!replaying(): the checkpointed forward) or takes them with take() (replaying(): the
// recomputation), which must return what keep() got for the same occurrence.
class OpSaver {
 public:
  virtual ~OpSaver() = default;
  // Whether this occurrence's results are kept. `weight`: the matmul's (out, in) weight;
  // undefined for the other ops.
  virtual bool keeps(SavableOp op, const at::Tensor& weight) = 0;
  virtual bool replaying() const = 0;
  // results[0] is the op's output; the rest are statistics its backward needs.
  virtual void keep(SavableOp op, std::vector<at::Tensor> results) = 0;
  virtual std::vector<at::Tensor> take(SavableOp op) = 0;
};

// The calling thread's saver, or null.
OpSaver* current_op_saver();

// Installs `saver` on the calling thread for the scope's lifetime (the previous one after).
class OpSaverScope {
 public:
  explicit OpSaverScope(OpSaver* saver);
  ~OpSaverScope();
  OpSaverScope(const OpSaverScope&) = delete;
  OpSaverScope& operator=(const OpSaverScope&) = delete;

 private:
  OpSaver* previous_;
};

// x (..., in) @ weight (out, in)^T -> (..., out), as at::linear.
at::Tensor savable_linear(const at::Tensor& x, const at::Tensor& weight);

// Causal scaled-dot-product attention as at::scaled_dot_product_attention(q, k, v, /*mask=*/{},
// /*dropout_p=*/0, /*is_causal=*/true, /*scale=*/default, enable_gqa). q (bs, n_heads, seq, hd),
// k and v (bs, n_kv_heads, seq, hd) -> (bs, n_heads, seq, hd). With `mask` (bool, broadcasting to
// (bs, n_heads, seq, seq), true where a query may attend to a key; e.g. block-causal) the mask
// replaces the causal one. Kept where kept_attention_kernel names a kernel for libtorch's choice
// (at::_fused_sdp_choice): that kernel then runs directly, with the mask prepared as SDPA would.
at::Tensor savable_causal_sdpa(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               bool enable_gqa, const at::Tensor& mask = {});

// The kernel per-op AC keeps for an SDPA call that libtorch runs with `backend` (an
// at::SDPBackend as at::_fused_sdp_choice returns it) on `device`: the CPU flash kernel; on CUDA
// flash (head_dim a multiple of 8: SDPA pads other head dims, which is not replicated here),
// memory-efficient (with or without a mask) and cuDNN (without a mask; grouped-query heads as
// SDPA passes them, unrepeated, when it chose cuDNN for them); kNone for the math backend and
// anything else (recomputed).
AttentionKernel kept_attention_kernel(int64_t backend, at::DeviceType device, int64_t head_dim,
                                      bool masked);

// Attention through `call` (attention_kernels.h) as an autograd function whose backward is the
// kernel's (attention_backward), kept and replayed under an OpSaver like the ops above. Shapes
// as attention_forward; returns the output.
at::Tensor savable_attention(const AttentionCall& call, const at::Tensor& q, const at::Tensor& k,
                             const at::Tensor& v);

// True on a thread while activation checkpointing recomputes a block for its backward (any
// mode): a forward that updates state once per step (an MoE layer's token counts) skips it then.
bool recomputing();
// Marks the calling thread as recomputing for the scope's lifetime (nests).
class RecomputeScope {
 public:
  RecomputeScope();
  ~RecomputeScope();
  RecomputeScope(const RecomputeScope&) = delete;
  RecomputeScope& operator=(const RecomputeScope&) = delete;

 private:
  bool previous_;
};

// For the forward of an autograd Function whose backward needs none of its forward values (a
// collective): compute(), or the kept result while replaying.
at::Tensor savable_result(SavableOp op, const std::function<at::Tensor()>& compute);

}  // namespace titan
