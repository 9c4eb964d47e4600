// validate_job_config(): per-key ranges and the cross-field checks (batch sizes against the
// data-parallel degree, warmup + decay against the step count), each failure a ConfigError that
// states the rule, the value and, for cross-field checks, the arithmetic.
#include "titan/common/check.h"
#include "titan/common/cpu.h"
#include "titan/common/format.h"
#include "titan/common/names.h"
#include "titan/config/config_manager.h"
#include "titan/config/field_table.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <string>
#include <vector>

namespace titan {

namespace {

using detail::format_number;

[[noreturn]] void fail(const std::string& message) { throw ConfigError(message); }

void check_at_least(const char* name, int64_t value, int64_t min) {
  if (value < min) {
    fail(std::string(name) + " must be >= " + std::to_string(min) + ", got " +
         std::to_string(value));
  }
}

// -1 is a sentinel ("take the rest", "all of it"); anything else must be >= 1.
void check_minus_one_or_positive(const char* name, int64_t value, const char* meaning) {
  if (value != -1 && value < 1) {
    fail(std::string(name) + " must be -1 (" + meaning + ") or >= 1, got " + std::to_string(value));
  }
}

// The comparisons are written so that NaN fails them.
void check_positive(const char* name, double value) {
  if (!(value > 0)) {
    fail(std::string(name) + " must be > 0, got " + format_number(value));
  }
}

void check_non_negative(const char* name, double value) {
  if (!(value >= 0)) {
    fail(std::string(name) + " must be >= 0, got " + format_number(value));
  }
}

void check_unit_interval(const char* name, double value, bool include_one) {
  if (!(value >= 0 && (include_one ? value <= 1 : value < 1))) {
    fail(std::string(name) + " must be in [0, 1" + (include_one ? "]" : ")") + ", got " +
         format_number(value));
  }
}

void check_one_of(const char* name, const std::string& value,
                  std::initializer_list<const char*> allowed) {
  std::string listed;
  for (const char* option : allowed) {
    if (value == option) {
      return;
    }
    listed += (listed.empty() ? "" : ", ") + std::string(*option ? option : "\"\" (unset)");
  }
  fail(std::string(name) + " must be one of " + listed + "; got '" + value + "'");
}

// checkpoint.load_only loads but never saves: a setting that asks for a save contradicts it.
void validate_load_only(const CheckpointSection& c) {
  if (!c.load_only) return;
  if (!c.enable) {
    fail(
        "checkpoint.load_only needs checkpoint.enable = true (without it nothing is loaded). "
        "HINT: add --checkpoint.enable, or drop checkpoint.load_only");
  }
  const std::pair<const char*, bool> saves[] = {
      {"checkpoint.create_seed_checkpoint", c.create_seed_checkpoint},
      {"checkpoint.enable_first_step_checkpoint", c.enable_first_step_checkpoint},
      {"checkpoint.last_save_in_hf", c.last_save_in_hf},
  };
  for (const auto& [name, on] : saves) {
    if (on) {
      fail(std::string(name) +
           " asks for a save, but checkpoint.load_only never saves. HINT: "
           "drop one of the two");
    }
  }
}

// Rules for every key of a type, over the whole field table, so a new key is covered without a
// check of its own:
//   - inf and nan read as floats (TOML, strtod) but are never a meaningful setting (lr inf trains
//     on garbage, max_norm nan silently disables clipping);
//   - integer keys stay within 2^53 in magnitude (far above any real setting), so the sums the
//     checks compute (warmup + active <= freq, seed + epoch) cannot overflow into passing
//     (products are checked where they are formed);
//   - strings and string lists hold no NUL byte (it would cut a path short in the C library).
void validate_field_values(const JobConfig& c) {
  JobConfig copy = c;  // a FieldTable points into a mutable config
  const detail::FieldTable table = detail::FieldTable::of(copy);
  constexpr int64_t kMaxInt = int64_t{1} << 53;
  for (const detail::FieldRef& field : table.fields()) {
    // A NUL byte (TOML "\u0000") would cut a path or name short where the C library reads it.
    std::vector<const std::string*> texts;
    if (field.type == detail::FieldType::kString) {
      texts.push_back(static_cast<const std::string*>(field.value));
    } else if (field.type == detail::FieldType::kStringList) {
      for (const std::string& t : *static_cast<const std::vector<std::string>*>(field.value)) {
        texts.push_back(&t);
      }
    }
    for (const std::string* text : texts) {
      const size_t nul = text->find('\0');
      if (nul != std::string::npos) {
        fail("config key '" + field.name() + "' holds a NUL byte at character " +
             std::to_string(nul) + " (after '" + detail::shown_name(text->substr(0, nul)) +
             "'); paths and names cannot contain one");
      }
    }
    if (field.type == detail::FieldType::kInt) {
      const int64_t value = *static_cast<const int64_t*>(field.value);
      if (value > kMaxInt || value < -kMaxInt) {
        fail("config key '" + field.name() + "' = " + std::to_string(value) +
             " is out of range: integer keys are at most 2^53 = " + std::to_string(kMaxInt) +
             " in magnitude");
      }
    }
    if (field.type != detail::FieldType::kDouble) continue;
    const double value = *static_cast<const double*>(field.value);
    if (!std::isfinite(value)) {
      fail("config key '" + field.name() + "' must be a finite number, got " +
           format_number(value) + " (inf and nan are refused for every float key)");
    }
  }
}

// TorchTitan keys whose feature is not built yet (kNotYet in job_config.h) keep their defaults;
// one table-driven check covers them all, so no value is silently ignored.
void validate_not_yet_supported(const JobConfig& c) {
  if (c.metrics.enable_wandb) {  // the generic message below, with the reason and the alternative
    fail(
        "config key 'metrics.enable_wandb' = true is not supported yet: Weights & Biases logs to "
        "a network service, which titan.cpp does not talk to. HINT: remove "
        "'metrics.enable_wandb' (or set it to false); for plots set metrics.enable_tensorboard = "
        "true (TensorBoard event files under <job.dump_folder>/<metrics.save_tb_folder>/), or "
        "read <job.dump_folder>/metrics.jsonl");
  }
  JobConfig copy = c;
  JobConfig defaults;
  const detail::FieldTable table = detail::FieldTable::of(copy);
  const detail::FieldTable default_table = detail::FieldTable::of(defaults);
  for (size_t i = 0; i < table.fields().size(); ++i) {
    const detail::FieldRef& field = table.fields()[i];
    if (field.support.kind != KeySupport::kNotYet) continue;
    const std::string value = detail::format_toml_value(field);
    const std::string default_value = detail::format_toml_value(default_table.fields()[i]);
    if (value != default_value) {
      fail("config key '" + field.name() + "' = " + value + " is not supported yet (" +
           field.description + "); titan.cpp accepts only its default, " + default_value +
           ". HINT: remove '" + field.name() +
           "' from the TOML file and the command line, or set "
           "it to " +
           default_value);
    }
  }
}

void validate_ranges(const JobConfig& c) {
  if (c.job.dump_folder.empty()) {
    fail(
        "job.dump_folder is empty; it must name the folder for metrics, checkpoints and other "
        "outputs (\".\" for the current directory, default \"./outputs\")");
  }
  check_at_least("metrics.log_freq", c.metrics.log_freq, 1);
  check_non_negative("metrics.peak_flops", c.metrics.peak_flops);

  check_at_least("comm.init_timeout_seconds", c.comm.init_timeout_seconds, 1);
  check_at_least("comm.train_timeout_seconds", c.comm.train_timeout_seconds, 1);
  check_one_of("parallelism.fsdp_reshard_after_forward", c.parallelism.fsdp_reshard_after_forward,
               {"default", "always", "never"});
  check_at_least("parallelism.fsdp_prefetch_units", c.parallelism.fsdp_prefetch_units, 0);
  check_at_least("checkpoint.interval", c.checkpoint.interval, 1);
  check_at_least("checkpoint.keep_latest_k", c.checkpoint.keep_latest_k, 0);
  check_minus_one_or_positive("checkpoint.load_step", c.checkpoint.load_step, "the latest");
  check_one_of("checkpoint.export_dtype", c.checkpoint.export_dtype,
               {"float32", "bfloat16", "float16"});
  check_one_of("checkpoint.async_mode", c.checkpoint.async_mode,
               {"disabled", "async", "async_with_pinned_mem"});
  for (const std::string& item : c.checkpoint.exclude_from_loading) {
    check_one_of("checkpoint.exclude_from_loading entry", item,
                 {"model", "optimizer", "lr_scheduler", "dataloader", "train_state", "rng"});
  }
  if (c.checkpoint.last_save_in_hf && !c.checkpoint.last_save_model_only) {
    fail(
        "checkpoint.last_save_in_hf needs checkpoint.last_save_model_only = true (a Hugging "
        "Face folder holds only model weights)");
  }
  if (c.checkpoint.create_seed_checkpoint && !c.checkpoint.enable) {
    fail("checkpoint.create_seed_checkpoint needs checkpoint.enable = true");
  }
  if (c.checkpoint.initial_load_in_hf && c.checkpoint.initial_load_path.empty()) {
    fail("checkpoint.initial_load_in_hf is set but checkpoint.initial_load_path is empty");
  }
  validate_load_only(c.checkpoint);
  if (c.debug.seed < -1) {
    fail("debug.seed must be -1 (a seed from the clock, printed) or >= 0, got " +
         std::to_string(c.debug.seed));
  }
  if (c.debug.deterministic_warn_only && !c.debug.deterministic) {
    fail(
        "debug.deterministic_warn_only needs debug.deterministic = true (it changes how "
        "deterministic mode treats ops without a deterministic implementation). HINT: add "
        "--debug.deterministic, or drop debug.deterministic_warn_only");
  }

  check_one_of("optimizer.name", c.optimizer.name, {"AdamW", "Adam", "Muon"});
  check_positive("optimizer.lr", c.optimizer.lr);
  check_unit_interval("optimizer.beta1", c.optimizer.beta1, /*include_one=*/false);
  check_unit_interval("optimizer.beta2", c.optimizer.beta2, /*include_one=*/false);
  check_positive("optimizer.eps", c.optimizer.eps);
  check_non_negative("optimizer.weight_decay", c.optimizer.weight_decay);
  check_one_of("optimizer.implementation", c.optimizer.implementation,
               {"fused", "foreach", "for-loop"});
  check_one_of("optimizer.state_dtype", c.optimizer.state_dtype, {"float32", "bfloat16"});
  check_unit_interval("optimizer.muon_momentum", c.optimizer.muon_momentum, /*include_one=*/false);
  check_at_least("optimizer.muon_ns_steps", c.optimizer.muon_ns_steps, 1);
  if (c.optimizer.muon_ns_steps >= 100) {
    fail("optimizer.muon_ns_steps must be below 100 (torch.optim.Muon's bound), got " +
         std::to_string(c.optimizer.muon_ns_steps));
  }
  check_positive("optimizer.muon_eps", c.optimizer.muon_eps);
  check_one_of("optimizer.muon_adjust_lr_fn", c.optimizer.muon_adjust_lr_fn,
               {"original", "match_rms_adamw", "spectral_unclamped"});
  if (c.optimizer.muon_adamw_lr != -1.0) {
    check_positive("optimizer.muon_adamw_lr", c.optimizer.muon_adamw_lr);
  }
  if (c.optimizer.muon_adamw_weight_decay != -1.0) {
    check_non_negative("optimizer.muon_adamw_weight_decay", c.optimizer.muon_adamw_weight_decay);
  }

  check_at_least("lr_scheduler.warmup_steps", c.lr_scheduler.warmup_steps, 0);
  check_minus_one_or_positive("lr_scheduler.total_steps", c.lr_scheduler.total_steps,
                              "unset: training.steps");
  double decay_ratio = c.lr_scheduler.decay_ratio;
  if (decay_ratio != -1.0 && !(decay_ratio >= 0 && decay_ratio <= 1)) {
    fail(
        "lr_scheduler.decay_ratio must be -1 (unset: decay right after warmup) or in [0, 1], "
        "got " +
        format_number(decay_ratio));
  }
  check_one_of("lr_scheduler.decay_type", c.lr_scheduler.decay_type, {"linear", "sqrt", "cosine"});
  check_unit_interval("lr_scheduler.min_lr_factor", c.lr_scheduler.min_lr_factor,
                      /*include_one=*/true);

  check_at_least("training.local_batch_size", c.training.local_batch_size, 1);
  check_at_least("training.seq_len", c.training.seq_len, 1);
  check_at_least("training.steps", c.training.steps, 1);
  check_one_of("training.dtype", c.training.dtype, {"float32", "bfloat16"});
  check_one_of("training.mixed_precision_param", c.training.mixed_precision_param,
               {"bfloat16", "float32"});
  check_at_least("training.gc_freq", c.training.gc_freq, 1);
  check_one_of("training.mixed_precision_reduce", c.training.mixed_precision_reduce, {"float32"});
  check_at_least("training.num_threads", c.training.num_threads, 0);
  check_one_of("training.device", c.training.device, {"auto", "cuda", "cpu"});
  if (c.training.mtp_loss_weight < 0) {
    fail("training.mtp_loss_weight must be >= 0 (the multi-token prediction loss's weight), got " +
         format_number(c.training.mtp_loss_weight));
  }
  check_unit_interval("training.classifier_free_guidance_prob",
                      c.training.classifier_free_guidance_prob, /*include_one=*/true);
  if (c.training.img_size < 16 || c.training.img_size % 16 != 0) {
    fail(
        "training.img_size must be a positive multiple of 16 (the autoencoder halves the size 3 "
        "times, then 2 x 2 latent patches make one image token), got " +
        std::to_string(c.training.img_size));
  }
  check_at_least("encoder.max_t5_encoding_len", c.encoder.max_t5_encoding_len, 1);
  check_at_least("training.max_images_per_batch", c.training.max_images_per_batch, 1);
  check_at_least("training.max_patches_per_image", c.training.max_patches_per_image, 1);
  check_at_least("training.patch_size", c.training.patch_size, 1);
  check_at_least("training.spatial_merge_size", c.training.spatial_merge_size, 1);
  check_at_least("training.packing_buffer_size", c.training.packing_buffer_size, 0);
  if (c.training.num_threads > kMaxNumThreads) {
    fail("training.num_threads " + std::to_string(c.training.num_threads) +
         " is above the cap of " + std::to_string(kMaxNumThreads) +
         " threads per rank (spawning them would stall start-up); "
         "use 0 (cores / local ranks) or at most this machine's core count");
  }

  check_one_of("sft.overlong", c.sft.overlong, {"drop", "truncate"});
  if (c.sft.prompt_field.empty() != c.sft.response_field.empty()) {
    throw ConfigError(message("sft.prompt_field = \"", c.sft.prompt_field,
                              "\" and sft.response_field = \"", c.sft.response_field,
                              "\": question/answer rows need both fields (or neither, for rows "
                              "with sft.messages_field)"));
  }

  const ParallelismSection& p = c.parallelism;
  check_at_least("parallelism.data_parallel_replicate_degree", p.data_parallel_replicate_degree, 1);
  check_minus_one_or_positive("parallelism.data_parallel_shard_degree",
                              p.data_parallel_shard_degree, "use the remaining ranks");
  check_at_least("parallelism.tensor_parallel_degree", p.tensor_parallel_degree, 1);
  check_at_least("parallelism.pipeline_parallel_degree", p.pipeline_parallel_degree, 1);
  check_at_least("parallelism.context_parallel_degree", p.context_parallel_degree, 1);
  check_at_least("parallelism.expert_parallel_degree", p.expert_parallel_degree, 1);
  check_one_of("model.attn_mask_type", c.model.attn_mask_type, {"causal", "block_causal"});
  check_one_of("parallelism.context_parallel_rotate_method", p.context_parallel_rotate_method,
               {"allgather", "alltoall"});
  check_one_of("parallelism.context_parallel_load_balancer", p.context_parallel_load_balancer,
               {"headtail", "none", "", "ptrr"});
  check_one_of("parallelism.expert_parallel_comm_backend", p.expert_parallel_comm_backend,
               {"standard", "deepep"});
  if (p.expert_parallel_degree > 1 && p.expert_parallel_comm_backend == "deepep") {
    throw ConfigError(
        "parallelism.expert_parallel_comm_backend = \"deepep\" (DeepEP's dispatch kernels) is not "
        "available. HINT: \"standard\" (the default): all-to-all over the ep group");
  }
  check_one_of("quantize.linear.float8.recipe_name", c.quantize.linear.float8.recipe_name,
               {"", "tensorwise", "rowwise", "rowwise_with_gw_hp"});
  check_one_of("quantize.linear.mx.mxfp8_dim1_cast_kernel_choice",
               c.quantize.linear.mx.mxfp8_dim1_cast_kernel_choice, {"triton", "cuda", "torch"});
  check_one_of("quantize.grouped_mm.mx.recipe_name", c.quantize.grouped_mm.mx.recipe_name,
               {"mxfp8"});

  check_at_least("validation.local_batch_size", c.validation.local_batch_size, 1);
  check_at_least("validation.seq_len", c.validation.seq_len, 1);
  check_at_least("validation.freq", c.validation.freq, 1);
  check_minus_one_or_positive("validation.steps", c.validation.steps,
                              "consume the whole validation set");
}

// TorchTitan's [activation_checkpoint] rules; the feature reads the other keys.
void validate_activation_checkpoint(const ActivationCheckpointSection& ac) {
  check_one_of("activation_checkpoint.mode", ac.mode,
               {"selective", "full", "none", "memory_budget"});
  if (ac.mode == "memory_budget") {
    fail(
        "activation_checkpoint.mode = \"memory_budget\" is not supported yet (it needs a "
        "graph compiler to choose what to save). HINT: use mode = \"selective\" (every Nth "
        "block or \"op\") or \"full\"");
  }
  const std::string& option = ac.selective_ac_option;
  if (option != "op") {
    bool digits = !option.empty() && option.size() <= 18 &&
                  option.find_first_not_of("0123456789") == std::string::npos;
    if (!digits) {
      fail("activation_checkpoint.selective_ac_option must be \"op\" or an integer >= 1, got '" +
           option + "'. HINT: \"2\" checkpoints every 2nd block, \"op\" selects by operator");
    }
    if (std::stoll(option) < 1) {
      fail(
          "activation_checkpoint.selective_ac_option must be an integer >= 1 (every Nth block), "
          "got " +
          option +
          ". HINT: use \"1\" to checkpoint every block, or mode = \"none\" "
          "for no checkpointing");
    }
  }
  check_one_of("activation_checkpoint.determinism_check", ac.determinism_check,
               {"default", "none"});
  check_unit_interval("activation_checkpoint.memory_budget", ac.memory_budget,
                      /*include_one=*/true);
}

// [compile]: titan's fused kernels stand in for torch.compile (models/converters.h): "model"
// for the layers' kernels, "loss" for the fused linear + cross-entropy. backend: titan has one,
// under TorchTitan's default name.
void validate_compile(const CompileSection& c) {
  for (const std::string& part : c.components) {
    if (part != "model" && part != "loss") {
      fail("compile.components entry '" + part + "' is not a component (model, loss)" +
           did_you_mean(likely_name(part, {"model", "loss"})));
    }
  }
  if (!c.enable) return;
  if (c.backend != "inductor") {
    fail("compile.backend '" + c.backend +
         "' is not supported: titan's fused kernels are its one backend, named \"inductor\" "
         "(the default). HINT: remove compile.backend");
  }
}

// [lora], when model.converters lists "lora" (the target names are checked against the model when
// the adapters are added: models/lora.h).
void validate_lora(const LoraSection& l) {
  if (l.rank < 1) {
    fail("lora.rank = " + std::to_string(l.rank) + " must be at least 1. HINT: 8 or 16 are usual");
  }
  if (!(l.alpha > 0)) fail("lora.alpha = " + std::to_string(l.alpha) + " must be > 0");
  if (!(l.dropout >= 0 && l.dropout < 1)) {
    fail("lora.dropout = " + std::to_string(l.dropout) + " must be in [0, 1)");
  }
  if (l.target_modules.empty()) {
    fail(
        "lora.target_modules is empty, so no layer would train. HINT: e.g. [\"wq\", \"wv\"] "
        "or [\"all-linear\"]");
  }
}

// lora.quantize_base (QLoRA): "nf4" quantizes the frozen base under LoRA's adapters, so it needs
// the adapters, a pretrained base to quantize (a Hugging Face folder) and no float8 on the same
// layers.
void validate_qlora(const JobConfig& c, bool lora, bool float8) {
  const std::string& q = c.lora.quantize_base;
  if (q.empty()) return;
  if (q != "nf4") {
    fail("lora.quantize_base = \"" + q + "\" is not a base quantization" +
         did_you_mean(nearest_name(q, {"nf4"})) + " (\"nf4\": 4-bit NormalFloat; \"\": none)");
  }
  if (!lora) {
    fail(
        "lora.quantize_base = \"nf4\" quantizes the frozen base under LoRA's adapters, but "
        "model.converters does not list \"lora\". HINT: model.converters = [\"lora\"]");
  }
  if (float8) {
    fail(
        "lora.quantize_base = \"nf4\" and the float8 linear converter both claim the base "
        "linear layers (a frozen weight is held in NF4 or computes in float8, not both). HINT: "
        "drop one of them from model.converters / lora.quantize_base");
  }
  if (c.checkpoint.initial_load_path.empty() || !c.checkpoint.initial_load_in_hf) {
    fail(
        "lora.quantize_base = \"nf4\" quantizes a pretrained base, read from a Hugging Face "
        "folder (and read again when a run resumes: checkpoints hold the adapters, not the NF4 "
        "base). HINT: set checkpoint.initial_load_path to the folder and "
        "checkpoint.initial_load_in_hf = true");
  }
  if (c.parallelism.tensor_parallel_degree > 1) {
    fail("lora.quantize_base = \"nf4\" with parallelism.tensor_parallel_degree = " +
         std::to_string(c.parallelism.tensor_parallel_degree) +
         " is not supported in this version (the NF4 base is held whole on each rank). HINT: "
         "split the batch with data parallelism (FSDP, HSDP, DDP) or the layers with pipeline "
         "parallelism");
  }
}

// model.converters: TorchTitan's registered names; the float8 linear converter is built (under
// its v0.2.2 name and its older one), the others are refused by name. Its FSDP float8 all-gather
// is not built, so its two switches are refused while the converter is on.
void validate_model_converters(const JobConfig& c) {
  const std::vector<std::string> built = {"quantize.linear.float8", "float8"};
  const std::vector<std::string> grouped = {"quantize.grouped_mm.float8", "quantize.grouped_mm.mx"};
  const std::vector<std::string> not_built = {"mx"};
  bool float8 = false, lora = false, mx = false;
  std::vector<std::string> grouped_listed;
  for (const std::string& name : c.model.converters) {
    const auto in = [&](const std::vector<std::string>& names) {
      return std::find(names.begin(), names.end(), name) != names.end();
    };
    if (name == "lora") {
      if (lora) fail("model.converters lists \"lora\" twice. HINT: keep one entry");
      lora = true;
      continue;
    }
    if (name == "quantize.linear.mx") {
      if (mx) fail("model.converters lists \"quantize.linear.mx\" twice. HINT: keep one entry");
      mx = true;
      continue;
    }
    if (in(grouped)) {
      if (std::find(grouped_listed.begin(), grouped_listed.end(), name) != grouped_listed.end()) {
        fail("model.converters lists \"" + name + "\" twice. HINT: keep one entry");
      }
      grouped_listed.push_back(name);
      continue;
    }
    if (in(not_built)) {
      fail("model.converters entry '" + name +
           "' (TorchTitan's older name of the MX linear converter) is not a converter here. HINT: "
           "use model.converters = [\"quantize.linear.mx\"]");
    }
    if (!in(built)) {
      std::vector<std::string> all = built;
      all.push_back("lora");
      all.push_back("quantize.linear.mx");
      all.insert(all.end(), grouped.begin(), grouped.end());
      fail("model.converters entry '" + name + "' is not a model converter" +
           did_you_mean(nearest_name(name, all)) +
           " (quantize.linear.float8, also spelled float8, quantize.linear.mx, "
           "quantize.grouped_mm.float8, quantize.grouped_mm.mx and lora)");
    }
    if (float8) {
      fail(
          "model.converters lists the float8 linear converter twice ('float8' is the older "
          "name of 'quantize.linear.float8'). HINT: keep one entry");
    }
    float8 = true;
  }
  if (mx) {
    if (float8) {
      fail(
          "model.converters lists both the float8 and the MX linear converters; a layer computes "
          "in one of them. HINT: keep quantize.linear.float8 or quantize.linear.mx");
    }
    const std::string& recipe = c.quantize.linear.mx.recipe_name;
    if (recipe != "mxfp8_cublas" && recipe != "mxfp8_emulated" && recipe != "mxfp8_cublas_rceil") {
      fail("quantize.linear.mx.recipe_name '" + recipe +
           "' is not built; titan.cpp computes MXFP8 with torchao's FLOOR scale rule "
           "(mxfp8_cublas, also spelled mxfp8_emulated) or its RCEIL rule (mxfp8_cublas_rceil); "
           "MXFP4 recipes are not built");
    }
  }
  if (grouped_listed.size() == 2) {
    fail(
        "model.converters lists both quantize.grouped_mm.float8 and quantize.grouped_mm.mx; the "
        "MoE experts' GEMMs compute in one of them. HINT: keep one entry");
  }
  for (const std::string& name : grouped_listed) {
    const bool mx_experts = name == "quantize.grouped_mm.mx";
    const std::vector<std::string>& fqns =
        mx_experts ? c.quantize.grouped_mm.mx.fqns : c.quantize.grouped_mm.float8.fqns;
    if (fqns.empty()) {
      fail("model.converters lists \"" + name + "\", which converts the MoE modules named in " +
           name + ".fqns, and that list is empty. HINT: " + name +
           ".fqns = [\"experts\"] selects every MoE layer's routed experts");
    }
    if (c.parallelism.expert_tensor_parallel_degree > 1) {
      fail("model.converters lists \"" + name +
           "\" with parallelism.expert_tensor_parallel_degree = " +
           std::to_string(c.parallelism.expert_tensor_parallel_degree) +
           ": quantized expert GEMMs under expert tensor parallelism are not built (their "
           "scales would span the experts' split hidden features). HINT: "
           "expert_tensor_parallel_degree = 1 (experts whole on each rank, or split by "
           "expert_parallel_degree)");
    }
  }
  if (lora) validate_lora(c.lora);
  validate_qlora(c, lora, float8);
  if (!float8) return;
  const Float8LinearSection& f8 = c.quantize.linear.float8;
  // The float8 all-gather casts each weight with one scale (torchao supports it for the
  // tensorwise recipe only, and TorchTitan refuses the other recipes with it).
  const bool tensorwise = f8.recipe_name.empty() || f8.recipe_name == "tensorwise";
  if (f8.enable_fsdp_float8_all_gather && !tensorwise) {
    fail(
        "quantize.linear.float8.enable_fsdp_float8_all_gather = true needs the tensorwise "
        "recipe, but recipe_name = '" +
        f8.recipe_name +
        "': the float8 all-gather casts each weight with one scale. HINT: set "
        "enable_fsdp_float8_all_gather = false (the matmuls still run in float8), or "
        "recipe_name = \"tensorwise\"");
  }
  if (f8.precompute_float8_dynamic_scale_for_fsdp && !f8.enable_fsdp_float8_all_gather) {
    fail(
        "quantize.linear.float8.precompute_float8_dynamic_scale_for_fsdp = true precomputes the "
        "scales of the float8 all-gather, which is off (enable_fsdp_float8_all_gather = false). "
        "HINT: set enable_fsdp_float8_all_gather = true as well, or precompute to false");
  }
}

// global_batch_size = local_batch_size * dp * gradient accumulation steps. The shard degree -1
// is only resolved against the world size later, so it counts as 1 here.
void validate_batch_sizes(const TrainingSection& t, const ParallelismSection& p) {
  if (t.global_batch_size == -1) {
    return;
  }
  int64_t shard = p.data_parallel_shard_degree == -1 ? 1 : p.data_parallel_shard_degree;
  int64_t dp = 0, per_step = 0;
  if (__builtin_mul_overflow(p.data_parallel_replicate_degree, shard, &dp) ||
      __builtin_mul_overflow(t.local_batch_size, dp, &per_step)) {
    fail("training.local_batch_size(" + std::to_string(t.local_batch_size) +
         ") * parallelism.data_parallel_replicate_degree(" +
         std::to_string(p.data_parallel_replicate_degree) + ") * data_parallel_shard_degree(" +
         std::to_string(shard) + ") overflows a 64-bit integer");
  }
  std::string product = "local_batch_size(" + std::to_string(t.local_batch_size) + ") * dp(" +
                        std::to_string(dp) + ") = " + std::to_string(per_step);
  if (t.global_batch_size <= 0) {
    fail(
        "training.global_batch_size must be -1 (= local_batch_size * dp) or a positive multiple "
        "of " +
        product + ", got " + std::to_string(t.global_batch_size));
  }
  if (t.global_batch_size % per_step != 0) {
    int64_t below = (t.global_batch_size / per_step) * per_step;
    std::string nearby = below > 0 ? std::to_string(below) + " or " : "";
    fail("training.global_batch_size " + std::to_string(t.global_batch_size) +
         " must be a multiple of " + product + " (gives " + std::to_string(t.global_batch_size) +
         " / " + std::to_string(per_step) + " = " +
         format_number(static_cast<double>(t.global_batch_size) / per_step) +
         " accumulation steps); use -1 or e.g. " + nearby + std::to_string(below + per_step));
  }
}

// [fault_tolerance]: this job is replica group replica_id of group_size.
void validate_fault_tolerance(const FaultToleranceSection& f) {
  if (!f.enable) return;
  if (f.group_size < 1) {
    fail(
        "fault_tolerance.group_size must be >= 1 (the number of replica groups) with "
        "fault_tolerance.enable, got " +
        std::to_string(f.group_size));
  }
  if (f.replica_id < 0 || f.replica_id >= f.group_size) {
    fail("fault_tolerance.replica_id must be in [0, group_size - 1] = [0, " +
         std::to_string(f.group_size - 1) + "], got " + std::to_string(f.replica_id));
  }
  if (f.min_replica_size < 1 || f.min_replica_size > f.group_size) {
    fail("fault_tolerance.min_replica_size must be in [1, group_size] = [1, " +
         std::to_string(f.group_size) + "], got " + std::to_string(f.min_replica_size));
  }
  check_at_least("fault_tolerance.process_group_timeout_ms", f.process_group_timeout_ms, 1);
  if (f.process_group == "nccl") {
    fail(
        "fault_tolerance.process_group = \"nccl\" is not supported yet: NCCL aborts the "
        "process when a peer fails, which is what the replica groups must survive. HINT: use "
        "\"gloo\" (GPU tensors go through host memory)");
  }
  check_one_of("fault_tolerance.process_group", f.process_group, {"gloo", "nccl"});
  check_one_of("fault_tolerance.semi_sync_method", f.semi_sync_method, {"", "local_sgd", "diloco"});
  check_at_least("fault_tolerance.sync_steps", f.sync_steps, 1);
  check_positive("fault_tolerance.outer_lr", f.outer_lr);
  check_unit_interval("fault_tolerance.outer_momentum", f.outer_momentum, /*include_one=*/false);
}

// Semi-synchronous replicas agree only every sync_steps steps; a checkpoint in between would hold
// a state no other replica has (and DiLoCo's snapshot would be lost).
void validate_semi_sync_checkpoints(const JobConfig& c) {
  const FaultToleranceSection& f = c.fault_tolerance;
  if (!f.enable || f.semi_sync_method.empty() || !c.checkpoint.enable) return;
  if (c.checkpoint.interval % f.sync_steps != 0) {
    fail("checkpoint.interval " + std::to_string(c.checkpoint.interval) +
         " must be a multiple of fault_tolerance.sync_steps " + std::to_string(f.sync_steps) +
         " with semi_sync_method = \"" + f.semi_sync_method +
         "\": the replica groups agree only at syncs (" + std::to_string(c.checkpoint.interval) +
         " % " + std::to_string(f.sync_steps) + " = " +
         std::to_string(c.checkpoint.interval % f.sync_steps) + ")");
  }
}

}  // namespace

void validate_job_config(const JobConfig& config) {
  validate_field_values(config);
  validate_not_yet_supported(config);
  validate_ranges(config);
  validate_activation_checkpoint(config.activation_checkpoint);
  validate_batch_sizes(config.training, config.parallelism);
  validate_model_converters(config);
  validate_compile(config.compile);
  validate_fault_tolerance(config.fault_tolerance);
  validate_semi_sync_checkpoints(config);
}

}  // namespace titan
