#include "titan/components/loss.h"

namespace titan {

at::Tensor lm_cross_entropy_loss(const at::Tensor& logits, const at::Tensor& labels) {
  return at::cross_entropy_loss(logits.flatten(0, 1).to(at::kFloat), labels.flatten(0, 1));
}

}  // namespace titan
