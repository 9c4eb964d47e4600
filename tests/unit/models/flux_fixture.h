// A tiny FLUX transformer and its inputs, shared by the model's tests (test_flux.cpp) and its
// tensor-parallel ones (tests/unit/parallel/test_flux_tensor_parallel.cpp).
#pragma once

#include "titan/models/flux/args.h"
#include "titan/models/model.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/module.h>

#include <cstdint>

namespace titan::test::flux_fixture {

// Every feature at small sizes: heads of 8 over 3 rotary axes; `depth` double and `single`
// single-stream blocks; a guidance embedding unless told otherwise.
inline flux::FluxArgs tiny_args(bool guidance = true, int64_t depth = 2, int64_t single = 1) {
  flux::FluxArgs a;
  a.in_channels = 8;
  a.out_channels = 8;
  a.vec_in_dim = 6;
  a.context_in_dim = 10;
  a.hidden_size = 16;
  a.num_heads = 2;
  a.depth = depth;
  a.depth_single_blocks = single;
  a.axes_dim = {2, 2, 4};
  a.guidance_embed = guidance;
  return a;
}

// Every parameter random (the init zeroes the modulations, which would make each block the
// identity and hide most of the computation from a comparison).
inline void randomize(torch::nn::Module& model, uint64_t seed) {
  at::NoGradGuard no_grad;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  for (auto& p : model.parameters()) p.normal_(0.0, 0.3, gen);
}

// Inputs of one forward: packed latents (bs, rows * cols, in_channels) and the conditioning.
struct Batch {
  at::Tensor img;
  ForwardInputs inputs;
};

inline at::Tensor image_ids(int64_t rows, int64_t cols) {
  const at::Tensor r = at::arange(rows, at::kFloat).view({rows, 1}).expand({rows, cols});
  const at::Tensor c = at::arange(cols, at::kFloat).view({1, cols}).expand({rows, cols});
  return at::stack({at::zeros_like(r), r, c}, -1).view({rows * cols, 3});
}

// 2 samples of 2 x 3 latent patches and 3 text tokens.
inline Batch make_batch(const flux::FluxArgs& a, at::ScalarType dtype, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const auto opts = at::TensorOptions().dtype(dtype);
  const int64_t bs = 2, rows = 2, cols = 3, txt_len = 3;
  Batch b;
  b.img = at::randn({bs, rows * cols, a.in_channels}, gen, opts);
  b.inputs.conditioning["txt"] = at::randn({bs, txt_len, a.context_in_dim}, gen, opts);
  b.inputs.conditioning["y"] = at::randn({bs, a.vec_in_dim}, gen, opts);
  b.inputs.conditioning["timesteps"] = at::rand({bs}, gen, opts);
  b.inputs.conditioning["img_ids"] = image_ids(rows, cols);
  b.inputs.conditioning["txt_ids"] = at::zeros({txt_len, 3});
  if (a.guidance_embed) b.inputs.conditioning["guidance"] = at::full({bs}, 3.5, opts);
  return b;
}

}  // namespace titan::test::flux_fixture
