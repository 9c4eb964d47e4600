// FSDP's engine, inside DataParallel (see data_parallel.h for what it does and
// data_parallel.cpp for how the pieces meet): a unit's parameters, its flat shard, the
// unsharded storage the model computes with, and the gathers and reductions in flight. Internal
// to data_parallel.cpp; one header so the engine and the class read apart.
#pragma once

#include "titan/common/check.h"
#include "titan/common/logging.h"
#include "titan/models/common/linear.h"
#include "titan/parallel/data_parallel.h"
#include "titan/parallel/device_streams.h"

#include <ATen/core/grad_mode.h>
#include <c10/core/StorageImpl.h>
#include <torch/csrc/autograd/custom_function.h>

#include <chrono>
#include <cmath>
#include <deque>
#include <map>
#include <set>

namespace titan {
namespace dp_internal {

inline const char* dtype_short(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "fp32";
    case at::kBFloat16: return "bf16";
    case at::kHalf: return "fp16";
    case at::kDouble: return "fp64";
    default: return "?";
  }
}

inline int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

inline void free_storage(const at::Tensor& t) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  s->set_data_ptr_noswap(at::DataPtr(nullptr, s->device()));
}

inline void allocate_storage(const at::Tensor& t) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  s->set_data_ptr_noswap(s->allocator()->allocate(s->nbytes()));
}

}  // namespace dp_internal

struct DataParallel::Impl {
  using variable_list = torch::autograd::variable_list;
  struct Param {
    std::string name;
    at::Tensor* slot = nullptr;
    std::vector<int64_t> shape;         // as sharded (a 0-d parameter as {1})
    std::vector<int64_t> global_shape;  // as the model declares it
    int64_t rows = 0, rest = 1;         // shape[0], product of the other dims
    int64_t chunk = 0;                  // rows per rank, ceil(rows / N)
    int64_t local_rows = 0;             // rows this rank holds
    int64_t offset = 0;                 // element offset of its chunk in the unit's shard
    int64_t unsharded_offset = 0;       // element offset of the gathered parameter in `unsharded`
    int64_t gather_offset = 0;          // of its chunk in the param-dtype gather (not float8)
    Linear* float8_layer = nullptr;     // gathered in float8 for this layer (float8 all-gather)
    int64_t offset8 = 0;                // byte offset of its float8 chunk in the unit's gather
    int64_t unsharded8_offset = 0;      // of the gathered float8 parameter in `unsharded8`
    int64_t scale_index = 0;            // in the unit's scales8
    bool frozen = false;                // no gradient (requires_grad false: LoRA's base weights)
  };
  enum class State { kSharded, kGathering, kGathered };
  struct Unit {
    std::string name;
    std::vector<int64_t> params;  // indices into params
    bool reused = false;
    bool reshard_after_forward = true;
    int64_t shard_numel = 0;
    at::Tensor shard;      // float32 (shard_numel)
    at::Tensor unsharded;  // param dtype (N * shard_numel)
    bool allocated = true;
    at::Tensor grad;  // float32 (shard_numel), undefined until the first reduction
    State state = State::kSharded;
    at::Tensor gather_in, gather_out;
    dist::Work gather_work;
    std::shared_ptr<c10::Event> gathered;  // CUDA: the gather stream's work for this unit
    int64_t uses = 0;                      // runs in the current forward
    std::vector<at::Tensor> installed;     // what the slots hold, from this unit's last install
    // Float8 all-gather (see the top of this file): elements per rank gathered in the param
    // dtype, bytes per rank gathered in float8, and the float8 parameters.
    int64_t hp_numel = 0, f8_numel = 0;
    std::vector<int64_t> f8_params;
    at::Tensor unsharded8, scales8;
    bool scales_ready = false;  // scales8 holds this forward's scales
    at::Tensor gather8_in, gather8_out;
    dist::Work gather8_work;
  };
  struct Pending {
    int64_t unit;
    dist::Work work;
    at::Tensor buffer;                    // reduce-scatter input (kept alive until done)
    at::Tensor out;                       // this rank's reduced shard
    std::shared_ptr<c10::Event> reduced;  // CUDA: all of it done on the reduce stream
  };

  DataParallelOptions options;
  int64_t N = 1, rank = 0, R = 1;
  double divide_factor = 1.0;
  std::vector<Param> params;
  std::vector<Unit> units;
  int64_t forward_pos = 0;  // units run so far in the current forward
  std::deque<Pending> pending;
  at::Tensor anchor;             // a leaf that requires grad: gives GatherParams a backward
  at::Device device = at::kCPU;  // the model's
  // Time compute waited for collectives; the side streams of CUDA (inactive on the CPU).
  std::unique_ptr<WaitClock> clock;
  std::unique_ptr<SideStream> gather_stream, reduce_stream;
  std::shared_ptr<WeightGradDeferral> deferral;  // see defer_weight_grads

  at::TensorOptions on_device(at::ScalarType dtype) const {
    return at::TensorOptions().dtype(dtype).device(device);
  }

  void timed_wait(dist::Work& work) {
    clock->time([&] { work.wait(); });
  }

  bool sharded() const { return N > 1; }
  // Unsharded parameters alias the float32 shard itself (one rank, full precision).
  bool aliased() const { return N == 1 && options.param_dtype == at::kFloat; }

  // Tensors of the unit's unsharded parameters (sharing `unsharded`'s storage, own TensorImpl).
  std::vector<at::Tensor> param_tensors(const Unit& u) {
    std::vector<at::Tensor> out;
    for (int64_t pi : u.params) {
      const Param& p = params[pi];
      out.push_back(alias(u.unsharded, p.unsharded_offset, p.global_shape));
    }
    return out;
  }

  // Hands each float8-gathered weight of the unit to its layer: the data aliases `unsharded8`,
  // the scale `scales8` (own TensorImpls, so re-gathering in place revives what autograd saved).
  void install_float8(const Unit& u) {
    for (int64_t pi : u.f8_params) {
      const Param& p = params[pi];
      p.float8_layer->float8_weight = Float8Tensor{
          alias(u.unsharded8, p.unsharded8_offset, p.global_shape).view(at::kFloat8_e4m3fn),
          alias(u.scales8, p.scale_index, {})};
    }
  }

  // A contiguous tensor of `shape` over `base`'s storage from element `offset` of `base`.
  static at::Tensor alias(const at::Tensor& base, int64_t offset,
                          const std::vector<int64_t>& shape) {
    at::Tensor t = at::empty({0}, base.options());
    std::vector<int64_t> strides(shape.size(), 1);
    for (int64_t i = static_cast<int64_t>(shape.size()) - 2; i >= 0; --i) {
      strides[i] = strides[i + 1] * shape[i + 1];
    }
    t.set_(base.storage(), base.storage_offset() + offset, shape, strides);
    return t;
  }

  // The tensorwise scales of the float8-gathered weights of `which` units, from max |weight|
  // over the shard group and, for weights split by tensor parallelism, over the TP group: one
  // all-reduce per group for all of them (precomputed: every unit at once).
  void compute_scales(const std::vector<int64_t>& which) {
    at::NoGradGuard no_grad;
    std::vector<at::Tensor> amax;
    std::vector<int64_t> tp_split;  // positions in `amax` of TP-split weights
    const Float8TensorParallel* tp = nullptr;
    for (int64_t ui : which) {
      const Unit& u = units[ui];
      for (int64_t pi : u.f8_params) {
        const Param& p = params[pi];
        const at::Tensor local = u.shard.narrow(0, p.offset, p.local_rows * p.rest);
        amax.push_back(local.numel() > 0 ? local.abs().max() : at::zeros({}, local.options()));
        const Float8TensorParallel* layer_tp = p.float8_layer->float8->tp.get();
        if (layer_tp != nullptr && layer_tp->weight_dim) {
          tp = layer_tp;
          tp_split.push_back(static_cast<int64_t>(amax.size()) - 1);
        }
      }
    }
    if (amax.empty()) return;
    at::Tensor all = at::stack(amax);
    dist::Work work = options.shard_group->all_reduce(all, dist::ReduceOp::kMax);
    if (gather_stream->active()) {
      work.wait();  // NCCL: a stream wait
    } else {
      timed_wait(work);
    }
    if (!tp_split.empty()) {
      const at::Tensor index = at::tensor(tp_split, at::kLong).to(all.device());
      at::Tensor split = all.index_select(0, index).contiguous();
      tp->all_reduce_max(split);  // the same TP group for every layer of the model
      all.index_copy_(0, index, split);
    }
    const at::Tensor scales = float8_scale(all, at::kFloat8_e4m3fn, /*power_of_2=*/false);
    int64_t k = 0;
    for (int64_t ui : which) {
      Unit& u = units[ui];
      const int64_t n = static_cast<int64_t>(u.f8_params.size());
      u.scales8.copy_(scales.narrow(0, k, n));
      k += n;
      u.scales_ready = true;
    }
  }

  // The param-dtype all-gather's input: the whole shard, or without float8 weights the other
  // parameters' chunks packed.
  at::Tensor hp_gather_input(const Unit& u) const {
    if (u.f8_params.empty()) {
      return options.param_dtype == at::kFloat ? u.shard : u.shard.to(options.param_dtype);
    }
    at::Tensor in = at::empty({u.hp_numel}, on_device(options.param_dtype));
    for (int64_t pi : u.params) {
      const Param& p = params[pi];
      if (p.float8_layer != nullptr) continue;
      const int64_t n = p.chunk * p.rest;
      in.narrow(0, p.gather_offset, n).copy_(u.shard.narrow(0, p.offset, n));
    }
    return in;
  }

  // The float8 all-gather's input: each float8 weight's chunk cast with its scale, as bytes
  // (padding rows are zero bytes, +0.0 in float8).
  at::Tensor float8_gather_input(const Unit& u) const {
    at::Tensor in = at::zeros({u.f8_numel}, on_device(at::kByte));
    for (int64_t pi : u.f8_params) {
      const Param& p = params[pi];
      const int64_t n = p.local_rows * p.rest;
      if (n == 0) continue;
      const at::Tensor cast = saturated_cast(u.shard.narrow(0, p.offset, n),
                                             u.scales8[p.scale_index], at::kFloat8_e4m3fn);
      in.narrow(0, p.offset8, n).copy_(cast.view(at::kByte));
    }
    return in;
  }

  void gather_start(int64_t ui) {
    Unit& u = units[ui];
    if (u.state != State::kSharded || u.params.empty()) return;
    if (!u.allocated) {
      dp_internal::allocate_storage(u.unsharded);
      if (u.f8_numel > 0) dp_internal::allocate_storage(u.unsharded8);
      u.allocated = true;
    }
    if (aliased()) {
      u.state = State::kGathered;
      return;
    }
    at::NoGradGuard no_grad;
    if (N == 1) {
      u.unsharded.copy_(u.shard);  // cast to the param dtype; nothing to communicate
      u.state = State::kGathered;
      return;
    }
    const auto issue = [&] {
      if (u.hp_numel > 0) {
        u.gather_in = hp_gather_input(u);
        u.gather_out = at::empty({N * u.hp_numel}, u.unsharded.options());
        u.gather_work = options.shard_group->all_gather_into_tensor(u.gather_out, u.gather_in);
      }
      if (u.f8_numel > 0) {
        if (!u.scales_ready) compute_scales({ui});
        u.gather8_in = float8_gather_input(u);
        u.gather8_out = at::empty({N * u.f8_numel}, on_device(at::kByte));
        u.gather8_work = options.shard_group->all_gather_into_tensor(u.gather8_out, u.gather8_in);
      }
    };
    if (gather_stream->active()) {
      // The whole gather, copy-out included, queued on the gather stream; the gather stream
      // waits for the NCCL ops (NCCL's wait() is a stream wait), the host does not.
      u.gathered = gather_stream->run([&] {
        issue();
        u.gather_work.wait();
        u.gather8_work.wait();
        copy_out(u);
      });
    } else {
      issue();
    }
    u.state = State::kGathering;
  }

  // The rank-major gathered rows into `unsharded` (and `unsharded8`), parameter by parameter.
  void copy_out(Unit& u) {
    for (int64_t pi : u.params) {
      const Param& p = params[pi];
      const int64_t n = p.chunk * p.rest;
      at::Tensor into = u.unsharded.narrow(0, p.unsharded_offset, N * n);
      if (p.float8_layer == nullptr) {
        const at::Tensor by_rank = u.gather_out.view({N, u.hp_numel});
        into.view({N, n}).copy_(by_rank.narrow(1, p.gather_offset, n));
        continue;
      }
      const at::Tensor by_rank8 = u.gather8_out.view({N, u.f8_numel});
      const at::Tensor into8 = u.unsharded8.narrow(0, p.unsharded8_offset, N * n);
      into8.view({N, n}).copy_(by_rank8.narrow(1, p.offset8, n));
      into.copy_(from_float8({into8.view(at::kFloat8_e4m3fn), u.scales8[p.scale_index]},
                             into.scalar_type()));
    }
    u.gather_in = at::Tensor();
    u.gather_out = at::Tensor();
    u.gather8_in = at::Tensor();
    u.gather8_out = at::Tensor();
  }

  void gather_finish(int64_t ui) {
    Unit& u = units[ui];
    if (u.state == State::kGathered) return;
    if (u.state == State::kSharded) gather_start(ui);
    if (u.state == State::kGathered) return;
    if (u.gathered) {
      SideStream::join(u.gathered, clock.get());
      u.gathered.reset();
    } else {
      timed_wait(u.gather_work);
      timed_wait(u.gather8_work);
      at::NoGradGuard no_grad;
      copy_out(u);
    }
    u.state = State::kGathered;
  }

  void reshard(int64_t ui) {
    Unit& u = units[ui];
    if (!sharded() || u.state != State::kGathered) return;
    dp_internal::free_storage(u.unsharded);
    if (u.f8_numel > 0) dp_internal::free_storage(u.unsharded8);
    u.allocated = false;
    u.state = State::kSharded;
  }

  void pre_backward(int64_t ui) {
    gather_finish(ui);
    for (int64_t k = 1; k <= options.prefetch && ui - k >= 0; ++k) gather_start(ui - k);
  }

  // The unit's backward is complete: start reducing its gradients, or, while an I step collects
  // deferred weight gradients, once the W step has delivered them (grads[k] undefined: deferred
  // or unused).
  void post_backward(int64_t ui, variable_list grads) {
    Unit& u = units[ui];
    reshard(ui);
    u.uses = 0;
    DeferredGrads* deferred = deferral ? deferral->current() : nullptr;
    std::vector<const at::Tensor*> slots;
    std::vector<size_t> missing;
    grads.resize(u.params.size());
    for (size_t k = 0; k < grads.size(); ++k) {
      if (grads[k].defined() || params[u.params[k]].frozen) continue;
      slots.push_back(params[u.params[k]].slot);
      missing.push_back(k);
    }
    if (deferred == nullptr || slots.empty()) {
      reduce(ui, grads);
      return;
    }
    deferred->add_consumer(slots, [this, ui, grads, missing](std::vector<at::Tensor> got) mutable {
      for (size_t i = 0; i < missing.size(); ++i) grads[missing[i]] = std::move(got[i]);
      reduce(ui, grads);
    });
  }

  // Packs the unit's gradients (undefined: zero) and starts their reduction.
  void reduce(int64_t ui, const variable_list& grads) {
    Unit& u = units[ui];
    at::NoGradGuard no_grad;
    at::Tensor buffer = at::zeros({N * u.shard_numel}, on_device(options.reduce_dtype));
    const at::Tensor by_rank = buffer.view({N, u.shard_numel});
    for (size_t k = 0; k < u.params.size(); ++k) {
      if (k >= grads.size() || !grads[k].defined()) continue;
      const Param& p = params[u.params[k]];
      const int64_t n = p.chunk * p.rest;
      at::Tensor g = grads[k].reshape({-1});
      if (p.rows != N * p.chunk) {
        at::Tensor padded = at::zeros({N * n}, g.options());
        padded.narrow(0, 0, p.rows * p.rest).copy_(g);
        g = padded;
      }
      by_rank.narrow(1, p.offset, n).copy_(g.view({N, n}));
    }
    Pending job{ui, {}, buffer, {}};
    const auto issue = [&] {
      if (N > 1) {
        job.out = at::empty({u.shard_numel}, buffer.options());
        job.work = options.shard_group->reduce_scatter_tensor(job.out, buffer);
      } else {
        job.out = buffer;
        if (R > 1) job.work = options.replicate_group->all_reduce(buffer);
      }
    };
    if (reduce_stream->active()) {
      // Reduction and accumulation queued on the reduce stream; `buffer` (packed on the compute
      // stream) stays reserved until the reduce stream is done with it.
      job.reduced = reduce_stream->run([&] {
        issue();
        job.work.wait();
        accumulate(job);
      });
      reduce_stream->record_on(buffer);
      job.buffer = at::Tensor();
      job.out = at::Tensor();
      pending.push_back(std::move(job));
      return;
    }
    issue();
    pending.push_back(std::move(job));
    while (pending.size() > 1) complete_front();
  }

  void complete_front() {
    Pending job = std::move(pending.front());
    pending.pop_front();
    if (job.reduced) {
      SideStream::join(job.reduced, clock.get());
      return;
    }
    timed_wait(job.work);
    accumulate(job);
  }

  // HSDP's all-reduce of the reduced shard, the mean, and the sum over micro-batches.
  void accumulate(Pending& job) {
    if (N > 1 && R > 1) {
      dist::Work all_reduce = options.replicate_group->all_reduce(job.out);
      if (reduce_stream->active()) {
        all_reduce.wait();  // a stream wait on the reduce stream
      } else {
        timed_wait(all_reduce);
      }
    }
    at::NoGradGuard no_grad;
    at::Tensor g = job.out.to(at::kFloat);
    g.mul_(1.0 / divide_factor);
    Unit& u = units[job.unit];
    if (u.grad.defined()) {
      u.grad.add_(g);
    } else {
      u.grad = g;  // a fresh buffer of this micro-batch
    }
  }
};

}  // namespace titan
