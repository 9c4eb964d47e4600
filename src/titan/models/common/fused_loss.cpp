// Fused linear + cross-entropy (see fused_loss.h): the blocked loop over tokens, the row kernels
// on the CPU (kernels/cross_entropy.h) or the same math in ATen ops on other devices, and the
// autograd op that hands back the gradients computed during the forward.
#include "titan/models/common/fused_loss.h"

#include "titan/common/check.h"
#include "titan/common/cpu.h"
#include "titan/common/phase.h"
#include "titan/kernels/cross_entropy.h"
#include "titan/models/common/linear.h"

#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>

namespace titan {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The label of each row as an index into the shard's columns (clamped), and whether it is there.
std::pair<at::Tensor, at::Tensor> local_targets(const at::Tensor& labels, int64_t start,
                                                int64_t n) {
  const at::Tensor local = labels - start;
  const at::Tensor here = local.ge(0).logical_and_(local.lt(n));
  return {local.clamp(0, std::max<int64_t>(n - 1, 0)).unsqueeze(1), here};
}

void block_stats(const at::Tensor& logits, const at::Tensor& labels, int64_t start, at::Tensor lse,
                 at::Tensor target) {
  if (logits.device().is_cpu()) {
    kernels::cross_entropy_stats(logits, labels, start, lse, target);
    return;
  }
  const at::Tensor x = logits.to(at::kFloat);
  const auto [index, here] = local_targets(labels, start, x.size(1));
  lse.copy_(at::logsumexp(x, 1));
  target.copy_(at::where(here, x.gather(1, index).squeeze(1), at::zeros_like(lse)));
}

void block_grad(at::Tensor& logits, const at::Tensor& labels, int64_t start, const at::Tensor& lse,
                const at::Tensor& scale) {
  if (logits.device().is_cpu()) {
    kernels::cross_entropy_grad_(logits, labels, start, lse, scale);
    return;
  }
  at::Tensor p = at::exp(logits.to(at::kFloat) - lse.unsqueeze(1)).mul_(scale.unsqueeze(1));
  const auto [index, here] = local_targets(labels, start, p.size(1));
  p.scatter_add_(1, index, scale.mul(here).neg_().unsqueeze(1));
  logits.copy_(p);
}

struct Outcome {
  at::Tensor loss;    // 0-d float32
  at::Tensor grad_h;  // (tokens, dim) in h's dtype, when asked for
  at::Tensor grad_w;  // (rows, dim) float32, when asked for
};

// h (tokens, dim) and w (rows, dim) contiguous in one dtype, labels (tokens) int64 on h's device.
// grad_h comes back in h's dtype.
Outcome compute(const at::Tensor& h_in, const at::Tensor& w_in, const at::Tensor& labels,
                const VocabShard& shard, int64_t block, bool grads) {
  // Where ATen's bf16 GEMMs run in a generic loop (cpu_has_fast_bf16_matmul), a bf16 head runs
  // its GEMMs in float32 (about 50x faster there), its gradients rounded once at the end.
  const bool widen = widens_reduced_matmul(h_in.scalar_type(), h_in.device());
  const at::Tensor h = widen ? h_in.to(at::kFloat) : h_in;
  const at::Tensor w = widen ? w_in.to(at::kFloat) : w_in;
  const int64_t tokens = h.size(0), rows = w.size(0), dim = h.size(1);
  const auto f32 = h.options().dtype(at::kFloat);
  const at::Tensor valid = labels.ne(kernels::kIgnoreIndex);
  const at::Tensor count = valid.sum().to(at::kFloat);
  // d loss / d (lse - target) per token: 1 / count where predicted, 0 where ignored.
  const at::Tensor scale = valid.to(at::kFloat).div_(count.clamp_min(1.0f));
  at::Tensor lse = at::empty({tokens}, f32), target = at::empty({tokens}, f32);
  Outcome out;
  if (grads) {
    out.grad_h = at::empty_like(h);
    out.grad_w = at::zeros({rows, dim}, f32);
  }
  // Turns a block's logits gradient (in place of its logits) into its share of both gradients.
  const auto accumulate = [&](const at::Tensor& g, int64_t t0, int64_t n) {
    const at::Tensor hb = h.narrow(0, t0, n);
    at::Tensor gh = out.grad_h.narrow(0, t0, n);
    at::mm_out(gh, g, w);
    if (g.scalar_type() == at::kFloat) {
      out.grad_w.addmm_(g.t(), hb);
    } else {
      out.grad_w.add_(at::mm(g.t(), hb));  // bf16 GEMM, summed over blocks in float32
    }
  };
  const bool sharded = static_cast<bool>(shard.all_reduce_sum);
  for (int64_t t0 = 0; t0 < tokens; t0 += block) {
    const int64_t n = std::min(block, tokens - t0);
    at::Tensor logits = at::mm(h.narrow(0, t0, n), w.t());
    const at::Tensor y = labels.narrow(0, t0, n);
    if (grads && !sharded && logits.device().is_cpu()) {
      at::Tensor l = lse.narrow(0, t0, n), t = target.narrow(0, t0, n);
      kernels::cross_entropy_stats_grad_(logits, y, scale.narrow(0, t0, n), l, t);
      accumulate(logits, t0, n);
      continue;
    }
    block_stats(logits, y, shard.start, lse.narrow(0, t0, n), target.narrow(0, t0, n));
    if (grads && !sharded) {
      block_grad(logits, y, shard.start, lse.narrow(0, t0, n), scale.narrow(0, t0, n));
      accumulate(logits, t0, n);
    }
  }
  if (sharded) {
    // log(sum over shards of exp(lse_shard)), taken about the largest.
    at::Tensor top = lse.clone();
    shard.all_reduce_max(top);
    at::Tensor sum = (lse - top).exp_();
    shard.all_reduce_sum(sum);
    lse = top.add_(sum.log_());
    shard.all_reduce_sum(target);  // the one shard holding a token's label contributes its logit
    if (grads) {
      for (int64_t t0 = 0; t0 < tokens; t0 += block) {
        const int64_t n = std::min(block, tokens - t0);
        at::Tensor logits = at::mm(h.narrow(0, t0, n), w.t());
        block_grad(logits, labels.narrow(0, t0, n), shard.start, lse.narrow(0, t0, n),
                   scale.narrow(0, t0, n));
        accumulate(logits, t0, n);
      }
    }
  }
  out.loss = lse.sub(target).mul_(valid).sum().div_(count.clamp_min(1.0f));  // 0 if none
  if (grads) out.grad_h = out.grad_h.to(h_in.scalar_type());
  return out;
}

struct FusedLinearCrossEntropy : public torch::autograd::Function<FusedLinearCrossEntropy> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& h, const at::Tensor& w,
                            const at::Tensor& labels, const VocabShard* shard, int64_t block) {
    Outcome out = compute(h, w, labels, *shard, block, /*grads=*/true);
    ctx->saved_data["grad_h"] = out.grad_h;
    ctx->saved_data["grad_w"] = out.grad_w;
    ctx->saved_data["w_dtype"] = static_cast<int64_t>(w.scalar_type());
    return out.loss;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    TITAN_CHECK(ctx->saved_data.count("grad_h") != 0,
                "fused linear + cross-entropy: backward ran twice over one forward (its "
                "gradients are computed in the forward and handed over once)");
    at::Tensor gh = ctx->saved_data["grad_h"].toTensor();
    at::Tensor gw = ctx->saved_data["grad_w"].toTensor();
    const auto w_dtype = static_cast<at::ScalarType>(ctx->saved_data["w_dtype"].toInt());
    ctx->saved_data.erase("grad_h");
    ctx->saved_data.erase("grad_w");
    gw = gw.to(w_dtype);  // the dtype the head's GEMM ran in, as autograd's would be
    const at::Tensor& g = grads[0];
    gh.mul_(g);
    gw.mul_(g);
    return {gh, gw, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

int64_t fused_loss_block_tokens(int64_t vocab) {
  constexpr int64_t kBlockLogits = int64_t{1} << 25;
  return std::clamp<int64_t>(kBlockLogits / std::max<int64_t>(vocab, 1), 256, 1024);
}

at::Tensor fused_linear_cross_entropy(const at::Tensor& h, const at::Tensor& weight,
                                      const at::Tensor& labels, at::ScalarType compute_dtype,
                                      const VocabShard& shard, int64_t block_tokens) {
  const TraceSpan span("loss");
  TITAN_CHECK(block_tokens >= 0, "fused linear + cross-entropy: block_tokens ", block_tokens,
              " < 0");
  TITAN_CHECK(weight.dim() == 2 && h.dim() >= 1 && h.size(-1) == weight.size(1),
              "fused linear + cross-entropy: h ", h.sizes(), " does not match weight ",
              weight.sizes(), " (rows, dim)");
  const int64_t dim = weight.size(1);
  TITAN_CHECK(labels.numel() * dim == h.numel(), "fused linear + cross-entropy: labels ",
              labels.sizes(), " do not match h ", h.sizes());
  const at::Tensor hc = to_compute(h, compute_dtype).reshape({-1, dim}).contiguous();
  const at::Tensor wc = to_compute(weight, compute_dtype).contiguous();
  TITAN_CHECK(hc.scalar_type() == wc.scalar_type(), "fused linear + cross-entropy: h in ",
              hc.scalar_type(), " and weight in ", wc.scalar_type(), " under compute dtype ",
              compute_dtype);
  const at::Tensor y = labels.reshape({-1}).to(hc.device(), at::kLong).contiguous();
  const int64_t block = block_tokens > 0 ? block_tokens : fused_loss_block_tokens(wc.size(0));
  if (at::GradMode::is_enabled() && (hc.requires_grad() || wc.requires_grad())) {
    return FusedLinearCrossEntropy::apply(hc, wc, y, &shard, block);
  }
  return compute(hc, wc, y, shard, block, /*grads=*/false).loss;
}

}  // namespace titan
