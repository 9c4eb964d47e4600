// Memory estimates: exactly the model's own activation figure at ordinary sizes, finite (no
// int64 overflow) at absurd ones, and a refusal only far above the memory given.
#include "titan/common/check.h"
#include "titan/config/job_config.h"
#include "titan/kernels/nf4.h"
#include "titan/models/common/rope.h"
#include "titan/models/lora.h"
#include "titan/models/registry.h"
#include "titan/plan/memory_estimate.h"
#include "titan/plan/memory_options.h"

#include <gtest/gtest.h>

#include <cmath>

namespace titan {
namespace test_memory_estimate {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

double part(const MemoryEstimate& e, const std::string& name) {
  for (const auto& p : e.parts) {
    if (p.name == name) return p.bytes;
  }
  ADD_FAILURE() << "no part " << name;
  return 0;
}

std::string refusal(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(MemoryEstimate, MatchesTheModelStatsAtOrdinarySizes) {
  const ModelSpec& spec = get_model_spec("llama3");
  const ModelStats s = spec.describe("debugmodel", 8, 256, at::kBFloat16);
  const MemoryEstimate e = estimate_training_memory(spec, "debugmodel", 8, 256, at::kBFloat16);
  EXPECT_DOUBLE_EQ(part(e, "activations (estimate)"), static_cast<double>(s.activation_bytes));
  EXPECT_DOUBLE_EQ(part(e, "weights (fp32)"), 4.0 * s.n_params);
  EXPECT_DOUBLE_EQ(part(e, "optimizer (AdamW fp32)"), 8.0 * s.n_params);
  EXPECT_DOUBLE_EQ(part(e, "bf16 weight copies"), 2.0 * s.n_params);
  EXPECT_DOUBLE_EQ(part(e, "RoPE tables"), rope_table_bytes(s.head_dim, 256));
  // Sharding divides the parameter state, tensor parallelism the activations.
  MemoryOptions layout;
  layout.param_shards = 4;
  layout.activation_shards = 2;
  const MemoryEstimate sharded =
      estimate_training_memory(spec, "debugmodel", 8, 256, at::kBFloat16, layout);
  EXPECT_DOUBLE_EQ(part(sharded, "weights (fp32)"), s.n_params);
  EXPECT_DOUBLE_EQ(part(sharded, "activations (estimate)"), s.activation_bytes / 2.0);
  // Context parallelism divides the activations only (each rank holds seq / cp of a sequence).
  layout.sequence_shards = 4;
  const MemoryEstimate cp =
      estimate_training_memory(spec, "debugmodel", 8, 256, at::kBFloat16, layout);
  EXPECT_DOUBLE_EQ(part(cp, "activations (estimate)"), s.activation_bytes / 8.0);
  EXPECT_DOUBLE_EQ(part(cp, "bf16 weight copies"), part(sharded, "bf16 weight copies"));
  // FSDP alone (param_shards beyond tp): the block running and those prefetched, of 6 blocks.
  MemoryOptions fsdp;
  fsdp.param_shards = 4;
  const double copies = 2.0 * static_cast<double>(s.n_params);
  EXPECT_DOUBLE_EQ(part(estimate_training_memory(spec, "debugmodel", 8, 256, at::kBFloat16, fsdp),
                        "bf16 weight copies"),
                   copies * 2 / 6);
  fsdp.fsdp_prefetch_units = 2;
  EXPECT_DOUBLE_EQ(part(estimate_training_memory(spec, "debugmodel", 8, 256, at::kBFloat16, fsdp),
                        "bf16 weight copies"),
                   copies * 3 / 6);
}

// The debug model with the default [lora] (rank 8 on wq and wv).
JobConfig debugmodel_with_lora() {
  JobConfig c;
  c.model.name = "llama3";
  c.model.flavor = "debugmodel";
  c.model.hf_assets_path = "";
  c.model.converters = {"lora"};
  return c;
}

// LoRA: gradients and AdamW moments for the adapters only, counted on the model the run builds.
TEST(MemoryEstimate, LoraHoldsGradientsAndAdamStateForTheAdaptersOnly) {
  JobConfig c = debugmodel_with_lora();
  // The default [lora]: rank 8 on wq and wv, each (256 x 256) in debugmodel's 6 blocks:
  // r (in + out) elements per adapted layer.
  const int64_t adapters = 6 * 2 * 8 * (256 + 256);
  EXPECT_EQ(lora_trained_params(c.model, c.lora), adapters);
  const MemoryOptions o = training_memory_options(c, 2);
  EXPECT_EQ(o.trained_params, adapters);
  const ModelSpec& spec = get_model_spec("llama3");
  const ModelStats s = spec.describe("debugmodel", 8, 256, at::kBFloat16);
  const MemoryEstimate e = estimate_training_memory(spec, "debugmodel", 8, 256, at::kBFloat16, o);
  EXPECT_DOUBLE_EQ(part(e, "weights (fp32)"), 4.0 * (s.n_params + adapters) / 2);
  EXPECT_DOUBLE_EQ(part(e, "gradients (fp32, LoRA adapters)"), 4.0 * adapters / 2);
  EXPECT_DOUBLE_EQ(part(e, "optimizer (AdamW fp32, LoRA adapters)"), 8.0 * adapters / 2);
  c.lora.target_modules = {kAllLinear};
  c.lora.rank = 4;
  // + wk (256 x 256), wo (256 x 256), w1 and w3 (768 x 256), w2 (256 x 768).
  EXPECT_EQ(lora_trained_params(c.model, c.lora), 6 * 4 * (4 * (256 + 256) + 3 * (768 + 256)));
  c.model.converters.clear();
  EXPECT_EQ(training_memory_options(c, 2).trained_params, -1);
}

TEST(MemoryEstimate, MuonKeepsOneMomentumPerMatrix) {
  JobConfig c;
  c.model.flavor = "debugmodel";
  c.optimizer.name = "Muon";
  const MemoryOptions o = training_memory_options(c, 2);
  const ModelSpec& spec = get_model_spec("llama3");
  const ModelStats s = spec.describe("debugmodel", 8, 256, at::kBFloat16);
  // The embedding and the output head (2048 x 256 each) keep AdamW's two moments, the rest one
  // momentum buffer: n + 2 * 2048 * 256 states, over 2 shards.
  const double adamw = 2.0 * 2048 * 256;
  EXPECT_NEAR(o.muon_share, 1.0 - adamw / static_cast<double>(s.n_params), 1e-12);
  const MemoryEstimate e = estimate_training_memory(spec, "debugmodel", 8, 256, at::kBFloat16, o);
  EXPECT_NEAR(part(e, "optimizer (Muon + AdamW fp32)"), 4.0 * (s.n_params + adamw) / 2, 1e-3);
  c.optimizer.name = "AdamW";
  EXPECT_EQ(training_memory_options(c, 2).muon_share, 0);
}

TEST(MemoryEstimate, Bf16OptimizerStatesHalveTheOptimizer) {
  JobConfig c;
  c.model.flavor = "debugmodel";
  c.optimizer.state_dtype = "bfloat16";
  const MemoryOptions o = training_memory_options(c, 1);
  EXPECT_TRUE(o.bf16_optimizer_state);
  const ModelSpec& spec = get_model_spec("llama3");
  const ModelStats s = spec.describe("debugmodel", 8, 256, at::kBFloat16);
  const MemoryEstimate e = estimate_training_memory(spec, "debugmodel", 8, 256, at::kBFloat16, o);
  EXPECT_DOUBLE_EQ(part(e, "weights (fp32)"), 4.0 * s.n_params);
  EXPECT_DOUBLE_EQ(part(e, "optimizer (AdamW bf16)"), 4.0 * s.n_params);
  c.optimizer.name = "Muon";
  const MemoryEstimate m = estimate_training_memory(spec, "debugmodel", 8, 256, at::kBFloat16,
                                                    training_memory_options(c, 1));
  EXPECT_NEAR(part(m, "optimizer (Muon + AdamW bf16)"), 2.0 * (s.n_params + 2.0 * 2048 * 256),
              1e-3);
}

// QLoRA: the frozen linear weights of the blocks in NF4 (4.13 bits each, whole on the rank), no
// bf16 copies of them; the embedding, norms and output head stay in the weights' dtype.
TEST(MemoryEstimate, QloraHoldsTheFrozenBlockLinearsInNf4) {
  JobConfig c = debugmodel_with_lora();
  EXPECT_EQ(qlora_base_params(c.model, c.lora), 0);  // quantize_base unset
  c.lora.quantize_base = "nf4";
  // Every linear layer of debugmodel's 6 blocks: wq, wk, wv, wo (256 x 256), w1, w2, w3 (768 x
  // 256), adapted or not (the adapted ones keep a frozen base weight too).
  const int64_t base = 6 * (4 * 256 * 256 + 3 * 768 * 256);
  EXPECT_EQ(qlora_base_params(c.model, c.lora), base);
  const MemoryOptions o = training_memory_options(c, 1);
  EXPECT_EQ(o.nf4_base_params, base);
  const int64_t adapters = 6 * 2 * 8 * (256 + 256);
  const ModelSpec& spec = get_model_spec("llama3");
  const ModelStats s = spec.describe("debugmodel", 8, 256, at::kBFloat16);
  const MemoryEstimate e = estimate_training_memory(spec, "debugmodel", 8, 256, at::kBFloat16, o);
  EXPECT_DOUBLE_EQ(part(e, "weights (fp32)"), 4.0 * (s.n_params - base + adapters));
  EXPECT_DOUBLE_EQ(part(e, "frozen base (NF4, QLoRA)"), base * kernels::nf4_bytes_per_weight());
  EXPECT_DOUBLE_EQ(part(e, "bf16 weight copies"), 2.0 * (s.n_params - base));
  // 4 bits per code, 8 per scale of 64 codes, 32 per scale of 256 scales: 4.127 bits.
  EXPECT_NEAR(8 * kernels::nf4_bytes_per_weight(), 4.0 + 8.0 / 64 + 32.0 / (64 * 256), 1e-12);
  // The real thing holds what the estimate says, but for a few fixed bytes per tensor.
  const kernels::Nf4Weight w = kernels::nf4_quantize(at::randn({768, 256}));
  EXPECT_NEAR(static_cast<double>(w.nbytes()), 768 * 256 * kernels::nf4_bytes_per_weight(), 8.0);
}

// Activation checkpointing: a checkpointed block keeps its input (full, every Nth) or its costly
// ops' outputs (op), plus one block's worth recomputed at a time; full bf16 training halves the
// parameter state and drops the copies.
TEST(MemoryEstimate, CountsActivationCheckpointingAndBf16Training) {
  const ModelSpec& spec = get_model_spec("llama3");
  const ModelStats s = spec.describe("debugmodel", 8, 256, at::kFloat);
  const std::string none_part = "activations (estimate)";
  const double none =
      part(estimate_training_memory(spec, "debugmodel", 8, 256, at::kFloat), none_part);
  auto with_ac = [&](int64_t every, bool per_op, const std::string& name) {
    MemoryOptions o;
    o.ac_every = every;
    o.ac_per_op = per_op;
    return part(estimate_training_memory(spec, "debugmodel", 8, 256, at::kFloat, o), name);
  };
  const double L = static_cast<double>(s.n_layers);  // 6
  const double block = static_cast<double>(s.block_activation_bytes);
  const double input = static_cast<double>(s.block_input_bytes);
  // The last block's recomputation adds its activations back when it is checkpointed (the
  // blocks after any other one are freed by the time it recomputes).
  const double full = with_ac(1, false, "activations (estimate, full AC)");
  EXPECT_DOUBLE_EQ(full, none - (L - 1) * (block - input));
  const double every2 = with_ac(2, false, "activations (estimate, selective 2 AC)");
  EXPECT_DOUBLE_EQ(every2, none - 2 * (block - input));  // blocks 1, 3, 5 (the last)
  const double every4 = with_ac(4, false, "activations (estimate, selective 4 AC)");
  EXPECT_DOUBLE_EQ(every4, none - 1 * (block - input));  // block 3
  const double op = with_ac(0, true, "activations (estimate, selective op AC)");
  EXPECT_LT(full, op);
  EXPECT_LT(op, every2);
  EXPECT_LT(every2, every4);
  EXPECT_LT(every4, none);
  // More checkpointing than blocks: nothing checkpointed.
  EXPECT_DOUBLE_EQ(with_ac(7, false, "activations (estimate, selective 7 AC)"), none);

  MemoryOptions bf16;
  bf16.bf16_state = true;
  const MemoryEstimate e =
      estimate_training_memory(spec, "debugmodel", 8, 256, at::kBFloat16, bf16);
  EXPECT_DOUBLE_EQ(part(e, "weights (bf16)"), 2.0 * s.n_params);
  EXPECT_DOUBLE_EQ(part(e, "gradients (bf16)"), 2.0 * s.n_params);
  EXPECT_DOUBLE_EQ(part(e, "optimizer (AdamW bf16)"), 4.0 * s.n_params);
  for (const auto& p : e.parts) EXPECT_NE(p.name, "bf16 weight copies");
}

TEST(MemoryEstimate, AbsurdSizesStayFiniteAndHuge) {
  const ModelSpec& spec = get_model_spec("llama3");
  const MemoryEstimate e =
      estimate_training_memory(spec, "8B", /*batch=*/100000000, /*seq_len=*/1000000000, at::kFloat);
  EXPECT_TRUE(std::isfinite(e.total()));
  EXPECT_GT(e.total(), 1e21);  // logits alone: 1e17 tokens x 128256 ids x 4 bytes
  EXPECT_GT(e.token_bytes(), 0.99 * e.total());
}

TEST(MemoryEstimate, RefusesOnlyFarAboveTheMemory) {
  const ModelSpec& spec = get_model_spec("llama3");
  const MemoryEstimate normal = estimate_training_memory(spec, "debugmodel", 8, 256, at::kBFloat16);
  EXPECT_EQ(refusal([&] { check_fits_in_memory(normal, 1 * kGiB, "debug", "hint"); }), "");
  EXPECT_EQ(refusal([&] { check_fits_in_memory(normal, 0, "unknown memory", "hint"); }), "");
  // Above the memory but within the margin: allowed.
  EXPECT_EQ(refusal([&] { check_fits_in_memory(normal, normal.total() / 1.5, "x", "h"); }), "");
  const MemoryEstimate huge =
      estimate_training_memory(spec, "debugmodel", 8, 1000000000, at::kBFloat16);
  const std::string msg = refusal([&] {
    check_fits_in_memory(huge, 16 * kGiB, "training with training.seq_len 1000000000",
                         "lower training.seq_len");
  });
  EXPECT_NE(msg.find("training with training.seq_len 1000000000 needs about"), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("activations (estimate)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("the 16.000 GiB this machine has"), std::string::npos) << msg;
  EXPECT_NE(msg.find("HINT: lower training.seq_len"), std::string::npos) << msg;
}

// Every model build passes the RoPE tables: a sequence length whose tables alone exceed the
// machine is a ConfigError before anything is allocated (it was a raw allocator error).
TEST(MemoryEstimate, RopeTablesLargerThanTheMachineAreRefused) {
  const std::string msg = refusal([] {
    RotaryEmbedding rope(/*head_dim=*/64, /*max_seq_len=*/int64_t{1} << 40, 500000.0, nullptr);
  });
  EXPECT_NE(msg.find("RoPE tables for max_seq_len 1099511627776 positions (head_dim 64)"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("--max_seq_len for `titan generate`, training.seq_len"), std::string::npos)
      << msg;
  RotaryEmbedding ok(64, 4096, 500000.0, nullptr);
  EXPECT_EQ(ok.cos.size(0), 4096);
}

}  // namespace test_memory_estimate
}  // namespace titan
