// What the trainer puts in a checkpoint: the state entries (model, optimizer, lr_scheduler,
// dataloader, train_state, rng) handed to the CheckpointManager, and resuming at construction.
#include "titan/checkpoint/checkpoint_manager.h"
#include "titan/checkpoint/hf_convert.h"
#include "titan/checkpoint/peft_folder.h"
#include "titan/checkpoint/rng_state.h"
#include "titan/common/check.h"
#include "titan/common/format.h"
#include "titan/common/logging.h"
#include "titan/components/data/data_loader.h"
#include "titan/components/tokenizer/tokenizer.h"
#include "titan/components/tokenizer/tokenizer_identity.h"
#include "titan/config/config_manager.h"
#include "titan/distributed/ft/semi_sync.h"
#include "titan/distributed/parallel_dims.h"
#include "titan/models/lora.h"
#include "titan/models/registry.h"
#include "titan/parallel/parallelized_model.h"
#include "titan/trainer/trainer.h"

#include "titan/checkpoint/peft_folder.h"
#include "titan/models/lora.h"

#include <chrono>
#include <functional>
#include <map>
#include <set>

namespace titan {

namespace {

using ckpt::CheckpointReader;
using ckpt::SavedTensor;
using ckpt::StateEntry;
using nlohmann::json;

// Where a rank's tensor of a parameter (or of its optimizer state) sits in the whole one.
using LayoutFn = std::function<ShardBox(const std::string& param)>;

// Whether this rank writes (its box of) a parameter: false where another rank holds the same box
// (data-parallel replicas, tensor-parallel replicated parameters).
using OwnerFn = std::function<bool(const std::string& param)>;

// The integer `key` of a state entry's fields, in [min, max]; DataError naming the checkpoint, the
// entry and the field otherwise (a resume must not run on a value no save writes).
int64_t state_int(const CheckpointReader& reader, const json& state, const std::string& entry,
                  const std::string& key, int64_t min, int64_t max) {
  const std::string where = "checkpoint '" + reader.dir() + "': " + entry + "." + key;
  if (!state.is_object() || !state.contains(key)) throw DataError(where + " is missing");
  const json& v = state.at(key);
  if (!v.is_number_integer() ||
      (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))) {
    throw DataError(where + " must be an integer in [" + std::to_string(min) + ", " +
                    std::to_string(max) + "], got " + v.dump());
  }
  const int64_t x = v.get<int64_t>();
  if (x < min || x > max) {
    throw DataError(where + " " + std::to_string(x) + " is outside [" + std::to_string(min) + ", " +
                    std::to_string(max) + "] (corrupted or edited?)");
  }
  return x;
}

// Steps and token counts: non-negative, and exact as doubles (the optimizer's step is one).
constexpr int64_t kMaxCount = int64_t{1} << 53;

// Appends `local` of tensor `name` at `box` to what a save writes: a packed box (tensor
// parallelism of a packed layer) as its plain pieces, which the reader assembles again.
void push_boxes(std::vector<SavedTensor>& tensors, const std::string& name, const at::Tensor& local,
                const ShardBox& box) {
  for (const ShardPiece& piece : box.pieces())
    tensors.push_back({name, piece.of(local), piece.box});
}

// Parameters (and their optimizer state) as (name, tensor) with their boxes.
StateEntry model_entry(std::vector<std::pair<std::string, at::Tensor>> params, LayoutFn layout,
                       OwnerFn owner) {
  StateEntry e;
  e.name = "model";
  e.is_model = true;
  e.save = [params, layout, owner](std::vector<SavedTensor>& tensors, json&) {
    for (const auto& [name, t] : params) {
      if ((t.numel() == 0 && t.dim() > 0) || !owner(name)) continue;
      push_boxes(tensors, name, t.detach(), layout(name));
    }
  };
  e.load = [params, layout](const CheckpointReader& reader, const json&) {
    // A checkpoint of the base model (its description has no "lora" entry) leaves LoRA's
    // adapters as initialized; one of a LoRA run must hold them.
    const json& saved = reader.state().is_object() ? reader.state().value("model", json()) : json();
    const bool base_only = !saved.is_object() || !saved.contains("lora");
    int64_t fresh = 0;
    for (const auto& [name, t] : params) {
      if (base_only && is_lora_param(name) && !reader.has(name)) {
        ++fresh;
        continue;
      }
      reader.read_box_into(name, layout(name), t);
    }
    if (fresh > 0) {
      log_info("checkpoint ", reader.dir(), " holds the base model: ", fresh,
               " LoRA adapter tensors keep their initial values");
    }
  };
  return e;
}

StateEntry optimizer_entry(Optimizer& optimizer, LayoutFn layout, OwnerFn owner) {
  // State tensors are named "<param>.exp_avg" / ".exp_avg_sq" and shaped like the parameter.
  const auto param_of = [](const std::string& state_name) {
    return state_name.substr(0, state_name.rfind('.'));
  };
  StateEntry e;
  e.name = "optimizer";
  e.save = [&optimizer, layout, owner, param_of](std::vector<SavedTensor>& tensors, json& state) {
    for (const auto& [name, t] : optimizer.state_tensors()) {
      if ((t.numel() == 0 && t.dim() > 0) || !owner(param_of(name))) continue;
      push_boxes(tensors, "optimizer." + name, t, layout(param_of(name)));
    }
    state["step_count"] = optimizer.step_count();
  };
  e.load = [&optimizer, layout, param_of](const CheckpointReader& reader, const json& state) {
    for (const auto& [name, t] : optimizer.state_tensors()) {
      reader.read_box_into("optimizer." + name, layout(param_of(name)), t);
    }
    optimizer.set_step_count(state_int(reader, state, "optimizer", "step_count", 0, kMaxCount));
  };
  return e;
}

StateEntry train_state_entry(TrainState& ts) {
  StateEntry e;
  e.name = "train_state";
  e.save = [&ts](std::vector<SavedTensor>&, json& state) {
    state["step"] = ts.step;
    state["tokens_seen"] = ts.tokens_seen;
  };
  e.load = [&ts](const CheckpointReader& reader, const json& state) {
    ts.step = state_int(reader, state, "train_state", "step", 0, kMaxCount);
    ts.tokens_seen = state_int(reader, state, "train_state", "tokens_seen", 0, kMaxCount);
  };
  return e;
}

// The schedule is a function of the step (restored by train_state); its settings are recorded
// so a resumed run with a different schedule can be noticed.
StateEntry lr_scheduler_entry(const LRScheduler& scheduler, const TrainState& ts) {
  StateEntry e;
  e.name = "lr_scheduler";
  e.save = [&scheduler, &ts](std::vector<SavedTensor>&, json& state) {
    state["last_step"] = ts.step;
    state["warmup_steps"] = scheduler.warmup_steps();
    state["stable_steps"] = scheduler.stable_steps();
    state["decay_steps"] = scheduler.decay_steps();
  };
  e.load = [&scheduler](const CheckpointReader& reader, const json& state) {
    // Recorded to notice a changed schedule (the schedule itself follows the step); checked
    // where present (-1: absent).
    std::map<std::string, int64_t> v;
    for (const char* key : {"last_step", "warmup_steps", "stable_steps", "decay_steps"}) {
      v[key] = state.is_object() && state.contains(key)
                   ? state_int(reader, state, "lr_scheduler", key, 0, kMaxCount)
                   : -1;
    }
    const int64_t warmup = v["warmup_steps"], decay = v["decay_steps"];
    if (warmup != scheduler.warmup_steps() || decay != scheduler.decay_steps()) {
      log_warning("checkpoint ", reader.dir(), " was saved with lr warmup/decay steps ", warmup,
                  "/", decay, "; this run uses ", scheduler.warmup_steps(), "/",
                  scheduler.decay_steps());
    }
  };
  return e;
}

// One state per data-parallel rank, keyed "dp_rank_<r>" (each rank restores its own), and the
// tokenizer the positions are counted in (`tokenizer`: a tokenizer_record), checked at resume.
StateEntry dataloader_entry(BatchLoader& loader, int64_t dp_rank, json tokenizer) {
  StateEntry e;
  e.name = "dataloader";
  const std::string key = "dp_rank_" + std::to_string(dp_rank);
  e.save = [&loader, key, tokenizer](std::vector<SavedTensor>&, json& state) {
    state[key] = loader.state_json();
    state["tokenizer"] = tokenizer;
  };
  e.load = [&loader, key, tokenizer](const CheckpointReader& reader, const json& state) {
    const std::string difference =
        tokenizer_difference(state.value("tokenizer", json()), tokenizer);
    if (!difference.empty()) log_warning("checkpoint ", reader.dir(), ": ", difference);
    if (!state.contains(key)) {
      throw DataError("checkpoint '" + reader.dir() + "' has no data loader state for " + key +
                      " (saved with a different data-parallel degree?)");
    }
    loader.load_state_json(state.at(key));
  };
  return e;
}

// DiLoCo's outer momentum, "ft_outer.<param>.momentum", laid out like the parameter. Checkpoints
// are written right after a sync (checkpoint.interval is a multiple of sync_steps), where the
// outer step's snapshot is the parameters themselves.
StateEntry outer_momentum_entry(std::vector<std::pair<std::string, at::Tensor>> buffers,
                                LayoutFn layout, OwnerFn owner) {
  StateEntry e;
  e.name = "ft_outer";
  e.save = [buffers, layout, owner](std::vector<SavedTensor>& tensors, json&) {
    for (const auto& [name, t] : buffers) {
      if (owner(name)) push_boxes(tensors, "ft_outer." + name + ".momentum", t, layout(name));
    }
  };
  e.load = [buffers, layout](const CheckpointReader& reader, const json&) {
    for (const auto& [name, t] : buffers) {
      reader.read_box_into("ft_outer." + name + ".momentum", layout(name), t);
    }
  };
  return e;
}

}  // namespace

// A Hugging Face folder holds the base model; LoRA's adapters keep their initial values.
void Trainer::load_hf_base(const std::string& hf_dir) {
  const TensorMap whole = ckpt::read_hf_parameters(hf_dir, model_description(config_.model));
  parallel_->load_full_parameters([&](const std::string& name) {
    const auto it = whole.find(name);
    if (it == whole.end() && is_lora_param(name)) return at::Tensor();
    return whole.at(name);
  });
  // The state buffers as read (DeepSeek-V3's e_score_correction_bias as the MoE layers'
  // expert_bias: the routing of the model as published; zeros where the folder has none).
  at::NoGradGuard no_grad;
  for (auto& [name, buffer] : parallel_->state_buffers()) buffer.copy_(whole.at(name));
}

// Every start of a QLoRA run reads the base here, a resumed one too: checkpoints hold the adapters
// and the other trained tensors, not the NF4 base, which is a function of the Hugging Face folder.
void Trainer::load_and_quantize_base() {
  const std::string& hf_dir = config_.checkpoint.initial_load_path;
  const auto t0 = std::chrono::steady_clock::now();
  load_hf_base(hf_dir);
  const Nf4Quantized q = parallel_->quantize_frozen_base();
  TITAN_CONFIG_CHECK(!q.layers.empty(),
                     "lora.quantize_base = \"nf4\": no frozen linear layer in the blocks to "
                     "quantize (lora.target_modules adapts every one?)");
  log_info("QLoRA: the frozen base of ", q.layers.size(), " linear layers (",
           with_commas(q.elements), " weights) from ", hf_dir,
           " held in NF4: ", human_bytes(static_cast<uint64_t>(q.dense_bytes)), " -> ",
           human_bytes(static_cast<uint64_t>(q.nf4_bytes)), " (",
           8.0 * static_cast<double>(q.nf4_bytes) / static_cast<double>(q.elements),
           " bits per weight) in ",
           std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), "s");
}

void Trainer::build_checkpoint() {
  const bool qlora = !config_.lora.quantize_base.empty();
  if (qlora) load_and_quantize_base();
  const std::vector<std::pair<std::string, at::Tensor>> params = trained_params();
  // Boxes and writers come from the parallelized model: replicas (HSDP, DDP) hold equal shards and
  // the first replica writes them; TP-replicated parameters are written by tp rank 0.
  std::map<std::string, ShardBox> boxes;
  std::set<std::string> written;
  for (const TrainedParam& p : parallel_->params()) {
    boxes[p.name] = p.box;
    if (p.writer) written.insert(p.name);
  }
  // Buffers that are state (MoE expert biases) go with the parameters, whole, written once.
  std::vector<std::pair<std::string, at::Tensor>> model_tensors = params;
  for (const auto& [name, buffer] : parallel_->state_buffers()) {
    model_tensors.emplace_back(name, buffer);
    boxes[name] = ShardBox::whole(buffer.sizes());
    if (parallel_->writes_state_buffers()) written.insert(name);
  }
  LayoutFn layout = [boxes](const std::string& name) { return boxes.at(name); };
  OwnerFn owner = [written](const std::string& name) { return written.count(name) > 0; };
  // The loader reads the global stream (identical on every rank): its state is one entry.
  std::vector<StateEntry> states = {
      model_entry(model_tensors, layout, owner),
      optimizer_entry(*optimizer_, layout, owner),
      lr_scheduler_entry(*lr_scheduler_, train_state_),
      dataloader_entry(*train_loader_, /*dp_rank=*/0,
                       tokenizer_record(*tokenizer_, config_.model.hf_assets_path)),
      train_state_entry(train_state_),
      // "rng.cpu" (rank 0's) and every rank's "rng.cuda.<rank>": rng_state.h has the rules.
      ckpt::rng_entry(ckpt::rank_generators(device_), rank_, world_size_),
  };
  if (ft_outer_ && !ft_outer_->momentum_buffers().empty()) {
    std::vector<std::pair<std::string, at::Tensor>> buffers;
    size_t i = 0;
    for (const TrainedParam& p : parallel_->params()) {
      if (!p.frozen) buffers.emplace_back(p.name, ft_outer_->momentum_buffers().at(i++));
    }
    states.push_back(outer_momentum_entry(std::move(buffers), layout, owner));
  }
  json describe = {{"model", trained_model_description(config_.model, config_.lora)},
                   {"tokenizer_path", config_.model.hf_assets_path},
                   {"job_config", render_config_toml(config_)}};
  if (qlora) {  // the blocks' frozen linears are not in this checkpoint: they come from here
    describe["qlora_base"] = {{"quantization", config_.lora.quantize_base},
                              {"hf_folder", config_.checkpoint.initial_load_path}};
  }
  checkpointer_ = std::make_unique<ckpt::CheckpointManager>(
      config_.checkpoint, config_.job.dump_folder, std::move(states), std::move(describe), world_);
  const auto& c = config_.checkpoint;
  if (c.create_seed_checkpoint) return;  // train() writes step 0 and stops
  if (c.enable) {
    const int64_t final_step = checkpointer_->final_model_only_step();
    if (final_step >= config_.training.steps) {
      already_complete_ = true;
      log_info("checkpoint folder ", checkpointer_->folder(), " holds the final model of step ",
               final_step, " >= training.steps ", config_.training.steps,
               ": training is complete (raise training.steps or use a new folder to go on)");
      return;
    }
  }
  const ckpt::LoadResult loaded = checkpointer_->load([&](const std::string& hf_dir) {
    if (!qlora) load_hf_base(hf_dir);  // else load_and_quantize_base has read this folder
  });
  if (loaded.loaded && !loaded.model_only) {
    if (train_state_.step >= config_.training.steps) {
      log_warning("resumed at step ", train_state_.step, ", which is >= training.steps ",
                  config_.training.steps, "; nothing to train");
    }
    log_info("resuming training after step ", train_state_.step, " (", train_state_.tokens_seen,
             " tokens seen)");
  }
}

void Trainer::save_final_hf(int64_t step) {
  const auto& c = config_.checkpoint;
  if (!c.enable || !c.last_save_in_hf) return;
  ckpt::HfWriteOptions options;
  options.dtype = dtype_from_name(c.export_dtype);
  options.tokenizer_path = config_.model.hf_assets_path;
  options.bos_id = tokenizer_->bos_id();
  options.eos_id = tokenizer_->eos_id();
  // Every rank takes part in gathering the parameters; rank 0 writes them.
  std::vector<std::pair<std::string, at::Tensor>> full =
      parallel_->gather_full_parameters(/*state_buffers=*/true);
  if (lora_enabled(config_.model)) {
    // The merged model as the Hugging Face folder, and the adapters alone as a PEFT folder.
    const LoraSpec spec = LoraSpec::from_section(config_.lora);
    const TensorMap params(full.begin(), full.end());
    const nlohmann::json description = model_description(config_.model);
    if (rank_ == 0) {
      ckpt::write_peft_adapter(ckpt::peft_export_dir(checkpointer_->folder(), step), params,
                               description, spec);
    }
    if (!config_.lora.quantize_base.empty()) {
      // QLoRA: the float base is the Hugging Face folder the run started from; merging onto the
      // NF4 copy would bake its rounding into the export.
      log_info("QLoRA: the final export is the PEFT adapter (",
               ckpt::peft_export_dir(checkpointer_->folder(), step), "), for the float base in ",
               config_.checkpoint.initial_load_path,
               " (titan convert from-hf BASE OUT --adapter PEFT_DIR, or peft); no merged Hugging "
               "Face folder is written");
      return;
    }
    const TensorMap merged = merge_lora(params, spec);
    full.assign(merged.begin(), merged.end());
  }
  ckpt::export_hf(ckpt::hf_export_dir(checkpointer_->folder(), step), full,
                  model_description(config_.model), rank_, options);
}

}  // namespace titan
