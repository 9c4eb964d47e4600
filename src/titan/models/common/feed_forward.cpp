// SwiGLU feed-forward (see feed_forward.h).
#include "titan/models/common/feed_forward.h"

#include "titan/common/phase.h"
#include "titan/kernels/fused_layers.h"
#include "titan/models/common/fused_ops.h"

namespace titan {

FeedForward::FeedForward(int64_t dim, int64_t hidden_dim, at::ScalarType compute_dtype)
    : compute_dtype(compute_dtype) {
  w1 = register_module("w1", std::make_shared<Linear>(dim, hidden_dim, compute_dtype));
  w2 = register_module("w2", std::make_shared<Linear>(hidden_dim, dim, compute_dtype));
  w3 = register_module("w3", std::make_shared<Linear>(dim, hidden_dim, compute_dtype));
}

at::Tensor FeedForward::forward(const at::Tensor& x) {
  return hooked(x, [this](const at::Tensor& in) {
    const at::Tensor xc = to_compute(in, compute_dtype);  // one cast for both w1 and w3
    if (fused && !packed_w13.intact() && w1->widens_plainly(xc) && w2->widens_plainly(xc) &&
        w3->widens_plainly(xc)) {
      // bf16 products widened to float32 (a CPU with slow bf16 GEMMs): the products stay in
      // float32 through the activation, whose bf16 roundings happen inside widened_swiglu (the
      // same numbers as ATen's bf16 ops), instead of a cast to bf16 and back around each op.
      const at::Tensor xw = xc.to(at::kFloat);
      const at::Tensor gate = w1->widened_product(xw), up = w3->widened_product(xw);
      at::Tensor hidden;
      {
        const TraceSpan span("swiglu");
        hidden = widened_swiglu(gate, up);
      }
      return w2->widened_product(hidden).to(compute_dtype);
    }
    at::Tensor hidden;  // (bs, seqlen, hidden_dim)
    {
      at::Tensor gate, up;
      if (packed_w13.intact()) {  // inference (prepare_for_inference): one product for both
        const std::vector<at::Tensor> outs = packed_w13.forward(xc);
        gate = outs[0], up = outs[1];
      } else {
        gate = w1->forward(xc), up = w3->forward(xc);
      }
      const TraceSpan span("swiglu");  // the profiler's and `titan bench --breakdown`'s name
      const bool use_fused =
          fused && kernels::cpu_fusable({gate, up}) &&
          kernels::fused_is_faster(kernels::FusedOp::kSwiGLU, gate.scalar_type());
      hidden = use_fused ? fused_swiglu(gate, up) : at::silu(gate) * up;
    }
    return w2->forward(hidden);
  });
}

}  // namespace titan
