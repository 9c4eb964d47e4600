// ParallelDims: degree validation (with the arithmetic in every error), mesh coordinates, and
// the one pass that builds the named process groups.
#include "titan/distributed/parallel_dims.h"

#include "titan/common/check.h"
#include "titan/common/format.h"

#include <algorithm>
#include <sstream>

namespace titan {

namespace {

[[noreturn]] void fail(const std::string& message) { throw ConfigError(message); }

void check_degree(const char* key, const char* name, int64_t value) {
  if (value < 1) {
    fail("parallelism." + std::string(key) + " (" + name + ") must be >= 1, got " +
         std::to_string(value));
  }
}

// Mesh dims by index, outer to inner.
enum Dim { kPp = 0, kDpReplicate, kDpShard, kCp, kTp, kNumDims };

int64_t degree_of(const ParallelDegrees& d, int dim) {
  switch (dim) {
    case kPp: return d.pp;
    case kDpReplicate: return d.dp_replicate;
    case kDpShard: return d.dp_shard;
    case kCp: return d.cp;
    case kTp: return d.tp;
  }
  return 1;
}

int64_t& coord_of(MeshCoord& c, int dim) {
  switch (dim) {
    case kPp: return c.pp;
    case kDpReplicate: return c.dp_replicate;
    case kDpShard: return c.dp_shard;
    case kCp: return c.cp;
    default: return c.tp;
  }
}

int dim_index(const std::string& name) {
  const auto& names = ParallelDims::mesh_dim_names();
  return static_cast<int>(std::find(names.begin(), names.end(), name) - names.begin());
}

}  // namespace

ParallelDegrees ParallelDegrees::from_config(const ParallelismSection& p) {
  ParallelDegrees d;
  d.dp_replicate = p.data_parallel_replicate_degree;
  d.dp_shard = p.data_parallel_shard_degree;
  d.cp = p.context_parallel_degree;
  d.tp = p.tensor_parallel_degree;
  d.pp = p.pipeline_parallel_degree;
  d.ep = p.expert_parallel_degree;
  d.etp = p.expert_tensor_parallel_degree;
  return d;
}

std::string ParallelDegrees::product_text() const {
  std::ostringstream os;
  os << "dp_replicate(" << dp_replicate << ") * dp_shard(" << dp_shard << ") * cp(" << cp
     << ") * tp(" << tp << ") * pp(" << pp << ")";
  return os.str();
}

ParallelDegrees resolve_parallel_degrees(const ParallelDegrees& degrees, int64_t world_size) {
  if (world_size < 1) fail("world_size must be >= 1, got " + std::to_string(world_size));
  ParallelDegrees d = degrees;
  check_degree("data_parallel_replicate_degree", "dp_replicate", d.dp_replicate);
  if (d.dp_shard != -1) check_degree("data_parallel_shard_degree", "dp_shard", d.dp_shard);
  check_degree("context_parallel_degree", "cp", d.cp);
  check_degree("tensor_parallel_degree", "tp", d.tp);
  check_degree("pipeline_parallel_degree", "pp", d.pp);
  check_degree("expert_parallel_degree", "ep", d.ep);
  check_degree("expert_tensor_parallel_degree", "etp", d.etp);

  if (d.dp_shard == -1) {
    const int64_t others = d.dp_replicate * d.cp * d.tp * d.pp;
    if (world_size % others != 0) {
      std::ostringstream os;
      os << "dp_shard = -1 takes the ranks the other degrees leave, but dp_replicate("
         << d.dp_replicate << ") * cp(" << d.cp << ") * tp(" << d.tp << ") * pp(" << d.pp
         << ") = " << others << " does not divide world_size " << world_size
         << ". HINT: choose degrees whose product divides the number of ranks.";
      fail(os.str());
    }
    d.dp_shard = world_size / others;
  }
  const int64_t product = d.dp_replicate * d.dp_shard * d.cp * d.tp * d.pp;
  if (product != world_size) {
    std::ostringstream os;
    os << d.product_text() << " = " << product << " != world_size " << world_size
       << ". HINT: make the product of the parallelism degrees equal the number of ranks, or "
          "set parallelism.data_parallel_shard_degree = -1 to take the rest.";
    fail(os.str());
  }
  if (d.etp != 1 && d.etp != d.tp) {
    fail("parallelism.expert_tensor_parallel_degree (etp) must be 1 or tensor_parallel_degree (" +
         std::to_string(d.tp) + "), got " + std::to_string(d.etp) +
         ". HINT: 1 keeps experts whole (each rank routes its own sequence shard); tp splits each "
         "expert's hidden features over the tp ranks");
  }
  if (d.ep > 1 && d.etp == 1) {
    // TorchTitan's rule: experts borrow all of cp * tp and part of dp_shard.
    const int64_t cp_tp = d.cp * d.tp;
    const int64_t shard_cp_tp = d.dp_shard * cp_tp;
    if (d.ep % cp_tp != 0 || shard_cp_tp % d.ep != 0) {
      std::ostringstream os;
      os << "ep(" << d.ep << ") must be a multiple of cp(" << d.cp << ") * tp(" << d.tp
         << ") = " << cp_tp << " and divide dp_shard(" << d.dp_shard << ") * cp(" << d.cp
         << ") * tp(" << d.tp << ") = " << shard_cp_tp
         << ". HINT: expert parallelism borrows ranks from dp_shard x cp x tp.";
      fail(os.str());
    }
  } else if (d.ep > 1) {
    // etp = tp: the experts already split over tp; ep borrows all of cp and part of dp_shard.
    const int64_t shard_cp = d.dp_shard * d.cp;
    if (d.ep % d.cp != 0 || shard_cp % d.ep != 0) {
      std::ostringstream os;
      os << "with expert_tensor_parallel_degree = tp, ep(" << d.ep << ") must be a multiple of cp("
         << d.cp << ") and divide dp_shard(" << d.dp_shard << ") * cp(" << d.cp
         << ") = " << shard_cp
         << ". HINT: expert parallelism then borrows ranks from dp_shard x cp only.";
      fail(os.str());
    }
  }
  return d;
}

void check_parallelism_implemented(const ParallelDegrees&) {
  // Every parallelism and layout that resolve_parallel_degrees accepts is implemented.
}

// ---- ParallelDims ----

ParallelDims::ParallelDims(const ParallelDegrees& degrees, int64_t world_size)
    : ParallelDims(resolve_parallel_degrees(degrees, world_size), world_size,
                   /*implemented_only=*/true) {}

ParallelDims::ParallelDims(const ParallelDegrees& resolved, int64_t world_size,
                           bool implemented_only)
    : d_(resolved), world_size_(world_size) {
  if (implemented_only) check_parallelism_implemented(d_);
}

ParallelDims ParallelDims::planned(const ParallelDegrees& degrees, int64_t world_size) {
  return ParallelDims(resolve_parallel_degrees(degrees, world_size), world_size,
                      /*implemented_only=*/false);
}

ParallelDims ParallelDims::from_config(const ParallelismSection& p, int64_t world_size) {
  return ParallelDims(ParallelDegrees::from_config(p), world_size);
}

const std::vector<std::string>& ParallelDims::mesh_dim_names() {
  static const std::vector<std::string> names{"pp", "dp_replicate", "dp_shard", "cp", "tp"};
  return names;
}

std::vector<int64_t> ParallelDims::mesh_shape() const {
  return {d_.pp, d_.dp_replicate, d_.dp_shard, d_.cp, d_.tp};
}

namespace {

struct GroupSpec {
  std::string name;
  std::vector<std::string> dims;  // the mesh dims it flattens
  // A communicator of its own even where another group has the same ranks (the ring's hops, one
  // per direction: on NCCL two ranks sending to each other over one communicator can deadlock).
  bool own = false;
};

const std::vector<GroupSpec>& group_table() {
  // The order groups are built in.
  static const std::vector<GroupSpec> table{
      {"dp_replicate", {"dp_replicate"}},
      {"dp_shard", {"dp_shard"}},
      {"cp", {"cp"}},
      {"tp", {"tp"}},
      {"pp", {"pp"}},
      {"dp", {"dp_replicate", "dp_shard"}},
      {"dp_shard_cp", {"dp_shard", "cp"}},
      {"dp_cp", {"dp_replicate", "dp_shard", "cp"}},
      // The ranks that hold distinct pieces of one stage's parameters (distributed Muon's).
      {"dp_shard_cp_tp", {"dp_shard", "cp", "tp"}},
      // Expert parallelism's (built when ep > 1): dp_shard's inner and outer parts.
      {"ep", {"dp_shard_in_ep", "cp", "tp"}},
      {"dp_shard_mod_ep", {"dp_shard_mod_ep"}},
      // Context parallelism's ring (built when cp > 1): its hops to a higher cp rank and to a
      // lower one.
      {"cp_up", {"cp"}, /*own=*/true},
      {"cp_down", {"cp"}, /*own=*/true},
  };
  return table;
}

// Whether `name` is built for degrees `d`.
bool built_for(const std::string& name, const ParallelDegrees& d) {
  if (name == "ep" || name == "dp_shard_mod_ep") return d.ep > 1;
  if (name == "cp_up" || name == "cp_down") return d.cp > 1;
  return true;
}

}  // namespace

const std::vector<std::string>& ParallelDims::group_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const auto& entry : group_table()) out.push_back(entry.name);
    return out;
  }();
  return names;
}

const std::vector<std::string>& ParallelDims::group_dims(const std::string& name) {
  for (const auto& entry : group_table()) {
    if (entry.name == name) return entry.dims;
  }
  TITAN_CHECK(false, "unknown parallel group '", name, "'; known: ", join(group_names()));
  static const std::vector<std::string> none;
  return none;
}

MeshCoord ParallelDims::coordinate(int64_t rank) const {
  TITAN_CHECK(rank >= 0 && rank < world_size_, "rank ", rank, " is not in [0, world_size ",
              world_size_, ")");
  MeshCoord c;
  int64_t rest = rank;
  for (int dim = kNumDims - 1; dim >= 0; --dim) {
    const int64_t n = degree_of(d_, dim);
    coord_of(c, dim) = rest % n;
    rest /= n;
  }
  return c;
}

int64_t ParallelDims::rank_at(const MeshCoord& c) const {
  MeshCoord copy = c;
  int64_t rank = 0;
  for (int dim = 0; dim < kNumDims; ++dim) {
    const int64_t n = degree_of(d_, dim);
    const int64_t x = coord_of(copy, dim);
    TITAN_CHECK(x >= 0 && x < n, "mesh coordinate ", x, " of ", mesh_dim_names()[dim],
                " is not in [0, ", n, ")");
    rank = rank * n + x;
  }
  return rank;
}

std::vector<int> ParallelDims::group_ranks(const std::string& name, int64_t rank) const {
  const auto& dims = group_dims(name);
  if (name == "ep" || name == "dp_shard_mod_ep") {
    // dp_shard = dp_shard_mod_ep x dp_shard_in_ep (outer x inner): the ranks that share this
    // one's other coordinates and (ep) its dp_shard_mod_ep coordinate, or (dp_shard_mod_ep) its
    // dp_shard_in_ep, cp and tp coordinates. Ascending world ranks are row-major in the group.
    TITAN_CHECK(d_.ep > 1, "parallel group '", name, "' exists only with expert parallelism");
    const int64_t in_ep = dp_shard_in_ep();
    const MeshCoord me = coordinate(rank);
    std::vector<int> ranks;
    for (int64_t r = 0; r < world_size_; ++r) {
      const MeshCoord c = coordinate(r);
      if (c.pp != me.pp || c.dp_replicate != me.dp_replicate) continue;
      // With experts split over tp, each tp rank exchanges tokens with its own tp coordinate.
      const bool same_mod =
          c.dp_shard / in_ep == me.dp_shard / in_ep && (d_.etp == 1 || c.tp == me.tp);
      const bool same_in =
          c.dp_shard % in_ep == me.dp_shard % in_ep && c.cp == me.cp && c.tp == me.tp;
      if (name == "ep" ? same_mod : same_in) ranks.push_back(static_cast<int>(r));
    }
    return ranks;
  }
  // Varying dims in mesh order (outer first), so the enumeration below is row-major.
  std::vector<int> varying;
  for (const auto& dim_name : dims) varying.push_back(dim_index(dim_name));
  std::sort(varying.begin(), varying.end());

  MeshCoord base = coordinate(rank);
  int64_t count = 1;
  for (int dim : varying) count *= degree_of(d_, dim);
  std::vector<int> ranks;
  for (int64_t i = 0; i < count; ++i) {
    MeshCoord c = base;
    int64_t rest = i;
    for (auto it = varying.rbegin(); it != varying.rend(); ++it) {
      const int64_t n = degree_of(d_, *it);
      coord_of(c, *it) = rest % n;
      rest /= n;
    }
    ranks.push_back(static_cast<int>(rank_at(c)));
  }
  return ranks;
}

int64_t ParallelDims::dp_rank(int64_t rank) const {
  MeshCoord c = coordinate(rank);
  return c.dp_replicate * d_.dp_shard + c.dp_shard;
}

void ParallelDims::build_groups(const std::shared_ptr<dist::Group>& world) {
  TITAN_CHECK(world, "ParallelDims::build_groups: the world group is null");
  TITAN_CHECK(world->size() == world_size_, "ParallelDims::build_groups: the world group has ",
              world->size(), " ranks but the parallel dims were made for world_size ", world_size_);
  TITAN_CHECK(groups_.empty(), "ParallelDims::build_groups was already called");
  check_parallelism_implemented(d_);
  const int64_t rank = world->rank();

  // Names that share a rank set share a group, named after all of them (but a group of its own
  // is never shared).
  struct Unique {
    std::vector<int> ranks;
    std::vector<std::string> names;
    bool own = false;
  };
  std::vector<Unique> unique;
  for (const auto& spec : group_table()) {
    if (!built_for(spec.name, d_)) continue;
    std::vector<int> ranks = group_ranks(spec.name, rank);
    auto it = std::find_if(unique.begin(), unique.end(), [&](const Unique& u) {
      return !spec.own && !u.own && u.ranks == ranks;
    });
    if (it == unique.end()) {
      unique.push_back({ranks, {spec.name}, spec.own});
    } else {
      it->names.push_back(spec.name);
    }
  }
  // Same order on every rank: the rank sets' equalities depend only on the degrees.
  for (const Unique& u : unique) {
    std::shared_ptr<dist::Group> group;
    if (static_cast<int64_t>(u.ranks.size()) == world_size_ && !u.own) {
      group = world;
    } else {
      group = world->new_subgroup(join(u.names, "="), u.ranks);
    }
    for (const auto& name : u.names) groups_[name] = group;
  }
}

std::shared_ptr<dist::Group> ParallelDims::group_ptr(const std::string& name) const {
  group_dims(name);  // unknown names throw with the list
  TITAN_CHECK(!groups_.empty(), "parallel group '", name,
              "' requested before ParallelDims::build_groups(world)");
  auto it = groups_.find(name);
  TITAN_CHECK(it != groups_.end(), "parallel group '", name,
              "' was not built (ep and dp_shard_mod_ep exist only with expert parallelism, "
              "cp_up and cp_down only with context parallelism)");
  return it->second;
}

dist::Group& ParallelDims::group(const std::string& name) const { return *group_ptr(name); }

std::string ParallelDims::describe() const {
  std::ostringstream os;
  os << "world " << world_size_ << " = pp(" << d_.pp << ") x dp_replicate(" << d_.dp_replicate
     << ") x dp_shard(" << d_.dp_shard << ") x cp(" << d_.cp << ") x tp(" << d_.tp << ")";
  if (d_.ep > 1) {
    os << "; experts: ep(" << d_.ep << ") = dp_shard_in_ep(" << dp_shard_in_ep() << ") x cp("
       << d_.cp << ")";
    if (d_.etp == 1) os << " x tp(" << d_.tp << ")";
    os << ", FSDP of experts over dp_shard_mod_ep(" << dp_shard_mod_ep() << ")";
  }
  if (d_.etp > 1) {
    os << "; each expert split over tp(" << d_.tp << ") (expert_tensor_parallel_degree)";
  }
  return os.str();
}

}  // namespace titan
