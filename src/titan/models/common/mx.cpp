#include "titan/models/common/mx.h"

#include "titan/common/check.h"

#include <torch/autograd.h>

#include <cmath>
#include <limits>

namespace titan {

namespace {

constexpr int64_t kFloat32MantissaBits = 23;
constexpr int64_t kE8M0Bias = 127;
constexpr int64_t kE4M3MaxPow2 = 8;  // 448 = 1.75 x 2^8
constexpr double kE4M3Max = 448.0;

// x split into blocks along its last dim: (..., K / 32, 32).
at::Tensor blocks_of(const at::Tensor& x) {
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() /= kMxBlock;
  shape.push_back(kMxBlock);
  return x.reshape(shape);
}

}  // namespace

at::Tensor e8m0_to_float(const at::Tensor& scale) {
  TITAN_CHECK(scale.scalar_type() == at::kByte, "E8M0 scales are uint8, got ", scale.scalar_type());
  const at::Tensor biased = scale.to(at::kInt);
  // A float32 with exponent field `biased` and no mantissa is 2^(biased - 127); byte 0 is the
  // subnormal 2^-127 (mantissa bit 22), byte 255 NaN.
  at::Tensor bits = biased.bitwise_left_shift(kFloat32MantissaBits);
  bits = at::where(biased == 0, at::scalar_tensor(0x00400000, bits.options()), bits);
  at::Tensor out = bits.view(at::kFloat);
  return at::where(biased == 255,
                   at::scalar_tensor(std::numeric_limits<float>::quiet_NaN(), out.options()), out);
}

namespace {

// torchao's _to_mx_rceil on the blocks (..., 32) and their float32 maxima (..., 1).
MxTensor to_mx_rceil(const at::Tensor& blocks, const at::Tensor& amax, at::IntArrayRef shape) {
  const at::Tensor descale = amax / kE4M3Max;
  const at::Tensor byte =
      (at::ceil(at::log2(descale)).clamp(-kE8M0Bias, kE8M0Bias) + kE8M0Bias).to(at::kByte);
  at::Tensor biased = at::where(descale.isinf(), at::scalar_tensor(254, byte.options()), byte);
  biased = at::where(descale.isnan(), at::scalar_tensor(255, byte.options()), biased);
  // The multiplier: 2^(127 - byte); 1 for byte 0 and 2^-127 for byte 254 (torchao's choices),
  // NaN for a NaN block.
  const at::Tensor exponent = biased.to(at::kFloat);
  at::Tensor multiplier = at::exp2(kE8M0Bias - exponent);
  multiplier = at::where(biased == 0, at::scalar_tensor(1.0f, multiplier.options()), multiplier);
  multiplier = at::where(
      biased == 254,
      at::scalar_tensor(std::ldexp(1.0f, -static_cast<int>(kE8M0Bias)), multiplier.options()),
      multiplier);
  multiplier = at::where(biased == 255, descale, multiplier);
  const at::Tensor data = (blocks.to(at::kFloat) * multiplier)
                              .clamp(-kE4M3Max, kE4M3Max)
                              .to(at::kFloat8_e4m3fn)
                              .reshape(shape);
  return {data, biased.squeeze(-1)};
}

}  // namespace

MxTensor to_mx(const at::Tensor& x, MxScaleRule rule) {
  TITAN_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16, "MX cast of a ",
              x.scalar_type(), " tensor (float32 or bfloat16)");
  TITAN_CHECK(x.dim() >= 1 && x.size(-1) % kMxBlock == 0, "MX cast of ", x.sizes(),
              ": the last dimension must be a multiple of the block size ", kMxBlock);
  const at::Tensor blocks = blocks_of(x.contiguous());
  const at::Tensor amax = blocks.abs().amax({-1}, /*keepdim=*/true).to(at::kFloat).contiguous();
  if (rule == MxScaleRule::kRceil) return to_mx_rceil(blocks, amax, x.sizes());
  // floor(log2(amax)) from the float32 exponent field (a subnormal or zero amax reads -127).
  const at::Tensor pow2 =
      amax.view(at::kInt).bitwise_right_shift(kFloat32MantissaBits).bitwise_and(0xFF) - kE8M0Bias;
  const at::Tensor exponent = (pow2 - kE4M3MaxPow2).clamp(-kE8M0Bias, kE8M0Bias + 1);
  at::Tensor biased = (exponent + kE8M0Bias).to(at::kByte);
  biased = at::where(amax.isnan(), at::scalar_tensor(255, biased.options()), biased);
  // Dividing by 2^(biased - 127), at least float32's smallest normal 2^-126.
  const at::Tensor divisor = biased.to(at::kInt)
                                 .bitwise_left_shift(kFloat32MantissaBits)
                                 .view(at::kFloat)
                                 .clamp_min(std::numeric_limits<float>::min());
  const at::Tensor data = (blocks.to(at::kFloat) / divisor)
                              .clamp(-kE4M3Max, kE4M3Max)
                              .to(at::kFloat8_e4m3fn)
                              .reshape(x.sizes());
  return {data, biased.squeeze(-1)};
}

at::Tensor from_mx(const MxTensor& t, at::ScalarType dtype) {
  const at::Tensor values = blocks_of(t.data.to(at::kFloat)) * e8m0_to_float(t.scale).unsqueeze(-1);
  return values.reshape(t.data.sizes()).to(dtype);
}

at::Tensor mx_mm_nt(const at::Tensor& a, const at::Tensor& b, at::ScalarType dtype,
                    MxScaleRule rule) {
  return at::mm(from_mx(to_mx(a, rule)), from_mx(to_mx(b, rule)).t()).to(dtype);
}

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct MxLinearFunction : public torch::autograd::Function<MxLinearFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            MxScaleRule rule) {
    ctx->save_for_backward({x, weight});
    ctx->saved_data["rule"] = static_cast<int64_t>(rule);
    return mx_mm_nt(x, weight, x.scalar_type(), rule);  // (tokens, in) x (out, in)^T
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];              // (tokens, in)
    const at::Tensor& weight = saved[1];         // (out, in)
    const at::Tensor g = grads[0].contiguous();  // (tokens, out)
    const auto rule = static_cast<MxScaleRule>(ctx->saved_data["rule"].toInt());
    at::Tensor grad_x, grad_w;
    if (ctx->needs_input_grad(0)) {
      // (tokens, out) x (in, out)^T: blocks along out.
      grad_x = mx_mm_nt(g, weight.t().contiguous(), x.scalar_type(), rule);
    }
    if (ctx->needs_input_grad(1)) {
      // (out, tokens) x (in, tokens)^T: blocks along the tokens.
      grad_w = mx_mm_nt(g.t().contiguous(), x.t().contiguous(), weight.scalar_type(), rule);
    }
    return {grad_x, grad_w, at::Tensor()};
  }
};

}  // namespace

at::Tensor mx_linear(const at::Tensor& x, const at::Tensor& weight, MxScaleRule rule) {
  TITAN_CHECK(weight.dim() == 2 && x.size(-1) == weight.size(1), "mx_linear: input ", x.sizes(),
              " and weight ", weight.sizes());
  const at::Tensor rows = x.reshape({-1, x.size(-1)});
  const auto multiple = [](int64_t n) { return n % kMxBlock == 0; };
  TITAN_CHECK(multiple(weight.size(0)) && multiple(weight.size(1)), "MXFP8 linear: the weight ",
              weight.sizes(), " needs both dims multiples of the block size ", kMxBlock);
  TITAN_CHECK(multiple(rows.size(0)) || !at::GradMode::is_enabled() || !weight.requires_grad(),
              "MXFP8 linear: ", rows.size(0), " tokens; the weight's gradient blocks them by ",
              kMxBlock,
              ", so a micro-batch's tokens (local_batch_size x seq_len, per rank) must "
              "be a multiple of it");
  std::vector<int64_t> out_sizes = x.sizes().vec();
  out_sizes.back() = weight.size(0);
  return MxLinearFunction::apply(rows.contiguous(), weight, rule).view(out_sizes);
}

}  // namespace titan
