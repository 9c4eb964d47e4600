// FSDP / HSDP / DDP over a model's units (see data_parallel.h).
//
// Per unit, three buffers:
//   shard      float32 (shard_numel): the concatenation over the unit's parameters of this rank's
//              chunk of c_i rows, zero-padded to c_i rows. The optimizer updates views of it.
//   unsharded  param dtype (N * shard_numel): parameter i occupies N * c_i rows at its offset, its
//              first R_i rows are the parameter. Its storage is freed while the unit is
//              resharded; the tensors installed in the model (and saved by autograd) share that
//              storage object, so re-allocating it and gathering again revives them all.
//   grad       float32 (shard_numel): the reduced gradients, accumulated over micro-batches.
// The all-gather output is rank-major (N x shard_numel); copying it into `unsharded` reorders it
// to parameter-major. The reduce-scatter input is built the other way round.
//
// With the float8 all-gather, a unit's float8 weights leave the param-dtype gather (whose input
// is then the other parameters' chunks, packed) and travel in a second all-gather of bytes:
//   scales8    float32 (one per float8 weight): fp8_max / max |weight| over every shard (and
//              the TP group), computed at the unit's first gather of a forward (or, precomputed,
//              for every unit at the forward's start) and kept for its backward's re-gather;
//   unsharded8 uint8 (N * float8 chunk bytes), parameter-major like `unsharded`, freed with it.
// The gathered float8 weight is handed to its Linear; its region of `unsharded` receives the
// dequantized values (what the layer computes with) and carries the gradient.
//
// On CUDA the collectives run on two side streams (device_streams.h), as FSDP2 does:
//   gather stream   after the compute stream's queued work: cast the shard to the param dtype,
//                   all-gather, copy out into `unsharded`; the compute stream waits for it only
//                   when the unit is about to run, so unit i + 1's gather overlaps unit i.
//   reduce stream   after the unit's gradients are packed (on the compute stream): reduce-scatter
//                   (and HSDP's all-reduce), divide, accumulate into `grad`; finish_backward makes
//                   the compute stream wait. The backward of earlier units overlaps it.
// `unsharded` is allocated on the compute stream (and freed there once compute is done), the
// gather's and reduction's temporaries on their side stream; `grad` is recorded on the compute
// stream before compute uses it. On the CPU (Gloo) the same code runs inline.
#include "titan/parallel/data_parallel.h"

#include "titan/common/check.h"
#include "titan/common/format.h"
#include "titan/common/logging.h"
#include "titan/parallel/data_parallel_units.h"

#include <torch/csrc/autograd/custom_function.h>

namespace titan {

using dp_internal::allocate_storage;
using dp_internal::dtype_short;
using dp_internal::free_storage;
using dp_internal::numel_of;

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Outputs: the unit's unsharded parameters (installed in the model). Backward: the unit's
// gradients arrive together, once all its uses are done; they are handed to the reduction.
struct GatherParams : public torch::autograd::Function<GatherParams> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& anchor,
                               DataParallel::Impl* impl, int64_t unit) {
    ctx->saved_data["impl"] = reinterpret_cast<int64_t>(impl);
    ctx->saved_data["unit"] = unit;
    ctx->set_materialize_grads(false);  // undefined: no gradient (or deferred, see post_backward)
    variable_list out = impl->param_tensors(impl->units[unit]);
    // Frozen parameters get no gradient: autograd then skips their weight-gradient GEMMs.
    const auto& params = impl->units[unit].params;
    for (size_t k = 0; k < params.size(); ++k) {
      if (impl->params[params[k]].frozen) ctx->mark_non_differentiable({out[k]});
    }
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto* impl = reinterpret_cast<DataParallel::Impl*>(ctx->saved_data["impl"].toInt());
    impl->post_backward(ctx->saved_data["unit"].toInt(), grads);
    return {at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// Identity on a unit's output; its backward runs before the unit's own backward: re-gather the
// unit if it was resharded, and prefetch the one before it.
struct PreBackward : public torch::autograd::Function<PreBackward> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, DataParallel::Impl* impl,
                            int64_t unit) {
    ctx->saved_data["impl"] = reinterpret_cast<int64_t>(impl);
    ctx->saved_data["unit"] = unit;
    return x;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto* impl = reinterpret_cast<DataParallel::Impl*>(ctx->saved_data["impl"].toInt());
    impl->pre_backward(ctx->saved_data["unit"].toInt());
    return {grads[0], at::Tensor(), at::Tensor()};
  }
};

}  // namespace

DataParallel::DataParallel(Model& model, DataParallelOptions options)
    : model_(model), impl_(std::make_unique<Impl>()) {
  Impl& d = *impl_;
  d.options = std::move(options);
  const auto& o = d.options;
  d.N = o.shard_group ? o.shard_group->size() : 1;
  d.rank = o.shard_group ? o.shard_group->rank() : 0;
  d.R = o.replicate_group ? o.replicate_group->size() : 1;
  d.divide_factor = o.grad_divisor > 0 ? o.grad_divisor : static_cast<double>(d.N * d.R);
  TITAN_CHECK(o.reshard_after_forward == "default" || o.reshard_after_forward == "always" ||
                  o.reshard_after_forward == "never",
              "fsdp_reshard_after_forward must be default, always or never, got '",
              o.reshard_after_forward, "'");
  TITAN_CHECK(
      o.param_dtype == at::kFloat || o.param_dtype == at::kBFloat16 || o.param_dtype == at::kHalf,
      "FSDP param dtype must be float32, bfloat16 or float16");
  TITAN_CHECK(o.reduce_dtype == at::kFloat || o.reduce_dtype == at::kBFloat16,
              "FSDP reduce dtype must be float32 or bfloat16");

  // Parameters by name, with the layer members forward reads them from.
  std::map<std::string, at::Tensor*> slots;
  for (const ParamSlot& s : parameter_slots(model)) slots[s.name] = s.slot;
  std::map<std::string, int64_t> index_of;
  const auto named = model.named_parameters();
  const auto managed = [&](const std::string& name) {
    return !o.param_filter || o.param_filter(name);
  };
  TITAN_CHECK(!named.is_empty(), "the model has no parameters to shard");
  d.device = named[0].value().device();
  const bool from_meta = d.device.is_meta();  // shapes only: nothing to copy into the shards
  if (from_meta) d.device = o.device;
  d.clock = std::make_unique<WaitClock>(d.device);
  // Side streams only where there is communication to overlap on a GPU: NCCL's, or Gloo's on
  // host copies of the CUDA tensors (the shared-device test mode), whose wait() blocks the host
  // and then queues the copies back on the side stream.
  const bool comm = o.shard_group != nullptr || o.replicate_group != nullptr;
  const at::Device stream_device = comm && d.device.is_cuda() ? d.device : at::Device(at::kCPU);
  d.gather_stream = std::make_unique<SideStream>(stream_device);
  d.reduce_stream = std::make_unique<SideStream>(stream_device);
  for (const auto& item : named) {
    if (!managed(item.key())) continue;
    Impl::Param p;
    p.name = item.key();
    p.slot = slots.at(p.name);
    const at::Tensor& t = item.value();
    p.frozen = !t.requires_grad();
    TITAN_CHECK(t.scalar_type() == at::kFloat, "FSDP expects float32 parameters; ", p.name, " is ",
                t.scalar_type());
    p.global_shape = t.sizes().vec();
    p.shape = p.global_shape.empty() ? std::vector<int64_t>{1} : p.global_shape;
    p.rows = p.shape[0];
    p.rest = numel_of(p.shape) / std::max<int64_t>(1, p.rows);
    p.chunk = (p.rows + d.N - 1) / d.N;
    p.local_rows = std::max<int64_t>(0, std::min(p.chunk, p.rows - d.rank * p.chunk));
    index_of[p.name] = static_cast<int64_t>(d.params.size());
    d.params.push_back(p);
  }

  // The float8 all-gather's weights: those of the float8 Linear layers, once sharded.
  if (o.float8_all_gather && d.N > 1) {
    for (const auto& [name, linear] : float8_linears(model)) {
      TITAN_CHECK(linear->float8->recipe == Float8Recipe::kTensorwise,
                  "the float8 all-gather (quantize.linear.float8.enable_fsdp_float8_all_gather) "
                  "needs the tensorwise recipe; layer ",
                  name, " uses ", float8_recipe_name(linear->float8->recipe));
      d.params[index_of.at(name)].float8_layer = linear;
    }
  }

  // Units, as the model declares them; every parameter in exactly one.
  const std::vector<ModelUnit> declared = model.units();
  std::set<std::string> seen;
  for (size_t ui = 0; ui < declared.size(); ++ui) {
    const ModelUnit& mu = declared[ui];
    Impl::Unit u;
    u.name = mu.name;
    u.reused = mu.reused_in_forward;
    for (const std::string& name : mu.params) {
      if (!managed(name) && named.contains(name)) continue;  // another instance's
      auto it = index_of.find(name);
      TITAN_CHECK(it != index_of.end(), "model unit '", mu.name, "' names unknown parameter ",
                  name);
      TITAN_CHECK(seen.insert(name).second, "parameter ", name, " is in two model units");
      Impl::Param& p = d.params[it->second];
      const int64_t n = p.chunk * p.rest;
      p.offset = u.shard_numel;
      p.unsharded_offset = d.N * u.shard_numel;
      u.shard_numel += n;
      if (p.float8_layer != nullptr) {
        p.offset8 = u.f8_numel;
        p.unsharded8_offset = d.N * u.f8_numel;
        p.scale_index = static_cast<int64_t>(u.f8_params.size());
        u.f8_numel += n;
        u.f8_params.push_back(it->second);
      } else {
        p.gather_offset = u.hp_numel;
        u.hp_numel += n;
      }
      u.params.push_back(it->second);
    }
    const bool last = ui + 1 == declared.size();
    if (d.N == 1 || u.reused || o.reshard_after_forward == "never") {
      u.reshard_after_forward = false;
    } else {
      u.reshard_after_forward = o.reshard_after_forward == "always" || !last;
    }
    d.units.push_back(std::move(u));
  }
  for (const auto& p : d.params) {
    TITAN_CHECK(seen.count(p.name) != 0, "parameter ", p.name, " is in no model unit");
  }

  // Shards from the (identical) full parameters; then the full ones are released.
  at::NoGradGuard no_grad;
  for (auto& u : d.units) {
    u.shard = at::zeros({u.shard_numel}, d.on_device(at::kFloat));
    for (int64_t pi : u.params) {
      const Impl::Param& p = d.params[pi];
      const at::Tensor full = named[p.name].reshape({p.rows, p.rest});
      if (p.local_rows > 0 && !from_meta) {
        u.shard.narrow(0, p.offset, p.local_rows * p.rest)
            .view({p.local_rows, p.rest})
            .copy_(full.narrow(0, d.rank * p.chunk, p.local_rows));
      }
    }
    if (d.aliased()) {
      u.unsharded = u.shard;
    } else {
      u.unsharded = at::empty({d.N * u.shard_numel}, d.on_device(o.param_dtype));
      if (u.f8_numel > 0) {
        u.unsharded8 = at::empty({d.N * u.f8_numel}, d.on_device(at::kByte));
        u.scales8 = at::ones({static_cast<int64_t>(u.f8_params.size())}, d.on_device(at::kFloat));
      }
      if (d.sharded()) {
        free_storage(u.unsharded);
        if (u.f8_numel > 0) free_storage(u.unsharded8);
        u.allocated = false;
      }
    }
  }
  TITAN_CHECK(!d.params.empty(), "data parallelism: no parameter passes the filter");
  for (const auto& item : named) {
    if (!managed(item.key())) continue;
    at::Tensor t = item.value();
    t.set_data(at::empty({0}, t.options()));
  }
  for (const auto& p : d.params) *p.slot = at::Tensor();

  // Public per-parameter shards (views of the flat shards), in named_parameters() order.
  params_.resize(d.params.size());
  for (const auto& u : d.units) {
    for (int64_t pi : u.params) {
      const Impl::Param& p = d.params[pi];
      std::vector<int64_t> local_shape = p.shape;
      local_shape[0] = p.local_rows;
      ShardedParam& sp = params_[pi];
      sp.name = p.name;
      sp.row_offset = std::min(d.rank * p.chunk, p.rows);
      auto placed = o.placements.find(p.name);
      sp.box = placed != o.placements.end() ? placed->second.box : ShardBox::whole(p.global_shape);
      sp.box = sp.box.rows(sp.row_offset, p.local_rows);
      sp.local = u.shard.narrow(0, p.offset, p.local_rows * p.rest).view(local_shape);
      if (sp.box.global_shape.empty()) sp.local = sp.local.view({});
    }
  }
  d.anchor = at::zeros({}, d.on_device(at::kFloat)).requires_grad_(true);
  model.add_unit_runner(this);
}

DataParallel::~DataParallel() {
  for (const auto& p : impl_->params) {
    if (p.float8_layer != nullptr) p.float8_layer->float8_weight.reset();
  }
  model_.remove_unit_runner(this);
}

double DataParallel::comm_wait_seconds() const { return impl_->clock->seconds(); }

at::Tensor DataParallel::run(int64_t index, const at::Tensor& input, const UnitFn& next) {
  Impl& d = *impl_;
  TITAN_CHECK(index >= 0 && index < static_cast<int64_t>(d.units.size()), "unit ", index,
              " out of range");
  const int64_t pos = d.forward_pos++;
  Impl::Unit& u = d.units[index];
  if (u.params.empty()) return next(input);  // none of this instance's parameters
  d.gather_finish(index);
  const auto n_units = static_cast<int64_t>(d.units.size());
  for (int64_t k = 1; k <= d.options.prefetch && pos + k < n_units && index + k < n_units; ++k) {
    d.gather_start(index + k);
  }
  const bool grad = at::GradMode::is_enabled();
  if (u.uses == 0) {
    u.installed = grad ? GatherParams::apply(d.anchor, &d, index) : d.param_tensors(u);
    for (size_t k = 0; k < u.params.size(); ++k) *d.params[u.params[k]].slot = u.installed[k];
    d.install_float8(u);
  }
  ++u.uses;
  at::Tensor out = next(input);
  if (grad) {
    out = PreBackward::apply(out, &d, index);
    if (u.reshard_after_forward) d.reshard(index);
  } else if (!u.reused) {
    d.reshard(index);  // no backward will need it (a reused unit: at end_forward)
  }
  return out;
}

void DataParallel::begin_forward() {
  Impl& d = *impl_;
  d.forward_pos = 0;
  // The weights may have changed since the float8 scales were taken.
  std::vector<int64_t> with_float8;
  for (int64_t ui = 0; ui < static_cast<int64_t>(d.units.size()); ++ui) {
    d.units[ui].uses = 0;
    d.units[ui].scales_ready = false;
    if (d.units[ui].f8_numel > 0) with_float8.push_back(ui);
  }
  if (d.options.float8_precompute_scales && !with_float8.empty()) d.compute_scales(with_float8);
}

void DataParallel::end_forward() {
  Impl& d = *impl_;
  if (at::GradMode::is_enabled()) return;  // backward releases them
  for (int64_t ui = 0; ui < static_cast<int64_t>(d.units.size()); ++ui) {
    if (d.units[ui].reused && d.units[ui].uses > 0) d.reshard(ui);
  }
}

void DataParallel::defer_weight_grads(std::shared_ptr<WeightGradDeferral> deferral) {
  impl_->deferral = std::move(deferral);
}

void DataParallel::finish_backward() {
  Impl& d = *impl_;
  while (!d.pending.empty()) d.complete_front();
  for (const auto& u : d.units) {
    if (!u.grad.defined()) continue;
    SideStream::record_on_current(u.grad);  // made on the reduce stream, used by compute now
    for (int64_t pi : u.params) {
      const Impl::Param& p = d.params[pi];
      if (p.frozen) continue;
      ShardedParam& sp = params_[pi];
      sp.local.mutable_grad() =
          u.grad.narrow(0, p.offset, p.local_rows * p.rest).view(sp.local.sizes());
    }
  }
}

void DataParallel::zero_grad() {
  TITAN_CHECK(impl_->pending.empty(), "zero_grad with gradient reductions in flight");
  for (auto& u : impl_->units) u.grad = at::Tensor();
  for (auto& sp : params_) {
    if (sp.local.grad().defined()) sp.local.mutable_grad() = at::Tensor();
  }
}

std::vector<std::pair<std::string, at::Tensor>> DataParallel::gather_full_parameters() {
  Impl& d = *impl_;
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> full(d.params.size());
  for (auto& u : d.units) {
    if (u.params.empty()) continue;
    at::Tensor by_rank;
    if (d.N > 1) {
      at::Tensor out = at::empty({d.N * u.shard_numel}, d.on_device(at::kFloat));
      d.options.shard_group->all_gather_into_tensor(out, u.shard).wait();
      by_rank = out.view({d.N, u.shard_numel});
    } else {
      by_rank = u.shard.view({1, u.shard_numel});
    }
    for (int64_t pi : u.params) {
      const Impl::Param& p = d.params[pi];
      const int64_t n = p.chunk * p.rest;
      at::Tensor whole = by_rank.narrow(1, p.offset, n).reshape({d.N * p.chunk, p.rest});
      // As the model holds it, copied to the host.
      full[pi] = whole.narrow(0, 0, p.rows)
                     .reshape(p.global_shape)
                     .to(at::kCPU, /*non_blocking=*/false, /*copy=*/true);
    }
  }
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (size_t i = 0; i < d.params.size(); ++i) out.emplace_back(d.params[i].name, full[i]);
  return out;
}

void DataParallel::load_full_parameters(const std::function<at::Tensor(const std::string&)>& full) {
  at::NoGradGuard no_grad;
  for (auto& sp : params_) {
    at::Tensor t = full(sp.name);
    if (!t.defined()) continue;  // kept as it is (e.g. LoRA adapters over a loaded base)
    TITAN_CHECK(t.sizes().vec() == sp.box.global_shape, "parameter ", sp.name, " has shape ",
                t.sizes(), ", expected ", at::IntArrayRef(sp.box.global_shape));
    if (sp.local.numel() == 0) continue;
    sp.local.copy_(sp.box.narrow(t, sp.local.sizes()));
  }
}

DataParallelMemory DataParallel::memory() const {
  const Impl& d = *impl_;
  DataParallelMemory m;
  m.units = static_cast<int64_t>(d.units.size());
  const int64_t param_bytes = static_cast<int64_t>(at::elementSize(d.options.param_dtype));
  for (const auto& u : d.units) {
    m.shard_param_bytes += u.shard_numel * 4;
    m.max_unit_unsharded_bytes =
        std::max(m.max_unit_unsharded_bytes, d.N * (u.shard_numel * param_bytes + u.f8_numel));
  }
  for (const auto& p : d.params) m.total_param_bytes += p.rows * p.rest * 4;
  return m;
}

std::string describe_memory(const std::vector<const ParallelPiece*>& pieces, bool stages) {
  DataParallelMemory total;
  for (const ParallelPiece* piece : pieces) {
    const DataParallelMemory m = piece->memory();
    total.shard_param_bytes += m.shard_param_bytes;
    total.total_param_bytes += m.total_param_bytes;
    total.max_unit_unsharded_bytes =
        std::max(total.max_unit_unsharded_bytes, m.max_unit_unsharded_bytes);
  }
  if (total.shard_param_bytes == 0) return "";
  return message("memory per rank: parameters ", human_bytes(total.shard_param_bytes),
                 " + gradients ", human_bytes(total.shard_param_bytes), " + AdamW states ",
                 human_bytes(2 * total.shard_param_bytes), " (fp32 shards; ",
                 stages ? "this rank's stages hold " : "the model's parameters are ",
                 human_bytes(total.total_param_bytes), ", 1/",
                 std::to_string(static_cast<double>(total.total_param_bytes) /
                                static_cast<double>(total.shard_param_bytes))
                     .substr(0, 4),
                 "); largest gathered unit ", human_bytes(total.max_unit_unsharded_bytes));
}

dist::Group* DataParallel::norm_group() const {
  return impl_->options.norm_over_shard_group ? impl_->options.shard_group.get() : nullptr;
}

void DataParallel::gather_held(std::map<std::string, at::Tensor>& held) {
  for (auto& [name, t] : gather_full_parameters()) held[name] = std::move(t);
}

std::string DataParallel::describe() const {
  const Impl& d = *impl_;
  std::string s = d.options.label.empty() ? "" : d.options.label + ": ";
  if (d.N > 1 && d.R > 1) {
    s += "HSDP: sharded over " + std::to_string(d.N) + " ranks, replicated " + std::to_string(d.R) +
         "x";
  } else if (d.N > 1) {
    s += "FSDP: sharded over " + std::to_string(d.N) + " ranks";
  } else if (d.R > 1) {
    s += "DDP: replicated over " + std::to_string(d.R) + " ranks";
  } else {
    s += "one copy (no other rank holds these parameters)";
  }
  int64_t used_units = 0;
  for (const auto& u : d.units) used_units += u.params.empty() ? 0 : 1;
  s += " (" + std::to_string(used_units) + " units";
  if (d.N > 1) s += ", reshard_after_forward " + d.options.reshard_after_forward;
  s += std::string(", param ") + dtype_short(d.options.param_dtype) + ", reduce " +
       dtype_short(d.options.reduce_dtype);
  if (d.divide_factor != static_cast<double>(d.N * d.R)) {
    s += ", gradients divided by " + std::to_string(static_cast<int64_t>(d.divide_factor));
  }
  int64_t float8_weights = 0;
  for (const auto& u : d.units) float8_weights += static_cast<int64_t>(u.f8_params.size());
  if (float8_weights > 0) {
    s += ", float8 all-gather of " + std::to_string(float8_weights) + " weights" +
         (d.options.float8_precompute_scales ? " with precomputed scales" : "");
  }
  s += ")";
  return s;
}

}  // namespace titan
