// The savable-op seam (savable_ops.h) with a saver that keeps every op: recording gives the plain
// op's output, replaying hands back the kept tensor itself (nothing recomputed) and its backward
// gives the plain op's gradients, bit for bit; without a saver the ops are the plain ones. And
// which attention kernel is kept for each SDPA backend and device (TorchTitan's save list).
#include "titan/models/common/savable_ops.h"

#include <ATen/SDPBackend.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include <limits>
#include <vector>

namespace titan {
namespace test_savable_ops {

// Keeps every op it is asked about; replays them in order.
class KeepAll : public OpSaver {
 public:
  bool keeps(SavableOp op, const at::Tensor&) override {
    asked.push_back(op);
    return true;
  }
  bool replaying() const override { return replay; }
  void keep(SavableOp, std::vector<at::Tensor> results) override { kept.push_back(results); }
  std::vector<at::Tensor> take(SavableOp) override { return kept.at(taken++); }

  bool replay = false;
  std::vector<SavableOp> asked;
  std::vector<std::vector<at::Tensor>> kept;
  size_t taken = 0;
};

struct Grads {
  at::Tensor out;
  std::vector<at::Tensor> grads;
};

// fn(leaves) and the leaves' gradients for the output gradient `grad`.
Grads differentiate(const std::function<at::Tensor(const std::vector<at::Tensor>&)>& fn,
                    const std::vector<at::Tensor>& inputs, const at::Tensor& grad) {
  std::vector<at::Tensor> leaves;
  for (const auto& t : inputs) leaves.push_back(t.detach().clone().requires_grad_(true));
  Grads g{fn(leaves), {}};
  g.out.backward(grad);
  for (const auto& leaf : leaves) g.grads.push_back(leaf.grad());
  return g;
}

// Records `fn` under a keeping saver without autograd, then replays it with autograd: the output
// must be the kept tensor and the gradients those of `plain`.
void check_replay(const std::function<at::Tensor(const std::vector<at::Tensor>&)>& fn,
                  const std::vector<at::Tensor>& inputs, SavableOp op, size_t results) {
  at::manual_seed(3);
  const Grads plain = differentiate(fn, inputs, at::randn(fn(inputs).sizes()));
  at::manual_seed(3);
  const at::Tensor grad = at::randn(plain.out.sizes());
  KeepAll saver;
  {
    at::NoGradGuard no_grad;
    OpSaverScope scope(&saver);
    EXPECT_TRUE(at::equal(fn(inputs), plain.out));
  }
  ASSERT_EQ(saver.asked, std::vector<SavableOp>{op});
  ASSERT_EQ(saver.kept.size(), 1u);
  ASSERT_EQ(saver.kept[0].size(), results);
  saver.replay = true;
  const at::Tensor kept = saver.kept[0][0];
  OpSaverScope scope(&saver);
  const Grads replayed = differentiate(fn, inputs, grad);
  EXPECT_EQ(saver.taken, 1u);
  EXPECT_EQ(replayed.out.data_ptr(), kept.data_ptr());  // the kept output, not a recomputed one
  ASSERT_EQ(replayed.grads.size(), plain.grads.size());
  for (size_t i = 0; i < plain.grads.size(); ++i) {
    EXPECT_TRUE(at::equal(replayed.grads[i], plain.grads[i]))
        << "input " << i << ": max diff "
        << (replayed.grads[i] - plain.grads[i]).abs().max().item<double>();
  }
}

TEST(SavableOps, LinearReplaysWithItsOwnBackward) {
  at::manual_seed(0);
  const std::vector<at::Tensor> inputs{at::randn({2, 5, 8}), at::randn({6, 8})};
  check_replay([](const auto& t) { return savable_linear(t[0], t[1]); }, inputs, SavableOp::kMatmul,
               1);
  // bf16, as under mixed precision.
  std::vector<at::Tensor> bf16;
  for (const auto& t : inputs) bf16.push_back(t.to(at::kBFloat16));
  check_replay([](const auto& t) { return savable_linear(t[0], t[1]); }, bf16, SavableOp::kMatmul,
               1);
}

TEST(SavableOps, GqaAttentionReplaysFromOutputAndLogSumExp) {
  at::manual_seed(1);
  // q (bs, heads, seq, hd), k and v (bs, kv_heads, seq, hd), as the model lays them out.
  const std::vector<at::Tensor> inputs{at::randn({2, 5, 4, 6}).transpose(1, 2),
                                       at::randn({2, 5, 2, 6}).transpose(1, 2),
                                       at::randn({2, 5, 2, 6}).transpose(1, 2)};
  check_replay(
      [](const auto& t) { return savable_causal_sdpa(t[0], t[1], t[2], /*enable_gqa=*/true); },
      inputs, SavableOp::kAttention, 2);
}

TEST(SavableOps, MaskedAttentionReplaysWithItsMask) {
  at::manual_seed(2);
  const std::vector<at::Tensor> inputs{at::randn({2, 6, 4, 6}).transpose(1, 2),
                                       at::randn({2, 6, 2, 6}).transpose(1, 2),
                                       at::randn({2, 6, 2, 6}).transpose(1, 2)};
  // Block-causal: two documents per row, split at different places.
  const at::Tensor docs = at::tensor({0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1}, at::kLong).view({2, 6});
  const at::Tensor mask = docs.unsqueeze(2)
                              .eq(docs.unsqueeze(1))
                              .logical_and_(at::ones({6, 6}, at::kBool).tril())
                              .unsqueeze(1);
  check_replay(
      [&](const auto& t) {
        return savable_causal_sdpa(t[0], t[1], t[2], /*enable_gqa=*/true, mask);
      },
      inputs, SavableOp::kAttention, 2);
}

// TorchTitan's op-SAC save list keeps _scaled_dot_product_flash_attention,
// _scaled_dot_product_efficient_attention and _scaled_dot_product_cudnn_attention (and titan the
// CPU flash kernel): the kernel kept for each backend libtorch may choose, on each device.
TEST(SavableOps, KeptAttentionKernelsFollowTheSaveList) {
  const auto kept = [](at::SDPBackend backend, at::DeviceType device, int64_t head_dim = 64,
                       bool masked = false) {
    return kept_attention_kernel(static_cast<int64_t>(backend), device, head_dim, masked);
  };
  using K = AttentionKernel;
  using B = at::SDPBackend;
  EXPECT_EQ(kept(B::flash_attention, at::kCPU), K::kCpuFlash);
  EXPECT_EQ(kept(B::flash_attention, at::kCPU, 6, /*masked=*/true), K::kCpuFlash);
  EXPECT_EQ(kept(B::math, at::kCPU), K::kNone);
  EXPECT_EQ(kept(B::flash_attention, at::kCUDA), K::kCudaFlash);
  EXPECT_EQ(kept(B::flash_attention, at::kCUDA, /*head_dim=*/12), K::kNone);  // SDPA pads it
  EXPECT_EQ(kept(B::efficient_attention, at::kCUDA), K::kEfficient);
  EXPECT_EQ(kept(B::efficient_attention, at::kCUDA, 12, /*masked=*/true), K::kEfficient);
  EXPECT_EQ(kept(B::cudnn_attention, at::kCUDA), K::kCudnn);
  EXPECT_EQ(kept(B::cudnn_attention, at::kCUDA, 64, /*masked=*/true), K::kNone);
  EXPECT_EQ(kept(B::math, at::kCUDA), K::kNone);
  EXPECT_EQ(kept(B::overrideable, at::kCUDA), K::kNone);
  EXPECT_EQ(kept(B::flash_attention, at::kMeta), K::kNone);
  // Each kept kernel's results: output, log-sum-exp and what its backward reads besides.
  for (K k : {K::kCpuFlash, K::kCudaFlash, K::kEfficient, K::kCudnn, K::kVarlenFlash}) {
    EXPECT_GE(attention_results_size(k), 2u) << attention_kernel_name(k);
  }
  EXPECT_EQ(attention_results_size(K::kCpuFlash), 2u);
}

// A kernel call whose results the saver keeps and replays, without the SDPA front end: the CPU
// flash kernel under an additive mask, its backward from the kept results.
TEST(SavableOps, KernelAttentionReplaysWithTheKernelsBackward) {
  at::manual_seed(4);
  const std::vector<at::Tensor> inputs{at::randn({2, 4, 6, 8}), at::randn({2, 2, 6, 8}),
                                       at::randn({2, 2, 6, 8})};
  AttentionCall call;
  call.kernel = AttentionKernel::kCpuFlash;
  call.causal = false;
  call.mask = at::zeros({1, 1, 6, 6})
                  .masked_fill_(at::ones({6, 6}, at::kBool).triu(2),
                                -std::numeric_limits<double>::infinity());
  check_replay([&](const auto& t) { return savable_attention(call, t[0], t[1], t[2]); }, inputs,
               SavableOp::kAttention, 2);
  // The kernel's output is SDPA's under the same mask.
  const at::Tensor sdpa = at::scaled_dot_product_attention(
      inputs[0], inputs[1], inputs[2], *call.mask, 0.0, false, std::nullopt, /*enable_gqa=*/true);
  EXPECT_TRUE(
      at::allclose(savable_attention(call, inputs[0], inputs[1], inputs[2]), sdpa, 1e-5, 1e-6));
}

TEST(SavableOps, ResultIsTakenWithoutComputing) {
  KeepAll saver;
  int computed = 0;
  const at::Tensor value = at::arange(4.0);
  auto compute = [&] {
    ++computed;
    return value * 2;
  };
  EXPECT_TRUE(at::equal(savable_result(SavableOp::kReduceScatter, compute), value * 2));
  EXPECT_EQ(computed, 1);  // no saver: computed
  {
    OpSaverScope scope(&saver);
    savable_result(SavableOp::kReduceScatter, compute);
    EXPECT_EQ(current_op_saver(), &saver);
  }
  EXPECT_EQ(current_op_saver(), nullptr);
  EXPECT_EQ(computed, 2);
  saver.replay = true;
  OpSaverScope scope(&saver);
  EXPECT_TRUE(at::equal(savable_result(SavableOp::kReduceScatter, compute), value * 2));
  EXPECT_EQ(computed, 2);  // taken, not computed
}

}  // namespace test_savable_ops
}  // namespace titan
