// Activation checkpointing (AC) with TorchTitan's [activation_checkpoint] keys: a checkpointed
// transformer block runs forward without autograd, keeping only its input (and the parameters it
// read); when backward reaches it, the block runs again with autograd and backward goes through
// that recomputation. Memory for activations drops to about one block's worth plus the block
// inputs; the price is a second forward of each checkpointed block.
//
//   TensorParallel tp(model, ...);                                     // 1. TP (hooks on modules)
//   auto ac = apply_activation_checkpointing(model, job.activation_checkpoint);  // 2. AC
//   DataParallel fsdp(model, ...);                                     // 3. FSDP, outermost
//
// The order is TorchTitan's parallelize order (TP, AC, FSDP): AC is a UnitRunner inside FSDP's,
// so FSDP has all-gathered a block's parameters before the checkpointed block runs, and has
// gathered them again (its pre-backward hook on the block's output) before the recomputation.
//
// Modes (activation_checkpoint.mode, selective_ac_option):
//   none             nothing is checkpointed (the factory returns null)
//   full             every transformer block
//   selective N      every Nth block: a counter over the blocks in order, incremented before the
//                    test, checkpoints the block when counter % N == 0 (N = 2: blocks 1, 3, 5, ...)
//   selective "op"   every block, per op (savable_ops.h): the forward keeps the outputs of
//                    matmuls (all but every second one of a block: the 2nd, 4th, ... are
//                    recomputed; matmuls of Linear layers named by
//                    per_op_sac_force_recompute_mm_shapes_by_fqns, by weight shape, are always
//                    recomputed and not counted), of the attention kernel (the fused kernels of
//                    TorchTitan's save list: flash, memory-efficient, cuDNN, the CPU flash
//                    kernel and titan's variable-length flash; SDPA's math backend is
//                    recomputed: savable_ops.h) and of tensor parallelism's reduce-scatters; the
//                    recomputation takes those instead of computing (or communicating) them and
//                    recomputes the rest (norms, RoPE, SiLU, casts, all-gathers).
//   memory_budget    refused (needs a graph compiler), as by config validation.
// Only units that are transformer blocks (ModelUnit::block >= 0) are checkpointed; a forward
// without autograd (validation) runs blocks plainly.
//
// Other keys:
//   preserve_rng_state  the recomputation replays the forward's CPU RNG state (and the device's
//                       for device inputs), so random ops (dropout) draw the same numbers.
//   determinism_check   "default": the recomputed block output must have the forward's shape,
//                       dtype and device, else backward fails naming the block; with "op", every
//                       kept result must be taken back, in order, by the same kind of op (an
//                       op replayed with a mismatched result is always an error). "none": the
//                       output check is skipped.
//   debug               logs every recomputation (block, kept results reused) and the largest
//                       difference between the recomputed and the forward output.
//   early_stop          not built: true is refused by the config (kNotYet). The recomputation is
//                       a second forward of the whole block, whose output is where its backward
//                       starts, so nothing can stop early; stopping once every saved tensor is
//                       rebuilt needs saved-tensor hooks on the forward's graph (a non-reentrant
//                       checkpoint), which libtorch's C++ API does not expose.
//
// Gradients: the recomputation reads the parameters through the block's parameter slots
// (parameter_slots, linear.h): whatever the slots held in forward (FSDP's gathered tensors, TP's
// local shards, or the parameters) are inputs of the checkpoint's autograd node, installed as
// fresh leaves while it recomputes, so gradients flow to them through the outer graph (to FSDP's
// reduction, or to .grad). Every mode gives bitwise the loss and gradients of no AC (the
// recomputation runs the same ops on the same inputs; "op"'s replayed matmuls and attention use
// the backward formulas autograd uses for them), checked in fp32 and bf16 on CPU.
#pragma once

#include "titan/config/job_config.h"
#include "titan/models/model.h"
#include "titan/parallel/piece.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace titan {

class ActivationCheckpointing : public UnitRunner, public ParallelPiece {
 public:
  // Chooses the blocks of `model` to checkpoint from `config` (mode full or selective) and adds
  // itself to the model's unit-runner chain. Must be constructed before DataParallel (throws if a
  // DataParallel runner is already installed), and outlive every backward through the model.
  // ConfigError for an unknown mode or selective_ac_option, memory_budget, or a
  // per_op_sac_force_recompute_mm_shapes_by_fqns entry that names a non-Linear layer.
  ActivationCheckpointing(Model& model, const ActivationCheckpointSection& config);
  ~ActivationCheckpointing() override;
  ActivationCheckpointing(const ActivationCheckpointing&) = delete;
  ActivationCheckpointing& operator=(const ActivationCheckpointing&) = delete;

  at::Tensor run(int64_t index, const at::Tensor& input, const UnitFn& next) override;

  // Whether unit `index` (a position in Model::units()) is checkpointed.
  bool checkpointed(int64_t index) const;
  // Recomputations done so far (one per checkpointed block per backward).
  int64_t recomputations() const;
  // "activation checkpointing: selective, every 2nd block (layers.1, layers.3)"
  std::string describe() const override;
  bool communicates() const override { return false; }
  // The units keep the slots of the parameters the model still registers.
  void parameters_removed() override;

  struct Impl;

 private:
  Model& model_;
  std::unique_ptr<Impl> impl_;
};

// What activation_checkpoint.mode / selective_ac_option checkpoint: whole blocks, every
// `every`-th (1 for full, N for selective N; AC's counter picks blocks N-1, 2N-1, ...), or every
// block per op (`per_op`, selective "op"); neither for mode "none". ConfigError as the
// ActivationCheckpointing constructor for other values.
struct AcPolicy {
  int64_t every = 0;
  bool per_op = false;
};
AcPolicy ac_policy(const ActivationCheckpointSection& config);

// TorchTitan's apply_ac: null for mode "none", else an ActivationCheckpointing on `model`.
std::unique_ptr<ActivationCheckpointing> apply_activation_checkpointing(
    Model& model, const ActivationCheckpointSection& config);

}  // namespace titan
