// The frozen text encoders FLUX.1 conditions on (models/encoders): T5 and CLIP against
// transformers' T5EncoderModel and CLIPTextModel on tiny random folders (written by
// tests/e2e/flux_reference.py, run by test_flux.sh), plus T5's relative position buckets
// against values worked out by hand and the loader's refusals.
#include "titan/checkpoint/safetensors.h"
#include "titan/common/check.h"
#include "titan/models/encoders/clip.h"
#include "titan/models/encoders/load.h"
#include "titan/models/encoders/t5.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

namespace titan {
namespace text_encoder_test {

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  return nlohmann::json::parse(in);
}

TensorMap read_tensors(const std::string& path) {
  const ckpt::SafetensorsReader file(path);
  TensorMap out;
  for (const auto& entry : file.entries()) out[entry.name] = file.read(entry.name);
  return out;
}

void expect_close(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  const double err = (got - want).abs().max().item<double>();
  const double scale = want.abs().max().item<double>();
  EXPECT_LT(err, 1e-5 * std::max(1.0, scale)) << what;
  std::printf("%s: max abs diff %.3g (max %.3g)\n", what.c_str(), err, scale);
}

TEST(TextEncoders, T5MatchesTransformers) {
  const char* dir = std::getenv("TITAN_FLUX_FIXTURE");
  if (dir == nullptr) GTEST_SKIP() << "run by tests/e2e/test_flux.sh";
  const std::string folder = std::string(dir) + "/t5";
  const encoders::T5Args args = encoders::t5_args_from_hf(read_json(folder + "/config.json"));
  EXPECT_TRUE(args.gated());
  encoders::T5Encoder t5(args);
  encoders::load_named_tensors(t5, read_tensors(folder + "/model.safetensors"), "t5",
                               {{"shared.weight", "encoder.embed_tokens.weight"}});
  const ckpt::SafetensorsReader io(folder + "/io.safetensors");
  at::NoGradGuard no_grad;
  expect_close(t5.forward(io.read("ids")), io.read("last_hidden_state"),
               "t5 encoder vs transformers T5EncoderModel: last hidden state");
}

TEST(TextEncoders, ClipMatchesTransformers) {
  const char* dir = std::getenv("TITAN_FLUX_FIXTURE");
  if (dir == nullptr) GTEST_SKIP() << "run by tests/e2e/test_flux.sh";
  for (const std::string variant : {"clip_legacy", "clip"}) {
    const std::string folder = std::string(dir) + "/" + variant;
    const encoders::ClipTextArgs args =
        encoders::clip_text_args_from_hf(read_json(folder + "/config.json"));
    encoders::ClipTextEncoder clip(args);
    encoders::load_named_tensors(
        clip, encoders::clip_text_tensors_from_hf(read_tensors(folder + "/model.safetensors")),
        "clip");
    const ckpt::SafetensorsReader io(folder + "/io.safetensors");
    at::NoGradGuard no_grad;
    const encoders::ClipTextOutput out = clip.forward(io.read("ids"));
    const std::string what = "clip text encoder (eos_token_id " +
                             std::to_string(args.eos_token_id) +
                             ") vs transformers CLIPTextModel: ";
    expect_close(out.last_hidden_state, io.read("last_hidden_state"), what + "last hidden state");
    expect_close(out.pooled, io.read("pooled"), what + "pooled output");
  }
}

TEST(TextEncoders, T5RelativeBucketsFollowTheLogScale) {
  // 32 buckets, max distance 128: 16 per direction, exact below 8, then logarithmic up to 15.
  const at::Tensor rel = at::tensor({0, 1, 7, 8, 12, 20, 64, 127, 1000, -1, -8, -1000}, at::kLong);
  const at::Tensor got = encoders::t5_relative_buckets(rel, 32, 128);
  // 8 + floor(log(n / 8) / log(16) * 8): 12 -> 8 + 1.17 = 9, 20 -> 8 + 2.64 = 10,
  // 64 -> 8 + 6 = 14, 127 -> 8 + 7.98 = 15; positive offsets add 16.
  const at::Tensor want = at::tensor({0, 17, 23, 24, 25, 26, 30, 31, 31, 1, 8, 15}, at::kLong);
  EXPECT_TRUE(at::equal(got, want)) << got;
}

TEST(TextEncoders, LoaderNamesWhatIsMissingOrExtra) {
  encoders::T5Args args;
  args.vocab_size = 10;
  args.d_model = 8;
  args.d_kv = 4;
  args.d_ff = 8;
  args.num_layers = 1;
  args.num_heads = 2;
  encoders::T5Encoder t5(args);
  TensorMap tensors;
  for (const auto& item : t5.named_parameters()) tensors[item.key()] = item.value().clone();
  TensorMap missing = tensors;
  missing.erase("encoder.block.0.layer.1.DenseReluDense.wo.weight");
  try {
    encoders::load_named_tensors(t5, missing, "t5");
    ADD_FAILURE() << "no error";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("t5: the weights lack "
                                         "'encoder.block.0.layer.1.DenseReluDense.wo.weight'"),
              std::string::npos)
        << e.what();
  }
  TensorMap extra = tensors;
  extra["lm_head.weight"] = at::zeros({10, 8});
  try {
    encoders::load_named_tensors(t5, extra, "t5");
    ADD_FAILURE() << "no error";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("'lm_head.weight' is not a parameter"), std::string::npos)
        << e.what();
  }
  TensorMap wrong = tensors;
  wrong["shared.weight"] = at::zeros({11, 8});
  EXPECT_THROW(encoders::load_named_tensors(t5, wrong, "t5"), DataError);
}

}  // namespace text_encoder_test
}  // namespace titan
