// QLoRA's base (models/common/linear.h: nf4_linear, quantize_frozen_nf4): a Linear whose frozen
// weight is held in NF4 computes what a plain layer computes with the dequantized weight, forward
// and backward, in float32 and bf16; a LoRA model with its frozen block weights quantized gives
// the logits and adapter gradients of the same model in float whose base weights are the NF4
// codes dequantized; what is quantized, what stays, and what is refused.
#include "titan/common/check.h"
#include "titan/common/device.h"
#include "titan/kernels/nf4.h"
#include "titan/models/common/init.h"
#include "titan/models/common/linear.h"
#include "titan/models/converters.h"
#include "titan/models/llama3/model.h"
#include "titan/models/lora.h"

#include "../parallel/parallel_test_util.h"

#include <gtest/gtest.h>

#include <map>

namespace titan {
namespace test_qlora {

constexpr int64_t kVocab = 61;

nlohmann::json tiny_description() { return test::tiny_description(kVocab); }

// The tiny Llama with adapters on every linear layer of its blocks, every lora_b non-zero.
std::shared_ptr<llama3::Transformer> adapted_model() {
  auto m = std::make_shared<llama3::Transformer>(test::tiny_args(/*tied=*/false, kVocab));
  LoraSpec spec;
  spec.rank = 4;
  spec.alpha = 8;
  spec.target_modules = {kAllLinear};
  apply_lora(*m, spec, tiny_description());
  m->init_weights(7);  // the base, and the adapters from the inits apply_lora set
  at::NoGradGuard no_grad;
  for (auto& item : m->named_parameters()) {
    if (item.key().find("lora_b") != std::string::npos) {
      init_whole(item.value(), ParamInit::normal(0, 0.1), 3, item.key());
    }
  }
  return m;
}

std::map<std::string, Linear*> linears(torch::nn::Module& root) {
  std::map<std::string, Linear*> out;
  for (const auto& item : root.named_modules()) {
    if (auto* l = dynamic_cast<Linear*>(item.value().get())) out[item.key()] = l;
  }
  return out;
}

TEST(Nf4Linear, ForwardAndInputGradientUseTheDequantizedWeight) {
  at::manual_seed(0);
  const at::Tensor w = at::randn({48, 128}) * 0.05;
  const auto q = std::make_shared<const kernels::Nf4Weight>(kernels::nf4_quantize(w));
  const at::Tensor wd = kernels::nf4_dequantize(*q, at::kFloat);
  EXPECT_GT((wd - w).abs().max().item<double>(), 1e-4);  // quantized: not the weight itself

  const at::Tensor x = at::randn({3, 5, 128}).requires_grad_();
  const at::Tensor y = nf4_linear(x, q, at::kFloat);
  ASSERT_EQ(y.sizes(), (std::vector<int64_t>{3, 5, 48}));
  const at::Tensor x2 = x.detach().clone().requires_grad_();
  const at::Tensor want = at::matmul(x2, wd.t());
  EXPECT_TRUE(at::allclose(y, want, 1e-6, 1e-6));
  const at::Tensor g = at::randn({3, 5, 48});
  y.backward(g);
  want.backward(g);
  EXPECT_TRUE(at::allclose(x.grad(), x2.grad(), 1e-6, 1e-6));

  // bf16 compute: both operands in bf16, the product rounded to bf16.
  const at::Tensor xb = x.detach().clone().requires_grad_();
  const at::Tensor yb = nf4_linear(xb, q, at::kBFloat16);
  EXPECT_EQ(yb.scalar_type(), at::kBFloat16);
  const at::Tensor want_b =
      at::matmul(x.detach().to(at::kBFloat16).to(at::kFloat),
                 kernels::nf4_dequantize(*q, at::kBFloat16).to(at::kFloat).t());
  EXPECT_TRUE(at::allclose(yb.to(at::kFloat), want_b, 1e-2, 1e-2));
  yb.backward(g.to(at::kBFloat16));
  EXPECT_EQ(xb.grad().scalar_type(), at::kFloat);  // through the cast back to x's dtype
  EXPECT_TRUE(at::allclose(xb.grad(), x2.grad(), 2e-2, 2e-2));

  EXPECT_THROW(nf4_linear(at::randn({2, 127}), q, at::kFloat), c10::Error);
}

TEST(Nf4Linear, TheLayerComputesThroughItsAdapterAndPrintsNf4) {
  at::manual_seed(1);
  auto layer = std::make_shared<Linear>(64, 32);
  layer->weight.set_data(at::randn({32, 64}) * 0.1);
  layer->weight.set_requires_grad(false);
  const at::Tensor dense = layer->weight.detach().clone();
  layer->lora_a = layer->register_module("lora_a", std::make_shared<Linear>(64, 2));
  layer->lora_b = layer->register_module("lora_b", std::make_shared<Linear>(2, 32));
  layer->lora_a->weight.set_data(at::randn({2, 64}));
  layer->lora_b->weight.set_data(at::randn({32, 2}));
  layer->lora_a->is_adapter = layer->lora_b->is_adapter = true;
  layer->lora_scaling = 0.5;
  // Wrapped in a "layers.0" tree, as in a model: only block layers are quantized.
  struct Root : torch::nn::Module {};
  auto root = std::make_shared<Root>();
  auto block = std::make_shared<Root>();
  block->register_module("proj", layer);
  auto layers = std::make_shared<Root>();
  layers->register_module("0", block);
  root->register_module("layers", layers);
  const Nf4Quantized done = quantize_frozen_nf4(*root);
  ASSERT_EQ(done.layers, (std::vector<std::string>{"layers.0.proj"}));
  EXPECT_EQ(done.elements, 32 * 64);
  EXPECT_EQ(done.dense_bytes, 32 * 64 * 4);
  EXPECT_EQ(done.nf4_bytes, layer->nf4_weight->nbytes());
  EXPECT_FALSE(layer->weight.defined());
  EXPECT_EQ(root->named_parameters().size(), 2u);  // the adapters only
  EXPECT_NO_THROW(parameter_slots(*root));
  std::ostringstream printed;
  layer->pretty_print(printed);
  EXPECT_EQ(printed.str(), "titan::Linear(in_features=64, out_features=32, nf4, lora_rank=2)");

  const at::Tensor wd = kernels::nf4_dequantize(*layer->nf4_weight, at::kFloat);
  const at::Tensor x = at::randn({4, 64});
  const at::Tensor y = layer->forward(x);
  const at::Tensor a = layer->lora_a->weight, b = layer->lora_b->weight;
  const at::Tensor want = x.mm(wd.t()) + x.mm(a.t()).mm(b.t()) * 0.5;
  EXPECT_TRUE(at::allclose(y, want, 1e-5, 1e-5));
  EXPECT_GT((x.mm(dense.t()) - x.mm(wd.t())).abs().max().item<double>(), 1e-4);
  y.sum().backward();
  EXPECT_TRUE(a.grad().defined() && b.grad().defined());
  // Nothing left to quantize the second time.
  EXPECT_TRUE(quantize_frozen_nf4(*root).layers.empty());
}

TEST(Qlora, ModelMatchesItsFloatTwinWithTheDequantizedBase) {
  auto m = adapted_model();
  auto twin = adapted_model();  // the same seeds: the same base and adapters
  const Nf4Quantized done = quantize_frozen_nf4(*m);
  // 2 blocks x (wq, wk, wv, wo, w1, w2, w3); the embedding and the output head stay.
  EXPECT_EQ(done.layers.size(), 14u);
  EXPECT_EQ(done.layers.front(), "layers.0.attention.wq");
  EXPECT_LT(done.nf4_bytes * 6, done.dense_bytes);  // 4.1 to 5 bits per weight, from 32
  const auto params = m->named_parameters();
  EXPECT_FALSE(params.contains("layers.0.attention.wq.weight"));
  EXPECT_TRUE(params.contains("layers.0.attention.wq.lora_a.weight"));
  EXPECT_TRUE(params.contains("tok_embeddings.weight"));
  EXPECT_TRUE(params.contains("output.weight"));
  EXPECT_TRUE(params.contains("layers.0.attention_norm.weight"));

  // The twin's base weights become the NF4 codes' values.
  auto ours = linears(*m);
  {
    at::NoGradGuard no_grad;
    for (auto& [name, layer] : linears(*twin)) {
      if (ours[name]->nf4_weight) {
        layer->weight.set_data(kernels::nf4_dequantize(*ours[name]->nf4_weight, at::kFloat));
      }
    }
  }
  const at::Tensor tokens = at::randint(kVocab, {2, 12}, at::kLong);
  const at::Tensor probe = at::randn({2, 12, kVocab});
  const at::Tensor got = m->forward(tokens);
  const at::Tensor want = twin->forward(tokens);
  ASSERT_FALSE(want.isnan().any().item<bool>());
  ASSERT_FALSE(got.isnan().any().item<bool>());
  EXPECT_TRUE(at::allclose(got, want, 1e-5, 1e-5)) << (got - want).abs().max().item<double>();
  (got * probe).sum().backward();
  (want * probe).sum().backward();
  const auto twin_params = twin->named_parameters();
  int64_t compared = 0;
  for (const auto& item : params) {
    if (!is_lora_param(item.key())) {
      EXPECT_FALSE(item.value().grad().defined()) << item.key();
      continue;
    }
    const at::Tensor& g = item.value().grad();
    const at::Tensor& g2 = twin_params[item.key()].grad();
    ASSERT_TRUE(g.defined() && g2.defined()) << item.key();
    EXPECT_TRUE(at::allclose(g, g2, 1e-4, 1e-5))
        << item.key() << " " << (g - g2).abs().max().item<double>();
    ++compared;
  }
  EXPECT_EQ(compared, 28);
}

TEST(Qlora, RefusesMetaWeightsFloat8AndWrappedLayers) {
  auto m = adapted_model();
  // A meta weight: the base is not loaded yet.
  auto meta = std::make_shared<llama3::Transformer>(test::tiny_args(/*tied=*/false, kVocab));
  for (auto& [name, layer] : linears(*meta)) {
    if (name.rfind("layers.", 0) == 0) {
      layer->replace_weight(at::empty(layer->weight.sizes(), at::device(at::kMeta)));
    }
  }
  try {
    quantize_frozen_nf4(*meta);
    FAIL() << "quantized a meta weight";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("layers.0.attention.wq.weight is on the meta device"),
              std::string::npos)
        << e.what();
  }
  // float8 either way round.
  auto f8 = adapted_model();
  linears(*f8)["layers.1.feed_forward.w2"]->float8 = Float8LinearOptions{};
  try {
    quantize_frozen_nf4(*f8);
    FAIL() << "quantized a float8 layer";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("layers.1.feed_forward.w2 computes in float8"),
              std::string::npos)
        << e.what();
  }
  quantize_frozen_nf4(*m);
  Float8LinearSection section;
  section.emulate = true;
  EXPECT_THROW(convert_to_float8(*m, section, DeviceInfo{}), ConfigError);
}

// The NF4 tensors moved to `cuda` (the device under test) dequantize there to the CPU table's
// bits, and the layer's bf16 product and input gradient there match the CPU's within bf16
// rounding.
void check_nf4_on(const at::Device& cuda) {
  at::manual_seed(4);
  const at::Tensor w = at::randn({96, 256}) * 0.05;
  for (bool double_quant : {false, true}) {
    SCOPED_TRACE(double_quant ? "double-quantized scales" : "float32 scales");
    const auto cpu = std::make_shared<const kernels::Nf4Weight>(kernels::nf4_quantize(
        w, kernels::Nf4Options{.blocksize = 64, .double_quant = double_quant}));
    const auto dev = std::make_shared<const kernels::Nf4Weight>(kernels::nf4_to(*cpu, cuda));
    for (auto dtype : {at::kFloat, at::kBFloat16}) {
      EXPECT_TRUE(at::equal(kernels::nf4_dequantize_aten(*dev, dtype).cpu(),
                            kernels::nf4_dequantize(*cpu, dtype)));
    }
    const at::Tensor x = at::randn({4, 7, 256});
    const at::Tensor g = at::randn({4, 7, 96});
    const at::Tensor xc = x.clone().requires_grad_();
    const at::Tensor xd = x.to(cuda).requires_grad_();
    const at::Tensor yc = nf4_linear(xc, cpu, at::kBFloat16);
    const at::Tensor yd = nf4_linear(xd, dev, at::kBFloat16);
    EXPECT_TRUE(at::allclose(yd.cpu().to(at::kFloat), yc.to(at::kFloat), 2e-2, 2e-2))
        << (yd.cpu().to(at::kFloat) - yc.to(at::kFloat)).abs().max();
    yc.backward(g.to(at::kBFloat16));
    yd.backward(g.to(at::kBFloat16).to(cuda));
    EXPECT_TRUE(at::allclose(xd.grad().cpu(), xc.grad(), 2e-2, 2e-2))
        << (xd.grad().cpu() - xc.grad()).abs().max();
  }
}

TEST(Nf4Linear, TheDeviceCheckHoldsOnTheCpu) { check_nf4_on(at::kCPU); }

// On a GPU (scripts/gpu_check.sh).
TEST(Nf4LinearCuda, DeviceDequantizeAndProductMatchTheCpu) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  check_nf4_on(at::Device(at::kCUDA, 0));
}

}  // namespace test_qlora
}  // namespace titan
