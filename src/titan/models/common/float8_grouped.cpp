#include "titan/models/common/float8_grouped.h"

#include "titan/common/check.h"
#include "titan/models/common/float8.h"

#include <torch/autograd.h>

#include <vector>

namespace titan {
namespace {

constexpr at::ScalarType kGroupedFloat8 = at::kFloat8_e4m3fn;

std::vector<int64_t> group_ends(const at::Tensor& offs) {
  const at::Tensor host = offs.to(at::kCPU, at::kLong).contiguous();
  return std::vector<int64_t>(host.data_ptr<int64_t>(), host.data_ptr<int64_t>() + host.numel());
}

at::Tensor emulated_scaled_grouped_mm(const at::Tensor& a, const at::Tensor& b,
                                      const at::Tensor& scale_a, const at::Tensor& scale_b,
                                      const at::Tensor& offs, at::ScalarType out_dtype) {
  const std::vector<int64_t> ends = group_ends(offs);
  const int64_t groups = static_cast<int64_t>(ends.size());
  const at::Tensor af = a.to(at::kFloat), bf = b.to(at::kFloat);
  if (b.dim() == 3) {  // (M, K) x (G, K, N): groups along M
    const at::Tensor a_values = af * scale_a.unsqueeze(1);
    const at::Tensor b_values = bf * scale_b.unsqueeze(1);
    at::Tensor out = at::zeros({a.size(0), b.size(2)}, a.options().dtype(at::kFloat));
    int64_t start = 0;
    for (int64_t g = 0; g < groups; ++g) {
      if (ends[g] > start) {
        out.narrow(0, start, ends[g] - start)
            .copy_(at::mm(a_values.narrow(0, start, ends[g] - start), b_values[g]));
      }
      start = ends[g];
    }
    return out.to(out_dtype);
  }
  // (m, T) x (T, n): groups along T.
  const int64_t m = a.size(0), n = b.size(1);
  at::Tensor out = at::zeros({groups, m, n}, a.options().dtype(at::kFloat));
  int64_t start = 0;
  for (int64_t g = 0; g < groups; ++g) {
    if (ends[g] > start) {
      const at::Tensor ag =
          af.narrow(1, start, ends[g] - start) * scale_a.narrow(0, g * m, m).unsqueeze(1);
      const at::Tensor bg =
          bf.narrow(0, start, ends[g] - start) * scale_b.narrow(0, g * n, n).unsqueeze(0);
      out[g].copy_(at::mm(ag, bg));
    }
    start = ends[g];
  }
  return out.to(out_dtype);
}

// `t` (rows, C) cast with one scale per (group, column) over the group's rows: the float8 data
// (rows, C) and the scales (groups, C).
std::pair<at::Tensor, at::Tensor> per_group_columns(const at::Tensor& t, const at::Tensor& offs) {
  const int64_t groups = offs.size(0);
  const at::Tensor rows = at::arange(t.size(0), offs.options().dtype(at::kLong));
  const at::Tensor group_of =
      at::searchsorted(offs.to(at::kLong), rows, /*out_int32=*/false, /*right=*/true)
          .clamp_max_(groups - 1);
  const at::Tensor index = group_of.unsqueeze(1).expand({t.size(0), t.size(1)});
  const at::Tensor amax = at::zeros({groups, t.size(1)}, t.options().dtype(at::kFloat))
                              .scatter_reduce_(0, index, t.abs().to(at::kFloat), "amax");
  const at::Tensor scale = float8_scale(amax, kGroupedFloat8, /*power_of_2=*/true);
  return {saturated_cast(t, scale.index_select(0, group_of), kGroupedFloat8), scale};
}

// w (E, N, K) cast per (e, row of dim `along`'s complement): along 2 gives scales (E, N), along
// 1 scales (E, K). Returns the float8 operand laid out as the kernels take it and the
// dequantization multipliers.
std::pair<at::Tensor, at::Tensor> cast_weight(const at::Tensor& w, int64_t along) {
  const at::Tensor scale = float8_scale(w.abs().amax({along}).to(at::kFloat), kGroupedFloat8, true);
  if (along == 2) {  // (E, N, K) data, handed over as (E, K, N) column-major
    const at::Tensor data = saturated_cast(w, scale.unsqueeze(2), kGroupedFloat8);
    return {data.transpose(1, 2), scale.reciprocal()};
  }
  // (E, K, N) data, handed over as (E, N, K) column-major.
  const at::Tensor data =
      saturated_cast(w.transpose(1, 2).contiguous(), scale.unsqueeze(2), kGroupedFloat8);
  return {data.transpose(1, 2), scale.reciprocal()};
}

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct Float8GroupedMmFunction : public torch::autograd::Function<Float8GroupedMmFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w,
                            const at::Tensor& offs, bool emulate) {
    ctx->save_for_backward({x, w, offs});
    ctx->saved_data["emulate"] = emulate;
    const Float8Tensor x8 = to_float8(x.contiguous(), kGroupedFloat8, 1, /*power_of_2=*/true);
    const auto [w8, w_scale] = cast_weight(w, 2);
    return scaled_grouped_mm(x8.data, w8, x8.scale.reciprocal().squeeze(1), w_scale, offs,
                             x.scalar_type(), emulate);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];  // (rows, K)
    const at::Tensor& w = saved[1];  // (E, N, K)
    const at::Tensor& offs = saved[2];
    const bool emulate = ctx->saved_data["emulate"].toBool();
    const at::Tensor g = grads[0].contiguous();  // (rows, N)
    at::Tensor grad_x, grad_w;
    if (ctx->needs_input_grad(0)) {
      const Float8Tensor g8 = to_float8(g, kGroupedFloat8, 1, /*power_of_2=*/true);
      const auto [w8, w_scale] = cast_weight(w, 1);
      grad_x = scaled_grouped_mm(g8.data, w8, g8.scale.reciprocal().squeeze(1), w_scale, offs,
                                 x.scalar_type(), emulate);
    }
    if (ctx->needs_input_grad(1)) {
      // (N, rows) x (rows, K) per group of rows -> (E, N, K).
      const auto [g8, g_scale] = per_group_columns(g, offs);
      const auto [x8, x_scale] = per_group_columns(x.contiguous(), offs);
      grad_w = scaled_grouped_mm(g8.t().contiguous(), x8.t().contiguous().t(),
                                 g_scale.reciprocal().flatten(), x_scale.reciprocal().flatten(),
                                 offs, w.scalar_type(), emulate);
    }
    return {grad_x, grad_w, at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor scaled_grouped_mm(const at::Tensor& a, const at::Tensor& b, const at::Tensor& scale_a,
                             const at::Tensor& scale_b, const at::Tensor& offs,
                             at::ScalarType out_dtype, bool emulate) {
  TITAN_CHECK(a.dim() == 2 && (b.dim() == 3 || b.dim() == 2) && offs.dim() == 1,
              "scaled_grouped_mm: a ", a.sizes(), ", b ", b.sizes(), ", offs ", offs.sizes());
  if (emulate) return emulated_scaled_grouped_mm(a, b, scale_a, scale_b, offs, out_dtype);
  // ATen's float8 grouped kernels write bf16 only.
  return at::_scaled_grouped_mm(a, b, scale_a, scale_b, offs.to(at::kInt), /*bias=*/std::nullopt,
                                /*scale_result=*/std::nullopt, at::kBFloat16,
                                /*use_fast_accum=*/true)
      .to(out_dtype);
}

at::Tensor float8_grouped_mm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& offs,
                             bool emulate) {
  TITAN_CHECK(x.dim() == 2 && w.dim() == 3 && x.size(1) == w.size(2) && offs.dim() == 1 &&
                  offs.size(0) == w.size(0),
              "float8_grouped_mm: x ", x.sizes(), ", w ", w.sizes(), ", offs ", offs.sizes());
  return Float8GroupedMmFunction::apply(x, w, offs, emulate);
}

}  // namespace titan
