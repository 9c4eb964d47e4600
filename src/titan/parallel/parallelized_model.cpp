// One parallelized model for the trainer (see parallelized_model.h).
#include "titan/parallel/parallelized_model.h"

#include "titan/common/check.h"
#include "titan/common/format.h"
#include "titan/common/logging.h"
#include "titan/components/loss.h"
#include "titan/components/optimizer.h"
#include "titan/models/common/linear.h"
#include "titan/parallel/activation_checkpoint.h"
#include "titan/parallel/data_parallel.h"
#include "titan/parallel/grad_norm.h"
#include "titan/parallel/tensor_parallel.h"

namespace titan {

ParallelizedModel::ParallelizedModel(std::shared_ptr<Model> model, const ParallelDims& dims,
                                     int64_t rank)
    : model_(std::move(model)), dims_(dims), rank_(rank) {
  TITAN_CHECK(model_ != nullptr, "ParallelizedModel: null model");
  refresh_params();
}

ParallelizedModel::~ParallelizedModel() {
  // Runners leave the model's chain outermost first.
  dp_.reset();
  ac_.reset();
  tp_.reset();
}

void ParallelizedModel::apply_tensor_parallel(
    bool loss_parallel, const std::vector<std::pair<std::string, int64_t>>& seq_lens) {
  TITAN_CHECK(!tp_ && !ac_ && !dp_, "tensor parallelism must be applied first (and once)");
  if (!dims_.tp_enabled()) return;
  const int64_t t = dims_.tp();
  for (const auto& [key, len] : seq_lens) {
    if (len % t != 0) {
      throw ConfigError(key + " " + std::to_string(len) +
                        " must be divisible by parallelism.tensor_parallel_degree " +
                        std::to_string(t) + " (sequence parallelism splits the sequence)");
    }
  }
  tp_ = std::make_unique<TensorParallel>(*model_, dims_.group_ptr("tp"), loss_parallel);
  refresh_params();
}

void ParallelizedModel::apply_activation_checkpointing(const ActivationCheckpointSection& ac) {
  TITAN_CHECK(!ac_ && !dp_, "activation checkpointing must be applied before data parallelism");
  ac_ = titan::apply_activation_checkpointing(*model_, ac);  // joins the runner chain itself
}

void ParallelizedModel::apply_data_parallel(const ParallelizeOptions& options) {
  TITAN_CHECK(!dp_, "data parallelism is applied once");
  if (options.fsdp_float8_all_gather && !dims_.dp_shard_enabled()) {
    log_warning(
        "quantize.linear.float8.enable_fsdp_float8_all_gather = true has no effect: parameters "
        "are not sharded (dp_shard = 1), so no weight is all-gathered; the float8 matmuls cast "
        "the weights themselves");
  }
  if (!dims_.dp_enabled()) return;
  DataParallelOptions o;
  if (tp_) o.placements = tp_->placements();
  if (dims_.dp_shard_enabled()) o.shard_group = dims_.group_ptr("dp_shard");
  if (dims_.dp_replicate_enabled()) o.replicate_group = dims_.group_ptr("dp_replicate");
  o.param_dtype = options.param_dtype;
  o.reduce_dtype = options.reduce_dtype;
  o.reshard_after_forward = options.fsdp_reshard_after_forward;
  o.device = options.device;
  o.float8_all_gather = options.fsdp_float8_all_gather;
  o.float8_precompute_scales = options.fsdp_float8_precompute_scales;
  dp_ = std::make_unique<DataParallel>(*model_, o);
  refresh_params();
}

void ParallelizedModel::materialize(at::Device device) {
  // set_data cannot move a tensor off the meta device: each layer registers a new parameter.
  for (const auto& item : model_->named_modules()) {
    auto* layer = dynamic_cast<WeightLayer*>(item.value().get());
    if (layer == nullptr) continue;
    const at::Tensor old = layer->named_parameters(/*recurse=*/false)["weight"];
    if (!old.is_meta()) continue;
    at::Tensor fresh = at::empty(old.sizes(), old.options().device(device));
    fresh.set_requires_grad(old.requires_grad());
    layer->replace_weight(fresh);
  }
  for (const auto& item : model_->named_parameters()) {
    TITAN_CHECK(!item.value().is_meta(), "parameter ", item.key(),
                " is still on the meta device: only WeightLayer weights are materialized");
  }
  // Buffers (RoPE tables) are built real on the CPU; set_data keeps the members that hold them.
  at::NoGradGuard no_grad;
  for (auto& buffer : model_->buffers()) {
    if (buffer.device() != device) buffer.set_data(buffer.to(device));
  }
  refresh_params();
}

void ParallelizedModel::init_weights(uint64_t seed) {
  for (TrainedParam& p : params_) {
    TITAN_CHECK(!p.local.is_meta(), "parameter ", p.name,
                " is on the meta device: materialize() before init_weights()");
    init_box(p.local, model_->param_init(p.name), seed, p.name, p.box);
  }
}

void ParallelizedModel::refresh_params() {
  params_.clear();
  const MeshCoord coord = dims_.coordinate(rank_);
  const auto tp_replicated = [this](const std::string& name) {
    return tp_ != nullptr && tp_->replicated(name);
  };
  const auto writer = [&](const std::string& name) {
    return coord.dp_replicate == 0 && (coord.tp == 0 || !tp_replicated(name));
  };
  if (dp_) {
    for (const ShardedParam& p : dp_->params()) {
      params_.push_back({p.name, p.local, p.box, writer(p.name), tp_replicated(p.name)});
    }
    return;
  }
  for (const auto& item : model_->named_parameters()) {
    const std::string& name = item.key();
    const ShardBox box =
        tp_ ? tp_->placements().at(name).box : ShardBox::whole(item.value().sizes());
    params_.push_back({name, item.value(), box, writer(name), tp_replicated(name)});
  }
}

at::Tensor ParallelizedModel::loss(const at::Tensor& logits, const at::Tensor& labels) const {
  return tp_ ? tp_->cross_entropy(logits, labels) : lm_cross_entropy_loss(logits, labels);
}

double ParallelizedModel::batch_mean(double value) const {
  if (dims_.dp_size() == 1) return value;
  dist::Group& dp = dims_.group("dp");
  at::Tensor t = at::full({1}, value, at::TensorOptions(at::kDouble).device(dp.device()));
  dp.all_reduce(t, dist::ReduceOp::kAvg).wait();
  return t.item<double>();
}

void ParallelizedModel::zero_grad() {
  if (dp_) {
    dp_->zero_grad();
    return;
  }
  for (TrainedParam& p : params_) {
    if (p.local.grad().defined()) p.local.mutable_grad() = at::Tensor();
  }
}

void ParallelizedModel::finish_backward() {
  if (dp_) dp_->finish_backward();
}

double ParallelizedModel::clip_grad_norm(double max_norm) {
  if (!dp_ && !tp_) {
    std::vector<at::Tensor> locals;
    for (const TrainedParam& p : params_) locals.push_back(p.local);
    return titan::clip_grad_norm(locals, max_norm);
  }
  std::vector<std::pair<std::string, at::Tensor>> grads;
  for (const TrainedParam& p : params_) grads.emplace_back(p.name, p.local.grad());
  if (tp_) tp_->reduce_replicated_grads(grads);
  // Squares summed over every shard once: TP-replicated parameters are on every tp rank.
  std::vector<at::Tensor> tensors;
  std::vector<double> weights;
  for (size_t i = 0; i < params_.size(); ++i) {
    tensors.push_back(grads[i].second);
    weights.push_back(params_[i].tp_replicated ? 1.0 / static_cast<double>(tp_->size()) : 1.0);
  }
  std::vector<dist::Group*> groups;
  if (dp_ && dims_.dp_shard_enabled()) groups.push_back(&dims_.group("dp_shard"));
  if (tp_) groups.push_back(&tp_->group());
  return clip_grad_norm_sharded(tensors, weights, groups, max_norm);
}

std::vector<std::pair<std::string, at::Tensor>> ParallelizedModel::gather_full_parameters() {
  std::vector<std::pair<std::string, at::Tensor>> full;
  if (dp_) {
    full = dp_->gather_full_parameters();  // as the model holds them: TP boxes under 2D
  } else {
    for (const auto& item : model_->named_parameters()) {
      full.emplace_back(item.key(), item.value().detach().to(at::kCPU));
    }
  }
  if (tp_) {
    for (auto& [name, t] : full) t = tp_->gather_whole(name, t);
  }
  return full;
}

void ParallelizedModel::load_full_parameters(
    const std::function<at::Tensor(const std::string&)>& whole) {
  if (dp_) {
    dp_->load_full_parameters(whole);
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

bool ParallelizedModel::communicates() const { return dp_ != nullptr || tp_ != nullptr; }

double ParallelizedModel::comm_wait_seconds() const {
  return (dp_ ? dp_->comm_wait_seconds() : 0.0) + (tp_ ? tp_->comm_wait_seconds() : 0.0);
}

std::vector<std::string> ParallelizedModel::describe() const {
  std::vector<std::string> lines;
  if (tp_) lines.push_back(tp_->describe());
  if (ac_) lines.push_back(ac_->describe());
  if (dp_) {
    lines.push_back(dp_->describe());
    const DataParallelMemory m = dp_->memory();
    lines.push_back("memory per rank: parameters " + human_bytes(m.shard_param_bytes) +
                    " + gradients " + human_bytes(m.shard_param_bytes) + " + AdamW states " +
                    human_bytes(2 * m.shard_param_bytes) +
                    " (fp32 shards; the model's parameters are " +
                    human_bytes(m.total_param_bytes) + ", 1/" +
                    std::to_string(static_cast<double>(m.total_param_bytes) /
                                   static_cast<double>(m.shard_param_bytes))
                        .substr(0, 4) +
                    "); largest gathered unit " + human_bytes(m.max_unit_unsharded_bytes));
  }
  return lines;
}

std::unique_ptr<ParallelizedModel> parallelize_decoder(std::shared_ptr<Model> model,
                                                       const ParallelDims& dims, int64_t rank,
                                                       const ParallelizeOptions& options) {
  auto pm = std::make_unique<ParallelizedModel>(std::move(model), dims, rank);
  // 1. TP first: it slices the parameters in place, so FSDP later shards the TP-local tensors
  //    and activation checkpointing recomputes through its hooks (same collectives again).
  pm->apply_tensor_parallel(options.loss_parallel, options.seq_lens);
  // 2. Context parallelism will go here (it swaps the inner attention kernel).
  // 3. Activation checkpointing before FSDP: FSDP's runner then sits outside it and keeps a
  //    block's parameters gathered while the block's backward recomputes it.
  pm->apply_activation_checkpointing(options.activation_checkpoint);
  // 4. FSDP / HSDP / DDP last (the outermost runner).
  pm->apply_data_parallel(options);
  // 5. Storage for what is still on the meta device (a model built with ModelBuildOptions::meta).
  pm->materialize(options.device);
  return pm;
}

}  // namespace titan
