// ParallelDims: the single owner of the parallelism degrees and of the named process groups
// (TorchTitan's ParallelDims). Ranks form a mesh, outer to inner [pp, dp_replicate, dp_shard, cp,
// tp] (row-major: tp neighbours are adjacent ranks); a named group is the set of ranks that
// differ from this one only in some of those dims:
//
//   "pp", "dp_replicate", "dp_shard", "cp", "tp"   one mesh dim each
//   "dp"           dp_replicate x dp_shard   data loading: the batch is split over it
//   "dp_shard_cp"  dp_shard x cp             FSDP shards parameters over it
//   "dp_cp"        dp_replicate x dp_shard x cp   the loss is averaged over it
//   "dp_shard_cp_tp"  dp_shard x cp x tp     distinct pieces of a stage's parameters (Muon's
//                  exchange, parallel/muon_exchange.h)
//   "cp_up", "cp_down"  the cp ranks again, each a communicator of its own (built when cp > 1):
//                  ring attention's hops to a higher and to a lower cp rank
//                  (context_parallel.h), one direction per communicator as the pipeline's
//
// Expert parallelism (ep > 1; TorchTitan's rules): the ep ranks of a group take all of cp, all
// of tp when expert_tensor_parallel_degree (etp) is 1, and part of dp_shard, which splits in two,
// outer to inner, dp_shard = dp_shard_mod_ep x dp_shard_in_ep with dp_shard_in_ep = ep / (cp x
// tp) (etp 1) or ep / cp (etp = tp, the experts themselves split over tp):
//
//   "ep"               dp_shard_in_ep x cp (x tp when etp is 1)   routed tokens are exchanged
//                                  over it; each of its ranks holds 1/ep of every MoE layer's
//                                  experts
//   "dp_shard_mod_ep"  dp_shard_mod_ep            FSDP shards the experts over it (replicas of the
//                                                 same experts); with dp_replicate, HSDP
//
// A rank's position in a flattened group is its row-major position over the group's dims, so
// the "dp" rank is dp_replicate_coord * dp_shard + dp_shard_coord.
//
//   ParallelDims dims = ParallelDims::from_config(config.parallelism, world->size());
//   dims.build_groups(world);                         // every rank, same point of start-up
//   dims.group("dp_shard").all_reduce(grad, dist::ReduceOp::kAvg).wait();
//
// Every parallelism is implemented.
#pragma once

#include "titan/config/job_config.h"
#include "titan/distributed/comm.h"

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace titan {

// Degrees as in [parallelism]; dp_shard = -1 takes the ranks the others leave.
struct ParallelDegrees {
  int64_t dp_replicate = 1;
  int64_t dp_shard = -1;
  int64_t cp = 1;
  int64_t tp = 1;
  int64_t pp = 1;
  int64_t ep = 1;
  int64_t etp = 1;  // expert_tensor_parallel_degree

  static ParallelDegrees from_config(const ParallelismSection& p);
  // "dp_replicate(2) * dp_shard(2) * cp(1) * tp(1) * pp(1)"
  std::string product_text() const;
};

// Validates degrees against a world size without any process group (config checks, `titan
// inspect`) and fills in dp_shard = -1. Throws ConfigError that shows the arithmetic, e.g.
// "dp_replicate(2) * dp_shard(2) * cp(1) * tp(2) * pp(1) = 8 != world_size 4".
ParallelDegrees resolve_parallel_degrees(const ParallelDegrees& degrees, int64_t world_size);

// Throws ConfigError when a parallelism that is not implemented yet has a degree above 1.
void check_parallelism_implemented(const ParallelDegrees& degrees);

// A rank's coordinate in each mesh dim.
struct MeshCoord {
  int64_t pp = 0;
  int64_t dp_replicate = 0;
  int64_t dp_shard = 0;
  int64_t cp = 0;
  int64_t tp = 0;
};

class ParallelDims {
 public:
  // Resolves and validates (resolve_parallel_degrees + check_parallelism_implemented).
  ParallelDims(const ParallelDegrees& degrees, int64_t world_size);
  static ParallelDims from_config(const ParallelismSection& p, int64_t world_size);
  // The mesh arithmetic of any valid layout, implemented or not (tests, `titan inspect`);
  // build_groups() refuses it when it needs an unimplemented parallelism.
  static ParallelDims planned(const ParallelDegrees& degrees, int64_t world_size);

  int64_t world_size() const { return world_size_; }
  int64_t dp_replicate() const { return d_.dp_replicate; }
  int64_t dp_shard() const { return d_.dp_shard; }
  int64_t cp() const { return d_.cp; }
  int64_t tp() const { return d_.tp; }
  int64_t pp() const { return d_.pp; }
  int64_t ep() const { return d_.ep; }
  int64_t etp() const { return d_.etp; }
  bool ep_enabled() const { return d_.ep > 1; }
  // expert_tensor_parallel_degree = tp > 1: MoE layers see whole sequences and split each
  // expert's hidden features over tp.
  bool experts_split_over_tp() const { return d_.etp > 1; }
  // Expert parallelism's split of dp_shard (see the top): 1 and dp_shard without ep.
  int64_t dp_shard_in_ep() const {
    return d_.ep > 1 ? d_.ep / (d_.cp * (d_.etp > 1 ? 1 : d_.tp)) : 1;
  }
  int64_t dp_shard_mod_ep() const { return d_.dp_shard / dp_shard_in_ep(); }
  const ParallelDegrees& degrees() const { return d_; }

  bool dp_enabled() const { return d_.dp_replicate * d_.dp_shard > 1; }
  bool dp_replicate_enabled() const { return d_.dp_replicate > 1; }
  bool dp_shard_enabled() const { return d_.dp_shard > 1; }
  // FSDP shards over dp_shard x cp.
  bool fsdp_enabled() const { return d_.dp_shard > 1 || d_.cp > 1; }
  // Replicas of a sharded model: HSDP; replicas of a whole model: DDP.
  bool hsdp_enabled() const { return dp_replicate_enabled() && fsdp_enabled(); }
  bool ddp_enabled() const { return dp_replicate_enabled() && !fsdp_enabled(); }
  bool tp_enabled() const { return d_.tp > 1; }
  bool pp_enabled() const { return d_.pp > 1; }
  bool cp_enabled() const { return d_.cp > 1; }
  // Ranks the batch is split over (dp_replicate x dp_shard).
  int64_t dp_size() const { return d_.dp_replicate * d_.dp_shard; }
  // Ranks that hold the same data: cp x tp x pp.
  int64_t non_data_parallel_size() const { return d_.cp * d_.tp * d_.pp; }

  // Outer to inner: {"pp", "dp_replicate", "dp_shard", "cp", "tp"}.
  static const std::vector<std::string>& mesh_dim_names();
  // The degrees in mesh order.
  std::vector<int64_t> mesh_shape() const;
  // Every group name build_groups() makes, in the order it makes them.
  static const std::vector<std::string>& group_names();
  // The mesh dims a group name spans ("dp" -> {"dp_replicate", "dp_shard"}); throws on an
  // unknown name, listing the known ones.
  static const std::vector<std::string>& group_dims(const std::string& name);

  MeshCoord coordinate(int64_t rank) const;
  int64_t rank_at(const MeshCoord& c) const;
  // The world ranks of the group `name` that `rank` belongs to, in group-rank order.
  std::vector<int> group_ranks(const std::string& name, int64_t rank) const;
  // `rank`'s position in its "dp" group: which slice of the batch it loads.
  int64_t dp_rank(int64_t rank) const;

  // Creates the groups this process belongs to, as sub-groups of `world` (whose size must be
  // world_size()), in group_names() order on every rank; identical rank sets share one group
  // (and a group spanning all ranks is `world` itself). Call once, on every rank.
  void build_groups(const std::shared_ptr<dist::Group>& world);
  // A group made by build_groups(); throws naming the known names when unknown or not built.
  dist::Group& group(const std::string& name) const;
  std::shared_ptr<dist::Group> group_ptr(const std::string& name) const;

  // "world 8 = pp(1) x dp_replicate(2) x dp_shard(4) x cp(1) x tp(1)"
  std::string describe() const;

 private:
  ParallelDims(const ParallelDegrees& resolved, int64_t world_size, bool implemented_only);

  ParallelDegrees d_;
  int64_t world_size_ = 1;
  std::map<std::string, std::shared_ptr<dist::Group>> groups_;
};

}  // namespace titan
