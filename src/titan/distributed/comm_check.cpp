// Checks made before a collective is issued: local ones (tensor, dtype, shape, splits, peers)
// and, with check_agreement, the cross-rank descriptor exchange. A Gloo collective that fails
// once leaves its group unusable, so every mistake that can be seen here must be.
#include "titan/common/check.h"
#include "titan/common/format.h"
#include "titan/distributed/comm_internal.h"

#include <ATen/ATen.h>

#include <sstream>

namespace titan::dist {

const char* to_string(OpKind kind) {
  switch (kind) {
    case OpKind::kAllReduce: return "all_reduce";
    case OpKind::kAllGather: return "all_gather_into_tensor";
    case OpKind::kReduceScatter: return "reduce_scatter_tensor";
    case OpKind::kAllToAll: return "all_to_all_single";
    case OpKind::kBroadcast: return "broadcast";
    case OpKind::kBarrier: return "barrier";
  }
  return "?";
}

namespace {

std::string shape_text(const at::Tensor& t) {
  std::ostringstream os;
  os << t.sizes();
  return os.str();
}

bool is_floating(at::ScalarType t) {
  return t == at::kFloat || t == at::kDouble || t == at::kHalf || t == at::kBFloat16;
}

}  // namespace

void check_tensor(const Group::State& s, const char* op, const char* arg, const at::Tensor& t) {
  TITAN_CHECK(t.defined(), op, " on ", s.describe(), ": ", arg, " is an undefined tensor");
  TITAN_CHECK(t.layout() == at::kStrided, op, " on ", s.describe(), ": ", arg,
              " must be a dense (strided) tensor, got layout ", t.layout());
  TITAN_CHECK(t.is_contiguous(), op, " on ", s.describe(), ": ", arg, " of shape ", shape_text(t),
              " is not contiguous. HINT: pass t.contiguous() and copy the result "
              "back, or allocate the buffer contiguous.");
  if (s.options.backend == Backend::kGloo) {
    if (s.options.stage_cuda_tensors && t.device().is_cuda()) return;  // staged (comm_ops.cpp)
    TITAN_CHECK(t.device().is_cpu(), op, " on ", s.describe(), ": ", arg, " is on ", t.device(),
                " but the gloo backend needs CPU tensors. HINT: use the nccl backend for CUDA "
                "tensors, or move the tensor to the CPU.");
  } else {
    TITAN_CHECK(t.device().is_cuda(), op, " on ", s.describe(), ": ", arg, " is on ", t.device(),
                " but the nccl backend needs CUDA tensors.");
  }
}

void check_dtype(const Group::State& s, const char* op, const at::Tensor& t, bool reduction,
                 ReduceOp reduce_op) {
  at::ScalarType dt = t.scalar_type();
  bool movable = dt == at::kFloat || dt == at::kDouble || dt == at::kHalf || dt == at::kBFloat16 ||
                 dt == at::kChar || dt == at::kByte || dt == at::kShort || dt == at::kInt ||
                 dt == at::kLong || dt == at::kBool;
  TITAN_CHECK(movable, op, " on ", s.describe(), ": dtype ", dt,
              " is not supported. HINT: use a floating, integer or bool tensor.");
  if (!reduction) return;
  TITAN_CHECK(dt != at::kBool && dt != at::kShort, op, " on ", s.describe(), ": cannot reduce ", dt,
              " tensors. HINT: reduce in int32/int64 or a floating dtype.");
  TITAN_CHECK(reduce_op != ReduceOp::kAvg || is_floating(dt), op, " on ", s.describe(),
              ": AVG needs a floating dtype, got ", dt,
              ". HINT: reduce with SUM and divide by the group size yourself.");
}

void check_same_dtype(const Group::State& s, const char* op, const at::Tensor& output,
                      const at::Tensor& input) {
  TITAN_CHECK(output.scalar_type() == input.scalar_type(), op, " on ", s.describe(),
              ": output dtype ", output.scalar_type(), " differs from input dtype ",
              input.scalar_type(),
              ". HINT: allocate the output with the input's dtype and cast afterwards.");
}

void check_gathered_shape(const Group::State& s, const char* op, const char* big_name,
                          const at::Tensor& big, const char* small_name, const at::Tensor& small) {
  const int64_t n = s.size;
  bool ok = big.numel() == n * small.numel();
  if (ok && big.dim() == small.dim()) {
    ok = big.dim() >= 1 && big.size(0) == n * small.size(0) &&
         big.sizes().slice(1) == small.sizes().slice(1);
  } else if (ok && big.dim() == small.dim() + 1) {
    ok = big.size(0) == n && big.sizes().slice(1) == small.sizes();
  } else {
    ok = false;
  }
  TITAN_CHECK(ok, op, " on ", s.describe(), ": ", big_name, " ", shape_text(big),
              " must be the group size (", n, ") times ", small_name, " ", shape_text(small),
              " along dim 0, i.e. (", n, " * n0, ...) or (", n, ", n0, ...); numel ", big.numel(),
              " vs ", n, " * ", small.numel(), " = ", n * small.numel(), ".");
}

std::vector<int64_t> resolve_splits(const Group::State& s, const char* arg,
                                    const std::vector<int64_t>& splits, const at::Tensor& t) {
  const char* op = "all_to_all_single";
  TITAN_CHECK(t.dim() >= 1, op, " on ", s.describe(), ": the tensors need at least one dim, ", arg,
              " has shape ", shape_text(t));
  const int64_t rows = t.size(0);
  if (splits.empty()) {
    TITAN_CHECK(rows % s.size == 0, op, " on ", s.describe(), ": with no ", arg, "_splits, dim 0 ",
                "of ", arg, " ", shape_text(t), " must divide by the group size ", s.size,
                ". HINT: pass explicit split sizes for uneven splits.");
    return std::vector<int64_t>(s.size, rows / s.size);
  }
  TITAN_CHECK(static_cast<int64_t>(splits.size()) == s.size, op, " on ", s.describe(), ": ", arg,
              "_splits has ", splits.size(), " entries [", join(splits), "] but the group has ",
              s.size, " ranks");
  int64_t sum = 0;
  for (int64_t v : splits) {
    TITAN_CHECK(v >= 0, op, " on ", s.describe(), ": negative split in ", arg, "_splits [",
                join(splits), "]");
    sum += v;
  }
  TITAN_CHECK(sum == rows, op, " on ", s.describe(), ": ", arg, "_splits [", join(splits),
              "] sum to ", sum, " but ", arg, " has ", rows, " rows (dim 0 of ", shape_text(t),
              ")");
  return splits;
}

void check_peer(const Group::State& s, const char* op, const char* arg, int peer, bool allow_self) {
  TITAN_CHECK(peer >= 0 && peer < s.size, op, " on ", s.describe(), ": ", arg, " ", peer,
              " is not a rank of the group [0, ", s.size, ")");
  TITAN_CHECK(allow_self || peer != s.rank, op, " on ", s.describe(), ": ", arg, " ", peer,
              " is this rank itself");
}

// ---- cross-rank agreement ----

namespace {

// One rank's descriptor of its next collective, as a row of int64 (same length on every rank,
// so the exchange itself is always well formed): seq, kind, dtype, numel, aux, then all-to-all
// input and output splits (size entries each, zero otherwise).
constexpr int64_t kHeader = 5;

std::string describe_row(const int64_t* row, int64_t size) {
  std::ostringstream os;
  auto kind = static_cast<OpKind>(row[1]);
  os << to_string(kind) << " #" << row[0] << " ("
     << c10::toString(static_cast<at::ScalarType>(row[2]));
  if (kind == OpKind::kAllToAll) {
    std::vector<int64_t> in(row + kHeader, row + kHeader + size);
    std::vector<int64_t> out(row + kHeader + size, row + kHeader + 2 * size);
    os << ", " << row[3] << " elements per row, input_splits [" << join(in) << "], output_splits ["
       << join(out) << "]";
  } else if (kind != OpKind::kBarrier) {
    os << ", " << row[3] << " elements";
    if (kind == OpKind::kBroadcast) os << ", root " << row[4];
    if (kind == OpKind::kAllReduce || kind == OpKind::kReduceScatter) {
      os << ", " << to_string(static_cast<ReduceOp>(row[4]));
    }
  }
  os << ")";
  return os.str();
}

}  // namespace

namespace {

int64_t record(Group::State& s, int64_t seq, const char* op, int peer, const at::Tensor* t,
               at::ScalarType dtype, int64_t numel, at::IntArrayRef shape) {
  FlightRecorder* fr = s.options.recorder.get();
  if (fr == nullptr) return -1;
  FlightRecorder::Op r;
  r.group = &s.options.name;
  r.group_size = s.size;
  r.group_rank = s.rank;
  r.group_ranks = &s.ranks;
  r.seq = seq;
  r.op = op;
  r.peer = peer;
  r.dtype = c10::toString(t != nullptr ? t->scalar_type() : dtype);
  r.numel = t != nullptr ? t->numel() : numel;
  if (t != nullptr) shape = t->sizes();
  r.shape = shape.data();
  r.dims = shape.size();
  return fr->record(r);
}

}  // namespace

void record_p2p(Group::State& s, const char* op, int peer, const at::Tensor& tensor) {
  s.fr_pending = record(s, -1, op, peer, &tensor, tensor.scalar_type(), 0, {});
}

std::string begin_collective(Group::State& s, const OpDesc& d) {
  const int64_t seq = s.collective_seq++;
  std::string label = std::string(to_string(d.kind)) + " #" + std::to_string(seq);
  s.check_healthy(label);
  const int64_t fr_id = record(s, seq, to_string(d.kind), -1, nullptr, d.dtype, d.numel, d.shape);
  if (!s.options.check_agreement || s.size == 1) {
    s.fr_pending = fr_id;
    return label;
  }
  // The check's own all-gather is not recorded; a failure of it fails this op (Work::wait).
  s.fr_checking = fr_id;
  struct Reset {
    Group::State& s;
    ~Reset() { s.fr_checking = -1; }
  } reset{s};

  const int64_t n = s.size;
  const int64_t width = kHeader + 2 * n;
  at::Tensor mine = at::zeros({width}, at::kLong);
  int64_t* p = mine.data_ptr<int64_t>();
  p[0] = seq;
  p[1] = static_cast<int64_t>(d.kind);
  p[2] = static_cast<int64_t>(d.dtype);
  p[3] = d.numel;
  p[4] = d.aux;
  if (d.input_splits != nullptr) {
    for (int64_t j = 0; j < n; ++j) p[kHeader + j] = (*d.input_splits)[j];
    for (int64_t j = 0; j < n; ++j) p[kHeader + n + j] = (*d.output_splits)[j];
  }

  auto device = s.options.backend == Backend::kNccl ? at::Device(at::kCUDA) : at::Device(at::kCPU);
  at::Tensor send = mine.to(device);
  at::Tensor all = at::empty({n, width}, send.options());
  std::vector<at::Tensor> outs;
  for (int64_t r = 0; r < n; ++r) outs.push_back(all[r]);
  std::vector<std::vector<at::Tensor>> out_lists{outs};
  std::vector<at::Tensor> ins{send};
  std::string check_label = label + " (agreement check)";
  make_work(s.shared_from_this(), check_label, s.pg->allgather(out_lists, ins)).wait();
  at::Tensor rows = all.cpu();
  const int64_t* r0 = rows.data_ptr<int64_t>();

  std::string problem;
  for (int64_t r = 0; r < n && problem.empty(); ++r) {
    const int64_t* row = r0 + r * width;
    bool same = row[0] == r0[0] && row[1] == r0[1] && row[2] == r0[2];
    if (same && d.kind != OpKind::kAllToAll) same = row[3] == r0[3] && row[4] == r0[4];
    if (same && d.kind == OpKind::kAllToAll) same = row[3] == r0[3];
    if (!same) {
      problem = "rank 0 calls " + describe_row(r0, n) + " but rank " + std::to_string(r) +
                " calls " + describe_row(row, n);
    }
  }
  if (problem.empty() && d.kind == OpKind::kAllToAll) {
    // Rank i sends input_splits_i[j] rows to j, which expects output_splits_j[i] from i.
    for (int64_t i = 0; i < n && problem.empty(); ++i) {
      for (int64_t j = 0; j < n && problem.empty(); ++j) {
        int64_t sent = r0[i * width + kHeader + j];
        int64_t expected = r0[j * width + kHeader + n + i];
        if (sent != expected) {
          problem = "rank " + std::to_string(i) + " sends " + std::to_string(sent) +
                    " rows to rank " + std::to_string(j) + ", which expects " +
                    std::to_string(expected) + " (input_splits[" + std::to_string(j) +
                    "] of rank " + std::to_string(i) + " must equal output_splits[" +
                    std::to_string(i) + "] of rank " + std::to_string(j) + ")";
        }
      }
    }
  }
  if (!problem.empty() && s.options.recorder) s.options.recorder->finish(fr_id, OpState::kFailed);
  TITAN_CHECK(problem.empty(), "collective mismatch on process group ", s.describe(), ": ", problem,
              ". Nothing was issued; the group is still usable. HINT: every rank must "
              "issue the same collectives in the same order, with matching dtypes and sizes.");
  s.fr_pending = fr_id;
  return label;
}

}  // namespace titan::dist
