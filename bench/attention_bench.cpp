// Causal GQA attention on this CPU: libtorch's fused scaled_dot_product_attention as the model
// uses it (enable_gqa: K and V read in place), the same kernel on K and V expanded to every query
// head, and our own materialised attention (the KV-cache path of attention.cpp run over a whole
// sequence: scores in query chunks, softmax in fp32, probabilities kept for backward). Prints,
// per dtype and sequence length, forward+backward milliseconds, the ratio to the fused kernel,
// and the largest difference of outputs and input gradients from a float64 reference. "training"
// is the same algorithm as the model trains with it (materialised_causal_attention, chosen by
// compile.enable where materialised_attention_is_faster): an autograd function that keeps the
// probabilities in the compute dtype and differentiates with batched matmuls.
// A benchmark: it prints, it never fails on speed.
//
//   attention_bench [--tokens 4096] [--heads 8] [--kv-heads 4] [--head-dim 64] [--iters 5]
//                   [--threads 2]
#include "titan/models/common/attention.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

namespace {

struct Inputs {
  at::Tensor q, k, v, grad;  // q (bs, seq, heads, hd), k/v (bs, seq, kv, hd), grad like q
};

using AttentionFn =
    std::function<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&)>;

// The model's kernel: titan::causal_attention (SDPA with enable_gqa).
at::Tensor fused_gqa(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  return titan::causal_attention(q, k, v);
}

// SDPA on K and V repeated to every query head: (bs, seq, kv, hd) -> (bs, seq, heads, hd).
at::Tensor fused_expanded(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  const int64_t rep = q.size(2) / k.size(2);
  auto expand = [&](const at::Tensor& t) {
    return t.unsqueeze(3)
        .expand({t.size(0), t.size(1), t.size(2), rep, t.size(3)})
        .reshape(q.sizes());
  };
  return at::scaled_dot_product_attention(q.transpose(1, 2), expand(k).transpose(1, 2),
                                          expand(v).transpose(1, 2), /*attn_mask=*/{},
                                          /*dropout_p=*/0.0, /*is_causal=*/true)
      .transpose(1, 2)
      .contiguous();
}

// Materialised scores: cached_attention over a whole sequence (start_pos 0), K and V in the
// cache layout (bs, kv, seq, hd). Differentiable: plain ATen ops.
at::Tensor materialised(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  return titan::cached_attention(q, k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous(),
                                 /*start_pos=*/0);
}

// titan's training attention (materialised_causal_attention).
at::Tensor training(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  return titan::materialised_causal_attention(q, k, v);
}

struct Outcome {
  double ms = 0;
  double max_diff = 0;  // outputs and gradients vs the float64 reference, largest
};

std::vector<at::Tensor> run(const AttentionFn& fn, const Inputs& in, at::ScalarType dtype) {
  // Fresh leaves every run (copy: `to` the same dtype would hand back the shared input itself).
  auto leaf = [&](const at::Tensor& t) {
    return t.to(dtype, /*non_blocking=*/false, /*copy=*/true).requires_grad_();
  };
  at::Tensor q = leaf(in.q);
  at::Tensor k = leaf(in.k);
  at::Tensor v = leaf(in.v);
  at::Tensor out = fn(q, k, v);
  out.backward(in.grad.to(dtype));
  return {out.detach(), q.grad(), k.grad(), v.grad()};
}

Outcome measure(const AttentionFn& fn, const Inputs& in, at::ScalarType dtype, int iters,
                const std::vector<at::Tensor>& reference) {
  Outcome o;
  std::vector<at::Tensor> got = run(fn, in, dtype);  // warm-up, and the numbers
  for (size_t i = 0; i < got.size(); ++i) {
    const double scale = reference[i].abs().max().item<double>();
    o.max_diff = std::max(
        o.max_diff, (got[i].to(at::kDouble) - reference[i]).abs().max().item<double>() / scale);
  }
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) run(fn, in, dtype);
  o.ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count() /
      iters;
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t tokens = 4096, heads = 8, kv_heads = 4, head_dim = 64;
  int iters = 5, threads = 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const int64_t value = std::atoll(argv[i + 1]);
    if (flag == "--tokens") tokens = value;
    else if (flag == "--heads") heads = value;
    else if (flag == "--kv-heads") kv_heads = value;
    else if (flag == "--head-dim") head_dim = value;
    else if (flag == "--iters") iters = static_cast<int>(value);
    else if (flag == "--threads") threads = static_cast<int>(value);
    else {
      std::fprintf(stderr,
                   "usage: attention_bench [--tokens N] [--heads H] [--kv-heads K] "
                   "[--head-dim D] [--iters I] [--threads T]\n");
      return 2;
    }
  }
  at::set_num_threads(threads);
  at::manual_seed(0);
  std::printf(
      "attention_bench: causal, %lld heads, %lld kv heads, head_dim %lld, %lld tokens "
      "per step (batch x seq), %d threads, forward + backward ms\n",
      static_cast<long long>(heads), static_cast<long long>(kv_heads),
      static_cast<long long>(head_dim), static_cast<long long>(tokens), threads);
  std::printf("%-9s %6s %6s | %10s | %10s %6s | %10s %6s | %10s %6s | %9s %9s %9s %9s\n", "dtype",
              "seq", "batch", "fused gqa", "expanded", "ratio", "material.", "ratio", "training",
              "ratio", "err gqa", "err exp", "err mat", "err train");
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    for (int64_t seq : {256, 512, 1024, 2048}) {
      const int64_t bs = std::max<int64_t>(1, tokens / seq);
      Inputs in{at::randn({bs, seq, heads, head_dim}, at::kDouble),
                at::randn({bs, seq, kv_heads, head_dim}, at::kDouble),
                at::randn({bs, seq, kv_heads, head_dim}, at::kDouble),
                at::randn({bs, seq, heads, head_dim}, at::kDouble)};
      const std::vector<at::Tensor> reference = run(materialised, in, at::kDouble);
      const Outcome gqa = measure(fused_gqa, in, dtype, iters, reference);
      const Outcome expanded = measure(fused_expanded, in, dtype, iters, reference);
      const Outcome mat = measure(materialised, in, dtype, iters, reference);
      const Outcome train = measure(training, in, dtype, iters, reference);
      std::printf(
          "%-9s %6lld %6lld | %10.1f | %10.1f %6.2f | %10.1f %6.2f | %10.1f %6.2f | %9.1e %9.1e "
          "%9.1e %9.1e\n",
          dtype == at::kFloat ? "float32" : "bfloat16", static_cast<long long>(seq),
          static_cast<long long>(bs), gqa.ms, expanded.ms, expanded.ms / gqa.ms, mat.ms,
          mat.ms / gqa.ms, train.ms, train.ms / gqa.ms, gqa.max_diff, expanded.max_diff,
          mat.max_diff, train.max_diff);
      std::fflush(stdout);
    }
  }
  std::printf(
      "ratio: time / fused gqa (above 1: slower than the kernel the model uses); err: "
      "largest |difference| from float64, relative to the largest reference value\n");
  return 0;
}
