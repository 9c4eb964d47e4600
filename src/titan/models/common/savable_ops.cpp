// Savable ops (see savable_ops.h): the plain op, or its kept results wired into autograd through
// the op's own backward. The backward formulas follow the ones autograd uses for the plain ops
// (at::linear folds (..., in) to rows and runs mm; SDPA runs the kernel _fused_sdp_choice names),
// so a replayed op gives the same gradients as the op computed afresh.
#include "titan/models/common/savable_ops.h"

#include "titan/common/check.h"

#include <ATen/SDPBackend.h>
#include <torch/csrc/autograd/custom_function.h>

#include <limits>
#include <optional>

namespace titan {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

thread_local OpSaver* t_saver = nullptr;
thread_local bool t_recomputing = false;

// A kept x @ w^T. x (..., in), weight (out, in), out (..., out).
struct ReplayedLinear : public torch::autograd::Function<ReplayedLinear> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const at::Tensor& out) {
    ctx->save_for_backward({x, weight});
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor& weight = saved[1];
    const at::Tensor grad = grads[0].reshape({-1, grads[0].size(-1)});  // (rows, out)
    at::Tensor grad_x, grad_weight;
    if (ctx->needs_input_grad(0)) grad_x = grad.mm(weight).reshape(x.sizes());
    if (ctx->needs_input_grad(1)) grad_weight = grad.t().mm(x.reshape({-1, x.size(-1)}));
    return {grad_x, grad_weight, at::Tensor()};
  }
};

// Attention through a fused kernel (attention_kernels.h), or its kept results: the output; the
// kernel's backward from q, k, v, the output, the log-sum-exp and the kernel's other results.
struct KernelAttention : public torch::autograd::Function<KernelAttention> {
  // The call (its mask and cumulative lengths) travels outside the tensor arguments: autograd
  // needs a device for each of those, and causal attention has no mask.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, const AttentionCall* call,
                            std::vector<at::Tensor>* kept) {
    const AttentionResults r = kept != nullptr ? AttentionResults::from_vector(std::move(*kept))
                                               : attention_forward(*call, q, k, v);
    variable_list saved{q, k, v};
    for (const at::Tensor& t : r.to_vector()) saved.push_back(t);
    ctx->save_for_backward(saved);
    ctx->saved_data["kernel"] = static_cast<int64_t>(call->kernel);
    ctx->saved_data["causal"] = call->causal;
    if (call->mask) ctx->saved_data["mask"] = *call->mask;
    if (call->scale) ctx->saved_data["scale"] = *call->scale;
    if (call->cu_seqlens.defined()) {
      ctx->saved_data["cu_seqlens"] = call->cu_seqlens;
      ctx->saved_data["max_seqlen"] = call->max_seqlen;
    }
    return r.out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list s = ctx->get_saved_variables();
    const auto& data = ctx->saved_data;
    AttentionCall call;
    call.kernel = static_cast<AttentionKernel>(data.at("kernel").toInt());
    call.causal = data.at("causal").toBool();
    if (data.count("mask")) call.mask = data.at("mask").toTensor();
    if (data.count("scale")) call.scale = data.at("scale").toDouble();
    if (data.count("cu_seqlens")) {
      call.cu_seqlens = data.at("cu_seqlens").toTensor();
      call.max_seqlen = data.at("max_seqlen").toInt();
    }
    const AttentionResults results =
        AttentionResults::from_vector(std::vector<at::Tensor>(s.begin() + 3, s.end()));
    auto [grad_q, grad_k, grad_v] =
        attention_backward(call, grads[0].contiguous(), s[0], s[1], s[2], results);
    return {grad_q, grad_k, grad_v, at::Tensor(), at::Tensor()};
  }
};

// The mask of a kept SDPA call as the kernel takes it (SDPA's own conversion): a boolean mask
// becomes additive in q's dtype (0 where kept, -inf elsewhere); for the memory-efficient kernel
// its rows start 16-element aligned (padded storage) and it is expanded to
// (bs, n_heads, seq_q, seq_k).
at::Tensor kernel_mask(const at::Tensor& mask, const at::Tensor& q, const at::Tensor& k,
                       AttentionKernel kernel) {
  const bool aligned = kernel == AttentionKernel::kEfficient;
  const int64_t keys = mask.size(-1);
  std::vector<int64_t> sizes = mask.sizes().vec();
  if (aligned) sizes.back() = (keys + 15) / 16 * 16;
  at::Tensor additive = at::zeros(sizes, q.options()).narrow(-1, 0, keys);
  if (mask.scalar_type() == at::kBool) {
    additive.masked_fill_(mask.logical_not(), -std::numeric_limits<double>::infinity());
  } else {
    additive.copy_(mask);
  }
  if (!aligned) return additive;
  return additive.expand({q.size(0), q.size(1), q.size(2), k.size(2)});
}

// The kept results of `op`, checked against the shape the op would compute now.
std::vector<at::Tensor> take_checked(OpSaver& saver, SavableOp op, at::IntArrayRef want,
                                     size_t count) {
  std::vector<at::Tensor> results = saver.take(op);
  TITAN_CHECK(results.size() == count && results[0].sizes() == want,
              "activation checkpointing: the recomputed ", savable_op_name(op),
              " has output shape ", want, " but the forward kept ",
              results.empty() ? at::IntArrayRef{} : results[0].sizes(),
              "; the checkpointed block ran differently when recomputed. HINT: a checkpointed "
              "block must compute the same shapes every time it runs");
  return results;
}

}  // namespace

const char* savable_op_name(SavableOp op) {
  switch (op) {
    case SavableOp::kMatmul: return "matmul";
    case SavableOp::kAttention: return "attention";
    case SavableOp::kReduceScatter: return "reduce-scatter";
  }
  return "?";
}

OpSaver* current_op_saver() { return t_saver; }

bool recomputing() { return t_recomputing; }

RecomputeScope::RecomputeScope() : previous_(t_recomputing) { t_recomputing = true; }

RecomputeScope::~RecomputeScope() { t_recomputing = previous_; }

OpSaverScope::OpSaverScope(OpSaver* saver) : previous_(t_saver) { t_saver = saver; }

OpSaverScope::~OpSaverScope() { t_saver = previous_; }

at::Tensor savable_linear(const at::Tensor& x, const at::Tensor& weight) {
  OpSaver* saver = t_saver;
  if (saver == nullptr || !saver->keeps(SavableOp::kMatmul, weight)) return at::linear(x, weight);
  if (saver->replaying()) {
    std::vector<int64_t> want = x.sizes().vec();
    want.back() = weight.size(0);
    return ReplayedLinear::apply(x, weight, take_checked(*saver, SavableOp::kMatmul, want, 1)[0]);
  }
  at::Tensor out = at::linear(x, weight);
  saver->keep(SavableOp::kMatmul, {out});
  return out;
}

AttentionKernel kept_attention_kernel(int64_t backend, at::DeviceType device, int64_t head_dim,
                                      bool masked) {
  const auto is = [&](at::SDPBackend b) { return backend == static_cast<int64_t>(b); };
  if (device == at::kCPU) {
    return is(at::SDPBackend::flash_attention) ? AttentionKernel::kCpuFlash
                                               : AttentionKernel::kNone;
  }
  if (device != at::kCUDA) return AttentionKernel::kNone;
  if (is(at::SDPBackend::flash_attention) && !masked && head_dim % 8 == 0) {
    return AttentionKernel::kCudaFlash;
  }
  if (is(at::SDPBackend::efficient_attention)) return AttentionKernel::kEfficient;
  if (is(at::SDPBackend::cudnn_attention) && !masked) {
    return AttentionKernel::kCudnn;
  }
  return AttentionKernel::kNone;
}

at::Tensor savable_attention(const AttentionCall& call, const at::Tensor& q, const at::Tensor& k,
                             const at::Tensor& v) {
  OpSaver* saver = t_saver;
  if (saver == nullptr || !saver->keeps(SavableOp::kAttention, at::Tensor())) {
    return KernelAttention::apply(q, k, v, &call, nullptr);
  }
  if (saver->replaying()) {
    std::vector<at::Tensor> kept =
        take_checked(*saver, SavableOp::kAttention, q.sizes(), attention_results_size(call.kernel));
    return KernelAttention::apply(q, k, v, &call, &kept);
  }
  const AttentionResults r = attention_forward(call, q, k, v);
  saver->keep(SavableOp::kAttention, r.to_vector());
  return r.out;
}

at::Tensor savable_causal_sdpa(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               bool enable_gqa, const at::Tensor& mask) {
  const std::optional<at::Tensor> attn_mask =
      mask.defined() ? std::optional<at::Tensor>(mask) : std::nullopt;
  const bool is_causal = !mask.defined();
  const auto plain = [&] {
    return at::scaled_dot_product_attention(q, k, v, attn_mask, /*dropout_p=*/0.0, is_causal,
                                            /*scale=*/std::nullopt, enable_gqa);
  };
  OpSaver* saver = t_saver;
  if (saver == nullptr) return plain();
  const int64_t backend = at::_fused_sdp_choice(q, k, v, attn_mask, /*dropout_p=*/0.0, is_causal,
                                                /*scale=*/std::nullopt, enable_gqa);
  AttentionCall call;
  call.kernel = kept_attention_kernel(backend, q.device().type(), q.size(3), mask.defined());
  if (call.kernel == AttentionKernel::kNone) return plain();
  call.causal = is_causal;
  if (mask.defined()) call.mask = kernel_mask(mask, q, k, call.kernel);
  return savable_attention(call, q, k, v);
}

at::Tensor savable_result(SavableOp op, const std::function<at::Tensor()>& compute) {
  OpSaver* saver = t_saver;
  if (saver == nullptr || !saver->keeps(op, at::Tensor())) return compute();
  if (saver->replaying()) {
    std::vector<at::Tensor> kept = saver->take(op);
    TITAN_CHECK(kept.size() == 1, "activation checkpointing: a kept ", savable_op_name(op), " has ",
                kept.size(), " results, expected 1");
    return kept[0];
  }
  at::Tensor out = compute();
  saver->keep(op, {out});
  return out;
}

}  // namespace titan
