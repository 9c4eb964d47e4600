// MXFP8 casts (models/common/mx.h): against torchao's to_mx / to_dtype (a fixture written by
// tests/e2e/mx_reference.py, run by test_mx.sh), bit for bit on the element and scale bytes; and
// the format's properties on their own.
#include "titan/checkpoint/safetensors.h"
#include "titan/common/device.h"
#include "titan/models/common/linear.h"
#include "titan/models/common/mx.h"
#include "titan/models/converters.h"
#include "titan/models/registry.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>

namespace titan {
namespace mx_test {

TEST(Mx, MatchesTorchao) {
  const char* path = std::getenv("TITAN_MX_FIXTURE");
  if (path == nullptr) GTEST_SKIP() << "run by tests/e2e/test_mx.sh";
  const ckpt::SafetensorsReader file(path);
  int64_t values = 0, blocks = 0;
  for (const std::string name : {"spread", "bf16", "edges"}) {
    for (const auto& [rule, suffix] :
         {std::pair{MxScaleRule::kFloor, ""}, std::pair{MxScaleRule::kRceil, ".rceil"}}) {
      const std::string key = name + suffix;
      SCOPED_TRACE(key);
      const at::Tensor x = file.read(name);
      const MxTensor mx = to_mx(x, rule);
      EXPECT_TRUE(at::equal(mx.data.view(at::kByte), file.read(key + ".data")));
      EXPECT_TRUE(at::equal(mx.scale, file.read(key + ".scale")));
      const at::Tensor back = from_mx(mx);
      const at::Tensor want = file.read(key + ".dequantized");
      // Bit for bit, NaNs included.
      EXPECT_TRUE(at::equal(back.view(at::kInt), want.view(at::kInt)));
      values += x.numel();
      blocks += mx.scale.numel();
    }
  }
  std::printf(
      "MX cast vs torchao (FLOOR and RCEIL scales): %lld values in %lld blocks, element and "
      "scale bytes equal\n",
      static_cast<long long>(values), static_cast<long long>(blocks));
}

TEST(Mx, LinearMatchesTorchaoCasts) {
  const char* path = std::getenv("TITAN_MX_FIXTURE");
  if (path == nullptr) GTEST_SKIP() << "run by tests/e2e/test_mx.sh";
  const ckpt::SafetensorsReader file(path);
  const at::Tensor x = file.read("linear.x").requires_grad_(true);
  const at::Tensor w = file.read("linear.w").requires_grad_(true);
  const at::Tensor y = mx_linear(x, w);
  y.backward(file.read("linear.g"));
  // The same casts and float32 GEMMs: equal to the last bit.
  EXPECT_TRUE(at::equal(y, file.read("linear.y")));
  EXPECT_TRUE(at::equal(x.grad(), file.read("linear.grad_x")));
  EXPECT_TRUE(at::equal(w.grad(), file.read("linear.grad_w")));
  std::printf("MX linear vs torchao's casts: output and both gradients equal\n");
}

TEST(Mx, LinearIsCloseToTheHighPrecisionOne) {
  at::manual_seed(4);
  const at::Tensor x = at::randn({2, 32, 64}).requires_grad_(true);
  const at::Tensor w = (at::randn({96, 64}) * 0.1).requires_grad_(true);
  const at::Tensor g = at::randn({2, 32, 96});
  const at::Tensor y = mx_linear(x, w);
  y.backward(g);
  const at::Tensor x2 = x.detach().clone().requires_grad_(true);
  const at::Tensor w2 = w.detach().clone().requires_grad_(true);
  at::linear(x2, w2).backward(g);
  const auto rel = [](const at::Tensor& a, const at::Tensor& b) {
    return ((a - b).norm() / b.norm()).item<double>();
  };
  // e4m3 keeps 3 mantissa bits: a few percent of the product's norm.
  EXPECT_LT(rel(y, at::linear(x2, w2)), 0.05);
  EXPECT_LT(rel(x.grad(), x2.grad()), 0.05);
  EXPECT_LT(rel(w.grad(), w2.grad()), 0.05);
  // 48 tokens do not block by 32 for the weight's gradient.
  try {
    mx_linear(at::randn({48, 64}), w);
    FAIL() << "48 tokens were accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("48 tokens"), std::string::npos) << e.what();
  }
}

TEST(Mx, BlocksShareAPowerOfTwoAndKeepTheirLargestValue) {
  at::manual_seed(2);
  const at::Tensor x =
      at::randn({6, 96}) *
      at::pow(10.0, at::randint(-8, 8, {6, 3, 1})).repeat_interleave(32, 2).reshape({6, 96});
  const MxTensor mx = to_mx(x);
  EXPECT_EQ(mx.data.scalar_type(), at::kFloat8_e4m3fn);
  EXPECT_EQ(mx.scale.sizes(), (std::vector<int64_t>{6, 3}));
  // Scaled, each block's largest magnitude is in [256, 448] (2^8 up to e4m3's saturation).
  const at::Tensor amax = mx.data.to(at::kFloat).abs().reshape({6, 3, 32}).amax(-1);
  EXPECT_GE(amax.min().item<double>(), 256.0);
  EXPECT_LE(amax.max().item<double>(), 448.0);
  // Back: within e4m3's rounding (2^-4 of a value) or the saturation of the block maximum.
  const at::Tensor back = from_mx(mx);
  const at::Tensor block_max = x.abs().reshape({6, 3, 32}).amax(-1, true);
  const at::Tensor err = ((back - x).abs().reshape({6, 3, 32}) / block_max).max();
  EXPECT_LE(err.item<double>(), 0.125);
  EXPECT_EQ(e8m0_to_float(at::tensor({0, 127, 128, 255}, at::kByte))[1].item<float>(), 1.0f);
  EXPECT_TRUE(std::isnan(e8m0_to_float(at::tensor({255}, at::kByte))[0].item<float>()));
  EXPECT_EQ(e8m0_to_float(at::tensor({0}, at::kByte))[0].item<float>(), std::ldexp(1.0f, -127));
}

TEST(Mx, RefusesShapesAndDtypesItCannotBlock) {
  try {
    to_mx(at::randn({4, 40}));
    FAIL() << "40 columns were blocked by 32";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("multiple of the block size 32"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(to_mx(at::randn({4, 32}, at::kDouble)), std::exception);
}

// The converter takes the recipe's scale rule (mxfp8_cublas: FLOOR, mxfp8_cublas_rceil: RCEIL),
// and a converted layer computes mx_linear with it.
TEST(Mx, ConverterTakesTheRecipesScaleRule) {
  ModelBuildOptions options;
  options.meta = true;
  for (const auto& [recipe, rule] : {std::pair{"mxfp8_cublas", MxScaleRule::kFloor},
                                     std::pair{"mxfp8_cublas_rceil", MxScaleRule::kRceil}}) {
    auto model = get_model_spec("llama3").build("tiny", options);
    MXLinearSection config;
    config.recipe_name = recipe;
    const MxConversion c = convert_to_mx(*model, config);
    ASSERT_FALSE(c.converted.empty());
    for (const auto& item : model->named_modules()) {
      auto* linear = dynamic_cast<Linear*>(item.value().get());
      if (linear == nullptr || !linear->mx) continue;
      EXPECT_EQ(*linear->mx, rule) << recipe << " " << item.key();
    }
  }
  at::manual_seed(9);
  Linear layer(64, 32);
  {
    at::NoGradGuard no_grad;
    layer.weight.copy_(at::randn({32, 64}) * 0.1);
  }
  const at::Tensor x = at::randn({2, 16, 64});
  layer.mx = MxScaleRule::kRceil;
  const at::Tensor rceil = layer.forward(x);
  EXPECT_TRUE(at::equal(rceil, mx_linear(x, layer.weight, MxScaleRule::kRceil)));
  layer.mx = MxScaleRule::kFloor;
  EXPECT_TRUE(at::equal(layer.forward(x), mx_linear(x, layer.weight, MxScaleRule::kFloor)));
}

}  // namespace mx_test
}  // namespace titan
