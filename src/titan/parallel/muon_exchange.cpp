#include "titan/parallel/muon_exchange.h"

#include "titan/common/check.h"
#include "titan/common/phase.h"

#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <optional>
#include <string>

namespace titan {

namespace {

constexpr int kDims = 3;
constexpr int kMetaPerMatrix = 2 * kDims;

std::vector<int64_t> as_3d(const std::vector<int64_t>& v, int64_t lead) {
  if (v.size() == 3) return v;
  std::vector<int64_t> out{lead};
  out.insert(out.end(), v.begin(), v.end());
  return out;
}

uint64_t fnv1a(const std::string& text, uint64_t h = 1469598103934665603ULL) {
  for (unsigned char ch : text) h = (h ^ ch) * 1099511628211ULL;
  return h;
}

// "layers.3.attention.wq.weight" -> "layers.3"; "output.weight" -> "output".
std::string block_of(const std::string& name) {
  const size_t first = name.find('.');
  if (first == std::string::npos) return name;
  const size_t second = name.find('.', first + 1);
  const std::string next = name.substr(first + 1, second - first - 1);
  const bool numbered = !next.empty() && std::all_of(next.begin(), next.end(),
                                                     [](char c) { return c >= '0' && c <= '9'; });
  return numbered ? name.substr(0, second) : name.substr(0, first);
}

}  // namespace

int64_t MuonExchange::Box::numel() const {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  return n;
}

namespace {

template <class Box>
std::optional<Box> intersect(const Box& a, const Box& b) {
  Box out;
  for (int d = 0; d < kDims; ++d) {
    const int64_t lo = std::max(a.offsets[d], b.offsets[d]);
    const int64_t hi = std::min(a.offsets[d] + a.sizes[d], b.offsets[d] + b.sizes[d]);
    if (hi <= lo) return std::nullopt;
    out.offsets.push_back(lo);
    out.sizes.push_back(hi - lo);
  }
  return out;
}

// The part `box` (in whole-matrix coordinates) of `t`, a 3-D tensor that sits at `at`.
template <class Box>
at::Tensor part_of(const at::Tensor& t, const Box& at, const Box& box) {
  at::Tensor out = t;
  for (int d = 0; d < kDims; ++d) out = out.narrow(d, box.offsets[d] - at.offsets[d], box.sizes[d]);
  return out;
}

at::Tensor view_3d(const at::Tensor& t) { return t.dim() == 2 ? t.unsqueeze(0) : t; }

}  // namespace

MuonExchange::MuonExchange(std::vector<MuonMatrix> matrices, std::shared_ptr<dist::Group> group)
    : matrices_(std::move(matrices)), group_(std::move(group)) {
  TITAN_CHECK(group_ != nullptr, "MuonExchange: no group");
  const int size = group_->size();
  const int64_t n = static_cast<int64_t>(matrices_.size());

  // Every rank's boxes, and a fingerprint of the names (the same list everywhere).
  uint64_t names = fnv1a(std::to_string(n));
  std::vector<int64_t> meta;
  for (const MuonMatrix& m : matrices_) {
    const size_t dims = m.box.global_shape.size();
    TITAN_CHECK(dims == 2 || dims == 3, "Muon: ", m.name, " is ", dims, "-d, not a matrix");
    TITAN_CHECK(m.local_sizes.size() == dims, "Muon: ", m.name, " is held as ",
                at::IntArrayRef(m.local_sizes), " of ", at::IntArrayRef(m.box.global_shape));
    // Every rank finds the same packed boxes (tensor parallelism splits the same layers).
    TITAN_CONFIG_CHECK(!m.box.packed(), "Muon cannot yet orthogonalize ", m.name,
                       ", a packed weight that tensor parallelism holds as several pieces per "
                       "rank. HINT: name it in optimizer.muon_adamw_fqns, or train without "
                       "tensor parallelism");
    names = fnv1a(m.name + "|", names);
    Box box{as_3d(m.box.offsets, 0), as_3d(m.local_sizes, 1)};
    mine_.push_back(box);
    meta.insert(meta.end(), box.offsets.begin(), box.offsets.end());
    meta.insert(meta.end(), box.sizes.begin(), box.sizes.end());
  }
  meta.push_back(static_cast<int64_t>(names));
  const int64_t row = static_cast<int64_t>(meta.size());
  const auto device = group_->device();
  const at::Tensor local = at::tensor(meta, at::kLong).to(device);
  const at::Tensor all = at::empty({size * row}, local.options());
  group_->all_gather_into_tensor(all, local).wait();
  const at::Tensor host = all.cpu().view({size, row});
  const auto* data = host.data_ptr<int64_t>();
  for (int r = 0; r < size; ++r) {
    TITAN_CHECK(data[r * row + row - 1] == static_cast<int64_t>(names), "Muon: rank ",
                group_->ranks()[r], " of ", group_->describe(), " has other matrices than rank ",
                group_->ranks()[group_->rank()], " (their names or count differ)");
  }
  const auto box_of = [&](int r, int64_t i) {
    const int64_t* p = data + r * row + i * kMetaPerMatrix;
    return Box{std::vector<int64_t>(p, p + kDims), std::vector<int64_t>(p + kDims, p + 2 * kDims)};
  };

  // Units, buckets (matrices in order, a new bucket where the block changes), owners.
  std::vector<int64_t> load(size, 0);  // Newton–Schulz cost owned so far, all buckets
  std::string block;
  for (int64_t i = 0; i < n; ++i) {
    const MuonMatrix& m = matrices_[i];
    const std::vector<int64_t> shape = as_3d(m.box.global_shape, 1);
    // The distinct non-empty boxes, with their holders; they must tile the matrix.
    std::vector<std::pair<Box, std::vector<int>>> distinct;
    for (int r = 0; r < size; ++r) {
      const Box b = box_of(r, i);
      if (b.numel() == 0) continue;
      auto it = std::find_if(distinct.begin(), distinct.end(), [&](const auto& d) {
        return d.first.offsets == b.offsets && d.first.sizes == b.sizes;
      });
      if (it == distinct.end()) {
        distinct.push_back({b, {r}});
      } else {
        it->second.push_back(r);
      }
    }
    int64_t covered = 0;
    for (const auto& d : distinct) covered += d.first.numel();
    const int64_t whole = shape[0] * shape[1] * shape[2];
    TITAN_CHECK(covered == whole, "Muon: the pieces of ", m.name, " ",
                at::IntArrayRef(m.box.global_shape), " on ", group_->describe(), " hold ", covered,
                " values, not the matrix's ", whole,
                " (they must tile it: each value held by one piece or by identical copies)");

    if (buckets_.empty() || block_of(m.name) != block) {
      buckets_.emplace_back();
      block = block_of(m.name);
    }
    Bucket& bucket = buckets_.back();
    bucket.matrices.push_back(static_cast<size_t>(i));
    const int64_t parts = std::min<int64_t>(shape[0], size);
    for (int64_t p = 0; p < parts; ++p) {
      const int64_t first = shape[0] * p / parts;
      const int64_t count = shape[0] * (p + 1) / parts - first;
      Unit u;
      u.matrix = static_cast<size_t>(i);
      u.box = Box{{first, 0, 0}, {count, shape[1], shape[2]}};
      for (const auto& [b, holders] : distinct) {
        const std::optional<Box> part = intersect(u.box, b);
        if (!part) continue;
        u.sources.push_back({holders.front(), *part});
        for (int r : holders) u.holders.push_back({r, *part});
      }
      bucket.units.push_back(units_.size());
      units_.push_back(std::move(u));
    }
  }
  for (Bucket& bucket : buckets_) {
    const auto cost = [&](const Unit& u) {
      const int64_t rows = u.box.sizes[1], cols = u.box.sizes[2];
      return u.box.sizes[0] * rows * cols * std::min(rows, cols);
    };
    std::vector<size_t> order = bucket.units;
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return cost(units_[a]) > cost(units_[b]); });
    std::vector<int64_t> here(size, 0);
    for (size_t k : order) {
      int best = 0;
      for (int r = 1; r < size; ++r) {
        if (std::tie(here[r], load[r]) < std::tie(here[best], load[best])) best = r;
      }
      units_[k].owner = best;
      here[best] += cost(units_[k]);
      load[best] += cost(units_[k]);
    }
  }
}

std::vector<std::vector<int>> MuonExchange::owners() const {
  std::vector<std::vector<int>> out(matrices_.size());
  for (const Unit& u : units_) out[u.matrix].push_back(u.owner);
  return out;
}

bool MuonExchange::travels(const Unit& u, const Piece& p, bool to_owners, int from, int to) {
  return to_owners ? p.rank == from && u.owner == to : u.owner == from && p.rank == to;
}

MuonExchange::Flight MuonExchange::issue(
    size_t b, bool to_owners, const std::function<at::Tensor(size_t, const Piece&)>& part) const {
  const int size = group_->size();
  const int me = group_->rank();
  const at::TensorOptions options = at::TensorOptions(at::kBFloat16).device(group_->device());
  Flight f;
  std::vector<int64_t> send_splits(size, 0);
  f.recv_splits.assign(size, 0);
  std::vector<at::Tensor> parts;
  for (int peer = 0; peer < size; ++peer) {
    for (size_t k : buckets_[b].units) {
      const Unit& u = units_[k];
      for (const Piece& p : to_owners ? u.sources : u.holders) {
        if (travels(u, p, to_owners, me, peer)) {
          parts.push_back(part(k, p).reshape(-1));
          send_splits[peer] += p.box.numel();
        }
        if (travels(u, p, to_owners, peer, me)) f.recv_splits[peer] += p.box.numel();
      }
    }
  }
  const at::Tensor send = parts.empty() ? at::empty({0}, options) : at::cat(parts);
  f.recv =
      at::empty({std::accumulate(f.recv_splits.begin(), f.recv_splits.end(), int64_t{0})}, options);
  f.work = group_->all_to_all_single(f.recv, send, f.recv_splits, send_splits);
  return f;
}

void MuonExchange::unpack(Flight& f, size_t b, bool to_owners,
                          const std::function<at::Tensor(size_t, const Piece&)>& into) const {
  f.work.wait();
  const int me = group_->rank();
  int64_t offset = 0;
  for (int peer = 0; peer < group_->size(); ++peer) {
    for (size_t k : buckets_[b].units) {
      const Unit& u = units_[k];
      for (const Piece& p : to_owners ? u.sources : u.holders) {
        if (!travels(u, p, to_owners, peer, me)) continue;
        const int64_t count = p.box.numel();
        into(k, p).copy_(f.recv.narrow(0, offset, count).view(p.box.sizes));
        offset += count;
      }
    }
  }
}

void MuonExchange::run(const std::vector<at::Tensor>& updates, const NewtonSchulz& ns,
                       const std::function<void(size_t, const at::Tensor&)>& done) {
  TITAN_CHECK(updates.size() == matrices_.size(), "MuonExchange: ", updates.size(), " updates for ",
              matrices_.size(), " matrices");
  at::NoGradGuard no_grad;
  const int me = group_->rank();
  const at::TensorOptions options = at::TensorOptions(at::kBFloat16).device(group_->device());
  std::vector<at::Tensor> local(updates.size());
  for (size_t i = 0; i < updates.size(); ++i) {
    TITAN_CHECK(updates[i].sizes().vec() == matrices_[i].local_sizes, "MuonExchange: update of ",
                matrices_[i].name, " is ", updates[i].sizes(), ", not ",
                at::IntArrayRef(matrices_[i].local_sizes));
    local[i] = view_3d(updates[i].to(options));
  }

  // Gathers: every bucket's pieces to their owners, all issued before any Newton–Schulz.
  std::vector<Flight> gathers;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    gathers.push_back(issue(b, /*to_owners=*/true, [&](size_t k, const Piece& p) {
      const size_t i = units_[k].matrix;
      return part_of(local[i], mine_[i], p.box);
    }));
  }
  // Per bucket, as its gather lands: assemble the owned units, orthogonalize, send back.
  std::vector<Flight> returns;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    std::map<size_t, at::Tensor> whole;
    for (size_t k : buckets_[b].units) {
      if (units_[k].owner == me) whole[k] = at::empty(units_[k].box.sizes, options);
    }
    unpack(gathers[b], b, /*to_owners=*/true,
           [&](size_t k, const Piece& p) { return part_of(whole.at(k), units_[k].box, p.box); });
    {
      const TraceSpan span("muon_newton_schulz");
      for (auto& [k, w] : whole) {
        // A lone matrix as 2-D: the same kernels as the one-process step.
        w = matrices_[units_[k].matrix].box.global_shape.size() == 2
                ? newton_schulz(w.squeeze(0), ns).unsqueeze(0)
                : newton_schulz(w, ns);
      }
    }
    returns.push_back(issue(b, /*to_owners=*/false, [&](size_t k, const Piece& p) {
      return part_of(whole.at(k), units_[k].box, p.box);
    }));
  }
  // Each rank's pieces of the results, matrix by matrix as their bucket returns.
  for (size_t b = 0; b < buckets_.size(); ++b) {
    std::map<size_t, at::Tensor> out;
    for (size_t i : buckets_[b].matrices) out[i] = at::empty(mine_[i].sizes, options);
    unpack(returns[b], b, /*to_owners=*/false, [&](size_t k, const Piece& p) {
      const size_t i = units_[k].matrix;
      return part_of(out.at(i), mine_[i], p.box);
    });
    for (size_t i : buckets_[b].matrices) {
      const at::Tensor& o = out.at(i);
      done(i, updates[i].dim() == 2 ? o.squeeze(0) : o);
    }
  }
}

}  // namespace titan
