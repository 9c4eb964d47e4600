// The training loop. Order of construction: threads + seed, model (registry), data (tokenizer,
// loaders), optimizer + lr schedule, metrics (which needs the model's FLOPs and the peak FLOP/s).
#include "titan/trainer/trainer.h"

#include "titan/checkpoint/checkpoint_manager.h"
#include "titan/common/check.h"
#include "titan/common/cpu.h"
#include "titan/common/format.h"
#include "titan/common/logging.h"
#include "titan/components/data/data_loader.h"
#include "titan/components/loss.h"
#include "titan/components/data/dataset.h"
#include "titan/components/tokenizer/tokenizer.h"

#include <ATen/Parallel.h>

#include <chrono>
#include <cmath>
#include <random>

namespace titan {

Trainer::Trainer(JobConfig config) : config_(std::move(config)) {
  log_info("threads: ", configure_threads(config_.training.num_threads));
  const auto& p = config_.parallelism;
  const int64_t world = p.data_parallel_replicate_degree *
                        std::max<int64_t>(1, p.data_parallel_shard_degree) *
                        p.tensor_parallel_degree * p.pipeline_parallel_degree *
                        p.context_parallel_degree;
  if (world != 1 || p.expert_parallel_degree != 1) {
    throw ConfigError(
        "parallel degrees multiply to dp_replicate(" +
        std::to_string(p.data_parallel_replicate_degree) + ") * dp_shard(" +
        std::to_string(p.data_parallel_shard_degree) + ") * tp(" +
        std::to_string(p.tensor_parallel_degree) + ") * pp(" +
        std::to_string(p.pipeline_parallel_degree) + ") * cp(" +
        std::to_string(p.context_parallel_degree) + ") = " + std::to_string(world) +
        " != world_size 1; this build runs a single rank, so every degree must be 1 (or -1 "
        "for data_parallel_shard_degree)");
  }
  seed_ = config_.debug.seed;
  if (seed_ < 0) {
    seed_ = static_cast<int64_t>(std::random_device{}() & 0x7fffffff);
    log_info("debug.seed not set; using seed ", seed_, " (pass --debug.seed ", seed_,
             " to reproduce)");
  }
  at::manual_seed(static_cast<uint64_t>(seed_));
  if (config_.debug.deterministic) at::globalContext().setDeterministicAlgorithms(true, false);
  compute_dtype_ = dtype_from_name(config_.training.mixed_precision_param);

  const int64_t per_step = config_.training.local_batch_size;  // times dp degree (1)
  const int64_t global = config_.training.global_batch_size < 0 ? per_step : config_.training.global_batch_size;
  TITAN_CHECK(global % per_step == 0, "global_batch_size must be a multiple of local_batch_size");
  accumulation_steps_ = global / per_step;

  build_model();
  build_data();
  build_optimizer();
  build_checkpoint();
  build_metrics();
}

Trainer::~Trainer() = default;

void Trainer::build_model() {
  spec_ = &get_model_spec(config_.model.name);
  check_flavor(*spec_, config_.model.flavor);
  ModelBuildOptions opts;
  opts.max_seq_len = config_.training.seq_len;
  if (config_.validation.enable) opts.max_seq_len = std::max(opts.max_seq_len, config_.validation.seq_len);
  opts.compute_dtype = compute_dtype_;
  auto t0 = std::chrono::steady_clock::now();
  model_ = spec_->build(config_.model.flavor, opts);
  const ModelStats stats = model_->stats(config_.training.local_batch_size, config_.training.seq_len);
  log_info("model ", config_.model.name, " ", config_.model.flavor, ": ",
           spec_->describe_flavor(config_.model.flavor));
  log_info("model parameters: ", with_commas(stats.n_params), " (", human_count(stats.n_params),
           "), non-embedding ", with_commas(stats.n_params - stats.n_embedding_params), "; built in ",
           std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), "s");
  for (const auto& p : model_->parameters()) params_.push_back(p);
}

void Trainer::build_data() {
  tokenizer_ = build_tokenizer(config_.model.hf_assets_path);
  const ModelStats stats = model_->stats(1, config_.training.seq_len);
  if (tokenizer_->vocab_size() > stats.vocab_size) {
    throw ConfigError("tokenizer vocab " + std::to_string(tokenizer_->vocab_size()) +
                      " exceeds the model's vocab_size " + std::to_string(stats.vocab_size) +
                      " for flavor '" + config_.model.flavor + "'; pick a flavor with a larger vocab");
  }
  const auto& t = config_.training;
  std::shared_ptr<const DocumentSource> docs =
      open_dataset(t.dataset, t.dataset_path, t.dataset_text_field);
  log_info("dataset ", t.dataset, ": ", docs->size(), " documents",
           t.dataset_shuffle ? ", shuffled each epoch" : ", in order", "; tokenizer vocab ",
           tokenizer_->vocab_size());
  train_loader_ = std::make_unique<DataLoader>(docs, *tokenizer_, t.seq_len, t.local_batch_size,
                                               /*dp_rank=*/0, /*dp_world=*/1, /*infinite=*/true,
                                               /*shuffle_seed=*/t.dataset_shuffle ? seed_ : -1);
  if (config_.validation.enable) {
    const auto& v = config_.validation;
    validation_docs_ = open_dataset(v.dataset, v.dataset_path, v.dataset_text_field);
    log_info("validation dataset ", v.dataset, ": ", validation_docs_->size(), " documents");
  }
}

void Trainer::build_optimizer() {
  std::vector<NamedParam> named;
  for (const auto& item : model_->named_parameters()) named.push_back({item.key(), item.value()});
  optimizer_ = std::make_unique<Optimizer>(std::move(named), config_.optimizer);
  lr_scheduler_ = std::make_unique<LRScheduler>(config_.lr_scheduler, config_.optimizer.lr,
                                                config_.training.steps);
}

void Trainer::build_metrics() {
  const ModelStats stats = model_->stats(config_.training.local_batch_size, config_.training.seq_len);
  double peak = config_.metrics.peak_flops;
  if (peak > 0) {
    log_info("peak FLOP/s for MFU: ", peak / 1e12, " TFLOP/s (metrics.peak_flops)");
  } else {
    peak = probe_peak_flops(compute_dtype_);
    log_info("peak FLOP/s for MFU: ", peak / 1e12, " TFLOP/s, measured by a ",
             compute_dtype_ == at::kBFloat16 ? "bfloat16" : "float32",
             " 1024^3 GEMM probe with ", at::get_num_threads(),
             " threads (set metrics.peak_flops to override)");
  }
  metrics_ = std::make_unique<MetricsLogger>(config_.metrics, config_.job.dump_folder,
                                             stats.flops_per_token(config_.training.seq_len), peak,
                                             config_.training.steps, /*write_file=*/true,
                                             /*start_step=*/train_state_.step);
}

at::Tensor Trainer::forward_backward_step(const at::Tensor& inputs, const at::Tensor& labels,
                                          double loss_scale) {
  at::Tensor logits = model_->forward(inputs);  // (bs, seqlen, vocab) float32
  at::Tensor loss = lm_cross_entropy_loss(logits, labels);
  (loss * loss_scale).backward();
  return loss.detach();
}

at::Tensor Trainer::train_step(int64_t step, double* grad_norm) {
  optimizer_->zero_grad();
  at::Tensor total = at::zeros({}, at::kFloat);
  const double scale = 1.0 / static_cast<double>(accumulation_steps_);
  for (int64_t micro = 0; micro < accumulation_steps_; ++micro) {
    auto batch = train_loader_->next();
    TITAN_CHECK(batch.has_value(), "training data loader ran dry at step ", step);
    total += forward_backward_step(batch->inputs, batch->labels, scale) * scale;
  }
  const double loss_value = total.item<double>();
  if (!std::isfinite(loss_value)) {
    throw TrainingError("loss is " + std::string(std::isnan(loss_value) ? "NaN" : "Inf") +
                        " at step " + std::to_string(step) +
                        "; training stopped. HINT: lower optimizer.lr, raise "
                        "lr_scheduler.warmup_steps, or use training.mixed_precision_param = "
                        "\"float32\"");
  }
  *grad_norm = clip_grad_norm(params_, config_.training.max_norm);
  optimizer_->step(lr_scheduler_->lr_at(step));
  return total;
}

double Trainer::validate(int64_t* tokens) {
  TITAN_CHECK(validation_docs_ != nullptr, "validation is not enabled");
  at::NoGradGuard no_grad;
  DataLoader loader(validation_docs_, *tokenizer_, config_.validation.seq_len,
                    config_.validation.local_batch_size, 0, 1, /*infinite=*/false);
  double sum = 0.0;
  int64_t n = 0, count = 0;
  while (config_.validation.steps < 0 || n < config_.validation.steps) {
    auto batch = loader.next();
    if (!batch) break;
    at::Tensor loss = lm_cross_entropy_loss(model_->forward(batch->inputs), batch->labels);
    sum += loss.item<double>();
    ++n;
    count += batch->inputs.numel();
  }
  TITAN_CHECK(n > 0, "validation set '", config_.validation.dataset, "' yields no full batch of ",
              config_.validation.local_batch_size, " x ", config_.validation.seq_len + 1,
              " tokens; lower validation.local_batch_size or validation.seq_len");
  if (tokens != nullptr) *tokens = count;
  return sum / static_cast<double>(n);
}

TrainResult Trainer::train() {
  TrainResult result;
  const auto& t = config_.training;
  if (config_.checkpoint.create_seed_checkpoint) {
    checkpointer_->save(/*step=*/0, /*model_only=*/true, /*keep_dtype=*/true);
    log_info("seed checkpoint written; start training with checkpoint.enable and the same folder");
    result.steps = 0;
    return result;
  }
  if (already_complete_) {
    result.steps = t.steps;
    result.start_step = t.steps + 1;
    return result;
  }
  log_info("training ", t.steps, " steps: local_batch_size ", t.local_batch_size, " x ",
           accumulation_steps_, " accumulation = global batch ",
           t.local_batch_size * accumulation_steps_, " sequences of ", t.seq_len,
           " tokens; compute dtype ", t.mixed_precision_param, "; seed ", seed_);
  auto start = std::chrono::steady_clock::now();
  const int64_t tokens_per_step = t.local_batch_size * accumulation_steps_ * t.seq_len;
  result.start_step = train_state_.step + 1;
  result.steps = train_state_.step;
  for (int64_t step = train_state_.step + 1; step <= t.steps; ++step) {
    double grad_norm = 0.0;
    at::Tensor loss = train_step(step, &grad_norm);
    result.losses.push_back(loss.item<double>());
    result.grad_norms.push_back(grad_norm);
    metrics_->on_step(step, tokens_per_step, loss, grad_norm, lr_scheduler_->lr_at(step));
    if (config_.validation.enable &&
        (step % config_.validation.freq == 0 || step == t.steps)) {
      auto v0 = std::chrono::steady_clock::now();
      int64_t tokens = 0;
      const double vloss = validate(&tokens);
      result.validation_losses.push_back(vloss);
      metrics_->log_validation(
          step, vloss, tokens,
          std::chrono::duration<double>(std::chrono::steady_clock::now() - v0).count());
    }
    train_state_.step = step;
    train_state_.tokens_seen += tokens_per_step;
    result.steps = step;
    checkpointer_->maybe_save(step, t.steps);
    if (step == t.steps) save_final_hf(step);
  }
  checkpointer_->wait();
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  log_info("training done: ", result.steps, " steps in ", result.seconds, "s; metrics in ",
           metrics_->jsonl_path());
  return result;
}

}  // namespace titan
