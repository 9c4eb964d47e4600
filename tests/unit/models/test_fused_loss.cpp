// The fused linear + cross-entropy (models/common/fused_loss.h, kernels/cross_entropy.h) against
// the unfused head and loss in float64: the loss and the gradients of h and the weight, float32
// and bfloat16, odd sizes over several token blocks, ignored labels, non-contiguous h, a loss
// scale; the vocabulary split over two shards (two threads that all-reduce through memory) as
// tensor parallelism runs it; the row kernels alone; and the tiny Llama 3 with its head fused.
#include "titan/components/loss.h"
#include "titan/kernels/cross_entropy.h"
#include "titan/models/common/fused_loss.h"
#include "titan/models/common/linear.h"
#include "titan/models/llama3/model.h"

#include <gtest/gtest.h>

#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

namespace titan {
namespace test_fused_loss {

double rel_error(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor bd = b.to(at::kDouble);
  const double scale = std::max(1e-3, bd.abs().max().item<double>());
  return (a.to(at::kDouble) - bd).abs().max().item<double>() / scale;
}

// The unfused head and loss: logits in the compute dtype, cross-entropy in float64.
at::Tensor reference_loss(const at::Tensor& h, const at::Tensor& w, const at::Tensor& labels) {
  const at::Tensor logits = at::matmul(h, w.t());
  return at::cross_entropy_loss(logits.flatten(0, -2).to(at::kDouble), labels.flatten());
}

struct Case {
  at::ScalarType dtype;
  int64_t tokens, vocab, dim;
};

TEST(FusedLoss, BlocksAreDeeperForSmallerVocabularies) {
  EXPECT_EQ(fused_loss_block_tokens(2048), 1024);
  EXPECT_EQ(fused_loss_block_tokens(32000), 1024);
  EXPECT_EQ(fused_loss_block_tokens(65536), 512);
  EXPECT_EQ(fused_loss_block_tokens(128256), 261);
  EXPECT_EQ(fused_loss_block_tokens(202048), 256);
}

TEST(FusedLoss, MatchesTheUnfusedHeadAndLoss) {
  // In blocks of 256 tokens, 520 tokens span three, the last one of 8; with the default blocks
  // (fused_loss_block_tokens: 1024 at 20,000 rows) one.
  for (const int64_t block : {int64_t{256}, int64_t{0}}) {
    for (const Case c : {Case{at::kFloat, 520, 20000, 48}, Case{at::kFloat, 37, 1001, 19},
                         Case{at::kBFloat16, 520, 20000, 48}, Case{at::kBFloat16, 37, 1001, 19}}) {
      at::manual_seed(7);
      const at::Tensor h0 = at::randn({c.dim, c.tokens}).t();  // non-contiguous
      const at::Tensor w0 = at::randn({c.vocab, c.dim}) * 0.3;
      at::Tensor labels = at::randint(c.vocab, {c.tokens}, at::kLong);
      labels.index_put_({at::arange(0, c.tokens, 5)}, kernels::kIgnoreIndex);
      const at::Tensor h = h0.to(c.dtype).requires_grad_();
      const at::Tensor w = w0.to(c.dtype).requires_grad_();
      const at::Tensor loss = fused_linear_cross_entropy(h, w, labels, c.dtype, {}, block);
      ASSERT_EQ(loss.dim(), 0);
      ASSERT_EQ(loss.scalar_type(), at::kFloat);
      (loss * 3.0).backward();

      // The reference runs in float64 from the same rounded values.
      const at::Tensor hr = h.detach().to(at::kDouble).requires_grad_();
      const at::Tensor wr = w.detach().to(at::kDouble).requires_grad_();
      const at::Tensor expected = reference_loss(hr, wr, labels);
      (expected * 3.0).backward();
      const double tol = c.dtype == at::kFloat ? 1e-5 : 1e-2;
      const std::string what = std::string(c10::toString(c.dtype)) + " " +
                               std::to_string(c.tokens) + "x" + std::to_string(c.vocab) +
                               " block " + std::to_string(block);
      EXPECT_NEAR(loss.item<double>(), expected.item<double>(), tol * expected.item<double>())
          << what;
      ASSERT_EQ(h.grad().scalar_type(), c.dtype);
      ASSERT_EQ(w.grad().scalar_type(), c.dtype);
      EXPECT_LT(rel_error(h.grad(), hr.grad()), 2 * tol) << what << " grad h";
      EXPECT_LT(rel_error(w.grad(), wr.grad()), 2 * tol) << what << " grad w";
      // Ignored tokens get no gradient.
      EXPECT_EQ(h.grad().select(0, 0).abs().max().item<double>(), 0.0) << what;

      // Without autograd: the same loss, no graph.
      at::NoGradGuard no_grad;
      const at::Tensor eval = fused_linear_cross_entropy(h, w, labels, c.dtype, {}, block);
      EXPECT_FALSE(eval.requires_grad());
      EXPECT_NEAR(eval.item<double>(), loss.item<double>(), 1e-6 * loss.item<double>()) << what;
    }
  }
}

TEST(FusedLoss, MixedPrecisionHeadSendsFloat32Gradients) {
  // A bf16 compute dtype over float32 master weights, as the layers run under mixed precision.
  at::manual_seed(3);
  const at::Tensor h = at::randn({2, 9, 16}).requires_grad_();
  const at::Tensor w = (at::randn({300, 16}) * 0.2).requires_grad_();
  const at::Tensor labels = at::randint(300, {2, 9}, at::kLong);
  fused_linear_cross_entropy(h, w, labels, at::kBFloat16).backward();
  const at::Tensor hr = h.detach().clone().requires_grad_();
  const at::Tensor wr = w.detach().clone().requires_grad_();
  lm_cross_entropy_loss(mixed_linear(hr, wr, at::kBFloat16), labels).backward();
  EXPECT_EQ(w.grad().scalar_type(), at::kFloat);
  EXPECT_LT(rel_error(w.grad(), wr.grad()), 2e-2);
  EXPECT_LT(rel_error(h.grad(), hr.grad()), 2e-2);
}

// Two ranks in one process: all-reduces meet at a barrier and combine through shared memory.
class TwoRankReducer {
 public:
  void all_reduce(int rank, at::Tensor& t, bool max) {
    std::unique_lock<std::mutex> lock(mutex_);
    const int64_t round = round_;
    slots_[rank] = t;
    if (++arrived_ < 2) {
      cv_.wait(lock, [&] { return round_ != round; });
    } else {
      result_ = max ? at::maximum(slots_[0], slots_[1]) : slots_[0] + slots_[1];
      arrived_ = 0;
      ++round_;
      cv_.notify_all();
    }
    t.copy_(result_);
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  at::Tensor slots_[2], result_;
  int arrived_ = 0;
  int64_t round_ = 0;
};

TEST(FusedLoss, VocabularyShardsGiveTheWholeLoss) {
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    at::manual_seed(11);
    const int64_t tokens = 131, vocab = 20000, dim = 24;
    const at::Tensor h0 = at::randn({tokens, dim}).to(dtype);
    const at::Tensor w0 = (at::randn({vocab, dim}) * 0.3).to(dtype);
    at::Tensor labels = at::randint(vocab, {tokens}, at::kLong);
    labels[3] = kernels::kIgnoreIndex;

    const at::Tensor h = h0.clone().requires_grad_();
    const at::Tensor w = w0.clone().requires_grad_();
    const at::Tensor whole = fused_linear_cross_entropy(h, w, labels, dtype);
    whole.backward();

    TwoRankReducer reducer;
    std::vector<double> losses(2);
    std::vector<at::Tensor> grad_h(2), grad_w(2);
    std::vector<std::thread> ranks;
    for (int r = 0; r < 2; ++r) {
      ranks.emplace_back([&, r] {
        VocabShard shard;
        shard.start = r * vocab / 2;
        shard.all_reduce_sum = [&, r](at::Tensor& t) { reducer.all_reduce(r, t, false); };
        shard.all_reduce_max = [&, r](at::Tensor& t) { reducer.all_reduce(r, t, true); };
        const at::Tensor hs = h0.clone().requires_grad_();
        const at::Tensor ws = w0.narrow(0, shard.start, vocab / 2).clone().requires_grad_();
        // Blocks of 64 tokens: 131 span three, each of them through the sharded second pass.
        const at::Tensor loss = fused_linear_cross_entropy(hs, ws, labels, dtype, shard, 64);
        loss.backward();
        losses[r] = loss.item<double>();
        grad_h[r] = hs.grad();
        grad_w[r] = ws.grad();
      });
    }
    for (auto& t : ranks) t.join();
    const double tol = dtype == at::kFloat ? 1e-5 : 1e-2;
    for (int r = 0; r < 2; ++r) {
      EXPECT_NEAR(losses[r], whole.item<double>(), 1e-5 * whole.item<double>()) << dtype;
    }
    // Each shard's h gradient is partial; tensor parallelism's input gather sums them.
    EXPECT_LT(rel_error(grad_h[0].to(at::kFloat) + grad_h[1].to(at::kFloat), h.grad()), 2 * tol)
        << dtype;
    EXPECT_LT(rel_error(at::cat({grad_w[0], grad_w[1]}), w.grad()), 2 * tol) << dtype;
  }
}

TEST(FusedLoss, RowKernelsMatchATen) {
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    at::manual_seed(5);
    const int64_t rows = 37, n = 1001, start = 500;
    const at::Tensor logits = (at::randn({rows, n}) * 4).to(dtype);
    at::Tensor labels = at::randint(0, 2000, {rows}, at::kLong);  // half fall in [500, 1501)
    at::Tensor lse = at::empty({rows}), target = at::empty({rows});
    kernels::cross_entropy_stats(logits, labels, start, lse, target);
    const at::Tensor x = logits.to(at::kDouble);
    EXPECT_LT(rel_error(lse, at::logsumexp(x, 1)), 1e-6) << dtype;
    const at::Tensor local = labels - start;
    const at::Tensor here = local.ge(0).logical_and(local.lt(n));
    const at::Tensor picked = x.gather(1, local.clamp(0, n - 1).unsqueeze(1)).squeeze(1);
    EXPECT_LT(rel_error(target, at::where(here, picked, at::zeros_like(picked))), 1e-6) << dtype;

    const at::Tensor scale = at::rand({rows});
    at::Tensor grad = logits.clone();
    kernels::cross_entropy_grad_(grad, labels, start, lse, scale);
    at::Tensor expected =
        at::exp(x - lse.to(at::kDouble).unsqueeze(1)) * scale.to(at::kDouble).unsqueeze(1);
    expected.scatter_add_(1, local.clamp(0, n - 1).unsqueeze(1),
                          (-scale.to(at::kDouble) * here).unsqueeze(1));
    EXPECT_LT(rel_error(grad, expected), dtype == at::kFloat ? 1e-5 : 1e-2) << dtype;
  }
}

TEST(FusedLoss, RefusesWhatItCannotTake) {
  const at::Tensor w = at::randn({10, 4});
  EXPECT_THROW(
      fused_linear_cross_entropy(at::randn({3, 5}), w, at::zeros({3}, at::kLong), at::kFloat),
      c10::Error);
  EXPECT_THROW(
      fused_linear_cross_entropy(at::randn({3, 4}), w, at::zeros({4}, at::kLong), at::kFloat),
      c10::Error);
  // Its gradients are handed over once.
  const at::Tensor h = at::randn({3, 4}).requires_grad_();
  const at::Tensor loss = fused_linear_cross_entropy(h, w, at::zeros({3}, at::kLong), at::kFloat);
  loss.backward({}, /*retain_graph=*/true);
  EXPECT_THROW(loss.backward(), c10::Error);
  at::Tensor logits = at::randn({3, 4}, at::kDouble);
  at::Tensor lse = at::empty({3}), target = at::empty({3});
  EXPECT_THROW(kernels::cross_entropy_stats(logits, at::zeros({3}, at::kLong), 0, lse, target),
               c10::Error);
}

// The tiny model with its head and loss fused against logits + lm_cross_entropy_loss.
TEST(FusedLoss, TinyModelKeepsItsLossAndGradients) {
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    for (bool tied : {false, true}) {
      llama3::Llama3Args args = llama3::args_for_flavor("tiny");
      args.max_seq_len = 32;
      args.tie_embeddings = tied;
      auto plain = std::make_shared<llama3::Transformer>(args, dtype);
      auto fused = std::make_shared<llama3::Transformer>(args, dtype);
      plain->init_weights(3);
      fused->init_weights(3);
      ASSERT_TRUE(fused->supports_fused_loss());
      at::manual_seed(4);
      const at::Tensor tokens = at::randint(args.vocab_size, {2, 32}, at::kLong);
      const at::Tensor labels = at::randint(args.vocab_size, {2, 32}, at::kLong);
      const at::Tensor expected = lm_cross_entropy_loss(plain->forward(tokens), labels);
      expected.backward();
      ForwardInputs inputs;
      inputs.loss_labels = labels;
      const at::Tensor loss = fused->forward(tokens, inputs);
      ASSERT_EQ(loss.dim(), 0);
      loss.backward();
      const double tol = dtype == at::kFloat ? 1e-5 : 1e-2;
      const std::string what = std::string(c10::toString(dtype)) + (tied ? " tied" : "");
      EXPECT_NEAR(loss.item<double>(), expected.item<double>(), tol * expected.item<double>())
          << what;
      const auto a = plain->named_parameters(), b = fused->named_parameters();
      for (const auto& p : a) {
        const at::Tensor& other = b[p.key()];
        ASSERT_TRUE(other.grad().defined()) << p.key() << " " << what;
        EXPECT_LT(rel_error(other.grad(), p.value().grad()), dtype == at::kFloat ? 1e-4 : 5e-2)
            << p.key() << " " << what;
      }
      // Labels cleared: logits again.
      at::NoGradGuard no_grad;
      EXPECT_EQ(fused->forward(tokens).dim(), 3) << what;
    }
  }
}

}  // namespace test_fused_loss
}  // namespace titan
