// Activation checkpointing (see activation_checkpoint.h).
//
// A checkpointed block is one autograd node, CheckpointFunction: its inputs are the block input
// and the tensors in the block's parameter slots, its forward runs the block without autograd,
// and its backward runs the block again with autograd on fresh leaves of those inputs and returns
// torch::autograd::grad of the recomputed output for each of them. Per-op selective AC adds an
// OpPolicy (an OpSaver, savable_ops.h) on the thread while the block runs: in forward it keeps
// the chosen ops' results in the node's Recompute record, in the recomputation it hands them back.
#include "titan/parallel/activation_checkpoint.h"

#include "titan/common/check.h"
#include "titan/common/logging.h"
#include "titan/models/common/linear.h"
#include "titan/models/common/savable_ops.h"
#include "titan/parallel/data_parallel.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <optional>

namespace titan {

// Outside the anonymous namespace: Impl, declared in the header, holds one.
enum class AcMode { kFull, kEveryNth, kOps };

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Results an op kept in forward, for the recomputation to take back in the same order.
struct KeptResult {
  SavableOp op;
  std::vector<at::Tensor> results;
  std::vector<int64_t> versions;  // at keep time: a later in-place change would corrupt them
};

}  // namespace

struct ActivationCheckpointing::Impl {
  struct Unit {
    std::string name;
    bool block = false;  // a transformer block (ModelUnit::block >= 0)
    bool checkpointed = false;
    std::vector<std::string> params;  // the unit's parameters, by name
    std::vector<at::Tensor*> slots;   // where the unit's layers read them
    // Weight shapes (out, in) whose matmuls "op" mode always recomputes.
    std::vector<std::vector<int64_t>> force_recompute;
  };
  AcMode mode = AcMode::kFull;
  int64_t every = 1;  // kEveryNth: one block in `every`
  bool preserve_rng_state = true;
  bool determinism_check = true;
  bool debug = false;
  std::vector<Unit> units;
  std::atomic<int64_t> recomputations{0};
};

namespace {

using Impl = ActivationCheckpointing::Impl;

// One checkpointed run of a unit: what its backward needs besides the saved tensors.
struct Recompute : public torch::CustomClassHolder {
  Impl* impl = nullptr;
  int64_t unit = 0;
  UnitFn next;
  std::vector<at::Tensor> rng_states;  // the generators' states at forward (preserve_rng_state)
  std::vector<KeptResult> kept;        // "op" mode
  std::vector<int64_t> out_sizes;
  at::ScalarType out_dtype = at::kFloat;
  at::Device out_device = at::kCPU;
  at::Tensor forward_out;  // debug: the forward's output (detached, no reference cycle)
};

// TorchTitan's per-op policy for one run of one block: keep matmul outputs except every second
// matmul (counted separately in forward and recomputation, so both count alike), attention and
// reduce-scatter outputs; recompute the rest.
class OpPolicy : public OpSaver {
 public:
  OpPolicy(const Impl::Unit& unit, std::vector<KeptResult>& kept, bool replaying)
      : unit_(unit), kept_(kept), replaying_(replaying) {}

  bool keeps(SavableOp op, const at::Tensor& weight) override {
    if (op != SavableOp::kMatmul) return true;
    for (const auto& shape : unit_.force_recompute) {
      if (weight.defined() && weight.sizes() == at::IntArrayRef(shape)) return false;
    }
    ++matmuls_;
    return matmuls_ % 2 == 1;  // the 2nd, 4th, ... are recomputed
  }

  bool replaying() const override { return replaying_; }

  void keep(SavableOp op, std::vector<at::Tensor> results) override {
    KeptResult k{op, std::move(results), {}};
    // A kernel's unused results (a random state without dropout) may be undefined.
    for (const auto& t : k.results) k.versions.push_back(t.defined() ? t._version() : -1);
    kept_.push_back(std::move(k));
  }

  std::vector<at::Tensor> take(SavableOp op) override {
    TITAN_CHECK(taken_ < kept_.size(), "activation checkpointing: recomputing ", unit_.name,
                " reached a ", savable_op_name(op), " after all ", kept_.size(),
                " results its forward kept were used; the block ran differently when "
                "recomputed. HINT: a checkpointed block must run the same ops every time");
    KeptResult& k = kept_[taken_++];
    TITAN_CHECK(k.op == op, "activation checkpointing: recomputing ", unit_.name, " reached a ",
                savable_op_name(op), " where its forward kept a ", savable_op_name(k.op),
                " (kept result ", taken_, " of ", kept_.size(),
                "); the block ran differently when recomputed. HINT: a checkpointed block must "
                "run the same ops every time");
    for (size_t i = 0; i < k.results.size(); ++i) {
      TITAN_CHECK(!k.results[i].defined() || k.results[i]._version() == k.versions[i],
                  "activation checkpointing: the ", savable_op_name(op), " output that ",
                  unit_.name,
                  " kept in forward was changed in place afterwards. HINT: do not modify matmul, "
                  "attention or reduce-scatter outputs in place in a checkpointed block");
    }
    return std::move(k.results);
  }

  size_t taken() const { return taken_; }

 private:
  const Impl::Unit& unit_;
  std::vector<KeptResult>& kept_;
  bool replaying_;
  int64_t matmuls_ = 0;
  size_t taken_ = 0;
};

// The default generators a unit on `device` draws from: the CPU's, and the device's own.
std::vector<at::Generator> generators(const at::Device& device) {
  std::vector<at::Generator> out{at::detail::getDefaultCPUGenerator()};
  if (!device.is_cpu()) out.push_back(at::globalContext().defaultGenerator(device));
  return out;
}

std::vector<at::Tensor> rng_states(std::vector<at::Generator> gens) {
  std::vector<at::Tensor> states;
  for (auto& g : gens) {
    std::lock_guard<std::mutex> lock(g.mutex());
    states.push_back(g.get_state());
  }
  return states;
}

void set_rng_states(std::vector<at::Generator>& gens, const std::vector<at::Tensor>& states) {
  for (size_t i = 0; i < gens.size(); ++i) {
    std::lock_guard<std::mutex> lock(gens[i].mutex());
    gens[i].set_state(states[i]);
  }
}

// Sets the generators to the forward's states for the recomputation, and back afterwards, so the
// draws after backward are those of a run without checkpointing.
class RngReplay {
 public:
  RngReplay(const at::Device& device, const std::vector<at::Tensor>& forward_states)
      : gens_(generators(device)), current_(rng_states(gens_)) {
    set_rng_states(gens_, forward_states);
  }
  ~RngReplay() { set_rng_states(gens_, current_); }

 private:
  std::vector<at::Generator> gens_;
  std::vector<at::Tensor> current_;
};

// Installs values[k] in slots[k] for the scope's lifetime.
class SlotSwap {
 public:
  SlotSwap(const std::vector<at::Tensor*>& slots, const std::vector<at::Tensor>& values)
      : slots_(slots) {
    for (size_t k = 0; k < slots.size(); ++k) {
      previous_.push_back(*slots[k]);
      *slots[k] = values[k];
    }
  }
  ~SlotSwap() {
    for (size_t k = 0; k < slots_.size(); ++k) *slots_[k] = previous_[k];
  }

 private:
  const std::vector<at::Tensor*>& slots_;
  std::vector<at::Tensor> previous_;
};

// The unit's forward without autograd (CheckpointFunction::forward runs with grad mode off).
at::Tensor checkpointed_forward(Recompute& r, const at::Tensor& input) {
  const Impl& d = *r.impl;
  if (d.preserve_rng_state) r.rng_states = rng_states(generators(input.device()));
  at::Tensor out;
  if (d.mode == AcMode::kOps) {
    OpPolicy policy(d.units[r.unit], r.kept, /*replaying=*/false);
    OpSaverScope scope(&policy);
    out = r.next(input);
  } else {
    out = r.next(input);
  }
  r.out_sizes = out.sizes().vec();
  r.out_dtype = out.scalar_type();
  r.out_device = out.device();
  if (d.debug) r.forward_out = out.detach();
  return out;
}

// The checks and the debug log after a recomputation.
void check_recomputed(const Recompute& r, const at::Tensor& out, size_t kept_taken) {
  const Impl& d = *r.impl;
  const std::string& name = d.units[r.unit].name;
  if (d.determinism_check) {
    TITAN_CHECK(out.sizes() == at::IntArrayRef(r.out_sizes) && out.scalar_type() == r.out_dtype &&
                    out.device() == r.out_device,
                "activation checkpointing: recomputing ", name, " for backward gave an output ",
                out.sizes(), " ", out.scalar_type(), " on ", out.device(),
                ", but its forward gave ", at::IntArrayRef(r.out_sizes), " ", r.out_dtype, " on ",
                r.out_device,
                ". HINT: a checkpointed block must compute the same thing every time it runs; "
                "activation_checkpoint.determinism_check = \"none\" skips this check");
    TITAN_CHECK(kept_taken == r.kept.size(), "activation checkpointing: recomputing ", name,
                " used ", kept_taken, " of the ", r.kept.size(),
                " results its forward kept; the block ran differently when recomputed. HINT: a "
                "checkpointed block must run the same ops every time; "
                "activation_checkpoint.determinism_check = \"none\" skips this check");
  }
  if (d.debug) {
    std::string diff = "not comparable";
    if (out.sizes() == r.forward_out.sizes()) {
      const at::Tensor delta = out.detach().to(at::kDouble) - r.forward_out.to(at::kDouble);
      diff = std::to_string(delta.numel() == 0 ? 0.0 : delta.abs().max().item<double>());
    }
    log_info("activation checkpointing: recomputed ", name, " (", kept_taken,
             " kept op results reused), largest |recomputed - forward| output difference ", diff);
  }
}

// The backward of a checkpointed run: recompute with autograd, then differentiate.
// saved: the unit input, then its parameter tensors; needs[i]: saved[i] wants a gradient.
variable_list recompute_backward(Recompute& r, const variable_list& saved, const at::Tensor& grad,
                                 const std::vector<bool>& needs) {
  Impl& d = *r.impl;
  const Impl::Unit& unit = d.units[r.unit];
  // Fresh leaves: the recomputed graph ends at them, and grad() returns their gradients.
  std::vector<at::Tensor> leaves, wrt;
  std::vector<size_t> wrt_index;
  for (size_t i = 0; i < saved.size(); ++i) {
    at::Tensor leaf = saved[i].detach();
    if (needs[i]) {
      leaf.requires_grad_(true);
      wrt.push_back(leaf);
      wrt_index.push_back(i);
    }
    leaves.push_back(leaf);
  }
  const std::vector<at::Tensor> params(leaves.begin() + 1, leaves.end());
  SlotSwap swap(unit.slots, params);
  at::Tensor out;
  size_t kept_taken = 0;
  {
    at::AutoGradMode enable_grad(true);
    RecomputeScope recomputing;
    std::optional<RngReplay> rng;
    if (d.preserve_rng_state) rng.emplace(leaves[0].device(), r.rng_states);
    if (d.mode == AcMode::kOps) {
      OpPolicy policy(unit, r.kept, /*replaying=*/true);
      OpSaverScope scope(&policy);
      out = r.next(leaves[0]);
      kept_taken = policy.taken();
    } else {
      out = r.next(leaves[0]);
    }
  }
  ++d.recomputations;
  check_recomputed(r, out, kept_taken);
  variable_list grads(saved.size());
  if (!wrt.empty() && out.requires_grad()) {
    const variable_list g = torch::autograd::grad({out}, wrt, {grad}, /*retain_graph=*/false,
                                                  /*create_graph=*/false, /*allow_unused=*/true);
    for (size_t k = 0; k < g.size(); ++k) grads[wrt_index[k]] = g[k];
  }
  r.kept.clear();
  r.forward_out = at::Tensor();
  return grads;
}

// Inputs: the unit input, the tensors in its parameter slots, and the run's Recompute record.
struct CheckpointFunction : public torch::autograd::Function<CheckpointFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, at::TensorList params,
                            c10::intrusive_ptr<Recompute> r) {
    at::Tensor out = checkpointed_forward(*r, input);
    std::vector<at::Tensor> saved{input};
    saved.insert(saved.end(), params.begin(), params.end());
    ctx->save_for_backward(saved);
    ctx->saved_data["recompute"] = c10::IValue::make_capsule(std::move(r));
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto r =
        c10::static_intrusive_pointer_cast<Recompute>(ctx->saved_data["recompute"].toCapsule());
    ctx->saved_data.erase("recompute");  // its kept results go with this backward
    const variable_list saved = ctx->get_saved_variables();
    std::vector<bool> needs;
    for (size_t i = 0; i < saved.size(); ++i) needs.push_back(ctx->needs_input_grad(i));
    variable_list out = recompute_backward(*r, saved, grads[0], needs);
    out.emplace_back();  // the Recompute record
    return out;
  }
};

// The mode from mode / selective_ac_option (every = N for kEveryNth).
AcMode parse_mode(const ActivationCheckpointSection& config, int64_t& every) {
  if (config.mode == "full") return AcMode::kFull;
  if (config.mode == "memory_budget") {
    throw ConfigError(
        "activation_checkpoint.mode = \"memory_budget\" is not supported (it needs a graph "
        "compiler to choose what to save). HINT: use \"selective\" or \"full\"");
  }
  if (config.mode != "selective") {
    throw ConfigError(message("activation_checkpoint.mode must be none, full or selective, got '",
                              config.mode, "'"));
  }
  const std::string& option = config.selective_ac_option;
  if (option == "op") return AcMode::kOps;
  const bool digits = !option.empty() && option.size() <= 18 &&
                      option.find_first_not_of("0123456789") == std::string::npos;
  every = digits ? std::stoll(option) : 0;
  if (every < 1) {
    const std::string hint = "'. HINT: \"2\" checkpoints every 2nd block";
    throw ConfigError(message(
        "activation_checkpoint.selective_ac_option must be \"op\" or an integer >= 1, got '",
        option, hint));
  }
  return AcMode::kEveryNth;
}

// Weight shapes of the unit's Linear layers whose names contain one of `fqns` (TorchTitan's
// per_op_sac_force_recompute_mm_shapes_by_fqns, a substring match on the module FQN).
std::vector<std::vector<int64_t>> force_recompute_shapes(
    const ModelUnit& unit, const std::vector<std::string>& fqns,
    const std::map<std::string, std::shared_ptr<torch::nn::Module>>& modules,
    const std::map<std::string, at::Tensor*>& slots) {
  std::vector<std::vector<int64_t>> shapes;
  const std::string suffix = ".weight";
  for (const std::string& param : unit.params) {
    if (param.size() <= suffix.size() ||
        param.compare(param.size() - suffix.size(), suffix.size(), suffix) != 0) {
      continue;
    }
    const std::string module = param.substr(0, param.size() - suffix.size());
    for (const std::string& fqn : fqns) {
      if (fqn.empty() || module.find(fqn) == std::string::npos) continue;
      auto it = modules.find(module);
      if (it == modules.end() || dynamic_cast<Linear*>(it->second.get()) == nullptr) {
        throw ConfigError(
            message("activation_checkpoint.per_op_sac_force_recompute_mm_shapes_by_fqns: '", fqn,
                    "' matches ", module,
                    ", which is not a Linear layer. HINT: name only Linear layers there"));
      }
      std::vector<int64_t> shape = slots.at(param)->sizes().vec();
      if (std::find(shapes.begin(), shapes.end(), shape) == shapes.end()) shapes.push_back(shape);
    }
  }
  return shapes;
}

}  // namespace

ActivationCheckpointing::ActivationCheckpointing(Model& model,
                                                 const ActivationCheckpointSection& config)
    : model_(model), impl_(std::make_unique<Impl>()) {
  Impl& d = *impl_;
  for (UnitRunner* runner : model.unit_runners()) {
    TITAN_CHECK(dynamic_cast<DataParallel*>(runner) == nullptr,
                "activation checkpointing must be applied before FSDP / DDP, so that it runs "
                "inside their unit runner (TorchTitan's order: TP, AC, FSDP). HINT: construct "
                "ActivationCheckpointing before DataParallel");
  }
  d.mode = parse_mode(config, d.every);
  if (config.determinism_check != "default" && config.determinism_check != "none") {
    throw ConfigError(
        message("activation_checkpoint.determinism_check must be default or none, got '",
                config.determinism_check, "'"));
  }
  d.preserve_rng_state = config.preserve_rng_state;
  d.determinism_check = config.determinism_check == "default";
  d.debug = config.debug;

  std::map<std::string, at::Tensor*> slots;
  for (const ParamSlot& s : parameter_slots(model)) slots[s.name] = s.slot;
  std::map<std::string, std::shared_ptr<torch::nn::Module>> modules;
  for (const auto& item : model.named_modules(/*name_prefix=*/"", /*include_self=*/false)) {
    modules[item.key()] = item.value();
  }
  int64_t blocks = 0;
  for (const ModelUnit& mu : model.units()) {
    Impl::Unit u;
    u.name = mu.name;
    u.params = mu.params;
    for (const std::string& name : mu.params) u.slots.push_back(slots.at(name));
    u.block = mu.block >= 0;
    if (u.block) {
      ++blocks;  // TorchTitan's counter: incremented per block, then tested
      u.checkpointed = d.mode != AcMode::kEveryNth || blocks % d.every == 0;
    }
    if (u.checkpointed && d.mode == AcMode::kOps) {
      u.force_recompute = force_recompute_shapes(
          mu, config.per_op_sac_force_recompute_mm_shapes_by_fqns, modules, slots);
    }
    d.units.push_back(std::move(u));
  }
  model.add_unit_runner(this);
}

ActivationCheckpointing::~ActivationCheckpointing() { model_.remove_unit_runner(this); }

void ActivationCheckpointing::parameters_removed() {
  std::map<std::string, at::Tensor*> slots;
  for (const ParamSlot& s : parameter_slots(model_)) slots[s.name] = s.slot;
  for (Impl::Unit& u : impl_->units) {
    std::vector<std::string> names;
    std::vector<at::Tensor*> kept;
    for (const std::string& name : u.params) {
      const auto it = slots.find(name);
      if (it == slots.end()) continue;
      names.push_back(name);
      kept.push_back(it->second);
    }
    u.params = std::move(names);
    u.slots = std::move(kept);
  }
}

at::Tensor ActivationCheckpointing::run(int64_t index, const at::Tensor& input,
                                        const UnitFn& next) {
  Impl& d = *impl_;
  TITAN_CHECK(index >= 0 && index < static_cast<int64_t>(d.units.size()), "unit ", index,
              " out of range");
  const Impl::Unit& unit = d.units[index];
  if (!unit.checkpointed || !at::GradMode::is_enabled()) return next(input);
  std::vector<at::Tensor> params;
  for (const at::Tensor* slot : unit.slots) {
    TITAN_CHECK(slot->defined(), "activation checkpointing: ", unit.name,
                " has a parameter slot with no tensor. HINT: apply activation checkpointing "
                "before FSDP, which fills the slots before each unit runs");
    params.push_back(*slot);
  }
  auto r = c10::make_intrusive<Recompute>();
  r->impl = &d;
  r->unit = index;
  r->next = next;
  return CheckpointFunction::apply(input, at::TensorList(params), std::move(r));
}

bool ActivationCheckpointing::checkpointed(int64_t index) const {
  return index >= 0 && index < static_cast<int64_t>(impl_->units.size()) &&
         impl_->units[index].checkpointed;
}

int64_t ActivationCheckpointing::recomputations() const { return impl_->recomputations.load(); }

std::string ActivationCheckpointing::describe() const {
  const Impl& d = *impl_;
  std::string names;
  int64_t count = 0, blocks = 0;
  for (const auto& u : d.units) {
    blocks += u.block ? 1 : 0;
    if (!u.checkpointed) continue;
    names += (count++ == 0 ? "" : ", ") + u.name;
  }
  std::string s = "activation checkpointing: ";
  switch (d.mode) {
    case AcMode::kFull: s += "full"; break;
    case AcMode::kEveryNth: s += "selective, one block in " + std::to_string(d.every); break;
    case AcMode::kOps:
      s += "selective op (keeps matmul outputs but every second one, attention and "
           "reduce-scatter outputs)";
      break;
  }
  return s + ", " + std::to_string(count) + " of " + std::to_string(blocks) + " blocks (" + names +
         ")";
}

AcPolicy ac_policy(const ActivationCheckpointSection& config) {
  AcPolicy policy;
  if (config.mode == "none") return policy;
  int64_t every = 0;
  const AcMode mode = parse_mode(config, every);
  policy.per_op = mode == AcMode::kOps;
  policy.every = mode == AcMode::kFull ? 1 : mode == AcMode::kEveryNth ? every : 0;
  return policy;
}

std::unique_ptr<ActivationCheckpointing> apply_activation_checkpointing(
    Model& model, const ActivationCheckpointSection& config) {
  if (config.mode == "none") return nullptr;
  return std::make_unique<ActivationCheckpointing>(model, config);
}

}  // namespace titan
