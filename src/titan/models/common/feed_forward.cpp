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
    at::Tensor hidden;                                    // (bs, seqlen, hidden_dim)
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
