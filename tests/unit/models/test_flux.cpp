// FLUX.1's transformer (models/flux): against diffusers' FluxTransformer2DModel on tiny random
// folders (written by tests/e2e/flux_reference.py, run by test_flux.sh), float64 gradients
// against central differences, the analytic parameter counts, the units, and the refusals.
#include "titan/checkpoint/safetensors.h"
#include "titan/common/check.h"
#include "titan/models/flux/autoencoder.h"
#include "titan/models/flux/hf_adapter.h"
#include "titan/models/flux/latents.h"
#include "titan/models/flux/model.h"

#include "finite_difference.h"
#include "flux_fixture.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <set>
#include <string>

namespace titan {
namespace flux_test {

using flux::FluxArgs;

// `fn` throws an E whose message contains `text`.
template <typename E>
void expect_throw_with(const std::function<void()>& fn, const std::string& text) {
  try {
    fn();
    ADD_FAILURE() << "nothing thrown; wanted: " << text;
  } catch (const E& e) {
    EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
  }
}
using flux::FluxTransformer;

using namespace test::flux_fixture;  // tiny_args, randomize, Batch, image_ids, make_batch

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  return nlohmann::json::parse(in);
}

TEST(FluxDiffusers, MatchesDiffusers) {
  const char* dir = std::getenv("TITAN_FLUX_FIXTURE");
  if (dir == nullptr) GTEST_SKIP() << "run by tests/e2e/test_flux.sh";
  for (const std::string variant : {"schnell", "dev"}) {
    SCOPED_TRACE(variant);
    const std::string folder = std::string(dir) + "/" + variant;
    const FluxArgs args = flux::from_diffusers_config(read_json(folder + "/config.json"));
    EXPECT_EQ(args.guidance_embed, variant == "dev");
    const ckpt::SafetensorsReader weights(folder + "/diffusion_pytorch_model.safetensors");
    TensorMap hf;
    for (const auto& entry : weights.entries()) hf[entry.name] = weights.read(entry.name);
    const TensorMap ours = flux::from_diffusers(hf, args);

    FluxTransformer model(args);
    {
      at::NoGradGuard no_grad;
      auto params = model.named_parameters();
      EXPECT_EQ(params.size(), ours.size());
      for (auto& item : params) item.value().copy_(ours.at(item.key()));
    }
    // Back to diffusers' names: the same tensors, bit for bit.
    TensorMap mine;
    for (const auto& item : model.named_parameters()) mine[item.key()] = item.value();
    const TensorMap back = flux::to_diffusers(mine, args);
    EXPECT_EQ(back.size(), hf.size());
    for (const auto& [name, tensor] : hf) {
      ASSERT_TRUE(back.count(name)) << name;
      EXPECT_TRUE(at::equal(back.at(name), tensor)) << name;
    }

    const ckpt::SafetensorsReader io(folder + "/io.safetensors");
    ForwardInputs inputs;
    inputs.conditioning["txt"] = io.read("encoder_hidden_states");
    inputs.conditioning["y"] = io.read("pooled_projections");
    inputs.conditioning["timesteps"] = io.read("timestep");
    inputs.conditioning["img_ids"] = io.read("img_ids");
    inputs.conditioning["txt_ids"] = io.read("txt_ids");
    if (args.guidance_embed) inputs.conditioning["guidance"] = io.read("guidance");
    at::NoGradGuard no_grad;
    const at::Tensor out = model.forward(io.read("hidden_states"), inputs);
    const at::Tensor want = io.read("sample");
    ASSERT_EQ(out.sizes(), want.sizes());
    const double err = (out - want).abs().max().item<double>();
    const double scale = want.abs().max().item<double>();
    EXPECT_LT(err, 1e-5 * std::max(1.0, scale));
    std::printf(
        "flux (%s) vs diffusers FluxTransformer2DModel: output %s, max abs diff %.3g (max |out| "
        "%.3g); %zu tensors round-trip bit for bit\n",
        variant.c_str(), "(2, 12, 16)", err, scale, hf.size());
  }
}

TEST(FluxDiffusers, AutoencoderMatchesDiffusers) {
  const char* dir = std::getenv("TITAN_FLUX_FIXTURE");
  if (dir == nullptr) GTEST_SKIP() << "run by tests/e2e/test_flux.sh";
  const std::string folder = std::string(dir) + "/vae";
  const flux::AutoEncoderArgs args =
      flux::ae_args_from_diffusers(read_json(folder + "/config.json"));
  EXPECT_EQ(args.ch_mult, (std::vector<int64_t>{1, 2, 2}));
  const ckpt::SafetensorsReader weights(folder + "/diffusion_pytorch_model.safetensors");
  TensorMap hf;
  for (const auto& entry : weights.entries()) hf[entry.name] = weights.read(entry.name);
  const TensorMap ours = flux::ae_from_diffusers(hf, args);
  flux::AutoEncoder ae(args);
  at::NoGradGuard no_grad;
  auto params = ae.named_parameters();
  EXPECT_EQ(params.size(), ours.size());
  for (auto& item : params) item.value().copy_(ours.at(item.key()));

  const ckpt::SafetensorsReader io(folder + "/io.safetensors");
  const auto expect_close = [](const at::Tensor& got, const at::Tensor& want, const char* what) {
    ASSERT_EQ(got.sizes(), want.sizes()) << what;
    const double err = (got - want).abs().max().item<double>();
    const double scale = want.abs().max().item<double>();
    EXPECT_LT(err, 1e-5 * std::max(1.0, scale)) << what;
    std::printf("flux autoencoder vs diffusers AutoencoderKL: %s max abs diff %.3g (max %.3g)\n",
                what, err, scale);
  };
  const at::Tensor image = io.read("image");
  expect_close(ae.encoder->forward(image), io.read("moments"), "encoder moments");
  expect_close(ae.encode(image), io.read("latents"), "latents (mean, scaled and shifted)");
  expect_close(ae.decode(io.read("decode_in")), io.read("decoded"), "decoded image");
  // A sample lies around the mean by the encoder's standard deviation.
  auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
  const at::Tensor sampled = ae.encode(image, gen);
  EXPECT_FALSE(at::allclose(sampled, io.read("latents")));
}

// Writes a diffusers AutoencoderKL folder's weights in black-forest-labs' names (ours), as their
// ae.safetensors holds them, for tests/e2e/test_flux.sh to load through
// encoder.autoencoder_path = FILE (the released file itself cannot be downloaded here).
TEST(FluxFixture, WritesTheAutoencoderInBlackForestLabsNames) {
  const char* dir = std::getenv("TITAN_FLUX_AE_FOLDER");
  const char* out = std::getenv("TITAN_FLUX_AE_FILE");
  if (dir == nullptr || out == nullptr) GTEST_SKIP() << "run by tests/e2e/test_flux.sh";
  const std::string folder(dir);
  const flux::AutoEncoderArgs args =
      flux::ae_args_from_diffusers(read_json(folder + "/config.json"));
  const ckpt::SafetensorsReader weights(folder + "/diffusion_pytorch_model.safetensors");
  TensorMap hf;
  for (const auto& entry : weights.entries()) hf[entry.name] = weights.read(entry.name);
  const TensorMap ours = flux::ae_from_diffusers(hf, args);
  std::vector<std::pair<std::string, at::Tensor>> tensors(ours.begin(), ours.end());
  ckpt::write_safetensors(out, tensors);
  std::printf("wrote %zu autoencoder tensors in black-forest-labs' names to %s\n", tensors.size(),
              out);
}

TEST(Flux, GradientsMatchCentralDifferences) {
  const FluxArgs args = tiny_args();
  FluxTransformer model(args);
  model.to(at::kDouble);
  randomize(model, 3);
  const Batch b = make_batch(args, at::kDouble, 4);
  const auto loss = [&] { return model.forward(b.img, b.inputs).pow(2).mean(); };
  model.zero_grad();
  loss().backward();
  test::expect_top_gradients_match(
      model,
      {"img_in.weight", "txt_in.bias.weight", "time_in.in_layer.weight",
       "guidance_in.out_layer.weight", "vector_in.in_layer.weight",
       "double_blocks.0.img_mod.lin.weight", "double_blocks.0.txt_attn.qkv.weight",
       "double_blocks.1.img_attn.norm.key_norm.weight", "double_blocks.1.txt_mlp.2.weight",
       "single_blocks.0.linear1.weight", "single_blocks.0.norm.query_norm.weight",
       "single_blocks.0.modulation.lin.bias.weight", "final_layer.adaLN_modulation.1.weight",
       "final_layer.linear.weight"},
      loss);
}

TEST(Flux, SharedAndPerSamplePositionsAgree) {
  const FluxArgs args = tiny_args(/*guidance=*/false);
  FluxTransformer model(args);
  randomize(model, 5);
  Batch b = make_batch(args, at::kFloat, 6);
  at::NoGradGuard no_grad;
  const at::Tensor shared = model.forward(b.img, b.inputs);
  for (const char* key : {"img_ids", "txt_ids"}) {
    b.inputs.conditioning[key] = b.inputs.conditioning[key].unsqueeze(0).expand({2, -1, -1});
  }
  EXPECT_TRUE(at::allclose(model.forward(b.img, b.inputs), shared, 1e-6, 1e-6));
  // Each sample on its own gives its row of the batch.
  Batch one = b;
  one.img = b.img.narrow(0, 1, 1);
  for (auto& [key, t] : one.inputs.conditioning) t = t.narrow(0, 1, 1);
  EXPECT_TRUE(at::allclose(model.forward(one.img, one.inputs), shared.narrow(0, 1, 1), 1e-5, 1e-5));
}

TEST(Flux, InitStartsEveryBlockAsTheIdentityAndTheOutputAtZero) {
  const FluxArgs args = tiny_args();
  FluxTransformer model(args);
  model.init_weights(7);
  const Batch b = make_batch(args, at::kFloat, 8);
  at::NoGradGuard no_grad;
  // The final layer is zero-initialized (DiT), so the first prediction is zero.
  EXPECT_EQ(model.forward(b.img, b.inputs).abs().max().item<double>(), 0.0);
  const auto params = model.named_parameters();
  EXPECT_GT(params["img_in.weight"].abs().max().item<double>(), 0.0);
  EXPECT_EQ(params["double_blocks.0.img_mod.lin.weight"].abs().max().item<double>(), 0.0);
  EXPECT_EQ(params["single_blocks.0.norm.key_norm.weight"].min().item<double>(), 1.0);
  const double bound = std::sqrt(6.0 / (48 + 16));  // xavier-uniform of qkv (48, 16)
  EXPECT_LE(params["double_blocks.0.img_attn.qkv.weight"].abs().max().item<double>(), bound);
}

TEST(Flux, ParameterCountsMatchTheModulesAndTheReleasedModel) {
  for (const std::string& flavor : {std::string("debugmodel"), std::string("flux-debug")}) {
    const FluxArgs args = flux::args_for_flavor(flavor);
    ParamDeviceGuard meta(at::kMeta);
    FluxTransformer model(args);
    int64_t n = 0;
    for (const auto& p : model.parameters()) n += p.numel();
    EXPECT_EQ(n, flux::count_params(args)) << flavor;
  }
  // FLUX.1-dev's transformer as released: 11,901,408,320 parameters (with the guidance
  // embedder); schnell lacks the guidance embedder's 256 * 3072 + 3072 + 3072 * 3072 + 3072.
  EXPECT_EQ(flux::count_params(flux::args_for_flavor("flux-dev")), 11901408320LL);
  EXPECT_EQ(flux::count_params(flux::args_for_flavor("flux-schnell")),
            11901408320LL - (256 * 3072 + 3072 + 3072 * 3072 + 3072));
}

TEST(Flux, UnitsHoldEveryParameterOnce) {
  FluxTransformer model(tiny_args());
  std::set<std::string> seen;
  const std::vector<ModelUnit> units = model.units();
  ASSERT_EQ(units.size(), 2u + 2u + 1u + 1u);
  EXPECT_EQ(units[0].name, "time_in, vector_in, guidance_in");
  EXPECT_EQ(units[2].block, 0);
  EXPECT_EQ(units[4].block, 2);
  for (const ModelUnit& unit : units) {
    EXPECT_FALSE(unit.params.empty()) << unit.name;
    for (const std::string& p : unit.params) EXPECT_TRUE(seen.insert(p).second) << p;
  }
  EXPECT_EQ(seen.size(), model.named_parameters().size());
}

TEST(Flux, RefusesBadArgsAndMissingConditioning) {
  FluxArgs bad = tiny_args();
  bad.axes_dim = {2, 2, 2};
  expect_throw_with<ConfigError>([&] { bad.validate(); },
                                 "2 + 2 + 2 = 6 != hidden_size / num_heads = 16 / 2 = 8");
  bad = tiny_args();
  bad.num_heads = 3;
  expect_throw_with<ConfigError>([&] { bad.validate(); }, "16 % 3 = 1");
  expect_throw_with<ConfigError>([] { flux::args_for_flavor("flux-deb"); }, "flux-debug");

  const FluxArgs args = tiny_args();
  FluxTransformer model(args);
  Batch b = make_batch(args, at::kFloat, 9);
  b.inputs.conditioning.erase("guidance");
  expect_throw_with<ConfigError>([&] { model.forward(b.img, b.inputs); },
                                 "needs the conditioning 'guidance' (2)");
  b = make_batch(args, at::kFloat, 9);
  b.inputs.conditioning["y"] = at::zeros({2, 5});
  expect_throw_with<ConfigError>([&] { model.forward(b.img, b.inputs); },
                                 "'y' must be (2, 6), got [2, 5]");
  EXPECT_NE(model.refuses("pipeline").find("HINT"), std::string::npos);
  EXPECT_EQ(model.refuses("tensor"), "");  // tests/unit/parallel/test_flux_tensor_parallel.cpp
}

TEST(FluxDiffusers, ConfigRoundTripsAndRefusesWhatItCannotHold) {
  const FluxArgs args = flux::args_for_flavor("flux-dev");
  const nlohmann::json config = flux::to_diffusers_config(args);
  EXPECT_EQ(config["attention_head_dim"], 128);
  EXPECT_EQ(config["joint_attention_dim"], 4096);
  const FluxArgs back = flux::from_diffusers_config(config);
  EXPECT_EQ(flux::args_to_json(back), flux::args_to_json(args));
  nlohmann::json patched = config;
  patched["patch_size"] = 2;
  expect_throw_with<ConfigError>([&] { flux::from_diffusers_config(patched); },
                                 "patch_size 2 is not supported");
  patched = config;
  patched["mlp_ratio"] = 3;
  expect_throw_with<ConfigError>([&] { flux::from_diffusers_config(patched); }, "'mlp_ratio'");
  // A tensor of the wrong width, and one this configuration lacks, are named.
  const FluxArgs tiny = tiny_args();
  FluxTransformer model(tiny);
  TensorMap ours;
  for (const auto& item : model.named_parameters()) ours[item.key()] = item.value();
  TensorMap hf = flux::to_diffusers(ours, tiny);
  hf["transformer_blocks.0.attn.to_k.weight"] = at::zeros({4, 16});
  expect_throw_with<DataError>([&] { flux::from_diffusers(hf, tiny); },
                               "'transformer_blocks.0.attn.to_k.weight' is [4, 16]");
  hf = flux::to_diffusers(ours, tiny);
  hf["transformer_blocks.7.attn.to_k.weight"] = at::zeros({16, 16});
  expect_throw_with<DataError>([&] { flux::from_diffusers(hf, tiny); },
                               "unknown diffusers tensor 'transformer_blocks.7.attn.to_k");
}

TEST(FluxSampling, ScheduleIsBlackForestLabs) {
  // Unshifted: 1, 0.75, 0.5, 0.25, 0.
  const std::vector<double> linear = flux::flow_schedule(4, 256, /*shift=*/false);
  ASSERT_EQ(linear.size(), 5u);
  EXPECT_DOUBLE_EQ(linear[1], 0.75);
  // Shifted at 256 image tokens: mu = 0.5, t' = e^mu / (e^mu + 1 / t - 1).
  const std::vector<double> shifted = flux::flow_schedule(4, 256, /*shift=*/true);
  EXPECT_DOUBLE_EQ(shifted[0], 1.0);
  EXPECT_NEAR(shifted[1], std::exp(0.5) / (std::exp(0.5) + 1.0 / 0.75 - 1.0), 1e-15);
  EXPECT_NEAR(shifted[1], 0.83183, 1e-5);
  EXPECT_EQ(shifted[4], 0.0);
  // At 4096 tokens mu = 1.15: later times move further toward the noise.
  EXPECT_NEAR(flux::flow_schedule(4, 4096, true)[2], std::exp(1.15) / (std::exp(1.15) + 1.0),
              1e-12);
}

TEST(FluxSampling, EulerFollowsStraightPathsToTheirEnd) {
  // On the path x_t = (1 - t) x* + t e the velocity is e - x* = (x - x*) / t; Euler steps
  // along any schedule land on x* at t = 0 (exactly, up to rounding).
  const at::Tensor target = at::randn({2, 5}, at::kDouble);
  const at::Tensor noise = at::randn({2, 5}, at::kDouble);
  int calls = 0;
  const at::Tensor end = flux::euler_sample(noise, flux::flow_schedule(7, 1000, true),
                                            [&](const at::Tensor& x, double t) {
                                              ++calls;
                                              return (x - target) / t;
                                            });
  EXPECT_EQ(calls, 7);
  EXPECT_TRUE(at::allclose(end, target, 1e-12, 1e-12));
}

}  // namespace flux_test
}  // namespace titan
