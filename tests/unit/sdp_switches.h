// SDPA's backend switches for a test, and the ATen op each backend runs, so a GPU test can pin
// the kernel it means to exercise (libtorch 2.9 and later put cuDNN first on sm90 / sm100, so
// SDPA's default choice differs between GPUs and releases):
//
//   test::SdpSwitches only_flash({at::SDPBackend::flash_attention, at::SDPBackend::math});
//   test::OpCounter flash(test::sdpa_kernel_op(at::SDPBackend::flash_attention));
//
// The switches are process-wide; the previous ones come back when the guard ends.
#pragma once

#include <ATen/Context.h>
#include <ATen/SDPBackend.h>

#include <algorithm>
#include <string>
#include <vector>

namespace titan::test {

class SdpSwitches {
 public:
  explicit SdpSwitches(const std::vector<at::SDPBackend>& enabled) {
    at::Context& ctx = at::globalContext();
    const auto on = [&](at::SDPBackend b) {
      return std::find(enabled.begin(), enabled.end(), b) != enabled.end();
    };
    ctx.setSDPUseFlash(on(at::SDPBackend::flash_attention));
    ctx.setSDPUseMemEfficient(on(at::SDPBackend::efficient_attention));
    ctx.setSDPUseMath(on(at::SDPBackend::math));
    ctx.setSDPUseCuDNN(on(at::SDPBackend::cudnn_attention));
  }
  ~SdpSwitches() {
    at::Context& ctx = at::globalContext();
    ctx.setSDPUseFlash(flash_);
    ctx.setSDPUseMemEfficient(efficient_);
    ctx.setSDPUseMath(math_);
    ctx.setSDPUseCuDNN(cudnn_);
  }
  SdpSwitches(const SdpSwitches&) = delete;
  SdpSwitches& operator=(const SdpSwitches&) = delete;

 private:
  const bool flash_ = at::globalContext().userEnabledFlashSDP();
  const bool efficient_ = at::globalContext().userEnabledMemEfficientSDP();
  const bool math_ = at::globalContext().userEnabledMathSDP();
  const bool cudnn_ = at::globalContext().userEnabledCuDNNSDP();
};

// The op SDPA calls for `backend` on CUDA ("" for the math backend, which is several ops).
inline std::string sdpa_kernel_op(at::SDPBackend backend) {
  switch (backend) {
    case at::SDPBackend::flash_attention: return "aten::_scaled_dot_product_flash_attention";
    case at::SDPBackend::efficient_attention:
      return "aten::_scaled_dot_product_efficient_attention";
    case at::SDPBackend::cudnn_attention: return "aten::_scaled_dot_product_cudnn_attention";
    default: return "";
  }
}

}  // namespace titan::test
