// The parallelize functions by model name, and the steps they are made of (see parallelize.h).
#include "titan/parallel/parallelize.h"

#include "titan/common/check.h"
#include "titan/common/logging.h"
#include "titan/common/names.h"
#include "titan/components/training_dtype.h"
#include "titan/models/common/linear.h"
#include "titan/models/converters.h"
#include "titan/parallel/activation_checkpoint.h"
#include "titan/parallel/context_parallel.h"
#include "titan/parallel/data_parallel.h"
#include "titan/parallel/expert_parallel.h"
#include "titan/parallel/pipeline.h"
#include "titan/parallel/tensor_parallel.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <utility>

namespace titan {
namespace {

using Step = ParallelizedModel::Step;

struct Registry {
  std::mutex mutex;
  std::map<std::string, ParallelizeFn> functions;
};

Registry& registry() {
  static Registry r;
  return r;
}

// The first piece of type T on `part`, or null (for a step that builds on another's work).
template <typename T>
T* find_piece(const ParallelizedModel& pm, size_t part) {
  for (ParallelPiece* piece : pm.pieces(part)) {
    if (auto* t = dynamic_cast<T*>(piece)) return t;
  }
  return nullptr;
}

// ConfigError with the model's reason when it cannot be split by `parallelism` (Model::refuses).
void check_model_accepts(ParallelizedModel& pm, const std::string& parallelism) {
  for (size_t i = 0; i < pm.n_parts(); ++i) {
    const std::string why = pm.part_model(i).refuses(parallelism);
    if (!why.empty()) throw ConfigError(why);
  }
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
  ParallelizedModel& m = *pm;
  // 0. The model as training runs it: dtype, converters (float8), compile's kernels.
  if (options.prepare) prepare_model(m.part_model(0), *options.prepare, options.device);
  if (options.fused_loss) {
    for (const auto& [name, layer] : float8_linears(m.part_model(0))) {
      TITAN_CONFIG_CHECK(name != "output.weight",
                         "compile.components 'loss' fuses the output projection with the "
                         "cross-entropy in ",
                         c10::toString(options.param_dtype),
                         ", and model.converters float8 converted it. HINT: add \"output\" to "
                         "quantize.linear.float8.filter_fqns, or set compile.components = "
                         "[\"model\"]");
    }
  }
  // 0b. Pipeline stages next: every later piece applies to each stage this rank holds.
  apply_pp(m, options);
  // 1. TP: it slices the parameters in place, so FSDP later shards the TP-local tensors
  //    and activation checkpointing recomputes through its hooks (same collectives again).
  apply_tp(m, options.loss_parallel, options.seq_lens);
  // 1b. Expert parallelism slices the experts TP left whole (each rank routes its own tokens).
  apply_ep(m);
  // 2. Context parallelism swaps the inner attention kernel for ring attention.
  apply_cp(m, options.cp_load_balancer, options.cp_rotate_method, options.seq_lens);
  // 3. Activation checkpointing before FSDP: FSDP's runner then sits outside it and keeps a
  //    block's parameters gathered while the block's backward recomputes it.
  apply_ac(m, options.activation_checkpoint);
  // 4. FSDP / HSDP / DDP last (the outermost runner).
  apply_dp(m, options);
  // 5. Storage for what is still on the meta device (a model built with ModelBuildOptions::meta).
  m.materialize(options.device);
  if (options.document_end_token) m.set_block_causal_mask(*options.document_end_token);
  if (options.fused_loss) m.set_fused_loss();
  return pm;
}

void prepare_model(Model& model, const ModelPreparation& p, at::Device device) {
  apply_training_dtype(model, p.training, p.world_size, p.layout);
  apply_model_converters(model, p.model, p.float8, device, p.lora, p.mx, p.grouped_mm);
  apply_compile(model, p.compile, device, p.compute_dtype, p.seq_len);
}

void apply_pp(ParallelizedModel& pm, const ParallelizeOptions& options) {
  pm.advance(Step::kPipeline, "pipeline parallelism must be applied first (and once)");
  if (!pm.dims().pp_enabled()) return;
  check_model_accepts(pm, "pipeline");
  TITAN_CHECK(options.pipeline.has_value(),
              "pipeline parallelism needs its layout (ParallelizeOptions::pipeline)");
  const pp::PipelineLayout& layout = *options.pipeline;
  const ParallelDims& dims = pm.dims();
  TITAN_CHECK(layout.pp == dims.pp(), "pipeline layout for pp ", layout.pp, ", mesh pp ",
              dims.pp());
  // The given model keeps this rank's first stage, build_model makes the others.
  const std::vector<int64_t>& ids = layout.rank_stage_ids.at(dims.coordinate(pm.rank()).pp);
  std::vector<std::pair<int64_t, std::shared_ptr<Model>>> stages;
  std::vector<PipelineRuntime::Stage> runtime_stages;
  for (size_t i = 0; i < ids.size(); ++i) {
    TITAN_CHECK(i == 0 || options.build_model != nullptr, "pipeline parallelism with ", ids.size(),
                " stages per rank needs a model builder (ParallelizeOptions::build_model)");
    std::shared_ptr<Model> model = pm.shared_model();
    if (i > 0) {  // built as the first was, then made as training runs it
      model = options.build_model();
      if (options.prepare) prepare_model(*model, *options.prepare, options.device);
    }
    model->keep_only(layout.module_fqns.at(ids[i]));
    runtime_stages.push_back({ids[i], model.get()});
    stages.emplace_back(ids[i], std::move(model));
  }
  auto runtime = std::make_unique<PipelineRuntime>(layout, dims.group_ptr("pp"),
                                                   std::move(runtime_stages), options.device);
  pm.set_pipeline(std::move(stages), std::move(runtime));
}

void apply_tp(ParallelizedModel& pm, bool loss_parallel, const SeqLens& seq_lens) {
  pm.advance(Step::kTensor, "tensor parallelism must be applied first (and once)");
  const ParallelDims& dims = pm.dims();
  if (!dims.tp_enabled()) return;
  check_model_accepts(pm, "tensor");
  const int64_t t = dims.tp();
  for (const auto& [what, n] : pm.part_model(0).tp_split_counts()) {
    TITAN_CONFIG_CHECK(n % t == 0, what, " ", n, " is not divisible by tensor_parallel_degree ", t,
                       " (", n, " % ", t, " = ", n % t,
                       "): tensor parallelism splits whole heads. HINT: pick a tp degree that "
                       "divides ",
                       what);
  }
  const bool sequence_sharded =
      pm.part_model(0).tensor_parallel_activations() == TpActivations::kSequenceSharded;
  for (const auto& [key, len] : seq_lens) {
    if (!sequence_sharded) break;
    TITAN_CONFIG_CHECK(len % t == 0, key, " ", len,
                       " must be divisible by parallelism.tensor_parallel_degree ", t,
                       " (sequence parallelism splits the sequence)");
  }
  for (size_t i = 0; i < pm.n_parts(); ++i) {
    pm.add_piece(i, std::make_unique<TensorParallel>(pm.part_model(i), dims.group_ptr("tp"),
                                                     loss_parallel, dims.experts_split_over_tp()));
  }
}

void apply_ep(ParallelizedModel& pm) {
  pm.advance(Step::kExpert,
             "expert parallelism must be applied before activation checkpointing and data "
             "parallelism (and once)");
  if (!pm.dims().ep_enabled()) return;
  for (size_t i = 0; i < pm.n_parts(); ++i) {
    const TensorParallel* tp = find_piece<TensorParallel>(pm, i);
    pm.add_piece(i, std::make_unique<ExpertParallel>(pm.part_model(i), pm.dims().group_ptr("ep"),
                                                     tp != nullptr ? &tp->placements() : nullptr));
  }
}

void apply_cp(ParallelizedModel& pm, const std::string& load_balancer,
              const std::string& rotate_method, const SeqLens& seq_lens) {
  pm.advance(Step::kContext,
             "context parallelism must be applied after tensor parallelism (and once)");
  const ParallelDims& dims = pm.dims();
  if (!dims.cp_enabled()) return;
  check_model_accepts(pm, "context");
  const RingGroups groups{dims.group_ptr("cp"), dims.group_ptr("cp_up"), dims.group_ptr("cp_down")};
  const int cp_rank = static_cast<int>(dims.coordinate(pm.rank()).cp);
  for (size_t i = 0; i < pm.n_parts(); ++i) {
    pm.add_piece(i, std::make_unique<ContextParallel>(pm.part_model(i), groups, cp_rank, dims.tp(),
                                                      load_balancer, rotate_method, seq_lens));
  }
}

void apply_ac(ParallelizedModel& pm, const ActivationCheckpointSection& ac) {
  pm.advance(Step::kCheckpoint, "activation checkpointing must be applied before data parallelism");
  int64_t blocks = 0, checkpointed = 0;
  std::vector<std::string> modules;  // every module of this rank's parts
  for (size_t pi = 0; pi < pm.n_parts(); ++pi) {
    Model& model = pm.part_model(pi);
    // Joins the runner chain (null for mode "none").
    std::unique_ptr<ActivationCheckpointing> applied = apply_activation_checkpointing(model, ac);
    for (const auto& item : model.named_modules("", /*include_self=*/false)) {
      modules.push_back(item.key());
    }
    if (!applied) continue;
    const std::vector<ModelUnit> units = model.units();
    for (size_t i = 0; i < units.size(); ++i) {
      if (units[i].block < 0) continue;
      ++blocks;
      checkpointed += applied->checkpointed(static_cast<int64_t>(i));
    }
    pm.add_piece(pi, std::move(applied));
  }
  // Settings that would do nothing are said, not ignored: an error on the whole model, a warning
  // on a pipeline stage (whose blocks are a part of it).
  const auto refuse = [&](const std::string& what, const std::string& hint) {
    if (!pm.pipelined()) throw ConfigError(message(what, ". HINT: ", hint));
    log_warning(what, " on this pipeline rank's stages");
  };
  const std::string& option = ac.selective_ac_option;
  if (ac.mode == "selective" && option != "op" && blocks > 0 && checkpointed == 0) {
    refuse("activation_checkpoint.selective_ac_option " + option + " checkpoints every " + option +
               "th block, and there are " + std::to_string(blocks) +
               " blocks: none would be checkpointed",
           "use a value of at most " + std::to_string(blocks) +
               ", or activation_checkpoint.mode = \"none\"");
  }
  if (ac.mode == "selective" && option == "op") {
    for (const std::string& fqn : ac.per_op_sac_force_recompute_mm_shapes_by_fqns) {
      const bool found = std::any_of(modules.begin(), modules.end(), [&](const std::string& m) {
        return !fqn.empty() && m.find(fqn) != std::string::npos;
      });
      // TorchTitan's default names the MoE router, absent from dense models: not a mistake.
      if (found || fqn == "moe.router.gate") continue;
      refuse("activation_checkpoint.per_op_sac_force_recompute_mm_shapes_by_fqns entry '" + fqn +
                 "' matches no module of the model" + did_you_mean(nearest_name(fqn, modules)),
             "name Linear layers by a part of their module name, e.g. 'moe.router.gate'");
    }
  }
}

void apply_dp(ParallelizedModel& pm, const ParallelizeOptions& options) {
  pm.advance(Step::kData, "data parallelism is applied last (and once)");
  const ParallelDims& dims = pm.dims();
  bool float8_layers = false;  // what the float8 all-gather acts on
  for (size_t pi = 0; pi < pm.n_parts(); ++pi) {
    float8_layers = float8_layers || !float8_linears(pm.part_model(pi)).empty();
  }
  const bool float8_all_gather = float8_layers && options.fsdp_float8_all_gather;
  if (float8_all_gather && !dims.dp_shard_enabled()) {
    log_warning(
        "quantize.linear.float8.enable_fsdp_float8_all_gather = true has no effect: parameters "
        "are not sharded (dp_shard = 1), so no weight is all-gathered; the float8 matmuls cast "
        "the weights themselves");
  }
  // Context parallelism's ranks hold the same parameters and different tokens: FSDP shards over
  // dp_shard x cp (and so sums their gradients), as in TorchTitan.
  if (!dims.dp_enabled() && !dims.cp_enabled()) return;
  for (size_t pi = 0; pi < pm.n_parts(); ++pi) {
    Model& model = pm.part_model(pi);
    DataParallelOptions o;
    o.placements = pm.placements(pi);  // FSDP shards what TP and EP left on this rank
    if (dims.fsdp_enabled()) {
      o.shard_group = dims.group_ptr(dims.cp_enabled() ? "dp_shard_cp" : "dp_shard");
    }
    if (dims.dp_replicate_enabled()) o.replicate_group = dims.group_ptr("dp_replicate");
    o.param_dtype = options.param_dtype;
    o.reduce_dtype = options.reduce_dtype;
    o.reshard_after_forward = options.fsdp_reshard_after_forward;
    o.prefetch = options.fsdp_prefetch_units;
    // TorchTitan: under PP, "default" keeps parameters gathered between microbatches (a stage
    // runs many forwards and backwards per step).
    if (pm.pipelined() && o.reshard_after_forward == "default") o.reshard_after_forward = "never";
    o.device = options.device;
    o.float8_all_gather = float8_all_gather;
    o.float8_precompute_scales = float8_all_gather && options.fsdp_float8_precompute_scales;
    if (options.keep_frozen_block_linears) {
      std::set<std::string> frozen;
      for (const std::string& layer : frozen_block_linears(model)) frozen.insert(layer + ".weight");
      o.param_filter = [frozen](const std::string& name) { return frozen.count(name) == 0; };
    }
    if (const ExpertParallel* ep = find_piece<ExpertParallel>(pm, pi)) {
      // The experts: sharded over the ranks holding the same ones (dp_shard_mod_ep), replicated
      // over dp_replicate, their gradients (summed over ep by the token exchange) divided by the
      // whole data-parallel size. Their shards lie within the other instance's groups and tp.
      DataParallelOptions e = o;
      const auto rest = o.param_filter;
      o.param_filter = [ep, rest](const std::string& name) {
        return !ep->holds(name) && (!rest || rest(name));
      };
      e.param_filter = [ep](const std::string& name) { return ep->holds(name); };
      e.shard_group = dims.dp_shard_mod_ep() > 1 ? dims.group_ptr("dp_shard_mod_ep") : nullptr;
      e.grad_divisor = static_cast<double>(dims.dp_size() * dims.cp());
      e.label = "experts";
      e.float8_all_gather = false;
      e.float8_precompute_scales = false;
      e.norm_over_shard_group = false;
      pm.add_piece(pi, std::make_unique<DataParallel>(model, o));
      pm.add_piece(pi, std::make_unique<DataParallel>(model, e));
      continue;
    }
    pm.add_piece(pi, std::make_unique<DataParallel>(model, o));
  }
}

}  // namespace titan
