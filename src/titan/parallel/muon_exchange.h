// Distributed Muon: Newton–Schulz needs whole matrices, and FSDP, TP and EP leave each rank a
// piece of each (components/muon.h). MuonExchange brings every matrix's momentum update to one
// owning rank, which orthogonalizes it, and sends each rank its piece of the result back:
//
//   - units: a matrix, or for a stack of experts a range of them (the stack split in as many
//     ranges as the group has ranks, so the experts spread over the owners);
//   - owners: within each bucket (a transformer block's matrices, or a top-level module's), the
//     units go, largest Newton–Schulz cost first, to the rank with the least of it so far, so
//     every rank computes a share of every bucket;
//   - per bucket, one all-to-all (bfloat16: the values Newton–Schulz starts from) carries the
//     pieces to their owners and one carries the results back. All buckets' gathers are issued
//     first; each bucket's Newton–Schulz then runs as its gather lands, and its results travel
//     while the next bucket computes.
//
// The group is the ranks that hold distinct pieces of the same matrices: "dp_shard_cp_tp" (the
// ranks of one pipeline stage and one data-parallel replica; replicas orthogonalize their own
// copies, which are equal). Pieces any number of ranks hold alike (replicated over part of the
// group) are sent by the lowest of them and returned to all of them. The result on every rank is
// bit-identical to the one-process Newton–Schulz of the whole matrix.
#pragma once

#include "titan/components/muon.h"
#include "titan/distributed/comm.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

namespace titan {

class MuonExchange : public MuonOrthogonalizer {
 public:
  // Collective over `group`: every rank constructs it at the same point, with the same matrix
  // names in the same order (checked), each with its own boxes. Throws when the pieces do not
  // tile a matrix.
  MuonExchange(std::vector<MuonMatrix> matrices, std::shared_ptr<dist::Group> group);

  void run(const std::vector<at::Tensor>& updates, const NewtonSchulz& ns,
           const std::function<void(size_t, const at::Tensor&)>& done) override;

  // Which rank orthogonalizes each unit (tests, logs): per matrix, the owners of its units.
  std::vector<std::vector<int>> owners() const;

 private:
  // A box in a matrix viewed as 3-D (a 2-D matrix is a stack of one).
  struct Box {
    std::vector<int64_t> offsets, sizes;
    int64_t numel() const;
  };
  struct Piece {
    int rank;
    Box box;  // in the whole matrix
  };
  struct Unit {
    size_t matrix;
    Box box;  // experts [first, first + count) of the matrix, whole rows and cols
    int owner = 0;
    std::vector<Piece> sources;  // who sends which part (one rank per distinct part)
    std::vector<Piece> holders;  // who gets which part back (every rank that holds it)
  };
  struct Bucket {
    std::vector<size_t> units;
    std::vector<size_t> matrices;  // the matrices whose units are all here
  };

  // One all-to-all of a bucket's pieces: each unit's `sources` to its owner (to_owners), or its
  // result's parts from the owner to each of its `holders`.
  struct Flight {
    at::Tensor recv;
    std::vector<int64_t> recv_splits;
    dist::Work work;
  };
  // Whether `p` of unit `u` travels from rank `from` to rank `to`.
  static bool travels(const Unit& u, const Piece& p, bool to_owners, int from, int to);
  // Issues bucket b's exchange; `part(unit, piece)` is the values this rank sends of a piece.
  Flight issue(size_t b, bool to_owners,
               const std::function<at::Tensor(size_t, const Piece&)>& part) const;
  // Copies what `f` received into `into(unit, piece)`, once it has landed.
  void unpack(Flight& f, size_t b, bool to_owners,
              const std::function<at::Tensor(size_t, const Piece&)>& into) const;

  std::vector<MuonMatrix> matrices_;
  std::vector<Box> mine_;  // this rank's box of each matrix, 3-D
  std::shared_ptr<dist::Group> group_;
  std::vector<Unit> units_;
  std::vector<Bucket> buckets_;
};

}  // namespace titan
