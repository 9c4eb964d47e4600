// Semi-synchronous training across replica groups (fault_tolerance.semi_sync_method): the groups
// take sync_steps optimizer steps each on its own data, then agree on the parameters.
//
//   LocalSGD  the parameters are averaged over the quorum.
//   DiLoCo    each group's pseudo-gradient, the parameters at the last sync minus the parameters
//             now, is averaged over the quorum, and an outer optimizer (SGD with Nesterov
//             momentum, torch.optim.SGD(lr, momentum, nesterov=True)) steps from the parameters
//             at the last sync with it: buf = momentum * buf + g; p = p0 - lr * (g + momentum *
//             buf).
//
//   OuterStep outer(method, params, lr, momentum);     // snapshot = the parameters now
//   ... sync_steps inner steps ...
//   std::vector<at::Tensor> x = outer.to_average();    // params (LocalSGD) or pseudo-gradients
//   if (manager.average(x)) outer.apply(x);            // else: the next sync tries again
#pragma once

#include <ATen/Tensor.h>

#include <string>
#include <vector>

namespace titan::ft {

enum class SemiSync { kNone, kLocalSgd, kDiLoCo };
// "" -> kNone, "local_sgd", "diloco"; std::invalid_argument otherwise.
SemiSync semi_sync_from_name(const std::string& name);

class OuterStep {
 public:
  // `params`: this rank's parameter tensors (updated in place); the snapshot is taken now.
  OuterStep(SemiSync method, std::vector<at::Tensor> params, double lr, double momentum);

  // What the replicas average: the parameters themselves (LocalSGD, in place: average writes the
  // mean into them) or fresh pseudo-gradients (DiLoCo).
  std::vector<at::Tensor> to_average() const;
  // After a successful average of to_average()'s tensors: DiLoCo's outer step (LocalSGD has
  // nothing left to do); the parameters become the next snapshot.
  void apply(const std::vector<at::Tensor>& averaged);
  // The parameters as they are now become the snapshot (after a peer's state was taken).
  void reset_snapshot();

  // DiLoCo's momentum buffers, one per parameter (empty for LocalSGD): training state, saved in
  // checkpoints and moved to recovering replicas.
  const std::vector<at::Tensor>& momentum_buffers() const { return momentum_; }
  SemiSync method() const { return method_; }

 private:
  SemiSync method_;
  std::vector<at::Tensor> params_, snapshot_, momentum_;
  double lr_, momentum_coef_;
};

}  // namespace titan::ft
