// The job configuration: one struct per TOML section, with TorchTitan's section and key names.
//
// Each section lists its fields once, in `visit`, with the key name and a one-line description;
// the default is the member initializer. Parsing (TOML + command line), `--help`,
// `--job.print_config` and validation are all driven by these visit functions, so adding a key is
// one member plus one `v(...)` line. Cross-field checks live in validate_job_config().
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace titan {

struct JobSection {
  static constexpr const char* kName = "job";
  std::string config_file = "";
  std::string dump_folder = "./outputs";
  std::string description = "default job";
  bool print_config = false;

  template <class V>
  void visit(V& v) {
    v("config_file", config_file, "TOML job config file to load");
    v("dump_folder", dump_folder, "Folder for metrics, logs and other outputs");
    v("description", description, "Description of the job");
    v("print_config", print_config, "Print the final config (after TOML and overrides) at start");
  }
};

struct MetricsSection {
  static constexpr const char* kName = "metrics";
  int64_t log_freq = 10;
  bool disable_color_printing = false;
  bool save_for_all_ranks = false;
  double peak_flops = 0.0;

  template <class V>
  void visit(V& v) {
    v("log_freq", log_freq, "Log metrics every N steps (>= 1)");
    v("disable_color_printing", disable_color_printing, "Disable ANSI colors in the metrics line");
    v("save_for_all_ranks", save_for_all_ranks, "Write metrics.jsonl on every rank, not only rank 0");
    v("peak_flops", peak_flops,
      "Peak FLOP/s per rank used for MFU; 0 measures it with a short GEMM probe at start");
  }
};

struct ModelSection {
  static constexpr const char* kName = "model";
  std::string name = "llama3";
  std::string flavor = "debugmodel";
  std::string hf_assets_path = "";

  template <class V>
  void visit(V& v) {
    v("name", name, "Model name from the model registry (e.g. llama3)");
    v("flavor", flavor, "Model flavor (size) registered by the model, e.g. debugmodel, 8B");
    v("hf_assets_path", hf_assets_path,
      "Folder with tokenizer files; empty uses the built-in byte-level tokenizer");
  }
};

struct OptimizerSection {
  static constexpr const char* kName = "optimizer";
  std::string name = "AdamW";
  double lr = 8e-4;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
  std::string implementation = "fused";

  template <class V>
  void visit(V& v) {
    v("name", name, "Optimizer: AdamW or Adam");
    v("lr", lr, "Peak learning rate (> 0)");
    v("beta1", beta1, "Adam beta1 in [0, 1)");
    v("beta2", beta2, "Adam beta2 in [0, 1)");
    v("eps", eps, "Adam epsilon (> 0)");
    v("weight_decay", weight_decay, "Decoupled weight decay (>= 0)");
    v("implementation", implementation, "Update kernel: fused, foreach or for-loop (same math)");
  }
};

struct LRSchedulerSection {
  static constexpr const char* kName = "lr_scheduler";
  int64_t warmup_steps = 200;
  double decay_ratio = -1.0;  // < 0: unset (decay over all steps after warmup)
  std::string decay_type = "linear";
  double min_lr_factor = 0.0;

  template <class V>
  void visit(V& v) {
    v("warmup_steps", warmup_steps, "Steps of linear warmup from ~0 to optimizer.lr (>= 0)");
    v("decay_ratio", decay_ratio,
      "Fraction of steps spent decaying at the end (warmup-stable-decay); unset (-1) decays "
      "right after warmup");
    v("decay_type", decay_type, "Decay shape: linear, sqrt or cosine");
    v("min_lr_factor", min_lr_factor, "Final lr as a fraction of optimizer.lr, in [0, 1]");
  }
};

struct TrainingSection {
  static constexpr const char* kName = "training";
  std::string dataset = "sotu";
  std::string dataset_path = "";
  std::string dataset_text_field = "text";
  bool dataset_shuffle = true;
  int64_t local_batch_size = 8;
  int64_t global_batch_size = -1;
  int64_t seq_len = 2048;
  double max_norm = 1.0;
  int64_t steps = 10000;
  std::string mixed_precision_param = "bfloat16";
  std::string mixed_precision_reduce = "float32";
  int64_t num_threads = 0;

  template <class V>
  void visit(V& v) {
    v("dataset", dataset,
      "Dataset name: sotu (built-in corpus), or your files at dataset_path: text (.txt, one "
      "document per file), jsonl (.jsonl/.json, one per line), tokens (.bin from `titan data "
      "prepare`), auto (by extension)");
    v("dataset_path", dataset_path,
      "Where the dataset lives (file or folder); empty uses the cache filled by scripts/setup.sh");
    v("dataset_text_field", dataset_text_field, "JSON key holding a document's text (jsonl)");
    v("dataset_shuffle", dataset_shuffle,
      "Shuffle the document order every epoch, seeded by debug.seed + epoch");
    v("local_batch_size", local_batch_size, "Sequences per rank per micro-batch (>= 1)");
    v("global_batch_size", global_batch_size,
      "Sequences per optimizer step over all ranks; -1 = local_batch_size * dp degree. A "
      "multiple larger than that accumulates gradients");
    v("seq_len", seq_len, "Tokens per sequence (>= 1)");
    v("max_norm", max_norm, "Clip gradients to this global L2 norm; <= 0 disables clipping");
    v("steps", steps, "Optimizer steps to train (>= 1)");
    v("mixed_precision_param", mixed_precision_param,
      "Compute dtype of matmuls: bfloat16 or float32 (master weights stay float32)");
    v("mixed_precision_reduce", mixed_precision_reduce,
      "Dtype of gradient reductions across ranks: float32");
    v("num_threads", num_threads,
      "CPU threads per rank for ATen and BLAS; 0 = cores / local ranks. At most 1024 (a "
      "ConfigError above); more than the cores is allowed with a warning");
  }
};

struct ParallelismSection {
  static constexpr const char* kName = "parallelism";
  int64_t data_parallel_replicate_degree = 1;
  int64_t data_parallel_shard_degree = -1;
  int64_t tensor_parallel_degree = 1;
  int64_t pipeline_parallel_degree = 1;
  int64_t context_parallel_degree = 1;
  int64_t expert_parallel_degree = 1;
  std::string fsdp_reshard_after_forward = "default";
  bool disable_loss_parallel = false;

  template <class V>
  void visit(V& v) {
    v("data_parallel_replicate_degree", data_parallel_replicate_degree,
      "Replicated data-parallel degree (DDP / HSDP replicas)");
    v("data_parallel_shard_degree", data_parallel_shard_degree,
      "Sharded data-parallel (FSDP) degree; -1 takes the remaining ranks");
    v("tensor_parallel_degree", tensor_parallel_degree, "Tensor-parallel degree");
    v("pipeline_parallel_degree", pipeline_parallel_degree, "Pipeline-parallel degree");
    v("context_parallel_degree", context_parallel_degree, "Context-parallel degree");
    v("expert_parallel_degree", expert_parallel_degree, "Expert-parallel degree");
    v("fsdp_reshard_after_forward", fsdp_reshard_after_forward,
      "Free gathered FSDP parameters after forward: default (yes unless pipelining), always, never");
    v("disable_loss_parallel", disable_loss_parallel,
      "With tensor parallelism, all-gather the vocabulary-sharded logits before the loss instead "
      "of computing the cross-entropy on the shards");
  }
};

struct CommSection {
  static constexpr const char* kName = "comm";
  int64_t init_timeout_seconds = 300;
  int64_t train_timeout_seconds = 100;
  int64_t trace_buf_size = 20000;
  std::string save_traces_folder = "comm_traces";

  template <class V>
  void visit(V& v) {
    v("init_timeout_seconds", init_timeout_seconds,
      "Timeout for rendezvous and the first collectives, in seconds");
    v("train_timeout_seconds", train_timeout_seconds,
      "Timeout for every collective after the first training step, in seconds");
    v("trace_buf_size", trace_buf_size, "Collectives kept by the flight recorder (0 disables it)");
    v("save_traces_folder", save_traces_folder,
      "Folder (under job.dump_folder) for flight-recorder dumps");
  }
};

struct ValidationSection {
  static constexpr const char* kName = "validation";
  bool enable = false;
  std::string dataset = "sotu_validation";
  std::string dataset_path = "";
  std::string dataset_text_field = "text";
  int64_t local_batch_size = 8;
  int64_t seq_len = 2048;
  int64_t freq = 10;
  int64_t steps = -1;

  template <class V>
  void visit(V& v) {
    v("enable", enable, "Run validation during training");
    v("dataset", dataset,
      "Validation dataset name: sotu_validation, or text/jsonl/tokens/auto (as training.dataset); "
      "read once in order");
    v("dataset_path", dataset_path, "Where the validation dataset lives; empty uses the cache");
    v("dataset_text_field", dataset_text_field, "JSON key holding a document's text (jsonl)");
    v("local_batch_size", local_batch_size, "Sequences per rank per validation batch (>= 1)");
    v("seq_len", seq_len, "Tokens per validation sequence (>= 1)");
    v("freq", freq, "Validate every N training steps (>= 1)");
    v("steps", steps, "Validation batches per run; -1 consumes the whole validation set");
  }
};

struct CheckpointSection {
  static constexpr const char* kName = "checkpoint";
  bool enable = false;
  std::string folder = "checkpoint";
  int64_t interval = 500;
  int64_t keep_latest_k = 10;
  int64_t load_step = -1;
  std::vector<std::string> exclude_from_loading = {};
  bool last_save_model_only = true;
  std::string export_dtype = "float32";
  std::string initial_load_path = "";
  bool initial_load_model_only = true;
  bool initial_load_in_hf = false;
  bool last_save_in_hf = false;
  bool create_seed_checkpoint = false;
  bool enable_first_step_checkpoint = false;
  std::string async_mode = "disabled";

  template <class V>
  void visit(V& v) {
    v("enable", enable, "Save checkpoints and resume from the latest complete one in the folder");
    v("folder", folder, "Checkpoint folder, relative to job.dump_folder; holds step-N directories");
    v("interval", interval, "Save every N steps (a final checkpoint is always saved at the end)");
    v("keep_latest_k", keep_latest_k, "Keep the newest K checkpoints, delete older ones; 0 keeps all");
    v("load_step", load_step, "Resume from this step's checkpoint; -1 takes the latest");
    v("exclude_from_loading", exclude_from_loading,
      "State to skip when resuming: model, optimizer, lr_scheduler, dataloader, train_state, rng");
    v("last_save_model_only", last_save_model_only,
      "The final checkpoint holds only the model weights (in checkpoint.export_dtype)");
    v("export_dtype", export_dtype, "dtype of model-only checkpoints: float32, bfloat16 or float16");
    v("initial_load_path", initial_load_path,
      "Checkpoint (or Hugging Face folder) to start from when the folder has no checkpoint");
    v("initial_load_model_only", initial_load_model_only,
      "Load only the model weights from initial_load_path");
    v("initial_load_in_hf", initial_load_in_hf, "initial_load_path is a Hugging Face model folder");
    v("last_save_in_hf", last_save_in_hf,
      "Also write the final model as a Hugging Face folder (step-N-hf); needs last_save_model_only");
    v("create_seed_checkpoint", create_seed_checkpoint,
      "Write the initialized model as step-0 and exit (no training)");
    v("enable_first_step_checkpoint", enable_first_step_checkpoint,
      "Also save after step 1");
    v("async_mode", async_mode,
      "disabled: save in the training loop; async (or async_with_pinned_mem): snapshot the "
      "state, write it on a background thread while training goes on");
  }
};

struct ActivationCheckpointSection {
  static constexpr const char* kName = "activation_checkpoint";
  std::string mode = "selective";
  std::string selective_ac_option = "2";
  std::vector<std::string> per_op_sac_force_recompute_mm_shapes_by_fqns = {"moe.router.gate"};
  bool early_stop = false;
  double memory_budget = 0.5;
  bool visualize_memory_budget_pareto = false;
  bool preserve_rng_state = true;
  std::string determinism_check = "default";
  bool debug = false;

  template <class V>
  void visit(V& v) {
    v("mode", mode,
      "Recompute activations in backward: selective, full, none (memory_budget is not supported "
      "yet)");
    v("selective_ac_option", selective_ac_option,
      "With mode selective: an integer N checkpoints every Nth transformer block, \"op\" saves "
      "only the outputs of costly ops (matmuls, attention) and recomputes the rest");
    v("per_op_sac_force_recompute_mm_shapes_by_fqns", per_op_sac_force_recompute_mm_shapes_by_fqns,
      "With selective_ac_option op: modules (name suffixes) whose matmuls are always recomputed");
    v("early_stop", early_stop, "Stop recomputation once the needed activations are rebuilt");
    v("memory_budget", memory_budget,
      "With mode memory_budget: fraction of activation memory to keep, in [0, 1]");
    v("visualize_memory_budget_pareto", visualize_memory_budget_pareto,
      "With mode memory_budget: write the runtime/memory Pareto plot");
    v("preserve_rng_state", preserve_rng_state,
      "Replay the forward's random state during recomputation (same dropout masks)");
    v("determinism_check", determinism_check,
      "Compare recomputed tensors with the forward's: default (shapes and dtypes) or none");
    v("debug", debug, "Log every recomputed op");
  }
};

struct DebugSection {
  static constexpr const char* kName = "debug";
  int64_t seed = -1;
  bool deterministic = false;

  template <class V>
  void visit(V& v) {
    v("seed", seed, "Random seed for init and data; -1 picks one from the clock (printed)");
    v("deterministic", deterministic, "Use deterministic algorithms only");
  }
};

struct JobConfig {
  JobSection job;
  MetricsSection metrics;
  ModelSection model;
  OptimizerSection optimizer;
  LRSchedulerSection lr_scheduler;
  TrainingSection training;
  ParallelismSection parallelism;
  ValidationSection validation;
  CheckpointSection checkpoint;
  ActivationCheckpointSection activation_checkpoint;
  CommSection comm;
  DebugSection debug;

  // Calls v.section(name, section) for each section, in the order `--help` shows them.
  template <class V>
  void visit_sections(V& v) {
    v.section(JobSection::kName, job);
    v.section(MetricsSection::kName, metrics);
    v.section(ModelSection::kName, model);
    v.section(OptimizerSection::kName, optimizer);
    v.section(LRSchedulerSection::kName, lr_scheduler);
    v.section(TrainingSection::kName, training);
    v.section(ParallelismSection::kName, parallelism);
    v.section(ValidationSection::kName, validation);
    v.section(CheckpointSection::kName, checkpoint);
    v.section(ActivationCheckpointSection::kName, activation_checkpoint);
    v.section(CommSection::kName, comm);
    v.section(DebugSection::kName, debug);
  }
};

}  // namespace titan
