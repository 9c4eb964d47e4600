// The parallelize functions (TorchTitan's parallelize_fn), by model name: parallel/ owns them, and
// models only declare data (tensor_parallel_plan(), units(), tp_split_counts()). Every model
// registered today is a decoder whose plan is that data, so parallelize_decoder serves them all; a
// model that needs another order registers its own function here, made of the same steps
// (apply_pp ... apply_dp below, TorchTitan's apply_tp, apply_moe_ep_tp, apply_cp, apply_ac,
// apply_fsdp / apply_ddp). Each step adds its piece (piece.h) to every part of the parallelized
// model, does nothing when its degree is 1, and is refused after a later step.
#pragma once

#include "titan/distributed/parallel_dims.h"
#include "titan/models/model.h"
#include "titan/parallel/parallelized_model.h"

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace titan {

using ParallelizeFn = std::function<std::unique_ptr<ParallelizedModel>(
    std::shared_ptr<Model> model, const ParallelDims& dims, int64_t rank,
    const ParallelizeOptions& options)>;

// The generic decoder parallelize (the order in parallelized_model.h), for models whose plan is
// their tensor_parallel_plan(), units() and tp_split_counts().
std::unique_ptr<ParallelizedModel> parallelize_decoder(std::shared_ptr<Model> model,
                                                       const ParallelDims& dims, int64_t rank,
                                                       const ParallelizeOptions& options);

using SeqLens = std::vector<std::pair<std::string, int64_t>>;

// 0b. Pipeline parallelism: splits the model into this rank's stages (options.pipeline, the
//    layout; options.build_model, a builder of the further stages as the first was built).
void apply_pp(ParallelizedModel& pm, const ParallelizeOptions& options);
// 0. The model as training runs it (ModelPreparation): training dtype, model converters,
//    compile's kernels; before the parallelisms, which split what they leave (apply_pp prepares
//    the further stages it builds the same way).
void prepare_model(Model& model, const ModelPreparation& p, at::Device device);
// 1. Tensor / sequence parallelism. ConfigError when a count the model splits whole (heads) or a
//    sequence length (with the key that sets it) does not divide by tp.
void apply_tp(ParallelizedModel& pm, bool loss_parallel, const SeqLens& seq_lens);
// 1b. Experts split over the ep group. ConfigError for a model without MoE layers or expert
//    counts that ep does not divide.
void apply_ep(ParallelizedModel& pm);
// 2. Ring attention in every attention layer over the cp group, for the sequence lengths given
//    (each must divide by 2 x cp with headtail, cp without, and the share by tp).
void apply_cp(ParallelizedModel& pm, const std::string& load_balancer,
              const std::string& rotate_method, const SeqLens& seq_lens);
// 3. Activation checkpointing. Settings that would checkpoint nothing: ConfigError on the whole
//    model, a warning on pipeline stages.
void apply_ac(ParallelizedModel& pm, const ActivationCheckpointSection& ac);
// 4. FSDP / HSDP / DDP from the options' param / reduce dtypes, reshard policy, device and float8
//    all-gather settings; the experts (after apply_ep) over dp_shard_mod_ep.
void apply_dp(ParallelizedModel& pm, const ParallelizeOptions& options);

// Registers `fn` as the parallelize function of model `name` (replacing parallelize_decoder).
void register_parallelize(const std::string& name, ParallelizeFn fn);
// The parallelize function of model `name`: its registered one, else parallelize_decoder.
ParallelizeFn parallelize_fn(const std::string& name);

}  // namespace titan
