// One parallelized model for the trainer (see parallelized_model.h).
#include "titan/parallel/parallelized_model.h"

#include "titan/models/common/fused_loss.h"

#include "titan/common/check.h"
#include "titan/common/format.h"
#include "titan/common/logging.h"
#include "titan/common/names.h"
#include "titan/common/phase.h"
#include "titan/components/loss.h"
#include "titan/components/optimizer.h"
#include "titan/models/common/attention.h"
#include "titan/models/common/fused_loss.h"
#include "titan/models/common/linear.h"
#include "titan/models/common/mla.h"
#include "titan/models/common/moe.h"
#include "titan/parallel/activation_checkpoint.h"
#include "titan/parallel/data_parallel.h"
#include "titan/parallel/expert_parallel.h"
#include "titan/parallel/grad_norm.h"
#include "titan/parallel/pipeline.h"
#include "titan/parallel/tensor_parallel.h"

#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <sstream>

namespace titan {

struct ParallelizedModel::Part {
  std::shared_ptr<Model> model;
  int64_t stage = 0;  // its pipeline stage (0 without PP)
  std::unique_ptr<TensorParallel> tp;
  std::unique_ptr<ExpertParallel> ep;
  std::unique_ptr<ActivationCheckpointing> ac;
  std::unique_ptr<DataParallel> dp;
  std::unique_ptr<DataParallel> expert_dp;  // expert parallelism's experts (dp_shard_mod_ep)
  bool is_expert(const std::string& param) const { return ep != nullptr && ep->holds(param); }
  ~Part() {
    // Runners leave the model's chain outermost first.
    expert_dp.reset();
    dp.reset();
    ac.reset();
    ep.reset();
    tp.reset();
  }
};

ParallelizedModel::ParallelizedModel(std::shared_ptr<Model> model, const ParallelDims& dims,
                                     int64_t rank)
    : dims_(dims), rank_(rank) {
  TITAN_CHECK(model != nullptr, "ParallelizedModel: null model");
  parts_.push_back(std::make_unique<Part>());
  parts_[0]->model = std::move(model);
  refresh_params();
}

ParallelizedModel::~ParallelizedModel() {
  pipeline_.reset();
  parts_.clear();
}

bool ParallelizedModel::has_tp() const { return parts_[0]->tp != nullptr; }
bool ParallelizedModel::has_dp() const { return parts_[0]->dp != nullptr; }
bool ParallelizedModel::has_ep() const { return parts_[0]->ep != nullptr; }

Model& ParallelizedModel::model() { return *parts_[0]->model; }

void ParallelizedModel::apply_pipeline(const pp::PipelineLayout& layout,
                                       const std::function<std::shared_ptr<Model>()>& build,
                                       at::Device device) {
  TITAN_CHECK(!pipeline_ && !applied_tp_ && !applied_ep_ && !applied_ac_ && !applied_dp_,
              "pipeline parallelism must be applied first (and once)");
  if (!dims_.pp_enabled()) return;
  TITAN_CHECK(layout.pp == dims_.pp(), "pipeline layout for pp ", layout.pp, ", mesh pp ",
              dims_.pp());
  const int64_t pp_rank = dims_.coordinate(rank_).pp;
  const std::vector<int64_t>& stages = layout.rank_stage_ids.at(pp_rank);
  std::vector<PipelineRuntime::Stage> runtime_stages;
  for (size_t i = 0; i < stages.size(); ++i) {
    if (i > 0) {
      TITAN_CHECK(build != nullptr, "pipeline parallelism with ", stages.size(),
                  " stages per rank needs a model builder (ParallelizeOptions::build_model)");
      parts_.push_back(std::make_unique<Part>());
      parts_.back()->model = build();
    }
    Part& part = *parts_.back();
    part.stage = stages[i];
    part.model->keep_only(layout.module_fqns.at(stages[i]));
    runtime_stages.push_back({stages[i], part.model.get()});
  }
  pipeline_ = std::make_unique<PipelineRuntime>(layout, dims_.group_ptr("pp"),
                                                std::move(runtime_stages), device);
  refresh_params();
}

void ParallelizedModel::apply_tensor_parallel(
    bool loss_parallel, const std::vector<std::pair<std::string, int64_t>>& seq_lens) {
  TITAN_CHECK(!applied_tp_ && !applied_ep_ && !applied_ac_ && !applied_dp_,
              "tensor parallelism must be applied first (and once)");
  applied_tp_ = true;
  if (!dims_.tp_enabled()) return;
  const int64_t t = dims_.tp();
  for (const auto& [what, n] : parts_[0]->model->tp_split_counts()) {
    TITAN_CONFIG_CHECK(n % t == 0, what, " ", n, " is not divisible by tensor_parallel_degree ", t,
                       " (", n, " % ", t, " = ", n % t,
                       "): tensor parallelism splits whole heads. HINT: pick a tp degree that "
                       "divides ",
                       what);
  }
  for (const auto& [key, len] : seq_lens) {
    TITAN_CONFIG_CHECK(len % t == 0, key, " ", len,
                       " must be divisible by parallelism.tensor_parallel_degree ", t,
                       " (sequence parallelism splits the sequence)");
  }
  for (auto& part : parts_) {
    part->tp = std::make_unique<TensorParallel>(*part->model, dims_.group_ptr("tp"), loss_parallel,
                                                dims_.experts_split_over_tp());
  }
  refresh_params();
}

void ParallelizedModel::apply_expert_parallel() {
  TITAN_CHECK(!applied_ep_ && !applied_ac_ && !applied_dp_,
              "expert parallelism must be applied before activation checkpointing and data "
              "parallelism (and once)");
  applied_ep_ = true;
  if (!dims_.ep_enabled()) return;
  for (auto& part : parts_) {
    part->ep = std::make_unique<ExpertParallel>(*part->model, dims_.group_ptr("ep"),
                                                part->tp ? &part->tp->placements() : nullptr);
  }
  refresh_params();
}

void ParallelizedModel::apply_context_parallel(
    const std::string& load_balancer, const std::string& rotate_method,
    const std::vector<std::pair<std::string, int64_t>>& seq_lens) {
  TITAN_CHECK(!applied_cp_ && !applied_ac_ && !applied_dp_,
              "context parallelism must be applied after tensor parallelism (and once)");
  applied_cp_ = true;
  if (!dims_.cp_enabled()) return;
  if (load_balancer == "ptrr") {
    throw ConfigError(
        "parallelism.context_parallel_load_balancer = \"ptrr\" is not supported (it balances "
        "flex attention's block masks). HINT: use \"headtail\" (the default) or \"none\"");
  }
  const SequenceSharding sharding =
      parse_sequence_sharding(load_balancer.empty() ? "none" : load_balancer);
  const RotateMethod rotate = parse_rotate_method(rotate_method);
  cp_rotate_ = rotate;
  const int64_t cp = dims_.cp(), tp = dims_.tp();
  for (const auto& [key, len] : seq_lens) {
    const int64_t chunks = sharding == SequenceSharding::kHeadTail ? 2 * cp : cp;
    if (len % (chunks * tp) != 0) {
      throw ConfigError(key + " " + std::to_string(len) + " must be divisible by " +
                        (sharding == SequenceSharding::kHeadTail ? "2 x " : "") +
                        "cp x tp = " + std::to_string(chunks * tp) + " (" + key + " % " +
                        std::to_string(chunks * tp) + " = " + std::to_string(len % (chunks * tp)) +
                        "): context parallelism splits the sequence into " +
                        std::to_string(chunks) + " chunks" +
                        (tp > 1 ? ", and sequence parallelism each rank's share into tp" : "") +
                        ". HINT: change " + key + " or the degrees");
    }
    cp_layouts_.emplace(len, SequenceLayout::make(len, cp, sharding));
  }
  for (auto& part : parts_) {
    for (const auto& item : part->model->named_modules()) {
      // Grouped-query attention and multi-head latent attention (whose q, k and v reach the
      // kernel padded to one head size) share the inner kernel's seam.
      std::shared_ptr<InnerAttention>* inner = nullptr;
      if (auto* attention = dynamic_cast<Attention*>(item.value().get())) {
        inner = &attention->inner_attention;
      } else if (auto* latent = dynamic_cast<MultiHeadLatentAttention*>(item.value().get())) {
        inner = &latent->inner_attention;
      }
      if (inner == nullptr) continue;
      std::vector<std::shared_ptr<RingAttention>> rings;
      const RingGroups groups{dims_.group_ptr("cp"), dims_.group_ptr("cp_up"),
                              dims_.group_ptr("cp_down")};
      for (const auto& [len, layout] : cp_layouts_) {
        rings.push_back(std::make_shared<RingAttention>(groups, layout, rotate));
      }
      *inner = std::make_shared<ContextParallelAttention>(std::move(rings));
    }
  }
}

std::pair<at::Tensor, at::Tensor> ParallelizedModel::context_shard(const at::Tensor& inputs,
                                                                   const at::Tensor& labels) {
  if (cp_layouts_.empty()) return {inputs, labels};
  auto it = cp_layouts_.find(inputs.size(1));
  TITAN_CHECK(it != cp_layouts_.end(), "context parallelism: batches of ", inputs.size(1),
              " tokens per sequence, but it was set up for other lengths");
  const int cp_rank = static_cast<int>(dims_.coordinate(rank_).cp);
  const SequenceLayout& layout = it->second;
  const at::Tensor positions = layout.positions(cp_rank, inputs.device());
  for (auto& part : parts_) part->model->set_token_positions(positions);
  return {shard_sequence(inputs, layout, cp_rank), shard_sequence(labels, layout, cp_rank)};
}

void ParallelizedModel::apply_block_causal_mask(int64_t end_token) {
  document_end_token_ = end_token;
}

void ParallelizedModel::apply_fused_loss() {
  Model& last = *parts_.back()->model;
  if (!last.supports_fused_loss()) {
    throw ConfigError(
        "this model has no fused linear + cross-entropy. HINT: set compile.components = "
        "[\"model\"] (--compile.components model)");
  }
  fused_loss_ = true;
  if (pipeline_) pipeline_->set_fused_loss(true);
}

at::Tensor ParallelizedModel::forward_loss(const at::Tensor& inputs, const at::Tensor& labels) {
  Model& model = *parts_[0]->model;
  if (!fused_loss_) return loss(model.forward(inputs), labels);  // logits (bs, seqlen, vocab)
  model.set_loss_labels(labels);
  struct Clear {
    Model& model;
    ~Clear() { model.set_loss_labels({}); }
  } clear{model};
  return model.forward(inputs);
}

at::Tensor ParallelizedModel::set_documents(const at::Tensor& inputs) {
  if (!document_end_token_) return {};
  const at::Tensor ids = document_ids(inputs, *document_end_token_);
  if (!pipeline_) parts_[0]->model->set_document_ids(ids);
  return ids;
}

void ParallelizedModel::apply_activation_checkpointing(const ActivationCheckpointSection& ac) {
  TITAN_CHECK(!applied_ac_ && !applied_dp_,
              "activation checkpointing must be applied before data parallelism");
  applied_ac_ = true;
  int64_t blocks = 0, checkpointed = 0;
  std::vector<std::string> modules;  // every module of this rank's parts
  for (auto& part : parts_) {
    part->ac = titan::apply_activation_checkpointing(*part->model, ac);  // joins the runner chain
    for (const auto& item : part->model->named_modules("", /*include_self=*/false)) {
      modules.push_back(item.key());
    }
    if (!part->ac) continue;
    const std::vector<ModelUnit> units = part->model->units();
    for (size_t i = 0; i < units.size(); ++i) {
      if (units[i].block < 0) continue;
      ++blocks;
      checkpointed += part->ac->checkpointed(static_cast<int64_t>(i));
    }
  }
  // Settings that would do nothing are said, not ignored: an error on the whole model, a warning
  // on a pipeline stage (whose blocks are a part of it).
  const auto refuse = [&](const std::string& what, const std::string& hint) {
    if (!pipeline_) throw ConfigError(what + ". HINT: " + hint);
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

void ParallelizedModel::apply_data_parallel(const ParallelizeOptions& options) {
  TITAN_CHECK(!applied_dp_, "data parallelism is applied once");
  applied_dp_ = true;
  if (options.fsdp_float8_all_gather && !dims_.dp_shard_enabled()) {
    log_warning(
        "quantize.linear.float8.enable_fsdp_float8_all_gather = true has no effect: parameters "
        "are not sharded (dp_shard = 1), so no weight is all-gathered; the float8 matmuls cast "
        "the weights themselves");
  }
  // Context parallelism's ranks hold the same parameters and different tokens: FSDP shards over
  // dp_shard x cp (and so sums their gradients), as in TorchTitan.
  if (!dims_.dp_enabled() && !dims_.cp_enabled()) return;
  for (auto& part : parts_) {
    DataParallelOptions o;
    if (part->tp) o.placements = part->tp->placements();
    if (dims_.fsdp_enabled()) o.shard_group = dims_.group_ptr(shard_group_name());
    if (dims_.dp_replicate_enabled()) o.replicate_group = dims_.group_ptr("dp_replicate");
    o.param_dtype = options.param_dtype;
    o.reduce_dtype = options.reduce_dtype;
    o.reshard_after_forward = options.fsdp_reshard_after_forward;
    // TorchTitan: under PP, "default" keeps parameters gathered between microbatches (a stage
    // runs many forwards and backwards per step).
    if (pipeline_ && o.reshard_after_forward == "default") o.reshard_after_forward = "never";
    o.device = options.device;
    o.float8_all_gather = options.fsdp_float8_all_gather;
    o.float8_precompute_scales = options.fsdp_float8_precompute_scales;
    if (part->ep) {
      // The experts: sharded over the ranks holding the same ones (dp_shard_mod_ep), replicated
      // over dp_replicate, their gradients (summed over ep by the token exchange) divided by the
      // whole data-parallel size.
      DataParallelOptions e = o;
      const ExpertParallel* ep = part->ep.get();
      o.param_filter = [ep](const std::string& name) { return !ep->holds(name); };
      e.param_filter = [ep](const std::string& name) { return ep->holds(name); };
      e.shard_group = dims_.dp_shard_mod_ep() > 1 ? dims_.group_ptr("dp_shard_mod_ep") : nullptr;
      e.placements = ep->placements();
      e.grad_divisor = static_cast<double>(dims_.dp_size() * dims_.cp());
      e.label = "experts";
      e.float8_all_gather = false;
      e.float8_precompute_scales = false;
      part->dp = std::make_unique<DataParallel>(*part->model, o);
      part->expert_dp = std::make_unique<DataParallel>(*part->model, e);
      continue;
    }
    part->dp = std::make_unique<DataParallel>(*part->model, o);
  }
  refresh_params();
}

void ParallelizedModel::materialize(at::Device device) {
  for (auto& part : parts_) {
    Model& model = *part->model;
    // set_data cannot move a tensor off the meta device: each layer registers a new parameter.
    for (const auto& item : model.named_modules()) {
      auto* layer = dynamic_cast<WeightLayer*>(item.value().get());
      if (layer == nullptr) continue;
      const at::Tensor old = layer->named_parameters(/*recurse=*/false)["weight"];
      if (!old.is_meta()) continue;
      at::Tensor fresh = at::empty(old.sizes(), old.options().device(device));
      fresh.set_requires_grad(old.requires_grad());
      layer->replace_weight(fresh);
    }
    for (const auto& item : model.named_parameters()) {
      TITAN_CHECK(!item.value().is_meta(), "parameter ", item.key(),
                  " is still on the meta device: only WeightLayer weights are materialized");
    }
    // Buffers (RoPE tables) are built real on the CPU; set_data keeps the members that hold them.
    at::NoGradGuard no_grad;
    for (auto& buffer : model.buffers()) {
      if (buffer.device() != device) buffer.set_data(buffer.to(device));
    }
  }
  refresh_params();
}

void ParallelizedModel::init_weights(uint64_t seed) {
  for (size_t i = 0; i < params_.size(); ++i) {
    TrainedParam& p = params_[i];
    TITAN_CHECK(!p.local.is_meta(), "parameter ", p.name,
                " is on the meta device: materialize() before init_weights()");
    init_box(p.local, parts_[param_part_[i]]->model->param_init(p.name), seed, p.name, p.box);
  }
}

void ParallelizedModel::refresh_params() {
  params_.clear();
  param_part_.clear();
  const MeshCoord coord = dims_.coordinate(rank_);
  for (size_t pi = 0; pi < parts_.size(); ++pi) {
    const Part& part = *parts_[pi];
    const auto tp_replicated = [&](const std::string& name) {
      return part.tp != nullptr && !part.is_expert(name) && part.tp->replicated(name);
    };
    const auto writer = [&](const std::string& name) {
      return coord.dp_replicate == 0 && (coord.tp == 0 || !tp_replicated(name));
    };
    if (part.dp) {
      // In named_parameters() order, from the instance that holds each.
      std::map<std::string, const ShardedParam*> held;
      for (const DataParallel* dp : {part.dp.get(), part.expert_dp.get()}) {
        if (dp == nullptr) continue;
        for (const ShardedParam& p : dp->params()) held[p.name] = &p;
      }
      for (const auto& item : part.model->named_parameters()) {
        const ShardedParam& p = *held.at(item.key());
        params_.push_back({p.name, p.local, p.box, writer(p.name), tp_replicated(p.name)});
        param_part_.push_back(pi);
      }
      continue;
    }
    for (const auto& item : part.model->named_parameters()) {
      const std::string& name = item.key();
      const ShardBox box = part.is_expert(name) ? part.ep->placements().at(name).box
                           : part.tp            ? part.tp->placements().at(name).box
                                                : ShardBox::whole(item.value().sizes());
      params_.push_back({name, item.value(), box, writer(name), tp_replicated(name)});
      param_part_.push_back(pi);
    }
  }
}

at::Tensor ParallelizedModel::loss(const at::Tensor& logits, const at::Tensor& labels) const {
  const Part& last = *parts_.back();
  const TraceSpan span("loss");
  return last.tp ? last.tp->cross_entropy(logits, labels) : lm_cross_entropy_loss(logits, labels);
}

namespace {

// The MoE layers of `model` by module name.
std::vector<std::pair<std::string, MoE*>> moe_layers(Model& model) {
  std::vector<std::pair<std::string, MoE*>> out;
  for (const auto& item : model.named_modules()) {
    if (auto* moe = dynamic_cast<MoE*>(item.value().get())) out.emplace_back(item.key(), moe);
  }
  return out;
}

// Evaluation forwards do not count tokens for MoE load balancing, for the scope's lifetime.
class NoTokenCounting {
 public:
  explicit NoTokenCounting(const std::vector<Model*>& models) {
    for (Model* m : models) {
      for (const auto& [name, moe] : moe_layers(*m)) {
        moe->count_tokens = false;
        layers_.push_back(moe);
      }
    }
  }
  ~NoTokenCounting() {
    for (MoE* moe : layers_) moe->count_tokens = true;
  }
  NoTokenCounting(const NoTokenCounting&) = delete;
  NoTokenCounting& operator=(const NoTokenCounting&) = delete;

 private:
  std::vector<MoE*> layers_;
};

}  // namespace

at::Tensor ParallelizedModel::forward_backward(const at::Tensor& batch_inputs,
                                               const at::Tensor& batch_labels, double loss_scale) {
  const at::Tensor documents = set_documents(batch_inputs);
  const auto [inputs, labels] = context_shard(batch_inputs, batch_labels);
  at::Tensor loss_value;
  if (pipeline_) {
    loss_value = pipeline_->train_step(
        inputs, labels, [this](const at::Tensor& l, const at::Tensor& y) { return loss(l, y); },
        loss_scale, documents);
    const PhaseScope phase(Phase::kBackward, "finish backward");
    finish_backward();
  } else {
    at::Tensor l;
    {
      const PhaseScope phase(Phase::kForward);
      l = forward_loss(inputs, labels);
    }
    const PhaseScope phase(Phase::kBackward);
    (l * loss_scale).backward();
    loss_value = l.detach();
    finish_backward();
  }
  return loss_value;
}

at::Tensor ParallelizedModel::evaluate(const at::Tensor& batch_inputs,
                                       const at::Tensor& batch_labels) {
  at::NoGradGuard no_grad;
  std::vector<Model*> models;
  for (auto& part : parts_) models.push_back(part->model.get());
  const NoTokenCounting no_counting(models);
  const at::Tensor documents = set_documents(batch_inputs);
  const auto [inputs, labels] = context_shard(batch_inputs, batch_labels);
  if (pipeline_) {
    return pipeline_->evaluate(
        inputs, labels, [this](const at::Tensor& l, const at::Tensor& y) { return loss(l, y); },
        documents);
  }
  return forward_loss(inputs, labels);
}

ParallelizedModel::MoELoads ParallelizedModel::update_moe_load_balance() {
  std::vector<std::pair<std::string, MoE*>> layers;
  for (auto& part : parts_) {
    for (const auto& layer : moe_layers(*part->model)) layers.push_back(layer);
  }
  MoELoads loads;
  if (layers.empty()) return loads;
  // Every layer's counts in one tensor, summed over the token-splitting groups.
  std::vector<at::Tensor> counts;
  for (const auto& [name, moe] : layers) counts.push_back(moe->tokens_per_expert);
  at::Tensor all = at::cat(counts);
  const auto sum_over = [&](const char* group) {
    dist::Group& g = dims_.group(group);
    at::Tensor t = all.to(g.device());
    g.all_reduce(t, dist::ReduceOp::kSum).wait();
    all = t.to(all.device(), /*non_blocking=*/true);
  };
  if (dims_.dp_size() * dims_.cp() > 1) sum_over(dims_.cp_enabled() ? "dp_cp" : "dp");
  // tp ranks route their own sequence shards, unless the experts are split over tp (each routes
  // the whole sequences).
  if (dims_.tp() > 1 && !dims_.experts_split_over_tp()) sum_over("tp");
  int64_t offset = 0;
  std::vector<at::Tensor> ratios;
  for (const auto& [name, moe] : layers) {
    const int64_t n = moe->tokens_per_expert.numel();
    const at::Tensor layer_loads = all.narrow(0, offset, n);
    offset += n;
    loads.layers.push_back(name);
    ratios.push_back(load_imbalance(layer_loads));
    moe->update_expert_bias(layer_loads);
  }
  loads.max_over_mean = at::stack(ratios);
  return loads;
}

std::vector<std::pair<std::string, at::Tensor>> ParallelizedModel::state_buffers() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& part : parts_) {
    for (const auto& [name, moe] : moe_layers(*part->model)) {
      out.emplace_back(name + ".expert_bias", moe->expert_bias);
    }
  }
  return out;
}

bool ParallelizedModel::writes_state_buffers() const {
  // Every rank but the pipeline's holds equal biases: the first of them writes.
  const MeshCoord c = dims_.coordinate(rank_);
  return c.dp_replicate == 0 && c.dp_shard == 0 && c.cp == 0 && c.tp == 0;
}

at::Tensor ParallelizedModel::batch_mean(const at::Tensor& value) const {
  // Context-parallel ranks hold different tokens of the same sequences: their (equal-sized)
  // shares average too.
  if (dims_.dp_size() * dims_.cp() == 1) return value;
  dist::Group& dp = dims_.group(dims_.cp_enabled() ? "dp_cp" : "dp");
  at::Tensor t =
      value.to(dp.device(), at::kDouble, /*non_blocking=*/false, /*copy=*/true).reshape({1});
  dp.all_reduce(t, dist::ReduceOp::kAvg).wait();
  return t.to(value.device(), /*non_blocking=*/true).reshape(value.sizes());
}

void ParallelizedModel::zero_grad() {
  if (has_dp()) {
    for (auto& part : parts_) {
      part->dp->zero_grad();
      if (part->expert_dp) part->expert_dp->zero_grad();
    }
    return;
  }
  for (TrainedParam& p : params_) {
    if (p.local.grad().defined()) p.local.mutable_grad() = at::Tensor();
  }
}

void ParallelizedModel::finish_backward() {
  for (auto& part : parts_) {
    if (part->dp) part->dp->finish_backward();
    if (part->expert_dp) part->expert_dp->finish_backward();
  }
}

GradNorm ParallelizedModel::grad_norm(double max_norm) {
  std::vector<std::pair<std::string, at::Tensor>> grads;
  for (const TrainedParam& p : params_) grads.emplace_back(p.name, p.local.grad());
  if (has_tp()) {
    // Each part sums the TP-partial gradients of its own parameters.
    for (size_t pi = 0; pi < parts_.size(); ++pi) {
      std::vector<std::pair<std::string, at::Tensor>> mine;
      for (size_t i = 0; i < grads.size(); ++i) {
        // Experts are whole on each rank of the tp group (distinct ones under expert
        // parallelism): their gradients are complete.
        if (param_part_[i] == pi && !parts_[pi]->is_expert(grads[i].first)) {
          mine.push_back(grads[i]);
        }
      }
      parts_[pi]->tp->reduce_replicated_grads(mine);
    }
  }
  // Squares summed over every shard once: TP-replicated parameters are on every tp rank, and
  // the pipeline's stages hold disjoint parameters. Experts under expert parallelism are split
  // over ep x dp_shard_mod_ep = dp_shard x cp x tp, the ranks these groups span.
  std::vector<at::Tensor> tensors;
  std::vector<double> weights;
  for (size_t i = 0; i < params_.size(); ++i) {
    tensors.push_back(grads[i].second);
    weights.push_back(params_[i].tp_replicated ? 1.0 / static_cast<double>(dims_.tp()) : 1.0);
  }
  std::vector<dist::Group*> groups;
  if (has_dp() && dims_.fsdp_enabled()) groups.push_back(&dims_.group(shard_group_name()));
  if (has_tp()) groups.push_back(&parts_[0]->tp->group());
  if (pipeline_) groups.push_back(&dims_.group("pp"));
  return global_grad_norm(tensors, weights, groups, max_norm);
}

double ParallelizedModel::clip_grad_norm(double max_norm) {
  const GradNorm n = grad_norm(max_norm);
  std::vector<at::Tensor> grads;
  for (const TrainedParam& p : params_) grads.push_back(p.local.grad());
  scale_grads(grads, n.clip_coef);
  return host_item<double>(n.norm);
}

std::vector<std::pair<std::string, at::Tensor>> ParallelizedModel::gather_full_parameters() {
  // Each part's parameters whole (collectives over its dp / tp groups), on the host.
  std::vector<std::vector<std::pair<std::string, at::Tensor>>> by_part;
  for (auto& part : parts_) {
    std::vector<std::pair<std::string, at::Tensor>> full;
    if (part->dp) {
      // As the model holds them (TP boxes under 2D, EP slices), in named_parameters() order.
      std::map<std::string, at::Tensor> held;
      for (DataParallel* dp : {part->dp.get(), part->expert_dp.get()}) {
        if (dp == nullptr) continue;
        for (auto& [name, t] : dp->gather_full_parameters()) held[name] = std::move(t);
      }
      for (const auto& item : part->model->named_parameters()) {
        full.emplace_back(item.key(), held.at(item.key()));
      }
    } else {
      for (const auto& item : part->model->named_parameters()) {
        full.emplace_back(item.key(), item.value().detach().to(at::kCPU));
      }
    }
    for (auto& [name, t] : full) {
      if (part->is_expert(name)) t = part->ep->gather_whole(name, t);
      if (part->tp) t = part->tp->gather_whole(name, t);  // replicated: t itself
    }
    by_part.push_back(std::move(full));
  }
  if (!pipeline_) return std::move(by_part[0]);
  // Under PP every stage's parameters go to every rank, stage by stage: the owner broadcasts the
  // names and shapes, then each tensor.
  const pp::PipelineLayout& layout = pipeline_->layout();
  dist::Group& group = dims_.group("pp");
  const at::Device wire = group.device();
  const int64_t my_pp = dims_.coordinate(rank_).pp;
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (int64_t stage = 0; stage < layout.n_stages(); ++stage) {
    const int root = static_cast<int>(layout.stage_rank[stage]);
    const std::vector<std::pair<std::string, at::Tensor>>* mine = nullptr;
    for (size_t pi = 0; pi < parts_.size(); ++pi) {
      if (parts_[pi]->stage == stage && root == my_pp) mine = &by_part[pi];
    }
    std::string text;
    if (mine != nullptr) {
      std::ostringstream os;
      for (const auto& [name, t] : *mine) {
        os << name;
        for (int64_t d : t.sizes()) os << ' ' << d;
        os << '\n';
      }
      text = os.str();
    }
    std::istringstream lines(group.broadcast_string(text, root));
    std::string line;
    size_t k = 0;
    while (std::getline(lines, line)) {
      std::istringstream fields(line);
      std::string name;
      fields >> name;
      std::vector<int64_t> shape;
      for (int64_t d; fields >> d;) shape.push_back(d);
      at::Tensor t = mine != nullptr ? (*mine)[k].second.to(wire)
                                     : at::empty(shape, at::TensorOptions(at::kFloat).device(wire));
      group.broadcast(t, root).wait();
      out.emplace_back(name, t.to(at::kCPU));
      ++k;
    }
  }
  return out;
}

void ParallelizedModel::load_full_parameters(
    const std::function<at::Tensor(const std::string&)>& whole) {
  if (has_dp()) {
    for (auto& part : parts_) {
      part->dp->load_full_parameters(whole);
      if (part->expert_dp) part->expert_dp->load_full_parameters(whole);
    }
    return;
  }
  at::NoGradGuard no_grad;
  for (TrainedParam& p : params_) {
    const at::Tensor t = whole(p.name);
    TITAN_CHECK(t.sizes().vec() == p.box.global_shape, "parameter ", p.name, " has shape ",
                t.sizes(), ", expected ", at::IntArrayRef(p.box.global_shape));
    p.local.copy_(p.box.narrow(t, p.local.sizes()));
  }
}

bool ParallelizedModel::communicates() const {
  return has_dp() || has_tp() || has_ep() || pipeline_ || !cp_layouts_.empty();
}

const char* ParallelizedModel::shard_group_name() const {
  return dims_.cp_enabled() ? "dp_shard_cp" : "dp_shard";
}

double ParallelizedModel::comm_wait_seconds() const {
  double seconds = pipeline_ ? pipeline_->comm_wait_seconds() : 0.0;
  for (const auto& part : parts_) {
    if (part->dp) seconds += part->dp->comm_wait_seconds();
    if (part->expert_dp) seconds += part->expert_dp->comm_wait_seconds();
    if (part->ep) seconds += part->ep->comm_wait_seconds();
    if (part->tp) seconds += part->tp->comm_wait_seconds();
  }
  return seconds;
}

std::vector<std::string> ParallelizedModel::describe() const {
  std::vector<std::string> lines;
  if (document_end_token_) {
    lines.push_back("attention: block-causal, documents end at token " +
                    std::to_string(*document_end_token_) + " (model.attn_mask_type)");
  }
  if (fused_loss_) {
    lines.push_back(
        "loss: fused linear + cross-entropy (compile.components loss): no (tokens, vocab) logits, "
        "blocks of " +
        std::to_string(fused_loss_block_tokens(parts_.back()->model->stats(1, 1).vocab_size)) +
        " tokens");
  }
  if (pipeline_) lines.push_back(pipeline_->describe());
  if (!cp_layouts_.empty()) {
    const SequenceLayout& layout = cp_layouts_.begin()->second;
    lines.push_back("context parallelism: ring attention (" + std::string(to_string(cp_rotate_)) +
                    ") over cp " + std::to_string(layout.cp) + ", " + to_string(layout.sharding) +
                    " sequence sharding; FSDP over dp_shard x cp, losses averaged over dp x cp");
  }
  DataParallelMemory total;
  for (size_t pi = 0; pi < parts_.size(); ++pi) {
    const Part& part = *parts_[pi];
    const std::string prefix =
        parts_.size() > 1 ? "stage " + std::to_string(part.stage) + ": " : std::string();
    if (part.tp) lines.push_back(prefix + part.tp->describe());
    if (part.ep) lines.push_back(prefix + part.ep->describe());
    if (part.ac) lines.push_back(prefix + part.ac->describe());
    for (const DataParallel* dp : {part.dp.get(), part.expert_dp.get()}) {
      if (dp == nullptr) continue;
      lines.push_back(prefix + dp->describe());
      const DataParallelMemory m = dp->memory();
      total.shard_param_bytes += m.shard_param_bytes;
      total.total_param_bytes += m.total_param_bytes;
      total.max_unit_unsharded_bytes =
          std::max(total.max_unit_unsharded_bytes, m.max_unit_unsharded_bytes);
    }
  }
  if (has_dp()) {
    lines.push_back("memory per rank: parameters " + human_bytes(total.shard_param_bytes) +
                    " + gradients " + human_bytes(total.shard_param_bytes) + " + AdamW states " +
                    human_bytes(2 * total.shard_param_bytes) + " (fp32 shards; " +
                    (pipeline_ ? "this rank's stages hold " : "the model's parameters are ") +
                    human_bytes(total.total_param_bytes) + ", 1/" +
                    std::to_string(static_cast<double>(total.total_param_bytes) /
                                   static_cast<double>(total.shard_param_bytes))
                        .substr(0, 4) +
                    "); largest gathered unit " + human_bytes(total.max_unit_unsharded_bytes));
  }
  return lines;
}

}  // namespace titan
