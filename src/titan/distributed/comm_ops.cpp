// The collectives: validate, agree (optionally), issue on the backend, and hand back a Work whose
// wait() finishes the local part of an emulated op. See comm.h for what Gloo lacks and how each
// gap is filled.
#include "titan/common/check.h"
#include "titan/common/device.h"
#include "titan/common/phase.h"
#include "titan/distributed/comm_internal.h"

#include <ATen/ATen.h>

#include <cstring>
#include <string>
#include <vector>

namespace titan::dist {

namespace {

bool is_gloo(const Group::State& s) { return s.options.backend == Backend::kGloo; }

bool low_precision(const at::Tensor& t) {
  return t.scalar_type() == at::kBFloat16 || t.scalar_type() == at::kHalf;
}

// Gloo moves no int16: data movement needs no arithmetic, so move it as fp16 bits of the same
// size. Bit-exact, no copy.
at::Tensor gloo_wire(const at::Tensor& t) {
  return t.scalar_type() == at::kShort ? t.view(at::kHalf) : t;
}

c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return c10d::ReduceOp::SUM;
    case ReduceOp::kAvg: return c10d::ReduceOp::AVG;
    case ReduceOp::kMax: return c10d::ReduceOp::MAX;
    case ReduceOp::kMin: return c10d::ReduceOp::MIN;
  }
  return c10d::ReduceOp::SUM;
}

// Reduces the (size, n) chunks received by a Gloo reduce-scatter into `output` (n elements), in
// rank order with element-wise ops into existing memory (no fresh allocation). Low-precision
// chunks accumulate in an fp32 scratch buffer and round once.
void reduce_chunks(ScratchPool& pool, const at::Tensor& chunks, const at::Tensor& output,
                   ReduceOp op, int size) {
  at::Tensor out = output.view({-1});
  const int64_t n = out.numel();
  if (op == ReduceOp::kMax || op == ReduceOp::kMin) {
    out.copy_(chunks[0]);
    for (int r = 1; r < size; ++r) {
      if (op == ReduceOp::kMax) {
        at::maximum_out(out, out, chunks[r]);
      } else {
        at::minimum_out(out, out, chunks[r]);
      }
    }
    return;
  }
  if (!low_precision(output)) {
    out.copy_(chunks[0]);
    for (int r = 1; r < size; ++r) out.add_(chunks[r]);
    if (op == ReduceOp::kAvg) out.div_(size);
    return;
  }
  // Each chunk is widened into `wide` first: a mixed-dtype add_ would allocate a temporary.
  at::Tensor acc = pool.get(n, at::kFloat);
  at::Tensor wide = pool.get(n, at::kFloat);
  acc.copy_(chunks[0]);
  for (int r = 1; r < size; ++r) {
    wide.copy_(chunks[r]);
    acc.add_(wide);
  }
  if (op == ReduceOp::kAvg) acc.div_(size);
  out.copy_(acc);
}

// Host copies of CUDA tensors for a Gloo group that stages them (GroupOptions::stage_cuda_tensors,
// comm.h): the backend gets a host tensor for each argument, and the Work's finish (at wait())
// copies the results back. Without staging (or for host tensors) every tensor passes as it is.
class HostStaging {
 public:
  explicit HostStaging(const Group::State& s) : on_(is_gloo(s) && s.options.stage_cuda_tensors) {}

  // What the backend reads: a page-locked copy of a CUDA `t`, made once the current stream has
  // produced t (the copy blocks the host until then), else t itself.
  at::Tensor read(const at::Tensor& t) {
    if (!staged(t)) return t;
    at::Tensor host = empty_staging(t.sizes(), t.scalar_type(), t.device());
    host.copy_(t);
    keep_.push_back(host);
    return host;
  }
  // What the backend writes: a page-locked buffer for a CUDA `t`, copied into t at wait(); with
  // `contents` it first holds t's values (in-place ops).
  at::Tensor write(const at::Tensor& t, bool contents) {
    if (!staged(t)) return t;
    at::Tensor host = contents ? read(t) : empty_staging(t.sizes(), t.scalar_type(), t.device());
    back_.emplace_back(t, host);
    return host;
  }
  // `finish` (the local part of a built op, on the host tensors), then the copies back, queued
  // on the stream current at wait() without blocking (the pinned allocator keeps each host block
  // until its copy has run). The host copies stay alive until then.
  std::function<void()> finish(std::function<void()> finish = {}) const {
    if (keep_.empty() && back_.empty()) return finish;
    return [finish = std::move(finish), keep = keep_, back = back_] {
      if (finish) finish();
      for (const auto& [device, host] : back) device.copy_(host, /*non_blocking=*/true);
    };
  }

 private:
  bool staged(const at::Tensor& t) const { return on_ && t.is_cuda(); }

  bool on_;
  std::vector<at::Tensor> keep_;                         // inputs the backend reads
  std::vector<std::pair<at::Tensor, at::Tensor>> back_;  // (CUDA tensor, host copy)
};

}  // namespace

at::Tensor ScratchPool::get(int64_t numel, at::ScalarType dtype) {
  const int64_t bytes = std::max<int64_t>(1, numel * static_cast<int64_t>(at::elementSize(dtype)));
  std::lock_guard<std::mutex> lock(mutex_);
  // The smallest idle buffer that fits; else grow an idle one, else add one, else a one-off.
  int best = -1;
  int idle = -1;
  for (size_t i = 0; i < buffers_.size(); ++i) {
    if (buffers_[i].storage().use_count() != 1) continue;  // still referenced: busy
    idle = static_cast<int>(i);
    if (buffers_[i].numel() >= bytes &&
        (best < 0 || buffers_[i].numel() < buffers_[best].numel())) {
      best = static_cast<int>(i);
    }
  }
  at::Tensor buffer;
  if (best >= 0) {
    buffer = buffers_[best];
  } else {
    buffer = at::empty({bytes}, at::kByte);
    if (idle >= 0) {
      buffers_[idle] = buffer;
    } else if (buffers_.size() < kMaxBuffers) {
      buffers_.push_back(buffer);
    }
  }
  return buffer.narrow(0, 0, numel * static_cast<int64_t>(at::elementSize(dtype))).view(dtype);
}

namespace {

// An all-to-all of equal chunks: Gloo's building block for the collectives it lacks.
c10::intrusive_ptr<c10d::Work> equal_all_to_all(Group::State& s, at::Tensor out, at::Tensor in) {
  std::vector<int64_t> equal_splits;  // empty: equal splits
  c10d::AllToAllOptions opts;
  opts.timeout = s.timeout();
  return s.pg->alltoall_base(out, in, equal_splits, equal_splits, opts);
}

// `size` copies of the flat `t` in one scratch buffer: an all-to-all of it sends t to every rank.
at::Tensor copies_for_every_rank(Group::State& s, const at::Tensor& t) {
  const int64_t n = t.numel();
  at::Tensor send = s.scratch.get(s.size * n, t.scalar_type());
  send.view({s.size, n}).copy_(t.unsqueeze(0).expand({s.size, n}));
  return send;
}

}  // namespace

Work Group::all_reduce(const at::Tensor& tensor, ReduceOp op) {
  State& s = *state_;
  const PhaseScope phase(Phase::kCollective, "all_reduce", s.options.name);
  const char* name = "all_reduce";
  check_tensor(s, name, "tensor", tensor);
  check_dtype(s, name, tensor, /*reduction=*/true, op);
  OpDesc desc{OpKind::kAllReduce, tensor.scalar_type(), tensor.numel(), static_cast<int64_t>(op)};
  desc.shape = tensor.sizes();
  std::string label = begin_collective(s, desc);
  if (tensor.numel() == 0) return make_work(state_, label, {});

  HostStaging stage(s);
  const at::Tensor t = stage.write(tensor, /*contents=*/true);
  c10d::AllreduceOptions opts;
  opts.timeout = s.timeout();
  const GlooOps& native = s.options.gloo_ops;
  if (is_gloo(s) && s.size > 1 &&
      t.numel() * static_cast<int64_t>(t.element_size()) <= native.small_all_reduce_bytes) {
    // Built on one all-to-all (comm.h): every rank receives every rank's tensor and reduces
    // them in rank order, so all get the same bits.
    const at::Tensor flat = gloo_wire(t).view({-1});
    const int64_t n = flat.numel();
    at::Tensor send = copies_for_every_rank(s, flat);
    at::Tensor recv = s.scratch.get(s.size * n, flat.scalar_type());
    auto work = equal_all_to_all(s, recv, send);
    const int size = s.size;
    const at::ScalarType dtype = t.scalar_type();
    std::shared_ptr<State> state = state_;
    return make_work(state_, label, work, stage.finish([state, send, recv, t, op, size, n, dtype] {
      reduce_chunks(state->scratch, recv.view(dtype).view({size, n}), t, op, size);
    }));
  }
  const bool built_avg = is_gloo(s) && op == ReduceOp::kAvg && !native.all_reduce_avg;
  const bool fp32_copy = is_gloo(s) && low_precision(t) && !native.all_reduce_low_precision;
  if (!built_avg && !fp32_copy) {
    opts.reduceOp = to_c10d(op);
    std::vector<at::Tensor> v{t};
    return make_work(state_, label, s.pg->allreduce(v, opts), stage.finish());
  }
  // Built: AVG = SUM, then divide; 16-bit = reduce an fp32 copy, round once at the end.
  opts.reduceOp = to_c10d(built_avg ? ReduceOp::kSum : op);
  at::Tensor buffer = t;
  if (fp32_copy) {
    buffer = s.scratch.get(t.numel(), at::kFloat).view(t.sizes());
    buffer.copy_(t);
  }
  std::vector<at::Tensor> v{buffer};
  auto work = s.pg->allreduce(v, opts);
  const int size = s.size;
  return make_work(state_, label, work, stage.finish([t, buffer, built_avg, size] {
    if (built_avg) buffer.div_(size);
    if (!buffer.is_same(t)) t.copy_(buffer);
  }));
}

Work Group::all_gather_into_tensor(const at::Tensor& output, const at::Tensor& input) {
  State& s = *state_;
  const PhaseScope phase(Phase::kCollective, "all_gather_into_tensor", s.options.name);
  const char* name = "all_gather_into_tensor";
  check_tensor(s, name, "output", output);
  check_tensor(s, name, "input", input);
  check_same_dtype(s, name, output, input);
  check_dtype(s, name, input, /*reduction=*/false, ReduceOp::kSum);
  check_gathered_shape(s, name, "output", output, "input", input);
  OpDesc desc{OpKind::kAllGather, input.scalar_type(), input.numel(), 0};
  desc.shape = input.sizes();
  std::string label = begin_collective(s, desc);
  if (input.numel() == 0) return make_work(state_, label, {});

  c10d::AllgatherOptions opts;
  opts.timeout = s.timeout();
  HostStaging stage(s);
  at::Tensor out = stage.write(output, /*contents=*/false);
  at::Tensor in = stage.read(input);
  if (!is_gloo(s) || s.options.gloo_ops.all_gather) {
    // Flat: backends split the output along dim 0 into `size` pieces shaped like the input, so a
    // stacked (size, n0, ...) output would not match.
    out = (is_gloo(s) ? gloo_wire(out) : out).view({-1});
    in = (is_gloo(s) ? gloo_wire(in) : in).view({-1});
    return make_work(state_, label, s.pg->_allgather_base(out, in, opts), stage.finish());
  }
  // Built: send this rank's input to every rank with an all-to-all straight into the output (the
  // same bytes on the wire as a ring all-gather; locally, size copies of the input into a
  // scratch buffer). Gloo's own gathers into a list of fresh tensors and copies.
  at::Tensor flat_in = gloo_wire(in).view({-1});
  at::Tensor flat_out = gloo_wire(out).view({-1});
  return make_work(state_, label, equal_all_to_all(s, flat_out, copies_for_every_rank(s, flat_in)),
                   stage.finish());
}

Work Group::reduce_scatter_tensor(const at::Tensor& output, const at::Tensor& input, ReduceOp op) {
  State& s = *state_;
  const PhaseScope phase(Phase::kCollective, "reduce_scatter_tensor", s.options.name);
  const char* name = "reduce_scatter_tensor";
  check_tensor(s, name, "output", output);
  check_tensor(s, name, "input", input);
  check_same_dtype(s, name, output, input);
  check_dtype(s, name, input, /*reduction=*/true, op);
  check_gathered_shape(s, name, "input", input, "output", output);
  OpDesc desc{OpKind::kReduceScatter, output.scalar_type(), output.numel(),
              static_cast<int64_t>(op)};
  desc.shape = output.sizes();
  std::string label = begin_collective(s, desc);
  if (output.numel() == 0) return make_work(state_, label, {});

  HostStaging stage(s);
  const at::Tensor out = stage.write(output, /*contents=*/false);
  const at::Tensor in = stage.read(input);
  if (!is_gloo(s) || s.options.gloo_ops.reduce_scatter) {
    c10d::ReduceScatterOptions opts;
    opts.timeout = s.timeout();
    opts.reduceOp = to_c10d(op);
    at::Tensor flat_out = out.view({-1});  // flat, as for all_gather_into_tensor
    at::Tensor flat_in = in.view({-1});
    return make_work(state_, label, s.pg->_reduce_scatter_base(flat_out, flat_in, opts),
                     stage.finish());
  }
  // Built: chunk j of every rank goes to rank j (an all-to-all, the same bytes as a ring
  // reduce-scatter; Gloo's own all-reduces the whole input), and each rank reduces the size
  // chunks it received. The bits travel in the input dtype; the sum is in fp32 for bf16/fp16.
  at::Tensor send = gloo_wire(in).view({-1});
  at::Tensor recv = s.scratch.get(send.numel(), send.scalar_type());
  auto work = equal_all_to_all(s, recv, send);
  const int size = s.size;
  const int64_t n = out.numel();
  const at::ScalarType dtype = in.scalar_type();
  std::shared_ptr<State> state = state_;
  return make_work(state_, label, work, stage.finish([state, recv, out, op, size, n, dtype] {
    reduce_chunks(state->scratch, recv.view(dtype).view({size, n}), out, op, size);
  }));
}

Work Group::all_to_all_single(const at::Tensor& output, const at::Tensor& input,
                              const std::vector<int64_t>& output_splits,
                              const std::vector<int64_t>& input_splits) {
  State& s = *state_;
  const PhaseScope phase(Phase::kCollective, "all_to_all_single", s.options.name);
  const char* name = "all_to_all_single";
  check_tensor(s, name, "output", output);
  check_tensor(s, name, "input", input);
  check_same_dtype(s, name, output, input);
  check_dtype(s, name, input, /*reduction=*/false, ReduceOp::kSum);
  std::vector<int64_t> in_splits = resolve_splits(s, "input", input_splits, input);
  std::vector<int64_t> out_splits = resolve_splits(s, "output", output_splits, output);
  TITAN_CHECK(input.sizes().slice(1) == output.sizes().slice(1), name, " on ", s.describe(),
              ": input ", input.sizes(), " and output ", output.sizes(),
              " must have the same trailing dims (rows are exchanged along dim 0)");
  // Values per row from the trailing dims: a rank with no rows to send still has rows of them.
  const int64_t row = c10::multiply_integers(input.sizes().slice(1));
  OpDesc desc{OpKind::kAllToAll, input.scalar_type(), row, 0, &in_splits, &out_splits};
  desc.shape = input.sizes();
  // Never skipped, even with nothing to move here: the peers' exchange may still need this rank.
  std::string label = begin_collective(s, desc);

  HostStaging stage(s);
  at::Tensor out = stage.write(output, /*contents=*/false);
  at::Tensor in = stage.read(input);
  if (is_gloo(s)) {
    out = gloo_wire(out);
    in = gloo_wire(in);
  }
  // Equal splits go to the backend as "empty" (its fast path).
  bool equal = input_splits.empty() && output_splits.empty();
  auto in_arg = std::make_shared<std::vector<int64_t>>(equal ? std::vector<int64_t>{} : in_splits);
  auto out_arg =
      std::make_shared<std::vector<int64_t>>(equal ? std::vector<int64_t>{} : out_splits);
  c10d::AllToAllOptions opts;
  opts.timeout = s.timeout();
  auto work = s.pg->alltoall_base(out, in, *out_arg, *in_arg, opts);
  return make_work(state_, label, work, stage.finish([in_arg, out_arg] {}));
}

Work Group::broadcast(const at::Tensor& tensor, int root) {
  State& s = *state_;
  const PhaseScope phase(Phase::kCollective, "broadcast", s.options.name);
  const char* name = "broadcast";
  check_tensor(s, name, "tensor", tensor);
  check_dtype(s, name, tensor, /*reduction=*/false, ReduceOp::kSum);
  check_peer(s, name, "root", root, /*allow_self=*/true);
  OpDesc desc{OpKind::kBroadcast, tensor.scalar_type(), tensor.numel(), root};
  desc.shape = tensor.sizes();
  std::string label = begin_collective(s, desc);
  if (tensor.numel() == 0) return make_work(state_, label, {});
  c10d::BroadcastOptions opts;
  opts.rootRank = root;
  opts.rootTensor = 0;
  opts.timeout = s.timeout();
  HostStaging stage(s);
  const at::Tensor t = stage.write(tensor, /*contents=*/s.rank == root);
  std::vector<at::Tensor> v{is_gloo(s) ? gloo_wire(t) : t};
  return make_work(state_, label, s.pg->broadcast(v, opts), stage.finish());
}

std::vector<int64_t> Group::broadcast_ints(const std::vector<int64_t>& values, int root) {
  const at::Tensor t = at::tensor(values, at::kLong).to(device());
  broadcast(t, root).wait();
  const at::Tensor c = t.cpu().contiguous();
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

int64_t Group::broadcast_int(int64_t value, int root) { return broadcast_ints({value}, root)[0]; }

std::string Group::broadcast_string(const std::string& text, int root) {
  const int64_t n = broadcast_int(static_cast<int64_t>(text.size()), root);
  at::Tensor bytes = at::empty({n}, at::kByte);
  if (rank() == root && n > 0) std::memcpy(bytes.data_ptr<uint8_t>(), text.data(), n);
  bytes = bytes.to(device());
  broadcast(bytes, root).wait();
  bytes = bytes.cpu();
  return std::string(reinterpret_cast<const char*>(bytes.data_ptr<uint8_t>()), n);
}

Work Group::send(const at::Tensor& tensor, int dst, int tag) {
  State& s = *state_;
  const PhaseScope phase(Phase::kCollective, "send", s.options.name);
  check_tensor(s, "send", "tensor", tensor);
  check_dtype(s, "send", tensor, /*reduction=*/false, ReduceOp::kSum);
  check_peer(s, "send", "dst", dst, /*allow_self=*/false);
  std::string label = "send to rank " + std::to_string(dst) + " (tag " + std::to_string(tag) + ")";
  s.check_healthy(label);
  record_p2p(s, "send", dst, tensor);
  if (tensor.numel() == 0) return make_work(state_, label, {});
  HostStaging stage(s);
  const at::Tensor t = stage.read(tensor);
  std::vector<at::Tensor> v{is_gloo(s) ? gloo_wire(t) : t};
  return make_work(state_, label, s.pg->send(v, dst, tag), stage.finish());
}

Work Group::recv(const at::Tensor& tensor, int src, int tag) {
  State& s = *state_;
  const PhaseScope phase(Phase::kCollective, "recv", s.options.name);
  check_tensor(s, "recv", "tensor", tensor);
  check_dtype(s, "recv", tensor, /*reduction=*/false, ReduceOp::kSum);
  check_peer(s, "recv", "src", src, /*allow_self=*/false);
  std::string label =
      "recv from rank " + std::to_string(src) + " (tag " + std::to_string(tag) + ")";
  s.check_healthy(label);
  record_p2p(s, "recv", src, tensor);
  if (tensor.numel() == 0) return make_work(state_, label, {});
  HostStaging stage(s);
  const at::Tensor t = stage.write(tensor, /*contents=*/false);
  std::vector<at::Tensor> v{is_gloo(s) ? gloo_wire(t) : t};
  return make_work(state_, label, s.pg->recv(v, src, tag), stage.finish());
}

Work Group::barrier() {
  State& s = *state_;
  const PhaseScope phase(Phase::kCollective, "barrier", s.options.name);
  std::string label = begin_collective(s, {OpKind::kBarrier, at::kFloat, 0, 0});
  c10d::BarrierOptions opts;
  opts.timeout = s.timeout();
  return make_work(state_, label, s.pg->barrier(opts));
}

}  // namespace titan::dist
