// The training loop. Order of construction: threads + seed, model (registry), data (tokenizer,
// loaders), optimizer + lr schedule, metrics (which needs the model's FLOPs and the peak FLOP/s).
#include "titan/trainer/trainer.h"

#include "titan/checkpoint/checkpoint_manager.h"
#include "titan/common/check.h"
#include "titan/common/cpu.h"
#include "titan/common/device.h"
#include "titan/common/file_io.h"
#include "titan/common/format.h"
#include "titan/common/host_sync.h"
#include "titan/common/logging.h"
#include "titan/common/memory_probe.h"
#include "titan/common/phase.h"
#include "titan/components/data/data_loader.h"
#include "titan/components/data/dataset.h"
#include "titan/components/data/record_source.h"
#include "titan/components/data/sft_data.h"
#include "titan/components/loss.h"
#include "titan/components/profiling.h"
#include "titan/components/tokenizer/chat_config.h"
#include "titan/components/tokenizer/tokenizer.h"
#include "titan/components/tokenizer/tokenizer_identity.h"
#include "titan/components/training_dtype.h"
#include "titan/config/config_manager.h"
#include "titan/distributed/flight_recorder.h"
#include "titan/distributed/ft/manager.h"
#include "titan/distributed/ft/semi_sync.h"
#include "titan/distributed/init.h"
#include "titan/distributed/parallel_dims.h"
#include "titan/kernels/cross_entropy.h"
#include "titan/models/common/attention.h"
#include "titan/models/common/linear.h"
#include "titan/models/common/moe.h"
#include "titan/parallel/muon_exchange.h"
#include "titan/parallel/parallelize.h"
#include "titan/parallel/parallelized_model.h"
#include "titan/plan/pipeline_split.h"
#include "titan/trainer/flow_matching.h"
#include "titan/trainer/interrupt.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <iomanip>
#include <random>
#include <sstream>

namespace titan {

Trainer::Trainer(JobConfig config, const DistributedContext* dist) : config_(std::move(config)) {
  build_parallelism(dist);
  lock_dump_folder();
  build_profiling();
  seed_ = config_.debug.seed;
  if (seed_ < 0) {
    seed_ = static_cast<int64_t>(std::random_device{}() & 0x7fffffff);
    if (world_) seed_ = world_->broadcast_int(seed_, 0);  // every rank, the same weights
    log_info("debug.seed not set; using seed ", seed_, " (pass --debug.seed ", seed_,
             " to reproduce)");
  }
  // Initial weights depend on the seed alone (build_model); the global generator (saved in
  // checkpoints) starts from it too, alike on every rank.
  at::manual_seed(static_cast<uint64_t>(seed_));  // the CPU's and every CUDA device's
  if (config_.debug.deterministic)
    set_deterministic(device_, config_.debug.deterministic_warn_only);
  compute_dtype_ = training_compute_dtype(config_.training);
  agree_cpu_matmul_path();

  const auto& t = config_.training;
  const int64_t per_step = t.local_batch_size * dp_size_;
  const int64_t global = t.global_batch_size < 0 ? per_step : t.global_batch_size;
  if (global % per_step != 0) {
    throw ConfigError(message("training.global_batch_size ", global,
                              " must be a multiple of local_batch_size(", t.local_batch_size,
                              ") * data-parallel degree(", dp_size_, ") = ", per_step,
                              " (the rest is gradient accumulation)"));
  }
  accumulation_steps_ = global / per_step;

  // The tokenizer first: block-causal attention needs its EOS token.
  tokenizer_ = build_tokenizer(config_.model.hf_assets_path);
  build_model();
  build_data();
  build_optimizer();
  build_checkpoint();
  build_fault_tolerance();
  build_metrics();
}

void Trainer::build_parallelism(const DistributedContext* dist) {
  world_size_ = dist != nullptr ? dist->world_size() : 1;
  rank_ = dist != nullptr ? dist->rank() : 0;
  device_ = select_device(config_.training.device, dist != nullptr ? dist->local_rank() : 0,
                          dist != nullptr ? dist->local_world_size() : 1);
  log_info("device: ", device_info(device_).describe(), " (training.device ",
           config_.training.device, ")");
  if (world_size_ > 1) {
    const int64_t threads =
        rank_num_threads(config_.training.num_threads, dist->env, process_env());
    log_info("rank ", rank_, " of ", world_size_,
             "; threads: ", configure_threads(threads, dist->local_world_size()));
  } else {
    log_info("threads: ", configure_threads(config_.training.num_threads));
  }
  // Validates the degrees against the world (showing the arithmetic) and refuses parallelisms
  // that are not implemented yet.
  dims_ =
      std::make_unique<ParallelDims>(ParallelDims::from_config(config_.parallelism, world_size_));
  dp_size_ = dims_->dp_size();
  dp_rank_ = dims_->dp_rank(rank_);
  const FaultToleranceSection& ft = config_.fault_tolerance;
  data_dp_size_ = ft.enable ? dp_size_ * ft.group_size : dp_size_;
  data_dp_rank_ = ft.enable ? ft.replica_id * dp_size_ + dp_rank_ : dp_rank_;
  if (world_size_ == 1) return;
  // Ranks must run the same job: a digest of the whole config is compared at the rendezvous.
  const std::string toml = render_config_toml(config_);
  char digest[32];
  std::snprintf(digest, sizeof(digest), "config-%016zx", std::hash<std::string>{}(toml));
  dist::GroupOptions options = world_group_options(*dist, config_.comm, digest, device_);
  flight_recorder_ =
      start_flight_recorder(config_.comm, config_.job.dump_folder, rank_, world_size_);
  options.recorder = flight_recorder_;
  world_ = dist::Group::create(dist->store, static_cast<int>(rank_), static_cast<int>(world_size_),
                               options);
  dims_->build_groups(world_);
  log_info("parallelism: ", dims_->describe(), "; data-parallel rank ", dp_rank_, " of ", dp_size_);
}

// Each rank measured its CPU's bf16 GEMMs (cpu_has_fast_bf16_matmul); every rank takes one path,
// so that ranks (and hosts) compute alike: widened where any rank measured them slow.
void Trainer::agree_cpu_matmul_path() {
  if (!world_ || !device_.is_cpu() || !is_reduced_float(compute_dtype_)) return;
  const bool fast = cpu_has_fast_bf16_matmul();
  const at::Tensor flag = at::full({1}, fast ? 1 : 0, at::kLong);
  world_->all_reduce(flag, dist::ReduceOp::kMin).wait();
  if (host_item<int64_t>(flag) == 0 && fast) {
    set_fast_bf16_matmul(false, fast_bf16_matmul_reason() +
                                    "; another rank's bf16 GEMMs are slow, and every rank "
                                    "computes alike");
  }
}

Trainer::~Trainer() = default;

void Trainer::build_profiling() {
  const ProfilingSection& p = config_.profiling;
  // A rehearsal of running out of memory on the CPU (see memory_probe.h).
  if (const char* limit = std::getenv("TITAN_CPU_MEMORY_LIMIT"); limit != nullptr && *limit) {
    char* end = nullptr;
    const long long bytes = std::strtoll(limit, &end, 10);
    if (end == limit || *end != '\0' || bytes <= 0) {
      throw ConfigError(
          message("TITAN_CPU_MEMORY_LIMIT must be a positive number of bytes, got '", limit, "'"));
    }
    if (!device_.is_cpu()) {
      throw ConfigError(
          message("TITAN_CPU_MEMORY_LIMIT limits CPU tensors; this run trains on ", device_.str()));
    }
    CpuMemoryProbe::install();
    CpuMemoryProbe::set_limit(bytes);
    log_warning("CPU tensors limited to ", bytes, " bytes (TITAN_CPU_MEMORY_LIMIT)");
  }
  if (p.enable_memory_snapshot) {
    memory_profiler_ = std::make_unique<MemoryProfiler>(p, config_.job.dump_folder, rank_, device_);
  }
  if (p.enable_profiling) {
    trace_profiler_ = std::make_unique<TraceProfiler>(p, config_.job.dump_folder, rank_, device_);
  }
}

void Trainer::lock_dump_folder() {
  enum : int64_t { kLocked = 0, kDataError = 1, kConfigError = 2 };
  int64_t outcome = kLocked;
  std::string error;
  if (rank_ == 0) {
    try {
      dump_lock_ = FolderLock::acquire(config_.job.dump_folder, "job.dump_folder");
    } catch (const ConfigError& e) {
      outcome = kConfigError;
      error = e.what();
    } catch (const DataError& e) {
      outcome = kDataError;
      error = e.what();
    }
  }
  // Every rank learns rank 0's outcome instead of waiting for it in a collective.
  if (world_) outcome = world_->broadcast_int(outcome, 0);
  if (outcome == kLocked) return;
  if (rank_ != 0) {
    error = "rank 0 cannot lock job.dump_folder '" + config_.job.dump_folder +
            "' (its log has the reason)";
  }
  if (outcome == kConfigError) throw ConfigError(error);
  throw DataError(error);
}

void Trainer::build_model() {
  spec_ = &get_model_spec(config_.model.name);
  check_flavor(*spec_, config_.model.flavor);
  ModelBuildOptions opts;
  opts.max_seq_len = config_.training.seq_len;
  if (config_.validation.enable)
    opts.max_seq_len = std::max(opts.max_seq_len, config_.validation.seq_len);
  opts.compute_dtype = compute_dtype_;
  // Shapes only: parallelize gives this rank storage for its pieces, and init_weights(seed_)
  // below fills them with the values a one-process build of this seed holds there.
  opts.meta = true;
  auto t0 = std::chrono::steady_clock::now();
  // The model as parallelize receives it (pipeline parallelism builds a rank's further stages
  // the same way); parallelize makes it as training runs it (ParallelizeOptions::prepare).
  const auto build = [this, opts] {
    std::shared_ptr<Model> model = spec_->build(config_.model.flavor, opts);
    if (config_.debug.moe_force_load_balance) {
      for (const auto& module : model->modules()) {
        if (auto* moe = dynamic_cast<MoE*>(module.get())) moe->force_load_balance = true;
      }
    }
    return model;
  };
  model_ = build();
  const ModelStats stats =
      model_->stats(config_.training.local_batch_size, config_.training.seq_len);
  log_info("model ", config_.model.name, " ", config_.model.flavor, ": ",
           spec_->describe_flavor(config_.model.flavor));
  log_info("model parameters: ", with_commas(stats.n_params), " (", human_count(stats.n_params),
           "), non-embedding ", with_commas(stats.n_params - stats.n_embedding_params),
           "; built in ",
           std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), "s");
  ParallelizeOptions o;
  o.prepare = ModelPreparation{config_.training,
                               world_size_,
                               dims_->describe(),
                               config_.model,
                               config_.quantize.linear.float8,
                               config_.lora,
                               config_.compile,
                               compute_dtype_,
                               config_.training.seq_len};
  o.prepare->mx = config_.quantize.linear.mx;
  o.prepare->grouped_mm = config_.quantize.grouped_mm;
  o.param_dtype = compute_dtype_;
  o.reduce_dtype = dtype_from_name(config_.training.mixed_precision_reduce);
  o.fsdp_reshard_after_forward = config_.parallelism.fsdp_reshard_after_forward;
  o.fsdp_prefetch_units = config_.parallelism.fsdp_prefetch_units;
  o.loss_parallel = !config_.parallelism.disable_loss_parallel;
  o.activation_checkpoint = config_.activation_checkpoint;
  o.seq_lens = {{"training.seq_len", config_.training.seq_len}};
  o.device = device_;
  o.cp_load_balancer = config_.parallelism.context_parallel_load_balancer;
  o.cp_rotate_method = config_.parallelism.context_parallel_rotate_method;
  const Float8LinearSection& f8 = config_.quantize.linear.float8;
  o.fsdp_float8_all_gather = f8.enable_fsdp_float8_all_gather;
  o.fsdp_float8_precompute_scales = f8.precompute_float8_dynamic_scale_for_fsdp;
  o.keep_frozen_block_linears = !config_.lora.quantize_base.empty();
  if (config_.validation.enable)
    o.seq_lens.emplace_back("validation.seq_len", config_.validation.seq_len);
  const std::vector<std::string>& compiled = config_.compile.components;
  o.fused_loss = config_.compile.enable &&
                 std::find(compiled.begin(), compiled.end(), "loss") != compiled.end();
  if (parse_attention_mask(config_.model.attn_mask_type) == AttentionMask::kBlockCausal) {
    o.document_end_token = tokenizer_->eos_id();  // the data loader ends each document with it
  }
  if (dims_->pp_enabled()) {
    // The stages, schedule and microbatches (errors show the arithmetic).
    o.pipeline = pp::validate_pipeline(config_.parallelism, stats.n_layers,
                                       config_.training.local_batch_size);
    o.build_model = build;
  }
  parallel_ = parallelize_fn(config_.model.name)(model_, *dims_, rank_, o);
  parallel_->set_auxiliary_loss_weight("mtp_loss", config_.training.mtp_loss_weight);
  const auto t1 = std::chrono::steady_clock::now();
  parallel_->init_weights(static_cast<uint64_t>(seed_));
  log_info("initialized this rank's parameters (seed ", seed_, ") in ",
           std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count(), "s");
  for (const std::string& line : parallel_->describe()) log_info(line);
}

std::vector<std::pair<std::string, at::Tensor>> Trainer::trained_params() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const TrainedParam& p : parallel_->params()) out.emplace_back(p.name, p.local);
  return out;
}

void Trainer::build_optimizer() {
  std::vector<NamedParam> named;
  for (const TrainedParam& p : parallel_->params()) {
    if (!p.frozen) named.push_back({p.name, p.local, p.box, p.matrix});
  }
  const FaultToleranceSection& f = config_.fault_tolerance;
  if (f.enable && !f.semi_sync_method.empty()) {
    std::vector<at::Tensor> trained;
    for (const NamedParam& p : named) trained.push_back(p.param);
    ft_outer_ = std::make_unique<ft::OuterStep>(ft::semi_sync_from_name(f.semi_sync_method),
                                                trained, f.outer_lr, f.outer_momentum);
  }
  optimizer_ = std::make_unique<Optimizer>(std::move(named), config_.optimizer);
  const std::vector<MuonMatrix> matrices = optimizer_->muon_matrices();
  if (config_.optimizer.name == "Muon") {
    const std::shared_ptr<dist::Group> group =
        world_size_ > 1 ? dims_->group_ptr("dp_shard_cp_tp") : nullptr;
    if (group && group->size() > 1) {
      optimizer_->set_muon_orthogonalizer(std::make_unique<MuonExchange>(matrices, group));
    }
    log_info("optimizer Muon: ", matrices.size(), " matrices",
             group && group->size() > 1 ? " orthogonalized by owners over " + group->describe()
                                        : std::string(" orthogonalized locally"),
             "; the other ", optimizer_->params().size() - matrices.size(),
             " parameters take AdamW");
  }
  lr_scheduler_ = std::make_unique<LRScheduler>(config_.lr_scheduler, config_.optimizer.lr,
                                                config_.training.steps);
}

void Trainer::build_metrics() {
  const ModelStats stats =
      model_->stats(config_.training.local_batch_size, config_.training.seq_len);
  double peak = config_.metrics.peak_flops;
  const std::string device_name = device_info(device_).name;
  if (peak > 0) {
    log_info("peak FLOP/s for MFU: ", peak / 1e12, " TFLOP/s (metrics.peak_flops)");
  } else if (device_.is_cpu()) {
    peak = probe_peak_flops(compute_dtype_);
    log_info("peak FLOP/s for MFU: ", peak / 1e12, " TFLOP/s, measured by a ",
             compute_dtype_ == at::kBFloat16 && !widens_reduced_matmul(compute_dtype_, device_)
                 ? "bfloat16"
                 : "float32",
             " 1024^3 GEMM probe with ", at::get_num_threads(), " threads",
             widens_reduced_matmul(compute_dtype_, device_)
                 ? " (bf16 matmuls run in float32 on this CPU)"
                 : "",
             " (set metrics.peak_flops to override)");
  } else if (const std::optional<double> sheet = datasheet_peak_flops(device_name)) {
    peak = *sheet;
    log_info("peak FLOP/s for MFU: ", peak / 1e12, " TFLOP/s, the bf16 dense datasheet figure of ",
             device_name, " (set metrics.peak_flops to override)");
  } else {
    // Not a silent guess: measured, and said loudly, with the key that fixes it.
    peak = probe_peak_flops(at::kBFloat16, 0.5, device_);
    log_warning("device '", device_name, "' is not in the peak FLOP/s table; MFU uses ",
                peak / 1e12,
                " TFLOP/s measured by a bfloat16 8192^3 GEMM probe, which is below "
                "the datasheet peak (MFU reads high). HINT: set metrics.peak_flops to the "
                "device's dense bf16 FLOP/s");
  }
  // TensorBoard's <save_tb_folder>/<YYYYmmdd-HHMM>/ folder is named from rank 0's clock, so
  // that the rank_<r> folders of save_for_all_ranks land in one folder.
  int64_t tb_started = static_cast<int64_t>(std::time(nullptr));
  if (config_.metrics.enable_tensorboard && config_.metrics.save_for_all_ranks && world_) {
    tb_started = world_->broadcast_int(tb_started, 0);
  }
  metrics_ = std::make_unique<MetricsLogger>(
      config_.metrics, config_.job.dump_folder,
      flow_ ? flow_->flops_per_image_token() : stats.flops_per_token(config_.training.seq_len),
      peak, config_.training.steps,
      /*write_file=*/!metrics_file_name(config_.metrics, rank_).empty(),
      /*start_step=*/train_state_.step, /*rank=*/rank_, device_, tb_started);
}

StepResult Trainer::train_step(int64_t step) {
  {
    const PhaseScope phase(Phase::kOptimizer, "zero_grad");
    parallel_->zero_grad();
  }
  at::Tensor total = at::zeros({}, at::TensorOptions(at::kDouble).device(device_));
  // Packed conversations: every micro-batch is read first, so that the loss can be the mean over
  // the predicted tokens of the whole global batch (TorchTitan's SFT loss), counted on the host
  // from the global rows every rank reads. Each rank's share is its sum over predicted tokens
  // times ranks / count, so that averaging over the batch-splitting ranks (dp x cp) gives the
  // mean. The document stream predicts every token: the mean of equal micro-batches.
  // The vision-language model's batches predict only their caption tokens, like conversations.
  std::vector<Batch> batches;
  double token_factor = 0;
  if (train_chats_ || spec_->objective == ModelObjective::kVisionLanguage) {
    const PhaseScope data(Phase::kData);
    int64_t predicted = 0;
    for (int64_t micro = 0; micro < accumulation_steps_; ++micro) {
      std::optional<Batch> batch = train_loader_->next();
      TITAN_CHECK(batch.has_value(), "training data loader ran dry at step ", step);
      const int64_t* labels = batch->labels.data_ptr<int64_t>();  // host memory: no device read
      predicted += std::count_if(labels, labels + batch->labels.numel(),
                                 [](int64_t y) { return y != kernels::kIgnoreIndex; });
      batches.push_back(std::move(*batch));
    }
    const int64_t ranks = data_dp_size_ * dims_->cp();
    token_factor =
        static_cast<double>(ranks) / static_cast<double>(std::max<int64_t>(predicted, 1));
  }
  const double scale = token_factor > 0 ? 1.0 : 1.0 / static_cast<double>(accumulation_steps_);
  std::map<std::string, at::Tensor> auxiliary;  // summed like the loss
  for (int64_t micro = 0; micro < accumulation_steps_; ++micro) {
    std::optional<Batch> batch;
    {
      const PhaseScope data(Phase::kData);
      batch = batches.empty() ? next_local_batch(*train_loader_)
                              : local_batch(std::move(batches[micro]));
    }
    TITAN_CHECK(batch.has_value(), "training data loader ran dry at step ", step);
    PackedBatch packing{batch->positions, batch->document_ids, token_factor};
    packing.conditioning = batch->conditioning;
    total +=
        parallel_->forward_backward(batch->inputs, batch->labels, scale, packing).to(at::kDouble) *
        scale;
    for (const auto& [name, value] : parallel_->auxiliary_losses()) {
      const at::Tensor part = value.to(at::kDouble) / static_cast<double>(accumulation_steps_);
      auto [it, fresh] = auxiliary.emplace(name, part);
      if (!fresh) it->second = it->second + part;
    }
  }
  StepResult result;
  // The losses' means over the batch's ranks travel while the gradient norm's reduction and the
  // optimizer step run (over a link with latency, one wait instead of two in a row).
  std::function<at::Tensor()> loss_mean = parallel_->batch_mean_async(total);
  std::map<std::string, std::function<at::Tensor()>> auxiliary_means;
  for (const auto& [name, sum] : auxiliary)
    auxiliary_means[name] = parallel_->batch_mean_async(sum);
  const auto settle_means = [&] {
    if (!loss_mean) return;  // settled already
    result.loss = loss_mean();
    for (auto& [name, mean] : auxiliary_means) result.auxiliary[name] = mean();
    loss_mean = nullptr;
  };
  if (ft_ && !ft_outer_) {
    settle_means();  // averaged over the replica groups next
    if (!ft_average(result)) {
      result.committed = false;
      return result;
    }
  }
  const PhaseScope optimizer(Phase::kOptimizer);
  // The norm and the clipping coefficient stay on the device; AdamW applies the coefficient as
  // it reads each gradient. A non-finite loss or norm is found when the step is read
  // (settle_steps), and training stops there.
  const GradNorm norm = parallel_->grad_norm(config_.training.max_norm);
  result.grad_norm = norm.norm;
  optimizer_->step(lr_scheduler_->lr_at(step), norm.clip_coef);
  moe_loads_ = parallel_->update_moe_load_balance();  // MoE: expert biases toward even loads
  settle_means();
  return result;
}

void Trainer::settle_steps(TrainResult& result) {
  if (unsettled_.empty()) return;
  std::vector<at::Tensor> values;
  for (const auto& [step, v] : unsettled_) values.push_back(v);
  const at::Tensor host = to_host(at::stack(values));  // (steps, 2 + auxiliary losses) float64
  const auto rows = host.accessor<double, 2>();
  std::vector<std::pair<int64_t, at::Tensor>> steps = std::move(unsettled_);
  unsettled_.clear();
  for (size_t i = 0; i < steps.size(); ++i) {
    const double loss = rows[static_cast<int64_t>(i)][0];
    const double norm = rows[static_cast<int64_t>(i)][1];
    for (size_t a = 0; a < auxiliary_names_.size(); ++a) {
      result.auxiliary_losses[auxiliary_names_[a]].push_back(
          rows[static_cast<int64_t>(i)][static_cast<int64_t>(2 + a)]);
    }
    const int64_t step = steps[i].first;
    if (!std::isfinite(loss) || !std::isfinite(norm)) {
      const bool bad_loss = !std::isfinite(loss);
      const double value = bad_loss ? loss : norm;
      throw TrainingError(
          std::string(bad_loss ? "loss" : "gradient norm") + " is " +
          (std::isnan(value) ? "NaN" : "Inf") + " at step " + std::to_string(step) +
          (step != steps.back().first
               ? " (found at step " + std::to_string(steps.back().first) +
                     ", the first step read since: steps are read from the device on logged "
                     "steps, see metrics.log_freq)"
               : std::string()) +
          "; training stopped, nothing was saved after it. HINT: lower optimizer.lr, raise "
          "lr_scheduler.warmup_steps, or use training.mixed_precision_param = \"float32\"");
    }
    result.losses.push_back(loss);
    result.grad_norms.push_back(norm);
  }
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
  log_info("training ", t.steps, " steps: local_batch_size ", t.local_batch_size, " x ", dp_size_,
           " data-parallel ranks x ", accumulation_steps_, " accumulation = global batch ",
           t.local_batch_size * accumulation_steps_ * dp_size_,
           flow_ ? " images of " : " sequences of ", sample_tokens(),
           flow_ ? " image tokens; compute dtype " : " tokens; compute dtype ",
           t.mixed_precision_param, "; seed ", seed_);
  auto start = std::chrono::steady_clock::now();
  const double comm_wait_at_start = parallel_->comm_wait_seconds();
  // Per rank (throughput and MFU are per device, as in TorchTitan: ranks that share a batch, as
  // tensor-parallel ranks do, split its tokens) and for the whole job.
  const int64_t batch_tokens = t.local_batch_size * accumulation_steps_ * sample_tokens();
  const int64_t tokens_per_step = batch_tokens / dims_->non_data_parallel_size();
  const int64_t global_tokens_per_step = batch_tokens * dp_size_;
  result.start_step = train_state_.step + 1;
  result.steps = train_state_.step;
  // SIGTERM/SIGINT: one line saying which step was interrupted and where to resume from.
  InterruptReporter interrupt(
      t.steps,
      [this] {
        return describe_last_checkpoint(config_.checkpoint.enable, checkpointer_->folder());
      },
      /*log=*/rank_ == 0);
  // Host reads per step (host_sync.h): each logged row reports its step's and the most any
  // step since the previous row made.
  int64_t most_syncs_since_log = 0;
  for (int64_t step = train_state_.step + 1; step <= t.steps; ++step) {
    // Communication ops of the step (the flight recorder counts them), the quorum's included.
    const int64_t comm_ops_at_start = flight_recorder_ ? flight_recorder_->recorded() : 0;
    if (ft_) {
      // May take a peer's state, and with it its step.
      if (!ft_outer_) {
        begin_ft_step();
      } else if (!ft_joined_) {
        ft_sync_round();
      }
      step = train_state_.step + 1;
      if (step > t.steps) break;
    }
    const int64_t syncs_at_start = host_sync_count();
    interrupt.set_step(step);
    if (memory_profiler_) memory_profiler_->begin_step(step);
    if (trace_profiler_) trace_profiler_->begin_step(step);
    StepResult out;
    try {
      out = train_step(step);
    } catch (...) {
      dist::dump_installed_flight_recorder();  // a fatal error: leave the last collectives
      if (memory_profiler_ && is_out_of_memory(std::current_exception())) {
        try {
          memory_profiler_->dump_after_error(step);
        } catch (const std::exception& e) {  // the out-of-memory error is the one to report
          log_warning("memory snapshot after the error not written: ", e.what());
        }
      }
      throw;
    }
    if (!out.committed) {  // fault tolerance: the quorum changed under the step; run it again
      if (trace_profiler_) trace_profiler_->end_step(step);
      if (memory_profiler_) memory_profiler_->end_step(step);
      --step;
      continue;
    }
    // Semi-synchronous replicas agree every sync_steps steps and at the end, before a checkpoint
    // (whose interval is a multiple) is written.
    if (ft_outer_ && (step % config_.fault_tolerance.sync_steps == 0 || step == t.steps)) {
      train_state_.step = step;
      ft_sync_round();
      if (train_state_.step != step) {  // behind: it took a peer's state (and step) instead
        if (trace_profiler_) trace_profiler_->end_step(step);
        if (memory_profiler_) memory_profiler_->end_step(step);
        step = train_state_.step;
        continue;
      }
    }
    // The auxiliary losses' columns, in auxiliary_names_ order (the same names every step).
    std::vector<at::Tensor> row = {out.loss, out.grad_norm};
    if (auxiliary_names_.empty()) {
      for (const auto& item : out.auxiliary) auxiliary_names_.push_back(item.first);
    }
    TITAN_CHECK(out.auxiliary.size() == auxiliary_names_.size(), "step ", step, " reports ",
                out.auxiliary.size(), " auxiliary losses, earlier steps ", auxiliary_names_.size());
    for (const std::string& name : auxiliary_names_) row.push_back(out.auxiliary.at(name));
    unsettled_.emplace_back(step, at::stack(row));
    const bool validates =
        config_.validation.enable && (step % config_.validation.freq == 0 || step == t.steps);
    // Read before anything is kept from this step (validation, a checkpoint, the end), so that
    // a non-finite loss stops the run before it is saved.
    if (validates || checkpointer_->should_save(step, t.steps) || step == t.steps) {
      settle_steps(result);
    }
    const std::optional<StepMetrics> logged = metrics_->on_step(step, tokens_per_step, [&] {
      settle_steps(result);
      LoggedValues v;
      v.loss = result.losses.back();
      v.grad_norm = result.grad_norms.back();
      for (const std::string& name : auxiliary_names_) {
        v.auxiliary.emplace_back(name, result.auxiliary_losses.at(name).back());
      }
      v.lr = lr_scheduler_->lr_at(step);
      v.host_syncs = host_sync_count() - syncs_at_start;
      v.host_syncs_between_logs = most_syncs_since_log;
      if (flight_recorder_) v.comm_ops = flight_recorder_->recorded() - comm_ops_at_start;
      return v;
    });
    if (logged && !moe_loads_.layers.empty()) {
      const at::Tensor ratios = to_host(moe_loads_.max_over_mean);
      std::ostringstream os;
      for (size_t i = 0; i < moe_loads_.layers.size(); ++i) {
        os << (i ? ", " : "") << moe_loads_.layers[i] << " " << std::fixed << std::setprecision(2)
           << ratios[static_cast<int64_t>(i)].item<double>();
      }
      log_info("step ", step, " expert load max/mean: ", os.str());
    }
    if (validates) {
      auto v0 = std::chrono::steady_clock::now();
      int64_t tokens = 0;
      const double vloss = validate(&tokens);
      result.validation_losses.push_back(vloss);
      metrics_->log_validation(
          step, vloss, tokens,
          std::chrono::duration<double>(std::chrono::steady_clock::now() - v0).count(),
          /*perplexity=*/!flow_);
    }
    if (step == result.start_step && world_) {
      // Every group is a sub-group of world_ (dims, pipeline directions, CP's ring, ...): this
      // reaches them all.
      world_->set_timeout(std::chrono::milliseconds(config_.comm.train_timeout_seconds * 1000));
    }
    train_state_.step = step;
    // Every replica group in the quorum trained its slice.
    train_state_.tokens_seen += global_tokens_per_step * (ft_ ? ft_->participants() : 1);
    result.steps = step;
    {
      const PhaseScope phase(Phase::kCheckpoint);
      checkpointer_->maybe_save(step, t.steps);
      if (step == t.steps) save_final_hf(step);
    }
    if (trace_profiler_) trace_profiler_->end_step(step);
    if (memory_profiler_) memory_profiler_->end_step(step);
    const int64_t syncs = host_sync_count() - syncs_at_start;
    most_syncs_since_log = logged ? 0 : std::max(most_syncs_since_log, syncs);
  }
  settle_steps(result);
  checkpointer_->wait();
  metrics_->close();  // a write the close reports lost fails the run, not just a log line
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const int64_t ran = result.steps - result.start_step + 1;
  if (parallel_->communicates() && ran > 0) {
    const double wait_ms = 1e3 * (parallel_->comm_wait_seconds() - comm_wait_at_start) / ran;
    log_info("parallelism: blocked in collectives ", wait_ms, " ms per step (",
             100.0 * wait_ms / (1e3 * result.seconds / ran), "% of the step time)");
  }
  log_info("training done: ", result.steps, " steps in ", result.seconds, "s; metrics in ",
           metrics_->jsonl_path());
  return result;
}

}  // namespace titan
