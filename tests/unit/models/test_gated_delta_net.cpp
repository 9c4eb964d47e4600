// Gated DeltaNet, Qwen3-Next's linear attention layer: the causal convolution against ATen's
// conv1d, packed documents (a document in a pack computes what it computes alone), generation's
// carried state (a prefix at once, then one position at a time, equals the whole sequence),
// gradients reaching every parameter, and transformers' Qwen3NextGatedDeltaNet on the same
// weights (the fixture tests/e2e/test_gated_delta_reference.sh writes; skipped without it).
#include "titan/checkpoint/safetensors.h"
#include "titan/common/check.h"
#include "titan/models/common/gated_delta_net.h"

#include "../test_util.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

namespace titan {
namespace test_gated_delta_net {

double max_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

GatedDeltaNetArgs small_args() {
  GatedDeltaNetArgs a;
  a.num_k_heads = 2;
  a.num_v_heads = 4;
  a.head_k_dim = 8;
  a.head_v_dim = 6;
  a.conv_kernel = 4;
  a.chunk = 8;
  return a;
}

// A layer of width 32 with weights at unit scale (each moves the output), decays spread.
std::shared_ptr<GatedDeltaNet> random_layer(const GatedDeltaNetArgs& args, uint64_t seed) {
  at::manual_seed(seed);
  auto layer = std::make_shared<GatedDeltaNet>(32, args, at::kFloat);
  at::NoGradGuard no_grad;
  for (auto& item : layer->named_parameters()) {
    at::Tensor& p = item.value();
    if (item.key() == "A_log.weight") {
      p.copy_(at::log(at::empty(p.sizes()).uniform_(0.5, 4.0)));
    } else if (p.dim() == 1) {
      p.copy_(1.0 + 0.3 * at::randn(p.sizes()));
    } else {
      p.copy_(at::randn(p.sizes()) / std::sqrt(static_cast<double>(p[0].numel())));
    }
  }
  return layer;
}

TEST(GatedDeltaNet, ConvolutionMatchesConv1d) {
  const at::Tensor x = at::randn({2, 11, 5});
  const at::Tensor w = at::randn({5, 1, 4});
  // ATen's depthwise conv1d, padded on the left only by cutting the right.
  const at::Tensor ref =
      at::conv1d(x.transpose(1, 2), w, {}, /*stride=*/1, /*padding=*/3, /*dilation=*/1, 5)
          .narrow(2, 0, 11)
          .transpose(1, 2);
  EXPECT_LT(max_diff(causal_depthwise_conv(x, w), ref), 1e-6);
  // A history: the positions before the start.
  const at::Tensor history = at::randn({2, 5, 3});
  const at::Tensor whole = at::cat({history.transpose(1, 2), x}, 1);
  const at::Tensor ref_h =
      at::conv1d(whole.transpose(1, 2), w, {}, 1, 3, 1, 5).narrow(2, 3, 11).transpose(1, 2);
  EXPECT_LT(max_diff(causal_depthwise_conv(x, w, history), ref_h), 1e-6);
}

TEST(GatedDeltaNet, PackedDocumentsComputeAsAlone) {
  auto layer = random_layer(small_args(), 1);
  at::NoGradGuard no_grad;
  const at::Tensor a = at::randn({1, 13, 32}), b = at::randn({1, 9, 32});
  const at::Tensor packed = at::cat({a, b}, 1);
  const at::Tensor docs = at::cat({at::zeros({1, 13}, at::kLong), at::ones({1, 9}, at::kLong)}, 1);
  const at::Tensor out = layer->forward(packed, docs);
  EXPECT_LT(max_diff(out.narrow(1, 0, 13), layer->forward(a)), 1e-5);
  EXPECT_LT(max_diff(out.narrow(1, 13, 9), layer->forward(b)), 1e-5);
  // Without the documents the second one reads the first.
  EXPECT_GT(max_diff(layer->forward(packed).narrow(1, 13, 9), layer->forward(b)), 1e-3);
}

TEST(GatedDeltaNet, CarriedStateEqualsTheWholeSequence) {
  auto layer = random_layer(small_args(), 2);
  at::NoGradGuard no_grad;
  const at::Tensor x = at::randn({2, 20, 32});
  const at::Tensor whole = layer->forward(x);
  LinearAttentionState state;
  std::vector<at::Tensor> parts = {layer->forward(x.narrow(1, 0, 11), {}, &state)};
  for (int64_t t = 11; t < 20; ++t) parts.push_back(layer->forward(x.narrow(1, t, 1), {}, &state));
  EXPECT_LT(max_diff(at::cat(parts, 1), whole), 1e-5);
  EXPECT_EQ(state.conv.sizes(), (std::vector<int64_t>{2, 56, 3}));
  EXPECT_EQ(state.recurrent.sizes(), (std::vector<int64_t>{2, 4, 8, 6}));
}

TEST(GatedDeltaNet, GradientsReachEveryParameter) {
  auto layer = random_layer(small_args(), 3);
  const at::Tensor x = at::randn({2, 10, 32}).requires_grad_();
  layer->forward(x).square().sum().backward();
  for (const auto& item : layer->named_parameters()) {
    ASSERT_TRUE(item.value().grad().defined()) << item.key();
    EXPECT_GT(item.value().grad().abs().max().item<double>(), 0.0) << item.key();
  }
  EXPECT_GT(x.grad().abs().max().item<double>(), 0.0);
  EXPECT_EQ(small_args().params(32), [&] {
    int64_t n = 0;
    for (const auto& item : layer->named_parameters()) n += item.value().numel();
    return n;
  }());
}

TEST(GatedDeltaNet, RefusesHeadsThatDoNotDivide) {
  GatedDeltaNetArgs a = small_args();
  a.num_v_heads = 5;
  EXPECT_NE(test::message_of([&] { a.validate(); }).find("5 % 2 = 1"), std::string::npos);
}

TEST(GatedDeltaNet, MatchesTransformers) {
  const char* path = std::getenv("TITAN_GATED_DELTA_FIXTURE");
  if (path == nullptr) GTEST_SKIP() << "run by tests/e2e/test_gated_delta_reference.sh";
  const ckpt::SafetensorsReader file(path);
  const at::Tensor sizes = file.read("layer_sizes");
  GatedDeltaNetArgs args;
  args.num_k_heads = sizes[1].item<int64_t>();
  args.num_v_heads = sizes[2].item<int64_t>();
  args.head_k_dim = sizes[3].item<int64_t>();
  args.head_v_dim = sizes[4].item<int64_t>();
  args.conv_kernel = sizes[5].item<int64_t>();
  GatedDeltaNet layer(sizes[0].item<int64_t>(), args, at::kFloat);
  at::NoGradGuard no_grad;
  // transformers' names: ours hold dt_bias, A_log and the norm weight as ".weight".
  for (auto& item : layer.named_parameters()) {
    std::string name = item.key();
    if (name == "dt_bias.weight" || name == "A_log.weight") name.resize(name.size() - 7);
    item.value().copy_(file.read("layer." + name));
  }
  const double diff = max_diff(layer.forward(file.read("layer_x")), file.read("layer_out"));
  EXPECT_LT(diff, 1e-5);
  std::printf("Gated DeltaNet layer vs transformers: max |titan - transformers| %.3g\n", diff);
}

}  // namespace test_gated_delta_net
}  // namespace titan
