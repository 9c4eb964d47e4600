// Savable ops (see savable_ops.h): the plain op, or its kept results wired into autograd through
// the op's own backward. The backward formulas follow the ones autograd uses for the plain ops
// (at::linear folds (..., in) to rows and runs mm; SDPA runs the CPU flash kernel), so a replayed
// op gives the same gradients as the op computed afresh.
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

// Kept causal attention: q (bs, n_heads, seq, hd), k and v (bs, n_kv_heads, seq, hd), the output
// (bs, n_heads, seq, hd) and the kernel's float32 log-sum-exp (bs, n_heads, seq); causal, or
// under the boolean `mask` when it is defined.
struct ReplayedAttention : public torch::autograd::Function<ReplayedAttention> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, const at::Tensor& out, const at::Tensor& logsumexp,
                            const at::Tensor* mask_or_null) {
    // The mask travels outside the tensor arguments: autograd needs a device for each of those,
    // and causal attention has none.
    ctx->save_for_backward({q, k, v, out, logsumexp});
    if (mask_or_null != nullptr) ctx->saved_data["mask"] = *mask_or_null;
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto s = ctx->get_saved_variables();
    const auto found = ctx->saved_data.find("mask");
    const std::optional<at::Tensor> mask = found != ctx->saved_data.end()
                                               ? std::optional<at::Tensor>(found->second.toTensor())
                                               : std::nullopt;
    auto [grad_q, grad_k, grad_v] = at::_scaled_dot_product_flash_attention_for_cpu_backward(
        grads[0], s[0], s[1], s[2], s[3], s[4], /*dropout_p=*/0.0,
        /*is_causal=*/!mask.has_value(), mask);
    return {grad_q, grad_k, grad_v, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// Whether libtorch runs this attention with the CPU flash kernel, the one whose results we can
// keep (output and log-sum-exp) and differentiate later.
bool runs_cpu_flash(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                    const std::optional<at::Tensor>& mask, bool enable_gqa) {
  if (!q.device().is_cpu()) return false;
  const int64_t backend =
      at::_fused_sdp_choice(q, k, v, mask, /*dropout_p=*/0.0, /*is_causal=*/!mask.has_value(),
                            /*scale=*/std::nullopt, enable_gqa);
  return backend == static_cast<int64_t>(at::SDPBackend::flash_attention);
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

at::Tensor savable_causal_sdpa(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               bool enable_gqa, const at::Tensor& mask) {
  const std::optional<at::Tensor> attn_mask =
      mask.defined() ? std::optional<at::Tensor>(mask) : std::nullopt;
  const bool is_causal = !mask.defined();
  OpSaver* saver = t_saver;
  if (saver == nullptr || !runs_cpu_flash(q, k, v, attn_mask, enable_gqa) ||
      !saver->keeps(SavableOp::kAttention, at::Tensor())) {
    return at::scaled_dot_product_attention(q, k, v, attn_mask, /*dropout_p=*/0.0, is_causal,
                                            /*scale=*/std::nullopt, enable_gqa);
  }
  // The flash kernel itself takes an additive mask in the query's dtype (SDPA converts a boolean
  // one the same way: 0 where kept, -inf elsewhere).
  std::optional<at::Tensor> additive;
  if (mask.defined()) {
    additive = mask.scalar_type() == at::kBool
                   ? at::zeros(mask.sizes(), q.options())
                         .masked_fill_(mask.logical_not(), -std::numeric_limits<double>::infinity())
                   : mask.to(q.scalar_type());
  }
  if (saver->replaying()) {
    const auto kept = take_checked(*saver, SavableOp::kAttention, q.sizes(), 2);
    return ReplayedAttention::apply(q, k, v, kept[0], kept[1], additive ? &*additive : nullptr);
  }
  auto [out, logsumexp] = at::_scaled_dot_product_flash_attention_for_cpu(
      q, k, v, /*dropout_p=*/0.0, is_causal, additive);
  saver->keep(SavableOp::kAttention, {out, logsumexp});
  return out;
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
