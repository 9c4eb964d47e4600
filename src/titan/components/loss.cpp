// Next-token cross-entropy; see loss.h.
#include "titan/components/loss.h"

#include "titan/kernels/cross_entropy.h"

namespace titan {

at::Tensor lm_cross_entropy_loss(const at::Tensor& logits, const at::Tensor& labels) {
  const at::Tensor flat = labels.flatten(0, 1);
  const at::Tensor mean =
      at::cross_entropy_loss(logits.flatten(0, 1).to(at::kFloat), flat,
                             /*weight=*/{}, at::Reduction::Mean, kernels::kIgnoreIndex);
  // ATen's mean over no predicted token is 0 / 0; its gradient is already zero there.
  return at::where(predicted_tokens(labels).gt(0), mean, at::zeros_like(mean));
}

at::Tensor predicted_tokens(const at::Tensor& labels) {
  return labels.ne(kernels::kIgnoreIndex).sum();
}

at::Tensor token_weighted_loss(const at::Tensor& mean, const at::Tensor& labels, double factor) {
  return mean * (predicted_tokens(labels).to(at::kFloat) * factor);
}

}  // namespace titan
