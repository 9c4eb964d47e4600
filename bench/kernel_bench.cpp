// Fused CPU kernels against the compositions the layers run without them (compile.enable off),
// whichever the layers pick with it on (kernels::fused_is_faster decides from these figures):
// RMSNorm, SwiGLU's product, RoPE and the head + loss (the fused linear + cross-entropy), forward
// + backward through autograd, at the activation shapes of the two benchmark models of
// bench/run_bench.sh, float32 and bfloat16. Prints the
// median milliseconds of each, the fused kernel's effective GB/s (bytes it must read and write)
// and the ratio. A benchmark, not a test: it never fails on speed.
//   build/kernel_bench [--threads N] [--iters N]
#include "titan/common/cpu.h"
#include "titan/models/common/fused_loss.h"
#include "titan/models/common/fused_ops.h"
#include "titan/models/common/linear.h"
#include "titan/models/common/norms.h"
#include "titan/models/common/rope.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <tuple>
#include <vector>

namespace {

using titan::RMSNorm;
using titan::RotaryEmbedding;

double median_ms(const std::function<void()>& fn, int iters) {
  for (int i = 0; i < 3; ++i) fn();
  std::vector<double> ms;
  for (int i = 0; i < iters; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

struct Shape {
  const char* model;
  int64_t bs, seqlen, dim, n_heads, head_dim, hidden, vocab;
};

void row(const char* op, const Shape& s, at::ScalarType dtype, double composed, double fused,
         double bytes) {
  std::printf("%-8s %-10s %-9s %10.3f %10.3f %8.2fx %9.1f\n", op, s.model,
              dtype == at::kFloat ? "float32" : "bfloat16", composed, fused, composed / fused,
              bytes / (fused * 1e-3) / 1e9);
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2, iters = 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--threads") == 0) threads = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--iters") == 0) iters = std::atoi(argv[i + 1]);
  }
  titan::configure_cpu_allocator();  // as titan runs: large blocks reused from the heap
  std::printf("threads: %s\n", titan::configure_threads(threads).c_str());
  const std::vector<Shape> shapes = {{"(a)", 8, 256, 256, 8, 32, 768, 8192},
                                     {"(b)", 4, 512, 512, 8, 64, 1536, 32000}};
  std::printf("%-8s %-10s %-9s %10s %10s %9s %9s\n", "op", "model", "dtype", "ATen ms", "fused ms",
              "ratio", "fused GB/s");
  for (const Shape& s : shapes) {
    for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
      const double esize = dtype == at::kFloat ? 4.0 : 2.0;
      at::manual_seed(0);
      // RMSNorm over (bs, seqlen, dim): forward reads x, writes y; backward reads g, x, writes gx.
      {
        RMSNorm norm(s.dim);
        const at::Tensor x = at::randn({s.bs, s.seqlen, s.dim}).to(dtype).requires_grad_();
        const at::Tensor g = at::randn({s.bs, s.seqlen, s.dim}).to(dtype);
        auto run = [&](bool fused) {
          return median_ms(
              [&] {
                (fused ? titan::fused_rms_norm(x, norm.weight, norm.eps) : norm.forward(x))
                    .backward(g);
                x.mutable_grad() = at::Tensor();
                norm.weight.mutable_grad() = at::Tensor();
              },
              iters);
        };
        const double a = run(false), b = run(true);
        row("rmsnorm", s, dtype, a, b, 5.0 * static_cast<double>(x.numel()) * esize);
      }
      // The residual add + RMSNorm after attention, (bs, seqlen, dim): forward reads x, delta,
      // writes h, y; backward reads both gradients and h, writes one gradient. Two baselines: the
      // ATen composition (x + delta, then the unfused norm) as "add+norm", and the add followed
      // by the fused RMSNorm (what compile.enable ran before this kernel) as "add,norm".
      {
        RMSNorm norm(s.dim);
        const auto shape = std::vector<int64_t>{s.bs, s.seqlen, s.dim};
        const at::Tensor x = at::randn(shape).to(dtype).requires_grad_();
        const at::Tensor d = at::randn(shape).to(dtype).requires_grad_();
        const at::Tensor gh = at::randn(shape).to(dtype), gy = at::randn(shape).to(dtype);
        auto run = [&](int variant) {  // 0: ATen, 1: add then fused norm, 2: fused add + norm
          return median_ms(
              [&] {
                at::Tensor h, y;
                if (variant == 2) {
                  std::tie(h, y) = titan::fused_add_rms_norm(x, d, norm.weight, norm.eps);
                } else {
                  h = x + d;
                  y = variant == 0 ? norm.forward(h)
                                   : titan::fused_rms_norm(h, norm.weight, norm.eps);
                }
                torch::autograd::backward({h, y}, {gh, gy});
                x.mutable_grad() = at::Tensor();
                d.mutable_grad() = at::Tensor();
                norm.weight.mutable_grad() = at::Tensor();
              },
              iters);
        };
        const double a = run(0), b = run(1), f = run(2);
        const double bytes = 7.0 * static_cast<double>(x.numel()) * esize;
        row("add+norm", s, dtype, a, f, bytes);
        row("add,norm", s, dtype, b, f, bytes);
      }
      // SwiGLU's product over (bs, seqlen, hidden): reads gate, up; writes h; backward reads g,
      // gate, up and writes both gradients.
      {
        const at::Tensor a = at::randn({s.bs, s.seqlen, s.hidden}).to(dtype).requires_grad_();
        const at::Tensor u = at::randn({s.bs, s.seqlen, s.hidden}).to(dtype).requires_grad_();
        const at::Tensor g = at::randn({s.bs, s.seqlen, s.hidden}).to(dtype);
        auto run = [&](bool fused) {
          return median_ms(
              [&] {
                (fused ? titan::fused_swiglu(a, u) : at::silu(a) * u).backward(g);
                a.mutable_grad() = at::Tensor();
                u.mutable_grad() = at::Tensor();
              },
              iters);
        };
        const double c = run(false), f = run(true);
        row("swiglu", s, dtype, c, f, 8.0 * static_cast<double>(a.numel()) * esize);
      }
      // RoPE over (bs, seqlen, n_heads, head_dim): reads x, writes out; backward reads g, writes.
      {
        RotaryEmbedding rope(s.head_dim, s.seqlen, 10000.0, nullptr);
        const at::Tensor x =
            at::randn({s.bs, s.seqlen, s.n_heads, s.head_dim}).to(dtype).requires_grad_();
        const at::Tensor g = at::randn({s.bs, s.seqlen, s.n_heads, s.head_dim}).to(dtype);
        auto run = [&](bool fused) {
          return median_ms(
              [&] {
                (fused ? titan::fused_rope(x, rope.cos, rope.sin) : rope.forward(x)).backward(g);
                x.mutable_grad() = at::Tensor();
              },
              iters);
        };
        const double c = run(false), f = run(true);
        row("rope", s, dtype, c, f, 4.0 * static_cast<double>(x.numel()) * esize);
      }
      // The head and the loss, (bs * seqlen, dim) @ (vocab, dim)^T then cross-entropy, forward +
      // backward: the unfused head as the model runs it (logits in the compute dtype, upcast,
      // log-softmax) against the fused linear + cross-entropy. GB/s: the fused op's logits, each
      // written once by the GEMM, read three times and written once.
      {
        const int64_t tokens = s.bs * s.seqlen;
        const at::Tensor h = at::randn({tokens, s.dim}).to(dtype).requires_grad_();
        const at::Tensor w = (at::randn({s.vocab, s.dim}) * 0.05).to(dtype).requires_grad_();
        const at::Tensor labels = at::randint(s.vocab, {tokens}, at::kLong);
        auto run = [&](bool fused) {
          return median_ms(
              [&] {
                (fused ? titan::fused_linear_cross_entropy(h, w, labels, dtype)
                       : at::cross_entropy_loss(titan::mixed_linear(h, w, dtype).to(at::kFloat),
                                                labels))
                    .backward();
                h.mutable_grad() = at::Tensor();
                w.mutable_grad() = at::Tensor();
              },
              std::max(3, iters / 4));
        };
        const double c = run(false), f = run(true);
        row("head+ce", s, dtype, c, f, 5.0 * static_cast<double>(tokens * s.vocab) * esize);
      }
    }
  }
  // A bf16 model whose matmuls run in float32 on the rounded operands (widens_reduced_matmul), at
  // the mixture of experts' sizes of qwen3 debugmodel_moe (seq 256 x 8 tokens, top 8 of 64
  // experts: about 17,000 expert rows of 768; the experts' (64, 768, 256) weights): the widened
  // SwiGLU against the casts and bf16 ops it replaces, and a weight rounded to bf16 in one pass
  // against its two casts, forward + backward. GB/s: the fused op's reads and writes.
  {
    at::manual_seed(0);
    const at::Tensor g1 = at::randn({17344, 768}).requires_grad_();
    const at::Tensor g3 = at::randn({17344, 768}).requires_grad_();
    const at::Tensor g = at::randn({17344, 768});
    auto run = [&](bool fused) {
      return median_ms(
          [&] {
            (fused ? titan::widened_swiglu(g1, g3)
                   : (at::silu(g1.to(at::kBFloat16)) * g3.to(at::kBFloat16)).to(at::kFloat))
                .backward(g);
            g1.mutable_grad() = at::Tensor();
            g3.mutable_grad() = at::Tensor();
          },
          iters);
    };
    const double c = run(false), f = run(true);
    const Shape moe{"moe", 1, 17344, 0, 0, 0, 768, 0};
    row("wswiglu", moe, at::kBFloat16, c, f, 32.0 * static_cast<double>(g1.numel()));
    const at::Tensor w = at::randn({64, 768, 256}).requires_grad_();
    const at::Tensor gw = at::randn({64, 768, 256});
    auto run_w = [&](bool fused) {
      return median_ms(
          [&] {
            (fused ? titan::widened_weight(w, at::kBFloat16) : w.to(at::kBFloat16).to(at::kFloat))
                .backward(gw);
            w.mutable_grad() = at::Tensor();
          },
          iters);
    };
    const double cw = run_w(false), fw = run_w(true);
    row("wweight", moe, at::kBFloat16, cw, fw, 16.0 * static_cast<double>(w.numel()));
  }
  return 0;
}
