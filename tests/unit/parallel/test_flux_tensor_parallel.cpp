// FLUX's tensor parallelism on 2 ranks (threads) against the unsplit model: whole activations
// between layers, the packed q/k/v and [q, k, v, MLP] / [attention, MLP] weights split part by
// part, biases with their rows: the same velocity, the gradient of every box (head-local norms
// summed over tp, whole ones not), and the whole parameters gathered back.
#include "../distributed/multirank.h"
#include "../models/flux_fixture.h"

#include "titan/models/flux/model.h"
#include "titan/parallel/tensor_parallel.h"

#include <gtest/gtest.h>

namespace titan {
namespace flux_tp_test {

using flux::FluxArgs;
using flux::FluxTransformer;
using test::run_ranks;
using test::run_ranks_collect;

using namespace test::flux_fixture;  // tiny_args, randomize, Batch, make_batch

// One double and two single blocks.
FluxArgs args() { return tiny_args(/*guidance=*/true, /*depth=*/1, /*single=*/2); }

// A rank-2 LoRA adapter on `layer` (as the LoRA converter adds one).
void add_adapter(Linear& layer) {
  const int64_t out = layer.weight.size(0), in = layer.weight.size(1);
  layer.lora_a = layer.register_module("lora_a", std::make_shared<Linear>(in, 2));
  layer.lora_b = layer.register_module("lora_b", std::make_shared<Linear>(2, out));
  layer.lora_scaling = 0.5;
}

// Every parameter random (the init's zero modulations would make each block the identity); with
// adapters on a column-wise packed, a row-wise, a gathered column-wise and a row-wise packed
// layer.
std::shared_ptr<FluxTransformer> make_model(bool adapters = false) {
  auto model = std::make_shared<FluxTransformer>(args());
  if (adapters) {
    add_adapter(*model->double_blocks[0]->img_attn->qkv);
    add_adapter(*model->double_blocks[0]->txt_attn->proj);
    add_adapter(*model->double_blocks[0]->img_mod->lin);
    add_adapter(*model->single_blocks[1]->linear2);
  }
  randomize(*model, 11);
  // float64: the split changes summation orders, and in float32 those alone move some small
  // gradients past the comparison's bounds.
  model->to(at::kDouble);
  return model;
}

// The velocity regressed onto.
at::Tensor target_velocity() {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(6);
  return at::randn({2, 6, args().out_channels}, gen, at::kDouble);
}

at::Tensor mse(const at::Tensor& out, const at::Tensor& target) {
  return (out - target).pow(2).mean();
}

void expect_close(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  EXPECT_TRUE(at::allclose(got, want, 1e-4, 1e-6))
      << what << ": max diff " << (got - want).abs().max().item<double>();
}

void check_tp2(bool adapters) {
  const Batch batch = make_batch(args(), at::kDouble, 5);
  const at::Tensor velocity = target_velocity();
  auto reference = make_model(adapters);
  const at::Tensor want = reference->forward(batch.img, batch.inputs);
  mse(want, velocity).backward();
  std::map<std::string, at::Tensor> params, grads;
  for (const auto& item : reference->named_parameters()) {
    params[item.key()] = item.value().detach();
    grads[item.key()] = item.value().grad();
  }

  std::vector<std::shared_ptr<FluxTransformer>> models = {make_model(adapters),
                                                          make_model(adapters)};
  run_ranks(2, [&](int rank, std::shared_ptr<dist::Group> world) {
    FluxTransformer& model = *models[rank];
    TensorParallel tp(model, world, /*loss_parallel=*/false);
    EXPECT_FALSE(tp.splits_logits());
    EXPECT_NE(tp.describe().find("whole activations"), std::string::npos) << tp.describe();

    // The packed layers hold slice `rank` of every part.
    const auto& qkv = tp.placements().at("double_blocks.0.img_attn.qkv.weight").box;
    ASSERT_TRUE(qkv.packed());
    EXPECT_EQ(qkv.runs.size(), 3u);
    EXPECT_EQ(qkv.runs[1].start, 16 + rank * 8);
    const auto& linear1 = tp.placements().at("single_blocks.0.linear1.weight").box;
    ASSERT_TRUE(linear1.packed());
    EXPECT_EQ(linear1.runs.back().start, 48 + rank * 32);
    EXPECT_EQ(linear1.runs.back().length, 32);
    const auto& linear2 = tp.placements().at("single_blocks.1.linear2.weight").box;
    ASSERT_TRUE(linear2.packed());
    EXPECT_EQ(linear2.packed_dim, 1);
    EXPECT_FALSE(tp.replicated("single_blocks.0.linear1.bias.weight"));
    EXPECT_TRUE(tp.replicated("single_blocks.0.linear2.bias.weight"));
    EXPECT_FALSE(tp.replicated("double_blocks.0.img_mod.lin.weight"));
    EXPECT_EQ(tp.placements().at("double_blocks.0.img_mod.lin.weight").box.offsets[0],
              rank * 48);  // 6 x 16 rows, a plain half
    EXPECT_TRUE(tp.replicated("double_blocks.0.img_mod.lin.bias.weight"));
    EXPECT_FALSE(tp.replicated("final_layer.adaLN_modulation.1.weight"));
    EXPECT_TRUE(tp.replicated("final_layer.linear.weight"));
    EXPECT_TRUE(tp.replicated("single_blocks.0.norm.key_norm.weight"));

    const at::Tensor out = model.forward(batch.img, batch.inputs);
    expect_close(out, want, "velocity on rank " + std::to_string(rank));
    mse(out, velocity).backward();
    NamedTensors local_grads;
    for (const auto& item : model.named_parameters()) {
      local_grads.emplace_back(item.key(), item.value().grad());
    }
    tp.reduce_replicated_grads(local_grads);
    for (const auto& [name, g] : local_grads) {
      const ParamPlacement& p = tp.placements().at(name);
      expect_close(g, p.box.narrow(grads.at(name), g.sizes()),
                   name + " gradient on rank " + std::to_string(rank));
    }
    for (const auto& item : model.named_parameters()) {
      expect_close(tp.gather_whole(item.key(), item.value().detach()), params.at(item.key()),
                   item.key() + " gathered on rank " + std::to_string(rank));
    }
    if (adapters) {
      EXPECT_FALSE(tp.replicated("double_blocks.0.img_attn.qkv.lora_b.weight"));
      EXPECT_TRUE(tp.placements().at("double_blocks.0.img_attn.qkv.lora_b.weight").box.packed());
      EXPECT_FALSE(tp.replicated("single_blocks.1.linear2.lora_a.weight"));
      EXPECT_TRUE(tp.replicated("double_blocks.0.txt_attn.proj.lora_b.weight"));
    }
  });
}

TEST(FluxTensorParallel, TwoRanksMatchOneProcess) { check_tp2(false); }

// LoRA adapters split with their layers; the halves they keep whole get partial gradients, summed.
TEST(FluxTensorParallel, TwoRanksMatchOneProcessWithLoraAdapters) { check_tp2(true); }

// A part that does not divide is refused naming the layer and the arithmetic.
TEST(FluxTensorParallel, RefusesPartsThatDoNotDivide) {
  // q, k and v parts of 16 rows over 3 ranks.
  std::vector<std::shared_ptr<FluxTransformer>> models;
  for (int r = 0; r < 3; ++r) models.push_back(std::make_shared<FluxTransformer>(args()));
  const std::vector<std::string> errors =
      run_ranks_collect(3, [&](int rank, std::shared_ptr<dist::Group> world) {
        TensorParallel tp(*models[rank], world, false);
      });
  for (const std::string& e : errors) {
    EXPECT_NE(e.find("double_blocks.0.img_attn.qkv.weight has 16 output features in part 0, not "
                     "divisible by tensor_parallel_degree 3 (16 % 3 = 1)"),
              std::string::npos)
        << e;
  }
}

}  // namespace flux_tp_test
}  // namespace titan
