// The Llama 3 Transformer as a whole: parameter names, TorchTitan's init, causality, gradients
// against central finite differences in float64, and bf16 compute against float32.
#include "titan/models/llama3/model.h"
#include "titan/models/registry.h"

#include <gtest/gtest.h>

#include <set>

namespace titan {
namespace test_llama3_model {

std::shared_ptr<llama3::Transformer> tiny_model(at::ScalarType compute_dtype = at::kFloat,
                                                bool tied = false, uint64_t seed = 0) {
  llama3::Llama3Args args = llama3::args_for_flavor("tiny");
  args.max_seq_len = 320;
  args.tie_embeddings = tied;
  auto model = std::make_shared<llama3::Transformer>(args, compute_dtype);
  model->init_weights(seed);
  return model;
}

at::Tensor random_tokens(int64_t bs, int64_t seqlen, int64_t vocab, uint64_t seed) {
  at::manual_seed(seed);
  return at::randint(vocab, {bs, seqlen}, at::kLong);
}

// Mean next-token cross-entropy, as the trainer computes it.
at::Tensor loss_of(const at::Tensor& logits, const at::Tensor& targets) {
  return at::nll_loss(at::log_softmax(logits.reshape({-1, logits.size(-1)}), -1),
                      targets.reshape(-1));
}

TEST(Llama3Model, ParameterNamesMatchTorchTitan) {
  const auto model = tiny_model();
  std::set<std::string> names;
  for (const auto& item : model->named_parameters()) {
    names.insert(item.key());
  }
  std::set<std::string> expected = {"tok_embeddings.weight", "norm.weight", "output.weight"};
  for (const std::string layer : {"layers.0.", "layers.1."}) {
    for (const std::string name :
         {"attention.wq.weight", "attention.wk.weight", "attention.wv.weight",
          "attention.wo.weight", "feed_forward.w1.weight", "feed_forward.w2.weight",
          "feed_forward.w3.weight", "attention_norm.weight", "ffn_norm.weight"}) {
      expected.insert(layer + name);
    }
  }
  EXPECT_EQ(names, expected);
  EXPECT_EQ(model->named_parameters()["layers.0.attention.wk.weight"].sizes(),
            at::IntArrayRef({2 * 16, 64}));
  // Tied: the shared tensor is listed once, under the embedding's name.
  const auto tied = tiny_model(at::kFloat, /*tied=*/true);
  EXPECT_EQ(tied->named_parameters().size(), expected.size() - 1);
  EXPECT_EQ(tied->output, nullptr);
}

TEST(Llama3Model, InitFollowsTorchTitan) {
  llama3::Llama3Args args = llama3::args_for_flavor("debugmodel");
  args.max_seq_len = 16;
  llama3::Transformer model(args);
  model.init_weights(/*seed=*/0);
  const auto std_of = [](const at::Tensor& t) { return t.std().item<double>(); };
  EXPECT_NEAR(std_of(model.tok_embeddings->weight), 1.0, 0.01);
  EXPECT_NEAR(std_of(model.layers[0]->attention->wq->weight), 0.02, 5e-4);
  EXPECT_NEAR(std_of(model.layers[0]->feed_forward->w1->weight), 0.02, 5e-4);
  // depth_init: std 0.02 / sqrt(2 (layer_id + 1)) for wo, w2, w3.
  EXPECT_NEAR(std_of(model.layers[0]->attention->wo->weight), 0.02 / std::sqrt(2.0), 5e-4);
  EXPECT_NEAR(std_of(model.layers[5]->feed_forward->w2->weight), 0.02 / std::sqrt(12.0), 5e-4);
  EXPECT_NEAR(std_of(model.layers[5]->feed_forward->w3->weight), 0.02 / std::sqrt(12.0), 5e-4);
  // Output: std dim^-0.5 truncated at 3 std.
  const double out_std = 1.0 / 16.0;
  const at::Tensor out = model.output->weight;
  EXPECT_LE(out.abs().max().item<double>(), 3 * out_std + 1e-7);
  EXPECT_NEAR(std_of(out), out_std * 0.9866, 1e-3);
  EXPECT_TRUE(at::equal(model.norm->weight, at::ones({256})));
  EXPECT_TRUE(at::equal(model.layers[3]->ffn_norm->weight, at::ones({256})));
  // Without depth_init every layer uses 0.02 / sqrt(2 n_layers).
  args.depth_init = false;
  llama3::Transformer flat(args);
  flat.init_weights(/*seed=*/0);
  EXPECT_NEAR(std_of(flat.layers[0]->attention->wo->weight), 0.02 / std::sqrt(12.0), 5e-4);
}

TEST(Llama3Model, SameSeedSameInit) {
  const auto a = tiny_model(at::kFloat, false, /*seed=*/42);
  const auto b = tiny_model(at::kFloat, false, /*seed=*/42);
  const auto c = tiny_model(at::kFloat, false, /*seed=*/43);
  const auto pa = a->named_parameters();
  const auto pb = b->named_parameters();
  for (const auto& item : pa) {
    EXPECT_TRUE(at::equal(item.value(), pb[item.key()])) << item.key();
  }
  EXPECT_FALSE(at::equal(pa["layers.0.attention.wq.weight"],
                         c->named_parameters()["layers.0.attention.wq.weight"]));
}

TEST(Llama3Model, SpecBuildsAnInitializedModel) {
  ModelBuildOptions options;
  options.max_seq_len = 64;
  at::manual_seed(0);
  const auto model = get_model_spec("llama3").build("tiny", options);
  const at::Tensor logits = model->forward(random_tokens(2, 64, 300, 1));
  EXPECT_EQ(logits.sizes(), at::IntArrayRef({2, 64, 300}));
  EXPECT_EQ(logits.scalar_type(), at::kFloat);
  EXPECT_TRUE(logits.isfinite().all().item<bool>());
  EXPECT_EQ(model->stats(2, 64).n_params,
            get_model_spec("llama3").describe("tiny", 2, 64, at::kFloat).n_params);
}

TEST(Llama3Model, LaterTokensDoNotChangeEarlierLogits) {
  const auto model = tiny_model();
  at::NoGradGuard no_grad;
  // 300 positions: several attention query chunks.
  const at::Tensor tokens = random_tokens(2, 300, 300, 1);
  const at::Tensor logits = model->forward(tokens);
  for (const int64_t t : {0, 7, 127, 128, 200, 298}) {
    at::Tensor changed = tokens.clone();
    changed.narrow(1, t + 1, 300 - t - 1).fill_(5);
    const at::Tensor other = model->forward(changed);
    EXPECT_TRUE(at::allclose(other.narrow(1, 0, t + 1), logits.narrow(1, 0, t + 1), 1e-5, 1e-6))
        << t;
    EXPECT_FALSE(at::allclose(other.narrow(1, t + 1, 1), logits.narrow(1, t + 1, 1), 1e-5, 1e-6))
        << t;
  }
}

// Autograd against (L(w + h) - L(w - h)) / 2h in float64, a few entries of every parameter.
void check_gradients_by_finite_differences(bool tied) {
  const auto model = tiny_model(at::kFloat, tied, /*seed=*/3);
  model->to(at::kDouble);
  // 136 positions: two attention query chunks, so the chunked path is differentiated too.
  const at::Tensor tokens = random_tokens(1, 137, 300, 4);
  const at::Tensor inputs = tokens.narrow(1, 0, 136);
  const at::Tensor targets = tokens.narrow(1, 1, 136);
  const at::Tensor loss = loss_of(model->forward(inputs), targets);
  ASSERT_EQ(loss.scalar_type(), at::kDouble);
  loss.backward();

  // h = 1e-5: the rounding error of a loss difference, ~1e-15 / 2h, stays below 1e-10, and the
  // O(h^2) truncation error is far below the relative tolerance.
  const double h = 1e-5;
  at::manual_seed(5);
  for (auto& item : model->named_parameters()) {
    at::Tensor param = item.value();
    const at::Tensor grad = param.grad();
    ASSERT_TRUE(grad.defined()) << item.key();
    at::Tensor flat = param.data().view(-1);
    std::vector<int64_t> indices;
    if (item.key() == "tok_embeddings.weight") {
      // Rows of tokens in the batch (other rows have zero gradient), plus the output-side
      // column dependence when tied.
      for (int64_t j = 0; j < 3; ++j) {
        indices.push_back(inputs[0][j].item<int64_t>() * param.size(1) + j);
      }
    }
    for (int64_t j = 0; j < 3; ++j) {
      indices.push_back(at::randint(flat.numel(), {1}, at::kLong).item<int64_t>());
    }
    for (const int64_t index : indices) {
      at::NoGradGuard no_grad;
      const double original = flat[index].item<double>();
      flat[index] = original + h;
      const double plus = loss_of(model->forward(inputs), targets).item<double>();
      flat[index] = original - h;
      const double minus = loss_of(model->forward(inputs), targets).item<double>();
      flat[index] = original;
      const double numeric = (plus - minus) / (2 * h);
      const double analytic = grad.view(-1)[index].item<double>();
      EXPECT_NEAR(analytic, numeric, 1e-5 * std::abs(numeric) + 5e-10)
          << item.key() << "[" << index << "]";
    }
  }
}

TEST(Llama3Model, GradientsMatchFiniteDifferences) {
  check_gradients_by_finite_differences(/*tied=*/false);
}

TEST(Llama3Model, TiedGradientsMatchFiniteDifferences) {
  check_gradients_by_finite_differences(/*tied=*/true);
}

TEST(Llama3Model, Bf16ComputeIsCloseToFloat32) {
  const auto fp32 = tiny_model(at::kFloat, false, /*seed=*/8);
  const auto bf16 = tiny_model(at::kBFloat16, false, /*seed=*/8);
  const at::Tensor tokens = random_tokens(2, 17, 300, 9);
  const at::Tensor inputs = tokens.narrow(1, 0, 16);
  const at::Tensor targets = tokens.narrow(1, 1, 16);
  const at::Tensor logits32 = fp32->forward(inputs);
  const at::Tensor logits16 = bf16->forward(inputs);
  EXPECT_EQ(logits16.scalar_type(), at::kFloat);
  EXPECT_LT((logits16 - logits32).abs().max().item<double>(), 0.1);
  EXPECT_LT((logits16 - logits32).abs().mean().item<double>(), 0.02);

  const at::Tensor loss32 = loss_of(logits32, targets);
  const at::Tensor loss16 = loss_of(logits16, targets);
  EXPECT_NEAR(loss16.item<double>(), loss32.item<double>(), 0.02);
  loss32.backward();
  loss16.backward();
  const auto p32 = fp32->named_parameters();
  for (const auto& item : bf16->named_parameters()) {
    const at::Tensor g16 = item.value().grad();
    ASSERT_TRUE(g16.defined()) << item.key();
    EXPECT_EQ(item.value().scalar_type(), at::kFloat) << item.key();
    EXPECT_EQ(g16.scalar_type(), at::kFloat) << item.key();
    const at::Tensor g32 = p32[item.key()].grad();
    const double cosine =
        (g16 * g32).sum().item<double>() / (g16.norm() * g32.norm()).item<double>();
    EXPECT_GT(cosine, 0.98) << item.key();
  }
}

}  // namespace test_llama3_model
}  // namespace titan
