// Muon (optimizer.name = "Muon"): momentum, then the update orthogonalized by a Newton–Schulz
// iteration, for the hidden weight matrices; the other parameters take AdamW (optimizer.h holds
// both groups behind one Optimizer). The numerics are torch.optim.Muon's:
//
//   buf = lerp(buf, g, 1 - momentum)                     (buf: "<param>.momentum_buffer")
//   u   = nesterov ? lerp(g, buf, momentum) : buf
//   O   = NS(u): in bfloat16, transposed when rows > cols, divided by max(|u|_F, eps), then
//         ns_steps times  G = X X^T;  X = a X + (b G + c G G) X
//   p   = p * (1 - lr * wd) - adjusted_lr * O
//
// with adjusted_lr from optimizer.muon_adjust_lr_fn and the whole matrix's (rows, cols). A stack
// of expert matrices (experts, rows, cols) is a batch of independent matrices.
//
// Newton–Schulz needs whole matrices, and FSDP, TP and EP hold pieces. A MuonOrthogonalizer turns
// this rank's pieces of the momentum updates into its pieces of the orthogonalized ones: the local
// one (every piece a whole matrix; anything else is refused) here, the distributed one, which
// brings each matrix to one owning rank and back, in parallel/muon_exchange.h.
#pragma once

#include "titan/common/shard_box.h"
#include "titan/config/job_config.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace titan {

struct NewtonSchulz {
  double a = 3.4445, b = -4.775, c = 2.0315;
  int64_t steps = 5;
  double eps = 1e-7;

  static NewtonSchulz of(const OptimizerSection& config);
};

// The orthogonalized update of `update`, (rows, cols) or a batch (n, rows, cols), in bfloat16.
at::Tensor newton_schulz(const at::Tensor& update, const NewtonSchulz& ns);

// `lr` scaled for a (rows, cols) matrix by `rule`: "original" sqrt(max(1, rows / cols)),
// "match_rms_adamw" 0.2 sqrt(max(rows, cols)), "spectral_unclamped" sqrt(rows / cols).
double muon_adjusted_lr(double lr, const std::string& rule, int64_t rows, int64_t cols);

// Whether a trained matrix (a Linear's weight or a stack of expert matrices) named `fqn` takes
// AdamW instead of Muon: an entry of optimizer.muon_adamw_fqns names it or a module above it
// ("output", "moe.gate": whole dotted components).
bool muon_excluded(const std::string& fqn, const std::vector<std::string>& adamw_fqns);

// One of Muon's matrices as this rank holds it.
struct MuonMatrix {
  std::string name;
  ShardBox box;                      // where this rank's piece sits in the whole
  std::vector<int64_t> local_sizes;  // the piece's sizes (a padded FSDP shard may be empty)
};

class MuonOrthogonalizer {
 public:
  virtual ~MuonOrthogonalizer() = default;
  // `updates[i]`: this rank's piece of matrix i (bfloat16, the sizes the constructor was given).
  // Calls `done(i, orthogonalized piece)` once for every i, as soon as its piece is ready, in any
  // order.
  virtual void run(const std::vector<at::Tensor>& updates, const NewtonSchulz& ns,
                   const std::function<void(size_t, const at::Tensor&)>& done) = 0;
};

// Every piece a whole matrix: Newton–Schulz in place, one matrix after another.
class LocalOrthogonalizer : public MuonOrthogonalizer {
 public:
  // Throws naming the first matrix this rank holds only part of.
  explicit LocalOrthogonalizer(const std::vector<MuonMatrix>& matrices);
  void run(const std::vector<at::Tensor>& updates, const NewtonSchulz& ns,
           const std::function<void(size_t, const at::Tensor&)>& done) override;
};

}  // namespace titan
