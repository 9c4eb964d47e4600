// One parallelized model for the trainer (see parallelized_model.h).
#include "titan/parallel/parallelized_model.h"

#include "titan/checkpoint/stage_gather.h"
#include "titan/common/check.h"
#include "titan/common/host_sync.h"
#include "titan/common/phase.h"
#include "titan/components/loss.h"
#include "titan/models/common/attention.h"
#include "titan/models/common/fused_loss.h"
#include "titan/models/common/linear.h"
#include "titan/parallel/data_parallel.h"
#include "titan/parallel/pipeline.h"

#include <ATen/core/grad_mode.h>

#include <set>

namespace titan {

struct ParallelizedModel::Part {
  std::shared_ptr<Model> model;
  int64_t stage = 0;                                   // its pipeline stage (0 without PP)
  std::vector<std::unique_ptr<ParallelPiece>> pieces;  // in apply order
  ~Part() {
    // Unit runners leave the model's chain outermost first.
    while (!pieces.empty()) pieces.pop_back();
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

// The pipeline runtime goes before the parts it runs (members in reverse order).
ParallelizedModel::~ParallelizedModel() = default;

Model& ParallelizedModel::model() { return *parts_[0]->model; }

void ParallelizedModel::advance(Step step, const char* order) {
  TITAN_CHECK(applied_ < step, order);
  applied_ = step;
}

Model& ParallelizedModel::part_model(size_t part) { return *parts_.at(part)->model; }
std::shared_ptr<Model> ParallelizedModel::shared_model() const { return parts_[0]->model; }

std::vector<ParallelPiece*> ParallelizedModel::pieces(size_t part) const {
  std::vector<ParallelPiece*> out;
  for (const auto& piece : parts_.at(part)->pieces) out.push_back(piece.get());
  return out;
}

void ParallelizedModel::add_piece(size_t part, std::unique_ptr<ParallelPiece> piece) {
  if (!piece) return;
  // Only a piece that places or shards parameters changes what is trained (AC and CP do not).
  const bool moves_params = piece->param_placements() != nullptr || piece->shards() != nullptr;
  parts_.at(part)->pieces.push_back(std::move(piece));
  if (moves_params) refresh_params();
}

std::map<std::string, ParamPlacement> ParallelizedModel::placements(
    size_t part, std::map<std::string, const ParallelPiece*>* owners) const {
  std::map<std::string, ParamPlacement> out;
  for (const auto& piece : parts_.at(part)->pieces) {
    if (const auto* placed = piece->param_placements()) {
      for (const auto& [name, placement] : *placed) {
        out[name] = placement;
        if (owners != nullptr) (*owners)[name] = piece.get();
      }
    }
  }
  return out;
}

std::vector<ParallelPiece*> ParallelizedModel::all_pieces() const {
  std::vector<ParallelPiece*> out;
  for (const auto& part : parts_) {
    for (const auto& piece : part->pieces) out.push_back(piece.get());
  }
  return out;
}

void ParallelizedModel::materialize(at::Device device) {
  for (auto& part : parts_) titan::materialize(*part->model, device);
  refresh_params();
}

std::vector<torch::nn::Module*> ParallelizedModel::models() const {
  std::vector<torch::nn::Module*> out;
  for (const auto& part : parts_) out.push_back(part->model.get());
  return out;
}

void ParallelizedModel::set_pipeline(std::vector<std::pair<int64_t, std::shared_ptr<Model>>> stages,
                                     std::unique_ptr<PipelineRuntime> runtime) {
  TITAN_CHECK(applied_ == Step::kPipeline && parts_.size() == 1 && !pipeline_ && !stages.empty() &&
                  stages[0].second == parts_[0]->model,
              "the pipeline split comes first (and once), with the model as its first stage");
  parts_.clear();
  for (auto& [stage, model] : stages) {
    parts_.push_back(std::make_unique<Part>());
    parts_.back()->model = std::move(model);
    parts_.back()->stage = stage;
  }
  pipeline_ = std::move(runtime);
  refresh_params();
}

void ParallelizedModel::set_fused_loss() {
  TITAN_CONFIG_CHECK(parts_.back()->model->supports_fused_loss(),
                     "this model has no fused linear + cross-entropy. HINT: set "
                     "compile.components = [\"model\"] (--compile.components model)");
  fused_loss_ = true;
  if (pipeline_) pipeline_->set_fused_loss(true);
}

void ParallelizedModel::init_weights(uint64_t seed) {
  for (size_t i = 0; i < params_.size(); ++i) {
    TrainedParam& p = params_[i];
    TITAN_CHECK(!p.local.is_meta(), "parameter ", p.name,
                " is on the meta device: materialize() before init_weights()");
    init_box(p.local, parts_[param_part_[i]]->model->initial_value(p.name), seed, p.name, p.box);
  }
}

void ParallelizedModel::refresh_params() {
  params_.clear();
  param_part_.clear();
  param_owner_.clear();
  const MeshCoord coord = dims_.coordinate(rank_);
  for (size_t pi = 0; pi < parts_.size(); ++pi) {
    const Part& part = *parts_[pi];
    std::map<std::string, const ParallelPiece*> owners;
    const std::map<std::string, ParamPlacement> placed = placements(pi, &owners);
    std::map<std::string, const ShardedParam*> sharded;  // from the piece that keeps each
    for (const auto& piece : part.pieces) {
      if (const auto* shards = piece->shards()) {
        for (const ShardedParam& p : *shards) sharded[p.name] = &p;
      }
    }
    const std::set<std::string> matrices = matrix_parameters(*part.model);
    for (const auto& item : part.model->named_parameters()) {
      const std::string& name = item.key();
      const auto where = placed.find(name);
      const bool tp_replicated = where != placed.end() && where->second.replicated;
      const bool writer = coord.dp_replicate == 0 && (coord.tp == 0 || !tp_replicated);
      if (const auto it = sharded.find(name); it != sharded.end()) {
        params_.push_back({name, it->second->local, it->second->box, writer, tp_replicated});
      } else {
        const ShardBox box =
            where != placed.end() ? where->second.box : ShardBox::whole(item.value().sizes());
        params_.push_back({name, item.value(), box, writer, tp_replicated});
      }
      params_.back().frozen = !item.value().requires_grad();
      params_.back().matrix = matrices.count(name) > 0;
      param_part_.push_back(pi);
      param_owner_.push_back(where != placed.end() ? owners.at(name) : nullptr);
    }
  }
}

at::Tensor ParallelizedModel::loss(const at::Tensor& logits, const at::Tensor& labels) const {
  const TraceSpan span("loss");
  // A regression target (a diffusion model's velocity): the mean squared error over every
  // element, in float32 (TorchTitan's FLUX loss: the summed squares over the batch's elements).
  if (labels.is_floating_point()) {
    return (logits.to(at::kFloat) - labels.to(at::kFloat)).pow(2).mean();
  }
  for (const auto& piece : parts_.back()->pieces) {
    if (piece->splits_logits()) return piece->cross_entropy(logits, labels);
  }
  return lm_cross_entropy_loss(logits, labels);
}

ForwardBatch ParallelizedModel::prepare(const at::Tensor& inputs, const at::Tensor& labels,
                                        const PackedBatch& packing) const {
  ForwardBatch batch{inputs, labels, {}};
  // From the whole sequences, before context parallelism shards them.
  if (packing.document_ids.defined()) {
    batch.forward.document_ids = packing.document_ids;
  } else if (document_end_token_) {
    batch.forward.document_ids = document_ids(inputs, *document_end_token_);
  }
  batch.forward.positions = packing.positions;
  batch.forward.conditioning = packing.conditioning;
  for (const auto& piece : parts_[0]->pieces) piece->shard_batch(batch);
  if (fused_loss_) batch.forward.loss_labels = batch.labels;  // (the pipeline splits its own)
  return batch;
}

std::pair<at::Tensor, at::Tensor> ParallelizedModel::forward_loss(
    const ForwardBatch& batch, double token_factor, std::map<std::string, at::Tensor>* auxiliary) {
  std::vector<AuxiliaryLoss> extra;
  ForwardInputs inputs = batch.forward;
  if (auxiliary != nullptr) {
    inputs.targets = batch.labels;
    inputs.auxiliary_losses = &extra;
  }
  const at::Tensor out = parts_[0]->model->forward(batch.inputs, inputs);
  const at::Tensor mean = fused_loss_ ? out : loss(out, batch.labels);  // fused: the loss
  const at::Tensor main =
      token_factor > 0 ? token_weighted_loss(mean, batch.labels, token_factor) : mean;
  if (auxiliary == nullptr) return {main, main};
  at::Tensor total = main;
  // Each name's entries (multi-token prediction: one per depth) averaged, then weighted.
  std::map<std::string, std::vector<const AuxiliaryLoss*>> by_name;
  for (const AuxiliaryLoss& a : extra) by_name[a.name].push_back(&a);
  for (const auto& [name, entries] : by_name) {
    const auto weight = auxiliary_weights_.find(name);
    TITAN_CHECK(weight != auxiliary_weights_.end(), "the model reports an auxiliary loss '", name,
                "' that has no weight (ParallelizedModel::set_auxiliary_loss_weight)");
    at::Tensor sum, logged;
    for (const AuxiliaryLoss* a : entries) {
      const at::Tensor part =
          token_factor > 0 ? token_weighted_loss(a->value, a->labels, token_factor) : a->value;
      sum = sum.defined() ? sum + part : part;
      logged = logged.defined() ? logged + a->value.detach() : a->value.detach();
    }
    const double n = static_cast<double>(entries.size());
    total = total + sum * (weight->second / n);
    (*auxiliary)[name] = logged / n;
  }
  return {main, total};
}

at::Tensor ParallelizedModel::forward_backward(const at::Tensor& batch_inputs,
                                               const at::Tensor& batch_labels, double loss_scale,
                                               const PackedBatch& packing) {
  const ForwardBatch batch = prepare(batch_inputs, batch_labels, packing);
  at::Tensor loss_value;
  auxiliary_.clear();
  if (pipeline_) {
    loss_value = pipeline_->train_step(
        batch.inputs, batch.labels,
        [this](const at::Tensor& l, const at::Tensor& y) { return loss(l, y); }, loss_scale,
        batch.forward, packing.token_factor);
    const PhaseScope phase(Phase::kBackward, "finish backward");
    finish_backward();
  } else {
    std::pair<at::Tensor, at::Tensor> l;  // the loss, and what backward runs on
    {
      const PhaseScope phase(Phase::kForward);
      l = forward_loss(batch, packing.token_factor, &auxiliary_);
    }
    const PhaseScope phase(Phase::kBackward);
    (l.second * loss_scale).backward();
    loss_value = l.first.detach();
    finish_backward();
  }
  return loss_value;
}

at::Tensor ParallelizedModel::evaluate(const at::Tensor& batch_inputs,
                                       const at::Tensor& batch_labels, const PackedBatch& packing) {
  at::NoGradGuard no_grad;
  const NoTokenCounting no_counting(models());
  const ForwardBatch batch = prepare(batch_inputs, batch_labels, packing);
  if (pipeline_) {
    return pipeline_->evaluate(
        batch.inputs, batch.labels,
        [this](const at::Tensor& l, const at::Tensor& y) { return loss(l, y); }, batch.forward);
  }
  return forward_loss(batch).first;
}

at::Tensor ParallelizedModel::reduce_over(const char* group, const at::Tensor& value,
                                          dist::ReduceOp op) const {
  dist::Group& g = dims_.group(group);
  at::Tensor t = value.to(g.device(), /*non_blocking=*/false, /*copy=*/true);
  g.all_reduce(t, op).wait();
  return t.to(value.device(), /*non_blocking=*/true);
}

MoELoads ParallelizedModel::update_moe_load_balance() {
  return balance_expert_loads(models(), [this](at::Tensor all) {
    if (dims_.dp_size() * dims_.cp() > 1) {
      all = reduce_over(dims_.cp_enabled() ? "dp_cp" : "dp", all, dist::ReduceOp::kSum);
    }
    // tp ranks route their own sequence shards, unless the experts are split over tp (each
    // routes the whole sequences).
    if (dims_.tp() > 1 && !dims_.experts_split_over_tp()) {
      all = reduce_over("tp", all, dist::ReduceOp::kSum);
    }
    return all;
  });
}

std::vector<std::pair<std::string, at::Tensor>> ParallelizedModel::state_buffers() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& part : parts_) {
    for (auto& buffer : titan::state_buffers(*part->model)) out.push_back(std::move(buffer));
  }
  return out;
}

bool ParallelizedModel::writes_state_buffers() const {
  // Every rank but the pipeline's holds equal biases: the first of them writes.
  const MeshCoord c = dims_.coordinate(rank_);
  return c.dp_replicate == 0 && c.dp_shard == 0 && c.cp == 0 && c.tp == 0;
}

at::Tensor ParallelizedModel::batch_mean(const at::Tensor& value) const {
  return batch_mean_async(value)();
}

std::function<at::Tensor()> ParallelizedModel::batch_mean_async(const at::Tensor& value) const {
  // Context-parallel ranks hold different tokens of the same sequences: their (equal-sized)
  // shares average too.
  if (dims_.dp_size() * dims_.cp() == 1) return [value] { return value; };
  dist::Group& g = dims_.group(dims_.cp_enabled() ? "dp_cp" : "dp");
  at::Tensor t = value.to(at::kDouble)
                     .reshape({1})
                     .to(g.device(), /*non_blocking=*/false,
                         /*copy=*/true);
  auto work = std::make_shared<dist::Work>(g.all_reduce(t, dist::ReduceOp::kAvg));
  return [work, t, device = value.device(), sizes = value.sizes().vec()] {
    work->wait();
    return t.to(device, /*non_blocking=*/true).reshape(sizes);
  };
}

void ParallelizedModel::zero_grad() {
  for (ParallelPiece* piece : all_pieces()) piece->zero_grad();
  for (TrainedParam& p : params_) {
    if (p.local.grad().defined()) p.local.mutable_grad() = at::Tensor();
  }
}

void ParallelizedModel::finish_backward() {
  for (ParallelPiece* piece : all_pieces()) piece->finish_backward();
}

GradNorm ParallelizedModel::grad_norm(double max_norm) {
  // Gradients partial over a piece's group are completed by the piece that placed them, piece
  // by piece in the same order on every rank.
  std::map<const ParallelPiece*, NamedTensors> placed_by;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (param_owner_[i] == nullptr) continue;
    placed_by[param_owner_[i]].emplace_back(params_[i].name, params_[i].local.grad());
  }
  for (ParallelPiece* piece : all_pieces()) {
    const auto it = placed_by.find(piece);
    if (it != placed_by.end()) piece->reduce_partial_grads(it->second);
  }
  // Squares summed over every shard once: TP-replicated parameters (on every tp rank) weigh
  // 1 / tp, and the pipeline's stages hold disjoint parameters.
  std::vector<at::Tensor> tensors;
  std::vector<double> weights;
  for (const TrainedParam& p : params_) {
    tensors.push_back(p.local.grad());
    weights.push_back(p.tp_replicated ? 1.0 / static_cast<double>(dims_.tp()) : 1.0);
  }
  std::vector<dist::Group*> groups;
  for (const auto& piece : parts_[0]->pieces) {
    if (dist::Group* g = piece->norm_group()) groups.push_back(g);
  }
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

std::vector<std::pair<std::string, at::Tensor>> ParallelizedModel::gather_full_parameters(
    bool state_buffers) {
  std::vector<ckpt::StageTensors> mine;
  for (auto& part : parts_) {
    // As the model holds them (TP boxes, EP slices): from the pieces that keep the trained
    // tensors, else the model's own; then each piece undoes its split, the last applied first.
    std::map<std::string, at::Tensor> held;
    for (auto& piece : part->pieces) piece->gather_held(held);
    NamedTensors full;
    for (const auto& item : part->model->named_parameters()) {
      const auto it = held.find(item.key());
      full.emplace_back(item.key(),
                        it != held.end() ? it->second : item.value().detach().to(at::kCPU));
    }
    for (auto it = part->pieces.rbegin(); it != part->pieces.rend(); ++it) {
      (*it)->gather_whole(full);
    }
    if (state_buffers) {
      for (const auto& [name, buffer] : titan::state_buffers(*part->model)) {
        full.emplace_back(name, buffer.detach().to(at::kCPU));
      }
    }
    mine.push_back({part->stage, std::move(full)});
  }
  if (!pipeline_) return std::move(mine[0].tensors);
  return ckpt::gather_stages(mine, pipeline_->layout().stage_rank, &dims_.group("pp"));
}

void ParallelizedModel::load_full_parameters(
    const std::function<at::Tensor(const std::string&)>& whole) {
  std::set<std::string> kept;  // by the pieces that keep the trained tensors
  for (ParallelPiece* piece : all_pieces()) {
    if (const auto* shards = piece->shards()) {
      piece->load_whole(whole);
      for (const ShardedParam& p : *shards) kept.insert(p.name);
    }
  }
  at::NoGradGuard no_grad;
  for (TrainedParam& p : params_) {
    if (kept.count(p.name) != 0) continue;
    const at::Tensor t = whole(p.name);
    if (!t.defined()) continue;  // kept as it is (e.g. LoRA adapters over a loaded base)
    TITAN_CHECK(t.sizes().vec() == p.box.global_shape, "parameter ", p.name, " has shape ",
                t.sizes(), ", expected ", at::IntArrayRef(p.box.global_shape));
    p.local.copy_(p.box.narrow(t, p.local.sizes()));
  }
}

Nf4Quantized ParallelizedModel::quantize_frozen_base(const kernels::Nf4Options& options) {
  TITAN_CONFIG_CHECK(!dims_.tp_enabled(),
                     "QLoRA (lora.quantize_base) with tensor parallelism is not supported in this "
                     "version (tp ",
                     dims_.tp(),
                     "). HINT: use data parallelism (FSDP, HSDP, DDP) or pipeline parallelism");
  Nf4Quantized all;
  for (auto& part : parts_) {
    const Nf4Quantized q = quantize_frozen_nf4(*part->model, options);
    all.layers.insert(all.layers.end(), q.layers.begin(), q.layers.end());
    all.elements += q.elements;
    all.dense_bytes += q.dense_bytes;
    all.nf4_bytes += q.nf4_bytes;
  }
  for (ParallelPiece* piece : all_pieces()) piece->parameters_removed();
  refresh_params();
  return all;
}

bool ParallelizedModel::communicates() const {
  if (pipeline_) return true;
  for (const auto& piece : parts_[0]->pieces) {
    if (piece->communicates()) return true;
  }
  return false;
}

double ParallelizedModel::comm_wait_seconds() const {
  double seconds = pipeline_ ? pipeline_->comm_wait_seconds() : 0.0;
  for (const ParallelPiece* piece : all_pieces()) seconds += piece->comm_wait_seconds();
  return seconds;
}

std::vector<std::string> ParallelizedModel::describe() const {
  std::vector<std::string> lines;
  if (document_end_token_) {
    lines.push_back(message("attention: block-causal, documents end at token ",
                            *document_end_token_, " (model.attn_mask_type)"));
  }
  if (fused_loss_) {
    lines.push_back(message(
        "loss: fused linear + cross-entropy (compile.components loss): no (tokens, vocab) logits, "
        "blocks of ",
        // The head's GEMMs run over this rank's vocabulary rows (split over tp), as the loss
        // sizes its blocks.
        fused_loss_block_tokens(parts_.back()->model->stats(1, 1).vocab_size / dims_.tp()),
        " tokens"));
  }
  if (pipeline_) lines.push_back(pipeline_->describe());
  for (const auto& part : parts_) {
    const std::string prefix = parts_.size() > 1 ? message("stage ", part->stage, ": ") : "";
    for (const auto& piece : part->pieces) {
      const std::string line = piece->describe();
      if (!line.empty()) lines.push_back(prefix + line);
    }
  }
  const std::vector<ParallelPiece*> all = all_pieces();
  const std::string memory = describe_memory({all.begin(), all.end()}, pipeline_ != nullptr);
  if (!memory.empty()) lines.push_back(memory);
  return lines;
}

}  // namespace titan
