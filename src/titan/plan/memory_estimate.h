// Memory that a training step needs, estimated from a model's analytic stats (nothing
// allocated). `titan inspect` prints it; `titan train` compares it with this machine's memory at
// start-up, so sizes that cannot fit (seq_len 1e9, a batch of 1e8) fail at once with the key
// named and the estimate shown, not with a raw allocator message. (`titan generate` is guarded
// by the RoPE tables' own check, models/common/rope.h: they are what grows with --max_seq_len.)
#pragma once

#include "titan/common/format.h"
#include "titan/models/registry.h"

#include <cstdint>
#include <string>
#include <vector>

namespace titan {

struct MemoryEstimate {
  struct Part {
    std::string name;                 // "weights (fp32)", "activations (estimate)", ...
    double bytes = 0;                 // per rank; double because absurd sizes overflow int64
    bool scales_with_tokens = false;  // grows with batch * sequence length
  };
  std::vector<Part> parts;

  double total() const;
  double token_bytes() const;  // the parts that scale with batch * sequence length
  // "weights (fp32) 0.02 GiB + ... = 12.3 GiB"
  std::string breakdown() const;
};

// The settings besides the sizes that change what a step needs per rank.
struct MemoryOptions {
  // FSDP shards weights, gradients and optimizer state over `param_shards` ranks; tensor and
  // pipeline parallelism split bf16 weight copies and activations over `activation_shards`
  // (tp x pp).
  int64_t param_shards = 1;
  int64_t activation_shards = 1;
  // Context parallelism splits every sequence over this many ranks: activations only.
  int64_t sequence_shards = 1;
  // Activation checkpointing (ac_policy, activation_checkpoint.h): checkpointed blocks (every
  // `ac_every`-th; 1 = full) keep their input, with `ac_per_op` every block keeps its costly ops'
  // outputs; during backward one block's activations come back at a time.
  int64_t ac_every = 0;
  bool ac_per_op = false;
  // training.dtype = "bfloat16": weights, gradients and AdamW moments in bf16, no copies.
  bool bf16_state = false;
  // Pipeline parallelism: a stage keeps activations for the microbatches in flight, not for the
  // whole local batch: this many sequences at the schedule's peak, in units of all the rank's
  // layers (see training_memory_options, plan/memory_options.h); 0: the whole batch.
  double pipeline_sequences_in_flight = 0;
  // FSDP keeps every unit gathered from its forward to its backward (reshard_after_forward
  // "never", the default under pipeline parallelism, so that microbatches do not gather again):
  // all the rank's bf16 weight copies are alive at once, not two blocks' worth.
  bool fsdp_keeps_gathered = false;
  int64_t fsdp_prefetch_units = 1;  // parallelism.fsdp_prefetch_units: gathered ahead of use
  // The routed experts of MoE layers, when they are not split like the dense weights: a rank's
  // bf16 copies hold 1 / expert_shards of them (pp x ep x etp: expert parallelism gives each rank
  // its own experts, etp = tp splits each expert over tp), its weights, gradients and optimizer
  // state 1 / expert_param_shards (param_shards, but param_shards / tp when the tp ranks keep
  // whole experts, replicated: tp > 1 without ep or etp). 0: as the dense weights.
  int64_t expert_shards = 0;
  int64_t expert_param_shards = 0;
  // LoRA (models/lora.h): only this many parameters are trained, the adapters, sharded as the
  // dense weights; gradients and AdamW moments exist for them alone. -1: every parameter.
  int64_t trained_params = -1;
  // optimizer.state_dtype = "bfloat16": the optimizer states in bf16 over float32 weights.
  bool bf16_optimizer_state = false;
  // Muon (optimizer.name): its matrices keep one momentum buffer instead of AdamW's two
  // moments; this share of the trained parameters is its (the rest, embeddings and output head,
  // take AdamW). 0: AdamW for every parameter.
  double muon_share = 0;
  // QLoRA (lora.quantize_base): this many of the frozen weights are held in NF4 (whole on every
  // rank, nf4_bytes_per_weight each) instead of the weights' dtype, and have no bf16 copies (a
  // layer dequantizes its weight for each matmul). 0: none.
  int64_t nf4_base_params = 0;
};

// Parameters of the routed experts of `flavor` (all MoE layers; 0 for a dense model), from the
// model's resolved arguments.
int64_t routed_expert_params(const ModelSpec& spec, const std::string& flavor);
// The MoE layers of resolved model arguments (ModelSpec::resolve_args): layers n_dense_layers on,
// every interleave_moe_layer_step-th of them where the key is there (Llama 4).
int64_t moe_layer_count(const nlohmann::json& args);

// One rank's training step on one micro-batch of (batch, seq_len) tokens with matmuls in
// `compute_dtype`: weights, gradients and AdamW moments (fp32, or bf16 with bf16_state), bf16
// weight copies (about two blocks' worth when FSDP gathers them unit by unit), the RoPE tables
// and the activations kept for backward, logits included.
MemoryEstimate estimate_training_memory(const ModelSpec& spec, const std::string& flavor,
                                        int64_t batch, int64_t seq_len,
                                        at::ScalarType compute_dtype,
                                        const MemoryOptions& options = {});

// A refusal needs the estimate above this multiple of the memory: the estimate is rough, and a
// run near the limit may still work (swap, smaller real activations); absurd sizes are far above.
constexpr double kMemoryRefuseFactor = 2.0;

// Throws ConfigError when need.total() > kMemoryRefuseFactor * available_bytes (0: unknown,
// never refuses). `what` says what needs it ("training llama3 debugmodel, local_batch_size 8 x
// seq_len 1000000000"); `hint` what to lower, with the keys; `where` whose memory it is.
void check_fits_in_memory(const MemoryEstimate& need, double available_bytes,
                          const std::string& what, const std::string& hint,
                          const std::string& where = "this machine");

}  // namespace titan
