// The job configuration: one struct per TOML section, with TorchTitan's section and key names.
//
// Each section lists its fields once, in `visit`, with the key name and a one-line description;
// the default is the member initializer. Parsing (TOML + command line), `--help`,
// `--job.print_config` and validation are all driven by these visit functions, so adding a key is
// one member plus one `v(...)` line. Cross-field checks live in validate_job_config().
//
// Every key of TorchTitan v0.2.2's job config is here, so its TOML files load unchanged. Keys of
// features not built yet carry a KeySupport marker (key_support.h): kNotYet keys must keep their
// default, used_with(...) keys are settings of such a feature. "int | None" and "str | None" keys
// of TorchTitan use -1 and "" for None. Sub-sections ([training.dataloader],
// [quantize.linear.float8]) are sections with a dotted name.
#pragma once

#include "titan/config/key_support.h"
#include "titan/config/quantize_sections.h"
#include "titan/config/task_sections.h"

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
  std::string save_config_file = "";
  std::string custom_config_module = "";

  template <class V>
  void visit(V& v) {
    v("config_file", config_file, "TOML job config file to load");
    v("dump_folder", dump_folder, "Folder for metrics, logs and other outputs");
    v("description", description, "Description of the job");
    v("print_config", print_config, "Print the final config (after TOML and overrides) at start");
    v("save_config_file", save_config_file,
      "Write the final config as TOML to this file, relative to dump_folder (rank 0); \"\" "
      "writes none");
    v("custom_config_module", custom_config_module,
      "Python module extending the job config (TorchTitan)", kNotYet);
  }
};

struct ProfilingSection {
  static constexpr const char* kName = "profiling";
  bool enable_profiling = false;
  std::string save_traces_folder = "profile_traces";
  int64_t profile_freq = 10;
  int64_t profiler_active = 1;
  int64_t profiler_warmup = 3;
  bool enable_memory_snapshot = false;
  std::string save_memory_snapshot_folder = "memory_snapshot";

  template <class V>
  void visit(V& v) {
    v("enable_profiling", enable_profiling, "Record profiler traces (Kineto, Chrome trace JSON)");
    v("save_traces_folder", save_traces_folder, "Folder for profiler traces, under dump_folder");
    v("profile_freq", profile_freq, "Profile one cycle every N steps");
    v("profiler_active", profiler_active, "Steps recorded per profiling cycle");
    v("profiler_warmup", profiler_warmup, "Warmup steps before the recorded ones in each cycle");
    v("enable_memory_snapshot", enable_memory_snapshot,
      "Write memory timelines by phase (and the CUDA allocator's history)");
    v("save_memory_snapshot_folder", save_memory_snapshot_folder,
      "Folder for memory snapshots, under dump_folder");
  }
};

struct MetricsSection {
  static constexpr const char* kName = "metrics";
  int64_t log_freq = 10;
  bool enable_tensorboard = false;
  bool disable_color_printing = false;
  std::string save_tb_folder = "tb";
  bool save_for_all_ranks = false;
  bool enable_wandb = false;
  double peak_flops = 0.0;

  template <class V>
  void visit(V& v) {
    v("log_freq", log_freq, "Log metrics every N steps (>= 1)");
    v("enable_tensorboard", enable_tensorboard,
      "Also write the metrics as TensorBoard event files, under "
      "<dump_folder>/<save_tb_folder>/<YYYYmmdd-HHMM>/");
    v("disable_color_printing", disable_color_printing, "Disable ANSI colors in the metrics line");
    v("save_tb_folder", save_tb_folder, "TensorBoard folder, under dump_folder");
    v("save_for_all_ranks", save_for_all_ranks,
      "Every rank writes its own metrics file, metrics_rank_<rank>.jsonl, and TensorBoard folder, "
      "rank_<rank>/; otherwise rank 0 writes metrics.jsonl");
    v("enable_wandb", enable_wandb, "Log metrics to Weights & Biases", kNotYet);
    v("peak_flops", peak_flops,
      "Peak FLOP/s per rank used for MFU; 0 measures it with a short GEMM probe at start");
  }
};

struct ModelSection {
  static constexpr const char* kName = "model";
  std::string name = "llama3";
  std::string flavor = "debugmodel";
  std::string hf_assets_path = "";
  std::string tokenizer_path = "";
  std::vector<std::string> converters = {};
  bool print_after_conversion = false;
  std::string attn_mask_type = "causal";

  template <class V>
  void visit(V& v) {
    v("name", name, "Model name from the model registry (e.g. llama3)");
    v("flavor", flavor, "Model flavor (size) registered by the model, e.g. debugmodel, 8B");
    v("hf_assets_path", hf_assets_path,
      "Folder with tokenizer files; empty uses the built-in byte-level tokenizer");
    v("tokenizer_path", tokenizer_path,
      "Deprecated name of hf_assets_path: when set, it replaces hf_assets_path (with a warning)");
    v("converters", converters,
      "Model converters applied after the build, before parallelism: \"quantize.linear.float8\" "
      "(or \"float8\"): float8 linear layers, see [quantize.linear.float8]; \"lora\": low-rank "
      "adapters on frozen weights, see [lora]");
    v("print_after_conversion", print_after_conversion, "Print the model after the converters ran");
    v("attn_mask_type", attn_mask_type,
      "Attention mask of training and validation: causal (every earlier token of the sequence) "
      "or block_causal (every earlier token of the same document: packed documents, which end "
      "at the tokenizer's EOS, do not attend to each other; TorchTitan sets this in its model "
      "args)");
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
  bool early_step_in_backward = false;
  std::string state_dtype = "float32";  // ours: the optimizer states' dtype
  // Muon (ours; TorchTitan v0.2.2 has no Muon): lr and weight_decay above are Muon's, these the
  // rest of its settings and those of the AdamW group it keeps for everything else.
  double muon_momentum = 0.95;
  bool muon_nesterov = true;
  double muon_ns_a = 3.4445;
  double muon_ns_b = -4.775;
  double muon_ns_c = 2.0315;
  int64_t muon_ns_steps = 5;
  double muon_eps = 1e-7;
  std::string muon_adjust_lr_fn = "original";
  std::vector<std::string> muon_adamw_fqns = {"output", "moe.gate"};
  double muon_adamw_lr = -1.0;            // < 0: optimizer.lr
  double muon_adamw_weight_decay = -1.0;  // < 0: optimizer.weight_decay

  template <class V>
  void visit(V& v) {
    v("name", name,
      "Optimizer: AdamW, Adam or Muon (Muon for hidden matrices, AdamW for the rest)");
    v("lr", lr, "Peak learning rate (> 0)");
    v("beta1", beta1, "Adam beta1 in [0, 1)");
    v("beta2", beta2, "Adam beta2 in [0, 1)");
    v("eps", eps, "Adam epsilon (> 0)");
    v("weight_decay", weight_decay, "Decoupled weight decay (>= 0)");
    v("implementation", implementation, "Update kernel: fused, foreach or for-loop (same math)");
    v("early_step_in_backward", early_step_in_backward,
      "Step each parameter as soon as its gradient is ready, during backward", kNotYet);
    v("state_dtype", state_dtype,
      "Optimizer states (AdamW's moments, Muon's momentum): float32 or bfloat16 (half the "
      "memory; float32 math)");
    v("muon_momentum", muon_momentum, "Muon: momentum in [0, 1)");
    v("muon_nesterov", muon_nesterov, "Muon: Nesterov momentum");
    v("muon_ns_a", muon_ns_a, "Muon: Newton-Schulz coefficient a (of X)");
    v("muon_ns_b", muon_ns_b, "Muon: Newton-Schulz coefficient b (of X X^T X)");
    v("muon_ns_c", muon_ns_c, "Muon: Newton-Schulz coefficient c (of (X X^T)^2 X)");
    v("muon_ns_steps", muon_ns_steps, "Muon: Newton-Schulz iterations, in [1, 100)");
    v("muon_eps", muon_eps, "Muon: floor of the update's norm before Newton-Schulz (> 0)");
    v("muon_adjust_lr_fn", muon_adjust_lr_fn,
      "Muon: learning rate per matrix shape: original, match_rms_adamw or spectral_unclamped");
    v("muon_adamw_fqns", muon_adamw_fqns,
      "Muon: matrices (and modules of them) that take AdamW instead; embeddings, norms and "
      "biases always do");
    v("muon_adamw_lr", muon_adamw_lr, "Muon: the AdamW group's peak learning rate; < 0: lr");
    v("muon_adamw_weight_decay", muon_adamw_weight_decay,
      "Muon: the AdamW group's weight decay; < 0: weight_decay");
  }
};

struct LRSchedulerSection {
  static constexpr const char* kName = "lr_scheduler";
  int64_t warmup_steps = 200;
  int64_t total_steps = -1;   // -1: unset (training.steps)
  double decay_ratio = -1.0;  // < 0: unset (decay over all steps after warmup)
  std::string decay_type = "linear";
  double min_lr_factor = 0.0;

  template <class V>
  void visit(V& v) {
    v("warmup_steps", warmup_steps, "Steps of linear warmup from ~0 to optimizer.lr (>= 0)");
    v("total_steps", total_steps,
      "Length of the schedule in steps (>= 1); unset (-1) uses training.steps. A run shorter "
      "than the schedule stops part-way along it; a longer one goes on at min_lr_factor * lr");
    v("decay_ratio", decay_ratio,
      "Fraction of steps spent decaying at the end (warmup-stable-decay); unset (-1) decays "
      "right after warmup");
    v("decay_type", decay_type, "Decay shape: linear, sqrt or cosine");
    v("min_lr_factor", min_lr_factor, "Final lr as a fraction of optimizer.lr, in [0, 1]");
  }
};

// [training.dataloader] and [validation.dataloader]: TorchTitan's PyTorch DataLoader settings.
struct DataLoaderSection {
  int64_t num_workers = 0;
  bool persistent_workers = false;
  bool pin_memory = false;
  int64_t prefetch_factor = -1;  // -1: unset

  template <class V>
  void visit(V& v) {
    v("num_workers", num_workers, "Worker processes loading data", kNotYet);
    v("persistent_workers", persistent_workers, "Keep workers alive between epochs", kNotYet);
    v("pin_memory", pin_memory, "Copy batches to pinned memory", kNotYet);
    v("prefetch_factor", prefetch_factor, "Batches loaded ahead by each worker; -1 unset", kNotYet);
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
  bool enable_cpu_offload = false;
  std::string dtype = "float32";
  std::string mixed_precision_param = "bfloat16";
  std::string mixed_precision_reduce = "float32";
  int64_t gc_freq = 50;
  bool gc_debug = false;
  int64_t num_threads = 0;
  std::string device = "auto";
  double mtp_loss_weight = 0.1;
  // FLUX (TorchTitan's flux job config adds these to [training]):
  double classifier_free_guidance_prob = 0.0;
  double guidance = 3.5;
  int64_t img_size = 256;
  bool test_mode = false;
  std::string image_caption_field = "caption";
  std::string image_field = "image";
  bool skip_unreadable_images = false;
  // The vision-language model (TorchTitan's VLM job config adds these to [training]):
  int64_t max_images_per_batch = 10;
  int64_t max_patches_per_image = 256;
  int64_t patch_size = 16;
  int64_t spatial_merge_size = 1;
  int64_t packing_buffer_size = 0;
  DataLoaderSection dataloader;  // [training.dataloader]

  template <class V>
  void visit(V& v) {
    v("dataset", dataset,
      "Dataset name: sotu (built-in corpus); c4, c4_test (TorchTitan's, from local files: "
      "dataset_path is the folder holding en/c4-train.*.json.gz, or a Hugging Face cache "
      "folder); or your files at dataset_path: text (.txt, one document per file), jsonl "
      "(.jsonl/.json, plain or .gz/.zst, one per line), parquet (.parquet, one per row; a "
      "hub folder's data/train-NNNNN-of-NNNNN.parquet), tokens (.bin from `titan data "
      "prepare`), auto (by extension); chat (conversations to fine-tune on, rows with "
      "messages in any of those row formats; see [sft]). FLUX: shapes (built-in procedural "
      "images with captions), flux_latents (the folder `titan flux encode` wrote, at "
      "dataset_path), or image-caption rows at dataset_path");
    v("dataset_path", dataset_path,
      "Where the dataset lives (file or folder); empty uses the cache ($TITAN_CACHE/datasets/"
      "<name>, filled by scripts/setup.sh for sotu)");
    v("dataset_text_field", dataset_text_field,
      "JSON key (jsonl) or column (parquet) holding a document's text");
    v("dataset_shuffle", dataset_shuffle,
      "Shuffle the document order every epoch, seeded by debug.seed + epoch");
    v("local_batch_size", local_batch_size, "Sequences per rank per micro-batch (>= 1)");
    v("global_batch_size", global_batch_size,
      "Sequences per optimizer step over all ranks; -1 = local_batch_size * dp degree. A "
      "multiple larger than that accumulates gradients");
    v("seq_len", seq_len, "Tokens per sequence (>= 1)");
    v("max_norm", max_norm, "Clip gradients to this global L2 norm; <= 0 disables clipping");
    v("steps", steps, "Optimizer steps to train (>= 1)");
    v("enable_cpu_offload", enable_cpu_offload,
      "Keep FSDP parameters, gradients and optimizer states in host memory", kNotYet);
    v("dtype", dtype,
      "Training dtype: float32, or bfloat16 for full bf16 training (parameters, gradients and "
      "optimizer states in bf16, no float32 copy; RoPE and logits stay float32). bfloat16 is "
      "single-process only for now");
    v("mixed_precision_param", mixed_precision_param,
      "Compute dtype of matmuls: bfloat16 or float32 (master weights stay float32)");
    v("mixed_precision_reduce", mixed_precision_reduce,
      "Dtype of gradient reductions across ranks: float32");
    v("gc_freq", gc_freq,
      "Python garbage-collection interval in TorchTitan (>= 1); C++ frees memory as soon as it "
      "is unused, so every value behaves like collecting at every step");
    v("gc_debug", gc_debug, "Collect garbage at every step to find reference cycles", kNotYet);
    v("num_threads", num_threads,
      "CPU threads per rank for ATen and BLAS; 0 = cores / local ranks. At most 1024 (a "
      "ConfigError above); more than the cores is allowed with a warning");
    v("device", device,
      "Device of each rank: auto (cuda:LOCAL_RANK when CUDA devices are visible, honouring "
      "CUDA_VISIBLE_DEVICES, else cpu), cuda (an error without one), or cpu");
    v("mtp_loss_weight", mtp_loss_weight,
      "Multi-token prediction (models with num_mtp_layers, e.g. deepseek_v3 debugmodel_mtp): "
      "backward runs on loss + mtp_loss_weight x the mean of the depths' cross-entropies "
      "(DeepSeek-V3's lambda: 0.3, then 0.1), which the metrics log as mtp_loss; >= 0");
    v("classifier_free_guidance_prob", classifier_free_guidance_prob,
      "FLUX: the probability of dropping each text encoding of a sample (its caption encoded "
      "as the empty text), T5's and CLIP's independently, so that the model also learns the "
      "unconditional velocity classifier-free guidance needs; in [0, 1]");
    v("guidance", guidance,
      "FLUX models with a guidance embedding (flux-dev): the guidance strength it is given while "
      "training (3.5, diffusers' FLUX training scripts' default); unused by other flavors");
    v("img_size", img_size,
      "FLUX: training images are resized (shorter side) and cropped to img_size x img_size; a "
      "multiple of 16 (the autoencoder's 8 x the 2 x 2 patches)");
    v("test_mode", test_mode,
      "FLUX: random text encoders and autoencoder instead of loading [encoder]'s weights (their "
      "configs from those folders when they exist, else small debug ones sized to the flavor), "
      "captions tokenized by model.hf_assets_path's tokenizer (TorchTitan's integration-test "
      "mode)");
    v("image_field", image_field,
      "Image datasets (FLUX, VLM): the JSON key or parquet column holding the image (a path, bytes, "
      "or Hugging Face's Image struct)");
    v("image_caption_field", image_caption_field,
      "Image datasets (FLUX, VLM): the JSON key or parquet column holding the caption");
    v("skip_unreadable_images", skip_unreadable_images,
      "Image datasets (FLUX, VLM): skip rows whose image cannot be read (a warning each, "
      "counted) instead of stopping with the row's name");
    v("max_images_per_batch", max_images_per_batch,
      "VLM: images the encoder takes per local batch at most (one per sample here, so at least "
      "training.local_batch_size)");
    v("max_patches_per_image", max_patches_per_image,
      "VLM: each image is resized, keeping its aspect ratio, to a grid of at most this many "
      "patches (the encoder's sequence length)");
    v("patch_size", patch_size,
      "VLM: pixels per patch side; must equal the model's encoder patch size");
    v("spatial_merge_size", spatial_merge_size,
      "VLM: patches merged per side before the decoder; only 1 (no merging) is built");
    v("packing_buffer_size", packing_buffer_size,
      "VLM: samples buffered for packing several into one sequence; only 0 (one sample per "
      "sequence) is built");
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
  int64_t fsdp_prefetch_units = 1;
  bool disable_loss_parallel = false;
  bool enable_async_tensor_parallel = false;
  std::vector<std::vector<std::string>> module_fqns_per_model_part = {};
  int64_t pipeline_parallel_first_stage_less_layers = 1;
  int64_t pipeline_parallel_last_stage_less_layers = 1;
  int64_t pipeline_parallel_layers_per_stage = -1;  // -1: unset
  std::string pipeline_parallel_schedule = "1F1B";
  std::string pipeline_parallel_schedule_csv = "";
  int64_t pipeline_parallel_microbatch_size = 1;
  bool pipeline_parallel_expert_parallel_overlap = true;
  std::string context_parallel_load_balancer = "headtail";
  std::string context_parallel_rotate_method = "allgather";
  int64_t expert_tensor_parallel_degree = 1;
  std::string expert_parallel_comm_backend = "standard";

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
    v("fsdp_prefetch_units", fsdp_prefetch_units,
      "FSDP units whose all-gather starts ahead of their use (forward and backward), each one "
      "unit's parameters of memory; more hide more of a slow link's latency; 0 none");
    v("disable_loss_parallel", disable_loss_parallel,
      "With tensor parallelism, all-gather the vocabulary-sharded logits before the loss instead "
      "of computing the cross-entropy on the shards");
    v("enable_async_tensor_parallel", enable_async_tensor_parallel,
      "Overlap tensor-parallel communication with compute (needs compile)", kNotYet);
    v("module_fqns_per_model_part", module_fqns_per_model_part,
      "Modules of each pipeline model part, e.g. [[\"tok_embeddings\", \"layers.0\"], "
      "[\"layers.1\", \"norm\", \"output\"]]; on the command line a;b parts with a,b modules");
    v("pipeline_parallel_first_stage_less_layers", pipeline_parallel_first_stage_less_layers,
      "Layers fewer in the first pipeline stage (it holds the embedding)");
    v("pipeline_parallel_last_stage_less_layers", pipeline_parallel_last_stage_less_layers,
      "Layers fewer in the last pipeline stage (it holds the output)");
    v("pipeline_parallel_layers_per_stage", pipeline_parallel_layers_per_stage,
      "Layers per (virtual) pipeline stage; -1 infers it");
    v("pipeline_parallel_schedule", pipeline_parallel_schedule,
      "Pipeline schedule: 1F1B, GPipe, Interleaved1F1B, LoopedBFS, InterleavedZeroBubble, "
      "ZBVZeroBubble, DualPipeV");
    v("pipeline_parallel_schedule_csv", pipeline_parallel_schedule_csv,
      "CSV file with a custom pipeline schedule");
    v("pipeline_parallel_microbatch_size", pipeline_parallel_microbatch_size,
      "Sequences per pipeline microbatch");
    v("pipeline_parallel_expert_parallel_overlap", pipeline_parallel_expert_parallel_overlap,
      "Overlap expert- and pipeline-parallel communication in DualPipeV (accepted; the overlapped "
      "forward and backward run one after the other either way)");
    v("context_parallel_load_balancer", context_parallel_load_balancer,
      "Context-parallel sequence sharding: headtail (causal load balancing) or none "
      "(contiguous shares); ptrr is refused");
    v("context_parallel_rotate_method", context_parallel_rotate_method,
      "Context-parallel exchange of key/value shards: allgather or alltoall");
    v("expert_tensor_parallel_degree", expert_tensor_parallel_degree,
      "Tensor-parallel degree of routed experts (1 or tensor_parallel_degree)");
    v("expert_parallel_comm_backend", expert_parallel_comm_backend,
      "Expert-parallel all-to-all: standard or deepep");
  }
};

struct CommSection {
  static constexpr const char* kName = "comm";
  int64_t init_timeout_seconds = 300;
  int64_t train_timeout_seconds = 100;
  int64_t trace_buf_size = 20000;
  std::string save_traces_folder = "comm_traces";
  std::string save_traces_file_prefix = "rank_";
  std::string mode = "default";

  template <class V>
  void visit(V& v) {
    v("init_timeout_seconds", init_timeout_seconds,
      "Timeout for rendezvous and the first collectives, in seconds");
    v("train_timeout_seconds", train_timeout_seconds,
      "Timeout for every collective after the first training step, in seconds");
    v("trace_buf_size", trace_buf_size, "Collectives kept by the flight recorder (0 disables it)");
    v("save_traces_folder", save_traces_folder,
      "Folder (under job.dump_folder) for flight-recorder dumps");
    v("save_traces_file_prefix", save_traces_file_prefix,
      "File-name prefix of flight-recorder dumps");
    v("mode", mode,
      "Communication mode: default, fake_backend (dry run) or local_tensor (simulated ranks)",
      kNotYet);
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
  DataLoaderSection dataloader;  // [validation.dataloader]

  template <class V>
  void visit(V& v) {
    v("enable", enable, "Run validation during training");
    v("dataset", dataset,
      "Validation dataset name: sotu_validation, c4_validation (en/c4-validation.*.json.gz at "
      "dataset_path), c4_test, or text/jsonl/parquet/tokens/auto (as training.dataset; a hub "
      "folder gives its validation split, else test), or chat (as training.dataset); read once "
      "in order");
    v("dataset_path", dataset_path, "Where the validation dataset lives; empty uses the cache");
    v("dataset_text_field", dataset_text_field,
      "JSON key (jsonl) or column (parquet) holding a document's text");
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
  bool initial_load_in_hf_quantized = false;
  bool last_save_in_hf = false;
  bool create_seed_checkpoint = false;
  bool enable_first_step_checkpoint = false;
  std::string async_mode = "disabled";
  bool load_only = false;
  bool enable_ft_dataloader_checkpoints = true;

  template <class V>
  void visit(V& v) {
    v("enable", enable, "Save checkpoints and resume from the latest complete one in the folder");
    v("folder", folder, "Checkpoint folder, relative to job.dump_folder; holds step-N directories");
    v("interval", interval, "Save every N steps (a final checkpoint is always saved at the end)");
    v("keep_latest_k", keep_latest_k,
      "Keep the newest K checkpoints, delete older ones; 0 keeps all");
    v("load_step", load_step, "Resume from this step's checkpoint; -1 takes the latest");
    v("exclude_from_loading", exclude_from_loading,
      "State to skip when resuming: model, optimizer, lr_scheduler, dataloader, train_state, rng");
    v("last_save_model_only", last_save_model_only,
      "The final checkpoint holds only the model weights (in checkpoint.export_dtype)");
    v("export_dtype", export_dtype,
      "dtype of model-only checkpoints: float32, bfloat16 or float16");
    v("initial_load_path", initial_load_path,
      "Checkpoint (or Hugging Face folder) to start from when the folder has no checkpoint");
    v("initial_load_model_only", initial_load_model_only,
      "Load only the model weights from initial_load_path");
    v("initial_load_in_hf", initial_load_in_hf, "initial_load_path is a Hugging Face model folder");
    v("initial_load_in_hf_quantized", initial_load_in_hf_quantized,
      "The Hugging Face weights at initial_load_path are quantized", kNotYet);
    v("last_save_in_hf", last_save_in_hf,
      "Also write the final model as a Hugging Face folder (step-N-hf); needs last_save_model_only");
    v("create_seed_checkpoint", create_seed_checkpoint,
      "Write the initialized model as step-0 and exit (no training)");
    v("enable_first_step_checkpoint", enable_first_step_checkpoint, "Also save after step 1");
    v("async_mode", async_mode,
      "disabled: save in the training loop; async (or async_with_pinned_mem): snapshot the "
      "state, write it on a background thread while training goes on");
    v("load_only", load_only,
      "Load checkpoints (resume, initial_load_path) but never save one; needs enable");
    v("enable_ft_dataloader_checkpoints", enable_ft_dataloader_checkpoints,
      "Checkpoint the data loader of fault-tolerant replicas (always, in titan)", kNotYet);
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
    v("early_stop", early_stop, "Stop recomputation once the needed activations are rebuilt",
      kNotYet);
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

struct CompileSection {
  static constexpr const char* kName = "compile";
  bool enable = false;
  std::vector<std::string> components = {"model", "loss"};
  std::string backend = "inductor";

  template <class V>
  void visit(V& v) {
    v("enable", enable, "Run titan's fused kernels in the components (torch.compile's place)");
    v("components", components,
      "What to fuse: model (RMSNorm, SwiGLU, RoPE, attention) and loss (linear + cross-entropy)");
    v("backend", backend, "Compiler backend: inductor (titan's fused kernels; the only one)");
  }
};

struct MemoryEstimationSection {
  static constexpr const char* kName = "memory_estimation";
  bool enable = false;
  bool disable_fake_mode = false;

  template <class V>
  void visit(V& v) {
    v("enable", enable, "Estimate FSDP memory before training", kNotYet);
    v("disable_fake_mode", disable_fake_mode, "Estimate with real tensors",
      used_with("memory_estimation.enable"));
  }
};

struct FaultToleranceSection {
  static constexpr const char* kName = "fault_tolerance";
  bool enable = false;
  std::string process_group = "gloo";
  int64_t process_group_timeout_ms = 10000;
  int64_t replica_id = 0;
  int64_t group_size = 0;
  int64_t min_replica_size = 1;
  std::string semi_sync_method = "";  // "": unset
  int64_t sync_steps = 5;
  double outer_lr = 0.7;
  double outer_momentum = 0.9;

  template <class V>
  void visit(V& v) {
    v("enable", enable,
      "Fault-tolerant replica groups: this job is one, coordinated by the lighthouse at "
      "TITAN_FT_LIGHTHOUSE (`titan ft lighthouse`)");
    v("process_group", process_group, "Process group between the replica groups: gloo");
    v("process_group_timeout_ms", process_group_timeout_ms,
      "Cross-replica operation timeout, in ms: a replica group that hangs longer is dropped");
    v("replica_id", replica_id, "This replica group's id, 0 .. group_size - 1");
    v("group_size", group_size, "Number of replica groups (each its slice of the data)");
    v("min_replica_size", min_replica_size, "Replica groups needed for a step");
    v("semi_sync_method", semi_sync_method,
      "Semi-synchronous training: local_sgd or diloco (unset: average gradients every step)");
    v("sync_steps", sync_steps, "Semi-synchronous: optimizer steps between syncs (TorchTitan's)");
    v("outer_lr", outer_lr, "DiLoCo: the outer Nesterov SGD's learning rate");
    v("outer_momentum", outer_momentum, "DiLoCo: the outer Nesterov SGD's momentum");
  }
};

struct ExperimentalSection {
  static constexpr const char* kName = "experimental";
  std::string custom_import = "";
  std::string custom_args_module = "";

  template <class V>
  void visit(V& v) {
    v("custom_import", custom_import, "Python module to import (TorchTitan)", kNotYet);
    v("custom_args_module", custom_args_module,
      "Deprecated name of job.custom_config_module (TorchTitan)", kNotYet);
  }
};

struct DebugSection {
  static constexpr const char* kName = "debug";
  int64_t seed = -1;
  bool deterministic = false;
  bool deterministic_warn_only = false;
  bool moe_force_load_balance = false;

  template <class V>
  void visit(V& v) {
    v("seed", seed, "Random seed for init and data; -1 picks one from the clock (printed)");
    v("deterministic", deterministic, "Use deterministic algorithms only");
    v("deterministic_warn_only", deterministic_warn_only,
      "With deterministic: warn about ops without a deterministic implementation instead of "
      "failing");
    v("moe_force_load_balance", moe_force_load_balance,
      "Route tokens to experts round-robin, whatever the router's scores (MoE benchmarks and "
      "debugging: even expert loads)");
  }
};

struct JobConfig {
  JobSection job;
  ProfilingSection profiling;
  MetricsSection metrics;
  ModelSection model;
  OptimizerSection optimizer;
  LRSchedulerSection lr_scheduler;
  TrainingSection training;
  EncoderSection encoder;
  SftSection sft;
  LoraSection lora;
  ParallelismSection parallelism;
  CheckpointSection checkpoint;
  ActivationCheckpointSection activation_checkpoint;
  CompileSection compile;
  QuantizeSection quantize;
  CommSection comm;
  MemoryEstimationSection memory_estimation;
  FaultToleranceSection fault_tolerance;
  ExperimentalSection experimental;
  ValidationSection validation;
  DebugSection debug;

  // Calls v.section(name, section) for each section, in TorchTitan's order (which `--help` and
  // --job.print_config show).
  template <class V>
  void visit_sections(V& v) {
    v.section(JobSection::kName, job);
    v.section(ProfilingSection::kName, profiling);
    v.section(MetricsSection::kName, metrics);
    v.section(ModelSection::kName, model);
    v.section(OptimizerSection::kName, optimizer);
    v.section(LRSchedulerSection::kName, lr_scheduler);
    v.section(TrainingSection::kName, training);
    v.section("training.dataloader", training.dataloader);
    v.section(EncoderSection::kName, encoder);
    v.section(SftSection::kName, sft);
    v.section(LoraSection::kName, lora);
    v.section(ParallelismSection::kName, parallelism);
    v.section(CheckpointSection::kName, checkpoint);
    v.section(ActivationCheckpointSection::kName, activation_checkpoint);
    v.section(CompileSection::kName, compile);
    v.section(Float8LinearSection::kName, quantize.linear.float8);
    v.section(MXLinearSection::kName, quantize.linear.mx);
    v.section(Float8GroupedMMSection::kName, quantize.grouped_mm.float8);
    v.section(MXGroupedMMSection::kName, quantize.grouped_mm.mx);
    v.section(CommSection::kName, comm);
    v.section(MemoryEstimationSection::kName, memory_estimation);
    v.section(FaultToleranceSection::kName, fault_tolerance);
    v.section(ExperimentalSection::kName, experimental);
    v.section(ValidationSection::kName, validation);
    v.section("validation.dataloader", validation.dataloader);
    v.section(DebugSection::kName, debug);
  }
};

}  // namespace titan
