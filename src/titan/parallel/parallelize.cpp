// The parallelize functions by model name (see parallelize.h).
#include "titan/parallel/parallelize.h"

#include "titan/common/check.h"

#include <map>
#include <mutex>
#include <utility>

namespace titan {
namespace {

struct Registry {
  std::mutex mutex;
  std::map<std::string, ParallelizeFn> functions;
};

Registry& registry() {
  static Registry r;
  return r;
}

}  // namespace

void register_parallelize(const std::string& name, ParallelizeFn fn) {
  TITAN_CHECK(fn != nullptr, "register_parallelize: null function for model ", name);
  Registry& r = registry();
  const std::lock_guard<std::mutex> lock(r.mutex);
  r.functions[name] = std::move(fn);
}

ParallelizeFn parallelize_fn(const std::string& name) {
  Registry& r = registry();
  const std::lock_guard<std::mutex> lock(r.mutex);
  const auto it = r.functions.find(name);
  return it != r.functions.end() ? it->second : ParallelizeFn(parallelize_decoder);
}

std::unique_ptr<ParallelizedModel> parallelize_decoder(std::shared_ptr<Model> model,
                                                       const ParallelDims& dims, int64_t rank,
                                                       const ParallelizeOptions& options) {
  auto pm = std::make_unique<ParallelizedModel>(std::move(model), dims, rank);
  // 0. Pipeline stages first: every later piece applies to each stage this rank holds.
  if (dims.pp_enabled()) {
    TITAN_CHECK(options.pipeline.has_value(),
                "pipeline parallelism needs its layout (ParallelizeOptions::pipeline)");
    pm->apply_pipeline(*options.pipeline, options.build_model, options.device);
  }
  // 1. TP: it slices the parameters in place, so FSDP later shards the TP-local tensors
  //    and activation checkpointing recomputes through its hooks (same collectives again).
  pm->apply_tensor_parallel(options.loss_parallel, options.seq_lens);
  // 1b. Expert parallelism slices the experts TP left whole (each rank routes its own tokens).
  pm->apply_expert_parallel();
  // 2. Context parallelism swaps the inner attention kernel for ring attention.
  pm->apply_context_parallel(options.cp_load_balancer, options.cp_rotate_method, options.seq_lens);
  // 3. Activation checkpointing before FSDP: FSDP's runner then sits outside it and keeps a
  //    block's parameters gathered while the block's backward recomputes it.
  pm->apply_activation_checkpointing(options.activation_checkpoint);
  // 4. FSDP / HSDP / DDP last (the outermost runner).
  pm->apply_data_parallel(options);
  // 5. Storage for what is still on the meta device (a model built with ModelBuildOptions::meta).
  pm->materialize(options.device);
  if (options.document_end_token) pm->apply_block_causal_mask(*options.document_end_token);
  if (options.fused_loss) pm->apply_fused_loss();
  return pm;
}

}  // namespace titan
