// The seams parallelisms plug into without the model knowing: the unit-runner chain (order,
// inputs, re-running a unit later), forward-hook chains, RoPE at explicit positions, and the
// inner-attention kernel.
#include "titan/models/llama3/model.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace titan {
namespace test_seams {

std::shared_ptr<llama3::Transformer> tiny_model() {
  llama3::Llama3Args args = llama3::args_for_flavor("tiny");
  args.max_seq_len = 64;
  auto model = std::make_shared<llama3::Transformer>(args);
  model->init_weights(/*seed=*/0);
  return model;
}

// Records which unit it saw, in which order, and keeps `next` to run the unit again later.
class RecordingRunner : public UnitRunner {
 public:
  RecordingRunner(std::string name, std::vector<std::string>* log)
      : name_(std::move(name)), log_(log) {}
  at::Tensor run(int64_t index, const at::Tensor& input, const UnitFn& next) override {
    log_->push_back(name_ + " enter " + std::to_string(index));
    at::Tensor out = next(input);
    log_->push_back(name_ + " leave " + std::to_string(index));
    last_next = next;
    last_input = input;
    return out;
  }
  UnitFn last_next;
  at::Tensor last_input;

 private:
  std::string name_;
  std::vector<std::string>* log_;
};

TEST(UnitRunnerChain, LastAddedRunsOutermostAndUnitsCanRunAgainLater) {
  auto model = tiny_model();
  at::NoGradGuard no_grad;
  const at::Tensor tokens = at::randint(model->args().vocab_size, {2, 8}, at::kLong);
  const at::Tensor plain = model->forward(tokens);

  std::vector<std::string> log;
  RecordingRunner inner("inner", &log), outer("outer", &log);
  model->add_unit_runner(&inner);
  model->add_unit_runner(&outer);
  const at::Tensor chained = model->forward(tokens);
  EXPECT_TRUE(at::equal(plain, chained));
  const int64_t units = static_cast<int64_t>(model->units().size());
  ASSERT_EQ(log.size(), static_cast<size_t>(4 * units));
  EXPECT_EQ(log[0], "outer enter 0");
  EXPECT_EQ(log[1], "inner enter 0");
  EXPECT_EQ(log[2], "inner leave 0");
  EXPECT_EQ(log[3], "outer leave 0");
  EXPECT_THROW(model->add_unit_runner(&inner), c10::Error);  // installed twice

  // The last unit's `next`, kept by the runner after forward returned, recomputes it (as
  // activation checkpointing does in backward): same input, same output.
  const at::Tensor again = outer.last_next(outer.last_input);
  EXPECT_TRUE(at::equal(again, chained));

  model->remove_unit_runner(&outer);
  model->remove_unit_runner(&inner);
  log.clear();
  EXPECT_TRUE(at::equal(model->forward(tokens), plain));
  EXPECT_TRUE(log.empty());
}

// Adds `tag` to its input before the body and multiplies the output by `scale` after.
class AffineHook : public ForwardHook {
 public:
  AffineHook(double add, double scale) : add_(add), scale_(scale) {}
  at::Tensor run(HookedModule&, const at::Tensor& x, const ForwardBody& body) override {
    return body(x + add_) * scale_;
  }

 private:
  double add_, scale_;
};

TEST(ForwardHooks, LastAddedRunsOutermost) {
  Linear linear(3, 3);
  {
    at::NoGradGuard no_grad;
    linear.weight.copy_(at::eye(3));
  }
  const at::Tensor x = at::ones({1, 3});
  auto first = std::make_shared<AffineHook>(1.0, 2.0);    // inner
  auto second = std::make_shared<AffineHook>(10.0, 3.0);  // outer
  linear.add_forward_hook(first);
  linear.add_forward_hook(second);
  // outer: (x + 10) -> inner: (+ 1) -> identity -> * 2 -> * 3
  EXPECT_TRUE(at::allclose(linear.forward(x), at::full({1, 3}, (1.0 + 10 + 1) * 2 * 3)));
  linear.remove_forward_hook(second.get());
  EXPECT_TRUE(at::allclose(linear.forward(x), at::full({1, 3}, (1.0 + 1) * 2)));
  linear.remove_forward_hook(first.get());
  EXPECT_TRUE(at::allclose(linear.forward(x), x));
}

TEST(RoPE, ExplicitPositionsSelectTheirRows) {
  RotaryEmbedding rope(/*head_dim=*/8, /*max_seq_len=*/32, /*theta=*/10000.0, nullptr);
  const at::Tensor x = at::randn({2, 32, 3, 8});
  const at::Tensor whole = rope.forward(x);
  // Positions [10, 18) of the sequence, alone: the same rotation as within the whole sequence.
  const at::Tensor part = rope.forward(x.narrow(1, 10, 8), at::arange(10, 18, at::kLong));
  EXPECT_TRUE(at::allclose(part, whole.narrow(1, 10, 8)));
  // Two chunks out of order (context parallelism's load-balanced layout).
  const at::Tensor positions =
      at::cat({at::arange(0, 4, at::kLong), at::arange(28, 32, at::kLong)});
  const at::Tensor chunks =
      rope.forward(at::cat({x.narrow(1, 0, 4), x.narrow(1, 28, 4)}, 1), positions);
  EXPECT_TRUE(at::allclose(chunks, at::cat({whole.narrow(1, 0, 4), whole.narrow(1, 28, 4)}, 1)));
  EXPECT_THROW(rope.forward(x.narrow(1, 0, 2), at::tensor({5, 32}, at::kLong)), c10::Error);
}

// Counts its calls and runs the default kernel.
class CountingAttention : public InnerAttention {
 public:
  at::Tensor forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     const at::Tensor& document_ids) override {
    ++calls;
    return causal_attention(q, k, v, document_ids);
  }
  int calls = 0;
};

TEST(Attention, InnerKernelIsASwappableSeam) {
  auto model = tiny_model();
  at::NoGradGuard no_grad;
  const at::Tensor tokens = at::randint(model->args().vocab_size, {1, 8}, at::kLong);
  const at::Tensor before = model->forward(tokens);
  auto counting = std::make_shared<CountingAttention>();
  for (const auto& layer : model->layers) layer->attention->inner_attention = counting;
  EXPECT_TRUE(at::equal(model->forward(tokens), before));
  EXPECT_EQ(counting->calls, static_cast<int>(model->layers.size()));
  // The cached (generation) path goes through the same forward but attends over its cache.
  KVCache cache(/*max_len=*/16);
  const at::Tensor cached = model->forward_cached(tokens, cache, 0);
  EXPECT_EQ(counting->calls, static_cast<int>(model->layers.size()));
  EXPECT_TRUE(at::allclose(cached, before, 1e-4, 1e-5));
}

// Block-causal attention keeps packed documents apart: with RoPE (relative positions) the
// second document's logits inside a packed sequence are those of the document alone.
TEST(Attention, BlockCausalDocumentsSeeOnlyThemselves) {
  auto model = tiny_model();
  at::NoGradGuard no_grad;
  constexpr int64_t kEnd = 3;  // the token that ends a document
  at::manual_seed(4);
  const at::Tensor first = at::randint(4, model->args().vocab_size, {2, 6}, at::kLong);
  const at::Tensor second = at::randint(4, model->args().vocab_size, {2, 9}, at::kLong);
  first.select(1, 5).fill_(kEnd);
  const at::Tensor packed = at::cat({first, second}, 1);
  const at::Tensor alone = model->forward(second);
  const at::Tensor first_alone = model->forward(first);
  ForwardInputs inputs;
  inputs.document_ids = document_ids(packed, kEnd);
  const at::Tensor masked = model->forward(packed, inputs);
  EXPECT_TRUE(at::allclose(masked.narrow(1, 6, 9), alone, 1e-4, 1e-5))
      << (masked.narrow(1, 6, 9) - alone).abs().max();
  EXPECT_TRUE(at::allclose(masked.narrow(1, 0, 6), first_alone, 1e-4, 1e-5));
  EXPECT_FALSE(at::allclose(model->forward(packed).narrow(1, 6, 9), alone, 1e-2, 1e-2));
}

}  // namespace test_seams
}  // namespace titan
