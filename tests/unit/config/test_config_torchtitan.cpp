// TorchTitan compatibility of the config: every key of TorchTitan v0.2.2's job config parses
// (at TorchTitan's default), keys of features not built yet refuse any other value naming the
// key, nested sections ([training.dataloader], [quantize.linear.float8]) load, and the
// [activation_checkpoint] rules.
#include "titan/config/config_manager.h"
#include "titan/config/field_table.h"

#include "config_test_util.h"

#include <algorithm>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>

namespace titan {
namespace test_config_torchtitan {

using config_test::config_error;
using config_test::contains;
using config_test::TempDir;

// Every key of TorchTitan v0.2.2's JobConfig with its default as a TOML literal. TorchTitan's
// None (unset) is written as our spelling of it: -1 for integers, "" for strings, [] for lists.
const std::pair<const char*, const char*> kTorchTitanKeys[] = {
    {"job.config_file", R"("")"},
    {"job.dump_folder", R"("./outputs")"},
    {"job.description", R"("default job")"},
    {"job.print_config", R"(false)"},
    {"job.save_config_file", R"("")"},
    {"job.custom_config_module", R"("")"},
    {"profiling.enable_profiling", R"(false)"},
    {"profiling.save_traces_folder", R"("profile_traces")"},
    {"profiling.profile_freq", R"(10)"},
    {"profiling.profiler_active", R"(1)"},
    {"profiling.profiler_warmup", R"(3)"},
    {"profiling.enable_memory_snapshot", R"(false)"},
    {"profiling.save_memory_snapshot_folder", R"("memory_snapshot")"},
    {"metrics.log_freq", R"(10)"},
    {"metrics.enable_tensorboard", R"(false)"},
    {"metrics.disable_color_printing", R"(false)"},
    {"metrics.save_tb_folder", R"("tb")"},
    {"metrics.save_for_all_ranks", R"(false)"},
    {"metrics.enable_wandb", R"(false)"},
    {"model.name", R"("llama3")"},
    {"model.flavor", R"("debugmodel")"},
    {"model.hf_assets_path", R"("./tests/assets/tokenizer")"},
    {"model.tokenizer_path", R"("")"},
    {"model.converters", R"([])"},
    {"model.print_after_conversion", R"(false)"},
    {"optimizer.name", R"("AdamW")"},
    {"optimizer.lr", R"(0.0008)"},
    {"optimizer.beta1", R"(0.9)"},
    {"optimizer.beta2", R"(0.95)"},
    {"optimizer.eps", R"(1e-08)"},
    {"optimizer.weight_decay", R"(0.1)"},
    {"optimizer.implementation", R"("fused")"},
    {"optimizer.early_step_in_backward", R"(false)"},
    {"lr_scheduler.warmup_steps", R"(200)"},
    {"lr_scheduler.total_steps", R"(-1)"},
    {"lr_scheduler.decay_ratio", R"(-1.0)"},
    {"lr_scheduler.decay_type", R"("linear")"},
    {"lr_scheduler.min_lr_factor", R"(0.0)"},
    {"training.dataset", R"("c4_test")"},
    {"training.dataset_path", R"("")"},
    {"training.local_batch_size", R"(8)"},
    {"training.global_batch_size", R"(-1)"},
    {"training.seq_len", R"(2048)"},
    {"training.max_norm", R"(1.0)"},
    {"training.steps", R"(10000)"},
    {"training.enable_cpu_offload", R"(false)"},
    {"training.dtype", R"("float32")"},
    {"training.mixed_precision_param", R"("bfloat16")"},
    {"training.mixed_precision_reduce", R"("float32")"},
    {"training.gc_freq", R"(50)"},
    {"training.gc_debug", R"(false)"},
    {"training.dataloader.num_workers", R"(0)"},
    {"training.dataloader.persistent_workers", R"(false)"},
    {"training.dataloader.pin_memory", R"(false)"},
    {"training.dataloader.prefetch_factor", R"(-1)"},
    {"parallelism.data_parallel_replicate_degree", R"(1)"},
    {"parallelism.data_parallel_shard_degree", R"(-1)"},
    {"parallelism.fsdp_reshard_after_forward", R"("default")"},
    {"parallelism.tensor_parallel_degree", R"(1)"},
    {"parallelism.disable_loss_parallel", R"(false)"},
    {"parallelism.enable_async_tensor_parallel", R"(false)"},
    {"parallelism.pipeline_parallel_degree", R"(1)"},
    {"parallelism.module_fqns_per_model_part", R"([])"},
    {"parallelism.pipeline_parallel_first_stage_less_layers", R"(1)"},
    {"parallelism.pipeline_parallel_last_stage_less_layers", R"(1)"},
    {"parallelism.pipeline_parallel_layers_per_stage", R"(-1)"},
    {"parallelism.pipeline_parallel_schedule", R"("1F1B")"},
    {"parallelism.pipeline_parallel_schedule_csv", R"("")"},
    {"parallelism.pipeline_parallel_microbatch_size", R"(1)"},
    {"parallelism.pipeline_parallel_expert_parallel_overlap", R"(true)"},
    {"parallelism.context_parallel_degree", R"(1)"},
    {"parallelism.context_parallel_load_balancer", R"("headtail")"},
    {"parallelism.context_parallel_rotate_method", R"("allgather")"},
    {"parallelism.expert_parallel_degree", R"(1)"},
    {"parallelism.expert_tensor_parallel_degree", R"(1)"},
    {"parallelism.expert_parallel_comm_backend", R"("standard")"},
    {"checkpoint.enable", R"(false)"},
    {"checkpoint.enable_ft_dataloader_checkpoints", R"(true)"},
    {"checkpoint.folder", R"("checkpoint")"},
    {"checkpoint.interval", R"(500)"},
    {"checkpoint.initial_load_path", R"("")"},
    {"checkpoint.initial_load_model_only", R"(true)"},
    {"checkpoint.initial_load_in_hf", R"(false)"},
    {"checkpoint.initial_load_in_hf_quantized", R"(false)"},
    {"checkpoint.last_save_model_only", R"(true)"},
    {"checkpoint.last_save_in_hf", R"(false)"},
    {"checkpoint.export_dtype", R"("float32")"},
    {"checkpoint.async_mode", R"("disabled")"},
    {"checkpoint.keep_latest_k", R"(10)"},
    {"checkpoint.load_step", R"(-1)"},
    {"checkpoint.exclude_from_loading", R"([])"},
    {"checkpoint.enable_first_step_checkpoint", R"(false)"},
    {"checkpoint.create_seed_checkpoint", R"(false)"},
    {"checkpoint.load_only", R"(false)"},
    {"activation_checkpoint.mode", R"("selective")"},
    {"activation_checkpoint.selective_ac_option", R"("2")"},
    {"activation_checkpoint.per_op_sac_force_recompute_mm_shapes_by_fqns",
     R"(["moe.router.gate"])"},
    {"activation_checkpoint.early_stop", R"(false)"},
    {"activation_checkpoint.memory_budget", R"(0.5)"},
    {"activation_checkpoint.visualize_memory_budget_pareto", R"(false)"},
    {"activation_checkpoint.preserve_rng_state", R"(true)"},
    {"activation_checkpoint.determinism_check", R"("default")"},
    {"activation_checkpoint.debug", R"(false)"},
    {"compile.enable", R"(false)"},
    {"compile.components", R"(["model", "loss"])"},
    {"compile.backend", R"("inductor")"},
    {"quantize.linear.float8.enable_fsdp_float8_all_gather", R"(false)"},
    {"quantize.linear.float8.precompute_float8_dynamic_scale_for_fsdp", R"(false)"},
    {"quantize.linear.float8.recipe_name", R"("")"},
    {"quantize.linear.float8.filter_fqns", R"([])"},
    {"quantize.linear.float8.emulate", R"(false)"},
    {"quantize.linear.mx.mxfp8_dim1_cast_kernel_choice", R"("triton")"},
    {"quantize.linear.mx.recipe_name", R"("mxfp8_cublas")"},
    {"quantize.linear.mx.filter_fqns", R"(["output"])"},
    {"quantize.grouped_mm.float8.fqns", R"([])"},
    {"quantize.grouped_mm.mx.recipe_name", R"("mxfp8")"},
    {"quantize.grouped_mm.mx.fqns", R"([])"},
    {"comm.init_timeout_seconds", R"(300)"},
    {"comm.train_timeout_seconds", R"(100)"},
    {"comm.trace_buf_size", R"(20000)"},
    {"comm.save_traces_folder", R"("comm_traces")"},
    {"comm.save_traces_file_prefix", R"("rank_")"},
    {"comm.mode", R"("default")"},
    {"memory_estimation.enable", R"(false)"},
    {"memory_estimation.disable_fake_mode", R"(false)"},
    {"fault_tolerance.enable", R"(false)"},
    {"fault_tolerance.process_group", R"("gloo")"},
    {"fault_tolerance.process_group_timeout_ms", R"(10000)"},
    {"fault_tolerance.replica_id", R"(0)"},
    {"fault_tolerance.group_size", R"(0)"},
    {"fault_tolerance.min_replica_size", R"(1)"},
    {"fault_tolerance.semi_sync_method", R"("")"},
    {"experimental.custom_import", R"("")"},
    {"experimental.custom_args_module", R"("")"},
    {"validation.enable", R"(false)"},
    {"validation.dataset", R"("c4_validation")"},
    {"validation.dataset_path", R"("")"},
    {"validation.local_batch_size", R"(8)"},
    {"validation.seq_len", R"(2048)"},
    {"validation.freq", R"(10)"},
    {"validation.steps", R"(-1)"},
    {"validation.dataloader.num_workers", R"(0)"},
    {"validation.dataloader.persistent_workers", R"(false)"},
    {"validation.dataloader.pin_memory", R"(false)"},
    {"validation.dataloader.prefetch_factor", R"(-1)"},
    {"debug.seed", R"(-1)"},
    {"debug.deterministic", R"(false)"},
    {"debug.deterministic_warn_only", R"(false)"},
    {"debug.moe_force_load_balance", R"(false)"},
};

// Keys of ours that TorchTitan does not have.
const std::set<std::string> kOwnKeys = {
    "metrics.peak_flops",
    "training.dataset_text_field",
    "training.dataset_shuffle",
    "training.num_threads",
    "training.device",
    "training.mtp_loss_weight",
    "validation.dataset_text_field",
    "model.attn_mask_type",
    "parallelism.fsdp_prefetch_units",
    "optimizer.state_dtype",
    // Muon's settings (TorchTitan v0.2.2 has no Muon).
    "optimizer.muon_momentum",
    "optimizer.muon_nesterov",
    "optimizer.muon_ns_a",
    "optimizer.muon_ns_b",
    "optimizer.muon_ns_c",
    "optimizer.muon_ns_steps",
    "optimizer.muon_eps",
    "optimizer.muon_adjust_lr_fn",
    "optimizer.muon_adamw_fqns",
    "optimizer.muon_adamw_lr",
    "optimizer.muon_adamw_weight_decay",
    // [sft]: chat fine-tuning (TorchTitan's came after v0.2.2, configured in Python).
    "sft.messages_field",
    "sft.prompt_field",
    "sft.response_field",
    "sft.system_prompt",
    "sft.chat_template",
    "sft.overlong",
    // [lora]: low-rank adapters (TorchTitan's LoRA came after v0.2.2, as an experiment).
    "lora.rank",
    "lora.alpha",
    "lora.dropout",
    "lora.target_modules",
    "lora.use_rslora",
    "lora.quantize_base",
    // Semi-synchronous replica groups: sync_steps is TorchTitan's (its FT experiment, after
    // v0.2.2); its DiLoCo outer optimizer is fixed in code, titan's has keys.
    "fault_tolerance.sync_steps",
    "fault_tolerance.outer_lr",
    "fault_tolerance.outer_momentum",
    // FLUX: the keys TorchTitan's flux experiment adds (its own job config module, not v0.2.2's
    // core), with its defaults, and titan's image-dataset and guidance settings.
    "training.classifier_free_guidance_prob",
    "training.img_size",
    "training.test_mode",
    "training.guidance",
    "training.image_field",
    "training.image_caption_field",
    "training.skip_unreadable_images",
    "encoder.t5_encoder",
    "encoder.clip_encoder",
    "encoder.autoencoder_path",
    "encoder.max_t5_encoding_len",
    // The VLM: the keys TorchTitan's vlm experiment adds to [training] (its job config module).
    "training.max_images_per_batch",
    "training.max_patches_per_image",
    "training.patch_size",
    "training.spatial_merge_size",
    "training.packing_buffer_size",
};

// Defaults of ours that differ from TorchTitan's, and why: our datasets and tokenizer.
const std::set<std::string> kOwnDefaults = {
    "model.hf_assets_path",  // "": the built-in byte-level tokenizer
    "training.dataset",      // "sotu", the built-in corpus (TorchTitan: c4_test)
    "validation.dataset",    // "sotu_validation" (TorchTitan: c4_validation)
};

// "a.b.c" -> {"a.b", "c"}.
std::pair<std::string, std::string> split_name(const std::string& name) {
  const size_t dot = name.rfind('.');
  return {name.substr(0, dot), name.substr(dot + 1)};
}

// A TOML file that sets every TorchTitan key to TorchTitan's default, section by section.
std::string all_torchtitan_keys_toml() {
  std::map<std::string, std::string> sections;
  for (const auto& [name, value] : kTorchTitanKeys) {
    const auto [section, key] = split_name(name);
    sections[section] += key + " = " + value + "\n";
  }
  std::string toml;
  for (const auto& [section, body] : sections) {
    toml += "[" + section + "]\n" + body + "\n";
  }
  return toml;
}

// The field named `name` of `table`; fails the test (and returns null) when there is none.
const detail::FieldRef* find_field(const detail::FieldTable& table, const std::string& name) {
  for (const detail::FieldRef& field : table.fields()) {
    if (field.name() == name) return &field;
  }
  ADD_FAILURE() << "no config key " << name;
  return nullptr;
}

// Sets `field` to a value other than its current one.
void set_other_value(const detail::FieldRef& field) {
  switch (field.type) {
    case detail::FieldType::kBool:
      *static_cast<bool*>(field.value) = !*static_cast<bool*>(field.value);
      break;
    case detail::FieldType::kInt: *static_cast<int64_t*>(field.value) += 1; break;
    case detail::FieldType::kDouble: *static_cast<double*>(field.value) += 0.25; break;
    case detail::FieldType::kString: *static_cast<std::string*>(field.value) += "x"; break;
    case detail::FieldType::kStringList:
      static_cast<std::vector<std::string>*>(field.value)->push_back("x");
      break;
    case detail::FieldType::kStringLists:
      static_cast<std::vector<std::vector<std::string>>*>(field.value)->push_back({"x"});
      break;
  }
}

TEST(ConfigTorchTitan, HasEveryTorchTitanKeyAndNoUndeclaredOnes) {
  EXPECT_EQ(std::size(kTorchTitanKeys), 149u);
  JobConfig config;
  const detail::FieldTable table = detail::FieldTable::of(config);
  std::set<std::string> ours;
  for (const detail::FieldRef& field : table.fields()) ours.insert(field.name());
  std::set<std::string> theirs;
  for (const auto& [name, value] : kTorchTitanKeys) {
    theirs.insert(name);
    EXPECT_TRUE(ours.count(name)) << "TorchTitan key " << name << " is missing";
  }
  for (const std::string& name : ours) {
    EXPECT_TRUE(theirs.count(name) || kOwnKeys.count(name))
        << name << " is neither a TorchTitan key nor listed in kOwnKeys";
  }
}

TEST(ConfigTorchTitan, DefaultsAreTorchTitans) {
  JobConfig config;
  const detail::FieldTable table = detail::FieldTable::of(config);
  for (const auto& [name, value] : kTorchTitanKeys) {
    const detail::FieldRef* field = find_field(table, name);
    if (field == nullptr || kOwnDefaults.count(name)) continue;
    EXPECT_EQ(detail::format_toml_value(*field), value) << name;
  }
}

TEST(ConfigTorchTitan, EveryKeyParsesFromTomlAtTorchTitansDefault) {
  TempDir dir;
  const std::string toml = all_torchtitan_keys_toml();
  const std::string file = dir.write("all_keys.toml", toml);
  JobConfig config;
  ASSERT_NO_THROW(config = parse_job_config({"--job.config_file", file})) << toml;
  const detail::FieldTable table = detail::FieldTable::of(config);
  for (const auto& [name, value] : kTorchTitanKeys) {
    if (std::string(name) == "job.config_file") continue;  // the command line names the file
    const detail::FieldRef* field = find_field(table, name);
    if (field != nullptr) {
      EXPECT_EQ(detail::format_toml_value(*field), value) << name;
    }
  }
}

TEST(ConfigTorchTitan, EveryKeyParsesFromTheCommandLine) {
  for (const auto& [name, value] : kTorchTitanKeys) {
    if (std::string(name) == "job.config_file") continue;  // would name a file to read
    JobConfig defaults;
    const detail::FieldTable table = detail::FieldTable::of(defaults);
    const detail::FieldRef* field = find_field(table, name);
    if (field == nullptr) continue;
    const std::string text = detail::format_help_value(*field);
    const std::string arg = "--" + std::string(name) + "=" +
                            (text == "none" ? ""
                             : field->type == detail::FieldType::kString
                                 ? *static_cast<const std::string*>(field->value)
                                 : text);
    EXPECT_NO_THROW(parse_job_config({arg})) << arg;
  }
}

TEST(ConfigTorchTitan, NotYetSupportedKeysRefuseOtherValuesNamingTheKey) {
  JobConfig defaults;
  const detail::FieldTable default_table = detail::FieldTable::of(defaults);
  int not_yet = 0;
  for (size_t i = 0; i < default_table.fields().size(); ++i) {
    if (default_table.fields()[i].support.kind != KeySupport::kNotYet) continue;
    ++not_yet;
    JobConfig config;
    const detail::FieldTable table = detail::FieldTable::of(config);
    const detail::FieldRef& field = table.fields()[i];
    set_other_value(field);
    const std::string message = config_error([&] { validate_job_config(config); });
    EXPECT_TRUE(contains(message, "config key '" + field.name() + "' = "));
    EXPECT_TRUE(contains(message, "is not supported yet"));
    EXPECT_TRUE(contains(message, "HINT: remove '" + field.name() + "'"));
  }
  EXPECT_GE(not_yet, 20);

  // The same from the command line and from TOML, with the value and the default shown.
  EXPECT_TRUE(contains(
      config_error([] { parse_job_config({"--parallelism.enable_async_tensor_parallel"}); }),
      "config key 'parallelism.enable_async_tensor_parallel' = true is not supported yet"));
  // compile: both components are built (the default); an unknown one is named, with the nearest.
  EXPECT_NO_THROW(parse_job_config({"--compile.enable"}));
  EXPECT_NO_THROW(parse_job_config({"--compile.enable", "--compile.components", "model"}));
  EXPECT_TRUE(contains(
      config_error([] {
        parse_job_config({"--compile.enable", "--compile.components", "los"});
      }),
      "compile.components entry 'los' is not a component (model, loss); did you mean 'loss'"));
  EXPECT_TRUE(contains(config_error([] {
                         parse_job_config({"--compile.enable", "--compile.components", "model",
                                           "--compile.backend", "aot_eager"});
                       }),
                       "compile.backend 'aot_eager' is not supported"));
  EXPECT_TRUE(contains(config_error([] {
                         parse_job_config({"--compile.components", "graph"});
                       }),
                       "compile.components entry 'graph' is not a component (model, loss)"));
  EXPECT_TRUE(contains(config_error([] {
                         parse_job_config({"--training.dataloader.prefetch_factor", "4"});
                       }),
                       "titan.cpp accepts only its default, -1"));
  TempDir dir;
  const std::string file =
      dir.write("mx.toml", "[model]\nconverters = [\"quantize.grouped_mm.mx\"]\n");
  EXPECT_TRUE(contains(config_error([&] {
                         parse_job_config({"--job.config_file", file});
                       }),
                       "quantize.grouped_mm.mx.fqns, and that list is empty"));
}

TEST(ConfigTorchTitan, SettingsOfUnbuiltFeaturesNameASwitchThatIsRefused) {
  JobConfig config;
  const detail::FieldTable table = detail::FieldTable::of(config);
  int used_with = 0;
  for (const detail::FieldRef& field : table.fields()) {
    if (field.support.kind != KeySupport::kUsedWith) continue;
    ++used_with;
    const std::string switch_key = field.support.switch_key;
    // A converter's settings: the switch is model.converters = ["<name>"], refused by name.
    const std::string converters = "model.converters = [\"";
    if (switch_key.rfind(converters, 0) == 0) {
      JobConfig with;
      with.model.converters = {
          switch_key.substr(converters.size(), switch_key.size() - converters.size() - 2)};
      EXPECT_TRUE(
          contains(config_error([&] { validate_job_config(with); }), "is not supported yet"))
          << field.name();
      continue;
    }
    const detail::FieldRef* sw = find_field(table, switch_key);
    if (sw != nullptr) {
      EXPECT_EQ(sw->support.kind, KeySupport::kNotYet) << field.name() << " -> " << switch_key;
    }
    // Any value is accepted while the feature is off.
    JobConfig edited;
    const detail::FieldTable edited_table = detail::FieldTable::of(edited);
    for (const detail::FieldRef& f : edited_table.fields()) {
      if (f.name() == field.name() && f.type != detail::FieldType::kString) set_other_value(f);
    }
    EXPECT_NO_THROW(validate_job_config(edited)) << field.name();
  }
  EXPECT_GE(used_with, 1);  // memory_estimation's (every quantize converter is built)
}

TEST(ConfigTorchTitan, HelpMarksKeysThatAreNotSupportedYet) {
  const std::string help = render_help("train");
  EXPECT_TRUE(contains(help, "\n[quantize.linear.float8]\n"));
  EXPECT_TRUE(contains(help, "\n[training.dataloader]\n"));
  std::istringstream lines(help);
  std::string line;
  std::map<std::string, std::string> by_key;
  while (std::getline(lines, line)) {
    const size_t start = line.find("--");
    if (start == std::string::npos) continue;
    by_key[line.substr(start + 2, line.find(' ', start) - start - 2)] = line;
  }
  EXPECT_TRUE(contains(by_key["parallelism.enable_async_tensor_parallel"],
                       "[not supported yet: must keep its default]"));
  EXPECT_TRUE(contains(by_key["memory_estimation.disable_fake_mode"],
                       "[not supported yet: read only with"));
  EXPECT_FALSE(
      contains(by_key["quantize.grouped_mm.mx.recipe_name"], "not supported").operator bool());
  EXPECT_TRUE(contains(by_key["checkpoint.enable_ft_dataloader_checkpoints"],
                       "[not supported yet: must keep its default]"));
  EXPECT_FALSE(contains(by_key["fault_tolerance.enable"], "not supported").operator bool());
  EXPECT_FALSE(contains(by_key["compile.enable"], "not supported").operator bool());
  EXPECT_FALSE(contains(by_key["profiling.enable_profiling"], "not supported").operator bool());
  EXPECT_FALSE(
      contains(by_key["parallelism.pipeline_parallel_schedule"], "not supported").operator bool());
  EXPECT_FALSE(contains(by_key["training.steps"], "not supported").operator bool());
}

TEST(ConfigTorchTitan, NestedSectionsFromTomlAndCommandLine) {
  TempDir dir;
  const std::string file = dir.write("nested.toml", R"(
[training]
steps = 3
[training.dataloader]
num_workers = 0
[quantize.linear.float8]
filter_fqns = ["output", "layers.0"]
[quantize]
grouped_mm.float8.fqns = "experts"   # a dotted key, and "list[str] | str"
[parallelism]
module_fqns_per_model_part = [["tok_embeddings", "layers.0"], ["layers.1", "norm", "output"]]
)");
  JobConfig config = parse_job_config({"--job.config_file", file});
  EXPECT_EQ(config.training.steps, 3);
  EXPECT_EQ(config.quantize.linear.float8.filter_fqns,
            (std::vector<std::string>{"output", "layers.0"}));
  EXPECT_EQ(config.quantize.grouped_mm.float8.fqns, (std::vector<std::string>{"experts"}));
  const std::vector<std::vector<std::string>> parts = {{"tok_embeddings", "layers.0"},
                                                       {"layers.1", "norm", "output"}};
  EXPECT_EQ(config.parallelism.module_fqns_per_model_part, parts);

  config = parse_job_config({"--quantize.linear.mx.filter_fqns", "output,layers.1",
                             "--training.dataloader.num_workers", "0",
                             "--parallelism.module_fqns_per_model_part",
                             "tok_embeddings, layers.0; layers.1,norm,output"});
  EXPECT_EQ(config.quantize.linear.mx.filter_fqns,
            (std::vector<std::string>{"output", "layers.1"}));
  EXPECT_EQ(config.parallelism.module_fqns_per_model_part, parts);

  // The printed config reloads to the same values, nested sections and lists of lists included.
  const std::string printed = render_config_toml(config);
  EXPECT_TRUE(contains(printed,
                       "module_fqns_per_model_part = [[\"tok_embeddings\", "
                       "\"layers.0\"], [\"layers.1\", \"norm\", \"output\"]]\n"));
  const std::string again = dir.write("printed.toml", printed);
  EXPECT_EQ(render_config_toml(parse_job_config({"--job.config_file", again})),
            render_config_toml(parse_job_config({"--job.config_file", again})));
  JobConfig reloaded = parse_job_config({"--job.config_file", again});
  EXPECT_EQ(reloaded.parallelism.module_fqns_per_model_part, parts);
  EXPECT_EQ(reloaded.quantize.linear.mx.filter_fqns, config.quantize.linear.mx.filter_fqns);
}

TEST(ConfigTorchTitan, UnknownNestedNamesSuggestTheNearest) {
  TempDir dir;
  std::string message = config_error([&] {
    parse_job_config(
        {"--job.config_file", dir.write("a.toml", "[training.dataloader]\nnum_worker = 2\n")});
  });
  EXPECT_TRUE(contains(message,
                       "unknown config key 'training.dataloader.num_worker'; did you "
                       "mean 'training.dataloader.num_workers'?"));
  message = config_error([&] {
    parse_job_config(
        {"--job.config_file", dir.write("b.toml", "[quantize.linear.fp8]\nemulate = false\n")});
  });
  EXPECT_TRUE(contains(message,
                       "unknown config section 'quantize.linear.fp8'; did you mean "
                       "'quantize.linear."));
  message = config_error([&] { parse_job_config({"--quantize.emulate", "true"}); });
  EXPECT_TRUE(contains(message, "unknown config section 'quantize'"));
  message = config_error([&] {
    parse_job_config({"--parallelism.module_fqns_per_model_part", "--x"});
  });
  EXPECT_TRUE(contains(message, "is given no value"));
  message = config_error([&] {
    parse_job_config({"--job.config_file", dir.write("c.toml",
                                                     "[parallelism]\nmodule_fqns_per_model_part = "
                                                     "[\"a\"]\n")});
  });
  EXPECT_TRUE(contains(message, "expects a list of lists of strings, got 'a' (a string"));
}

TEST(ConfigTorchTitan, TokenizerPathIsTheDeprecatedHfAssetsPath) {
  JobConfig config = parse_job_config({"--model.tokenizer_path", "assets/tok"});
  EXPECT_EQ(config.model.hf_assets_path, "assets/tok");
  EXPECT_EQ(parse_job_config({"--model.hf_assets_path", "x"}).model.hf_assets_path, "x");
}

TEST(ConfigTorchTitan, CrossKeyRulesOfTheNewKeys) {
  EXPECT_TRUE(contains(config_error([] { parse_job_config({"--checkpoint.load_only"}); }),
                       "checkpoint.load_only needs checkpoint.enable = true"));
  EXPECT_TRUE(contains(config_error([] {
                         parse_job_config({"--checkpoint.enable", "--checkpoint.load_only",
                                           "--checkpoint.create_seed_checkpoint"});
                       }),
                       "checkpoint.create_seed_checkpoint asks for a save, but "
                       "checkpoint.load_only never saves"));
  EXPECT_NO_THROW(parse_job_config({"--checkpoint.enable", "--checkpoint.load_only"}));
  EXPECT_TRUE(contains(config_error([] { parse_job_config({"--debug.deterministic_warn_only"}); }),
                       "debug.deterministic_warn_only needs debug.deterministic = true"));
  EXPECT_NO_THROW(parse_job_config({"--debug.deterministic", "--debug.deterministic_warn_only"}));
  EXPECT_TRUE(contains(config_error([] {
                         parse_job_config({"--lr_scheduler.total_steps", "0"});
                       }),
                       "lr_scheduler.total_steps must be -1 (unset: training.steps) or >= 1"));
  EXPECT_TRUE(contains(config_error([] {
                         parse_job_config({"--training.dtype", "float16"});
                       }),
                       "training.dtype must be one of float32, bfloat16; got 'float16'"));
  EXPECT_TRUE(contains(config_error([] {
                         parse_job_config({"--training.gc_freq", "0"});
                       }),
                       "training.gc_freq must be >= 1, got 0"));
  EXPECT_TRUE(
      contains(config_error([] {
                 parse_job_config({"--quantize.linear.float8.recipe_name", "fp8"});
               }),
               "must be one of \"\" (unset), tensorwise, rowwise, rowwise_with_gw_hp; got 'fp8'"));
}

TEST(ConfigTorchTitan, FaultToleranceKeysShowTheirRanges) {
  const std::vector<std::string> on = {"--fault_tolerance.enable", "--fault_tolerance.group_size",
                                       "2"};
  const auto with = [&](std::vector<std::string> more) {
    std::vector<std::string> args = on;
    args.insert(args.end(), more.begin(), more.end());
    return config_error([&] { parse_job_config(args); });
  };
  EXPECT_NO_THROW(parse_job_config(on));
  EXPECT_TRUE(contains(config_error([] { parse_job_config({"--fault_tolerance.enable"}); }),
                       "fault_tolerance.group_size must be >= 1 (the number of replica groups)"));
  EXPECT_TRUE(
      contains(with({"--fault_tolerance.replica_id", "2"}),
               "fault_tolerance.replica_id must be in [0, group_size - 1] = [0, 1], got 2"));
  EXPECT_TRUE(contains(with({"--fault_tolerance.min_replica_size", "3"}),
                       "fault_tolerance.min_replica_size must be in [1, group_size] = [1, 2], "
                       "got 3"));
  EXPECT_TRUE(contains(with({"--fault_tolerance.process_group_timeout_ms", "0"}),
                       "fault_tolerance.process_group_timeout_ms must be >= 1"));
  EXPECT_TRUE(contains(with({"--fault_tolerance.process_group", "nccl"}),
                       "\"nccl\" is not supported yet: NCCL aborts the process"));
  EXPECT_TRUE(contains(with({"--fault_tolerance.process_group", "mpi"}),
                       "fault_tolerance.process_group must be one of gloo, nccl; got 'mpi'"));
  EXPECT_TRUE(contains(with({"--fault_tolerance.semi_sync_method", "sync"}),
                       "fault_tolerance.semi_sync_method must be one of \"\" (unset), local_sgd, "
                       "diloco; got 'sync'"));
  EXPECT_TRUE(contains(with({"--fault_tolerance.sync_steps", "0"}),
                       "fault_tolerance.sync_steps must be >= 1, got 0"));
  EXPECT_TRUE(contains(with({"--fault_tolerance.outer_momentum", "1"}),
                       "fault_tolerance.outer_momentum must be in [0, 1)"));
  EXPECT_TRUE(
      contains(with({"--fault_tolerance.semi_sync_method", "diloco", "--fault_tolerance.sync_steps",
                     "20", "--checkpoint.enable", "--checkpoint.interval", "30"}),
               "checkpoint.interval 30 must be a multiple of fault_tolerance.sync_steps 20 "
               "with semi_sync_method = \"diloco\": the replica groups agree only at "
               "syncs (30 % 20 = 10)"));
  EXPECT_NO_THROW(parse_job_config({"--fault_tolerance.enable", "--fault_tolerance.group_size", "2",
                                    "--fault_tolerance.semi_sync_method", "local_sgd",
                                    "--checkpoint.enable", "--checkpoint.interval", "10"}));
  // Off, the other keys are not read (TorchTitan's files set them freely).
  EXPECT_NO_THROW(parse_job_config({"--fault_tolerance.replica_id", "5"}));
}

TEST(ConfigTorchTitan, SaveConfigFileWritesTheConfigThatReloads) {
  TempDir dir;
  JobConfig config =
      parse_job_config({"--job.dump_folder", dir.path() + "/out", "--job.save_config_file",
                        "sub/config.toml", "--training.steps", "7"});
  const std::string path = save_config_file(config);
  EXPECT_EQ(path, dir.path() + "/out/sub/config.toml");
  JobConfig reloaded = parse_job_config({"--job.config_file", path});
  EXPECT_EQ(reloaded.training.steps, 7);
  reloaded.job.config_file = "";
  EXPECT_EQ(render_config_toml(reloaded), render_config_toml(config));
  EXPECT_EQ(save_config_file(parse_job_config({})), "");  // unset: nothing written
}

std::string ac_error(const std::function<void(ActivationCheckpointSection&)>& edit) {
  JobConfig config;
  edit(config.activation_checkpoint);
  return config_error([&] { validate_job_config(config); });
}

TEST(ConfigActivationCheckpoint, DefaultsAreTorchTitans) {
  JobConfig config = parse_job_config({});
  const ActivationCheckpointSection& ac = config.activation_checkpoint;
  EXPECT_EQ(ac.mode, "selective");
  EXPECT_EQ(ac.selective_ac_option, "2");
  EXPECT_EQ(ac.per_op_sac_force_recompute_mm_shapes_by_fqns,
            (std::vector<std::string>{"moe.router.gate"}));
  EXPECT_FALSE(ac.early_stop);
  EXPECT_DOUBLE_EQ(ac.memory_budget, 0.5);
  EXPECT_FALSE(ac.visualize_memory_budget_pareto);
  EXPECT_TRUE(ac.preserve_rng_state);
  EXPECT_EQ(ac.determinism_check, "default");
  EXPECT_FALSE(ac.debug);
}

TEST(ConfigActivationCheckpoint, AcceptsEveryModeAndOption) {
  for (const char* mode : {"selective", "full", "none"}) {
    JobConfig config = parse_job_config({"--activation_checkpoint.mode", mode});
    EXPECT_EQ(config.activation_checkpoint.mode, mode);
  }
  for (const char* option : {"op", "1", "4"}) {
    JobConfig config = parse_job_config({"--activation_checkpoint.selective_ac_option", option});
    EXPECT_EQ(config.activation_checkpoint.selective_ac_option, option);
  }
  JobConfig config = parse_job_config({"--activation_checkpoint.determinism_check", "none"});
  EXPECT_EQ(config.activation_checkpoint.determinism_check, "none");
}

TEST(ConfigActivationCheckpoint, RefusesBadValuesNamingTheKey) {
  std::string message = ac_error([](auto& ac) { ac.mode = "partial"; });
  EXPECT_TRUE(contains(message, "activation_checkpoint.mode must be one of selective, full, none"));
  EXPECT_TRUE(contains(message, "got 'partial'"));

  message = ac_error([](auto& ac) { ac.mode = "memory_budget"; });
  EXPECT_TRUE(
      contains(message, "activation_checkpoint.mode = \"memory_budget\" is not supported yet"));
  EXPECT_TRUE(contains(message, "HINT: use mode = \"selective\""));

  message = ac_error([](auto& ac) { ac.selective_ac_option = "every"; });
  EXPECT_TRUE(
      contains(message, "selective_ac_option must be \"op\" or an integer >= 1, got 'every'"));
  message = ac_error([](auto& ac) { ac.selective_ac_option = "-2"; });
  EXPECT_TRUE(contains(message, "got '-2'"));
  message = ac_error([](auto& ac) { ac.selective_ac_option = std::string(1, '0'); });
  EXPECT_TRUE(
      contains(message, "selective_ac_option must be an integer >= 1 (every Nth block), got 0"));

  message = ac_error([](auto& ac) { ac.determinism_check = "strict"; });
  EXPECT_TRUE(
      contains(message, "activation_checkpoint.determinism_check must be one of default, none"));
}

}  // namespace test_config_torchtitan
}  // namespace titan
