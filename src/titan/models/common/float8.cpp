// Float8 linear layers (see float8.h). The GEMM operands of each recipe follow torchao's
// Float8LinearConfig.from_recipe_name; the autograd function saves x and W in high precision and
// casts them again in backward (torchao's hp-argument path), so backward scales operands along
// the dimension its own GEMMs reduce.
#include "titan/models/common/float8.h"

#include "titan/common/check.h"
#include "titan/models/common/linear.h"

#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/custom_function.h>

namespace titan {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr at::ScalarType kE4M3 = at::kFloat8_e4m3fn;
constexpr at::ScalarType kE5M2 = at::kFloat8_e5m2;

// The casts of one recipe: which float8 dtype each operand takes and whether its scale is one
// per tensor or one per row of the GEMM operand (along the reduced dimension).
struct RecipeCasts {
  bool rowwise;            // input and weight of the output GEMM, grad_output everywhere
  bool weight_rowwise_gi;  // the weight of the grad_input GEMM
  bool grad_weight_hp;     // grad_weight = g^T x in high precision
  bool power_of_2;
  at::ScalarType grad_dtype;  // float8 dtype of grad_output
};

RecipeCasts casts_of(Float8Recipe recipe) {
  switch (recipe) {
    case Float8Recipe::kTensorwise: return {false, false, false, false, kE5M2};
    case Float8Recipe::kRowwise: return {true, true, false, true, kE4M3};
    case Float8Recipe::kRowwiseWithGwHp: return {true, false, true, true, kE4M3};
  }
  TITAN_CHECK(false, "unknown float8 recipe");
}

// One scale (nullopt) or one per row / column: `dim` is the dimension the maximum reduces.
std::optional<int64_t> granularity(bool per_row, int64_t dim) {
  return per_row ? std::optional<int64_t>(dim) : std::nullopt;
}

// A zero-padded copy of the float8 matrix `m` with `pad` more columns (zero bytes are +0.0 in
// every float8 format; padding runs on the bytes, which every pad kernel supports).
at::Tensor pad_columns(const at::Tensor& m, int64_t pad) {
  return at::constant_pad_nd(m.contiguous().view(at::kByte), {0, pad}, 0).view(m.scalar_type());
}

// at::_scaled_mm's contract: a (M, K) row-major, b (K, N) column-major, K a multiple of 16,
// reciprocal float32 scales of shape () each or (M, 1) and (1, N); row-wise scales give bf16.
at::Tensor scaled_mm(const Float8Tensor& a, const Float8Tensor& b, at::ScalarType out_dtype,
                     bool use_fast_accum) {
  at::Tensor ad = a.data;
  at::Tensor bd = b.data;
  const int64_t m = ad.size(0), k = ad.size(1), n = bd.size(1);
  if (k % 16 != 0) {
    ad = pad_columns(ad, 16 - k % 16);
    bd = pad_columns(bd.t(), 16 - k % 16).t();
  }
  ad = ad.contiguous();
  bd = bd.t().contiguous().t();
  at::Tensor sa = a.scale.reciprocal();
  at::Tensor sb = b.scale.reciprocal();
  if (sa.numel() == 1 && sb.numel() == 1) {
    const bool direct =
        out_dtype == at::kBFloat16 || out_dtype == at::kHalf || out_dtype == at::kFloat;
    return at::_scaled_mm(ad, bd, sa.reshape({}), sb.reshape({}), /*bias=*/std::nullopt,
                          /*scale_result=*/std::nullopt, direct ? out_dtype : at::kFloat,
                          use_fast_accum)
        .to(out_dtype);
  }
  sa = sa.expand({m, 1}).contiguous();
  sb = sb.expand({1, n}).contiguous();
  return at::_scaled_mm(ad, bd, sa, sb, /*bias=*/std::nullopt, /*scale_result=*/std::nullopt,
                        at::kBFloat16, use_fast_accum)
      .to(out_dtype);
}

// y = x W^T with float8 GEMMs (see float8.h). x (rows, in), weight (out, in); `kept`: the output
// a per-op activation checkpoint kept (then forward computes nothing), or an empty tensor
// (autograd functions take defined tensors only); `w8_data` / `w8_scale`: the weight already in
// float8 (tensorwise), or empty tensors.
struct Float8LinearFunction : public torch::autograd::Function<Float8LinearFunction> {
  // A copy of the options rides in the graph (callers may pass a temporary).
  struct Saved : torch::CustomClassHolder {
    Saved(Float8LinearOptions o, DeferTarget d) : options(std::move(o)), defer(d) {}
    Float8LinearOptions options;
    DeferTarget defer;
  };

  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const at::Tensor& kept, const at::Tensor& w8_data,
                            const at::Tensor& w8_scale, const Float8LinearOptions& given,
                            DeferTarget defer) {
    ctx->save_for_backward({x, weight, w8_data, w8_scale});
    auto saved = c10::make_intrusive<Saved>(given, defer);
    const Float8LinearOptions* options = &saved->options;
    ctx->saved_data["options"] = c10::IValue::make_capsule(std::move(saved));
    if (kept.numel() > 0) return kept;
    const RecipeCasts c = casts_of(options->recipe);
    const bool emulate = options->emulate;
    const Float8TensorParallel* tp = options->tp.get();
    const auto split = [&](std::optional<int64_t> Float8TensorParallel::*dim) {
      return tp != nullptr ? tp->*dim : std::nullopt;
    };
    // (rows, in) @ (in, out): the input scaled per row, the weight per output feature.
    const Float8Tensor x8 = to_float8(x, kE4M3, granularity(c.rowwise, 1), c.power_of_2, tp,
                                      split(&Float8TensorParallel::input_dim));
    const Float8Tensor w8 = w8_data.numel() > 0
                                ? Float8Tensor{w8_data, w8_scale}
                                : to_float8(weight, kE4M3, granularity(c.rowwise, 1), c.power_of_2,
                                            tp, split(&Float8TensorParallel::weight_dim));
    return float8_mm(x8, w8.t(), x.scalar_type(), emulate, /*use_fast_accum=*/true);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];       // (rows, in)
    const at::Tensor& weight = saved[1];  // (out, in)
    const c10::intrusive_ptr<torch::CustomClassHolder> capsule =
        ctx->saved_data["options"].toCapsule();
    const Float8LinearOptions* options = &static_cast<const Saved*>(capsule.get())->options;
    const RecipeCasts c = casts_of(options->recipe);
    const bool emulate = options->emulate;
    const Float8TensorParallel* tp = options->tp.get();
    const auto split = [&](std::optional<int64_t> Float8TensorParallel::*dim) {
      return tp != nullptr ? tp->*dim : std::nullopt;
    };
    const auto w_split = split(&Float8TensorParallel::weight_dim);
    const auto g_split = split(&Float8TensorParallel::grad_output_dim);
    const at::Tensor grad = grads[0].contiguous();  // (rows, out)
    at::Tensor grad_x, grad_weight;
    if (ctx->needs_input_grad(0)) {
      // (rows, out) @ (out, in): grad_output per row, the weight per input feature.
      const Float8Tensor g8 =
          to_float8(grad, c.grad_dtype, granularity(c.rowwise, 1), c.power_of_2, tp, g_split);
      const Float8Tensor w8 = saved[2].numel() > 0
                                  ? Float8Tensor{saved[2], saved[3]}
                                  : to_float8(weight, kE4M3, granularity(c.weight_rowwise_gi, 0),
                                              c.power_of_2, tp, w_split, /*column_major=*/true);
      grad_x = float8_mm(g8, w8, grad.scalar_type(), emulate, /*use_fast_accum=*/false);
    }
    if (ctx->needs_input_grad(1)) {
      const DeferTarget& defer = static_cast<const Saved*>(capsule.get())->defer;
      if (DeferredGrads* deferred = defer.current()) {
        // The capsule keeps the options alive until W runs.
        deferred->add_weight_grad(defer.layer, [capsule, grad, x] {
          return weight_grad(grad, x, static_cast<const Saved*>(capsule.get())->options);
        });
      } else {
        grad_weight = weight_grad(grad, x, *options);
      }
    }
    return {grad_x,       grad_weight,  at::Tensor(), at::Tensor(),
            at::Tensor(), at::Tensor(), at::Tensor()};
  }

  // grad (rows, out)^T @ x (rows, in) -> (out, in) in grad's dtype, as the recipe casts it.
  static at::Tensor weight_grad(const at::Tensor& grad, const at::Tensor& x,
                                const Float8LinearOptions& options) {
    const RecipeCasts c = casts_of(options.recipe);
    if (c.grad_weight_hp) return grad.t().mm(x);
    const Float8TensorParallel* tp = options.tp.get();
    const auto split = [&](std::optional<int64_t> Float8TensorParallel::*dim) {
      return tp != nullptr ? tp->*dim : std::nullopt;
    };
    // (out, rows) @ (rows, in): both scaled per feature over the rows.
    // g8.t() is the row-major first operand, x8 the column-major second one.
    const Float8Tensor g8 =
        to_float8(grad, c.grad_dtype, granularity(c.rowwise, 0), c.power_of_2, tp,
                  split(&Float8TensorParallel::grad_output_dim), /*column_major=*/true);
    const Float8Tensor x8 =
        to_float8(x, kE4M3, granularity(c.rowwise, 0), c.power_of_2, tp,
                  split(&Float8TensorParallel::input_dim), /*column_major=*/true);
    return float8_mm(g8.t(), x8, grad.scalar_type(), options.emulate, /*use_fast_accum=*/false);
  }
};

}  // namespace

Float8Recipe float8_recipe_from_name(const std::string& name) {
  if (name.empty() || name == "tensorwise") return Float8Recipe::kTensorwise;
  if (name == "rowwise") return Float8Recipe::kRowwise;
  if (name == "rowwise_with_gw_hp") return Float8Recipe::kRowwiseWithGwHp;
  throw ConfigError(message("quantize.linear.float8.recipe_name must be tensorwise, rowwise or ",
                            "rowwise_with_gw_hp (or unset: tensorwise); got '", name, "'"));
}

const char* float8_recipe_name(Float8Recipe recipe) {
  switch (recipe) {
    case Float8Recipe::kTensorwise: return "tensorwise";
    case Float8Recipe::kRowwise: return "rowwise";
    case Float8Recipe::kRowwiseWithGwHp: return "rowwise_with_gw_hp";
  }
  return "?";
}

double float8_max(at::ScalarType float8_dtype) {
  switch (float8_dtype) {
    case at::kFloat8_e4m3fn: return 448.0;
    case at::kFloat8_e5m2: return 57344.0;
    default: break;
  }
  TITAN_CHECK(false, "float8_max: ", float8_dtype, " is not a float8 dtype used for training");
}

at::Tensor float8_scale(const at::Tensor& amax, at::ScalarType float8_dtype, bool power_of_2) {
  constexpr double kEps = 1e-12;  // an all-zero operand gets a large finite scale
  at::Tensor scale =
      (float8_max(float8_dtype) / amax.to(at::kDouble).clamp_min(kEps)).to(at::kFloat);
  if (power_of_2) scale = at::exp2(at::floor(at::log2(scale)));
  return scale;
}

Float8Tensor to_float8(const at::Tensor& x, at::ScalarType float8_dtype,
                       std::optional<int64_t> reduce_dim, bool power_of_2,
                       const Float8TensorParallel* tp, std::optional<int64_t> split_dim,
                       bool column_major) {
  TITAN_CHECK(x.dim() == 2, "to_float8: expected a matrix, got shape ", x.sizes());
  at::NoGradGuard no_grad;
  // The absolute maximum in one reduction (|x| is not materialized), in float32: exact.
  at::Tensor amax =
      reduce_dim ? at::linalg_vector_norm(x, INFINITY, at::IntArrayRef{*reduce_dim},
                                          /*keepdim=*/true, at::kFloat)
                 : at::linalg_vector_norm(x, INFINITY, std::nullopt, /*keepdim=*/false, at::kFloat);
  if (tp != nullptr && split_dim && (!reduce_dim || *reduce_dim == *split_dim)) {
    amax = amax.contiguous();
    tp->all_reduce_max(amax);
  }
  const at::Tensor scale = float8_scale(amax, float8_dtype, power_of_2);
  // The scale comes from this operand's own maximum (or its group's, which is larger), so
  // |x * scale| <= fp8_max up to one float32 rounding: saturated_cast's clamp would change no
  // value (a non-finite x gives NaN either way), and is left out: one pass over x fewer. The
  // product is taken in float32 (a scale of at least one dimension promotes it) and rounded to
  // float8 as it is stored: one pass.
  const at::Tensor scale_1d = scale.dim() == 0 ? scale.reshape({1}) : scale;
  const auto options = x.options().dtype(float8_dtype);
  at::Tensor data = column_major ? at::empty({x.size(1), x.size(0)}, options).t()
                                 : at::empty({x.size(0), x.size(1)}, options);
  at::mul_out(data, x, scale_1d);
  return {data, scale};
}

at::Tensor saturated_cast(const at::Tensor& x, const at::Tensor& scale,
                          at::ScalarType float8_dtype) {
  const double max = float8_max(float8_dtype);
  return (x.to(at::kFloat) * scale).clamp(-max, max).to(float8_dtype);
}

at::Tensor from_float8(const Float8Tensor& x, at::ScalarType dtype) {
  return (x.data.to(at::kFloat) / x.scale).to(dtype);
}

at::Tensor float8_mm(const Float8Tensor& a, const Float8Tensor& b, at::ScalarType out_dtype,
                     bool emulate, bool use_fast_accum) {
  const int64_t m = a.data.size(0), n = b.data.size(1);
  TITAN_CHECK(a.data.size(1) == b.data.size(0), "float8_mm: shapes ", a.data.sizes(), " and ",
              b.data.sizes(), " cannot be multiplied");
  // Scales must factor out of the sum over K: per tensor, or along M for a and N for b.
  TITAN_CHECK(a.scale.numel() == 1 || a.scale.sizes() == at::IntArrayRef({m, 1}),
              "float8_mm: the first operand's scale must be one value or (", m, ", 1), got ",
              a.scale.sizes());
  TITAN_CHECK(b.scale.numel() == 1 || b.scale.sizes() == at::IntArrayRef({1, n}),
              "float8_mm: the second operand's scale must be one value or (1, ", n, "), got ",
              b.scale.sizes());
  if (!emulate) return scaled_mm(a, b, out_dtype, use_fast_accum);
  return (a.data.to(at::kFloat) / a.scale).mm(b.data.to(at::kFloat) / b.scale).to(out_dtype);
}

at::Tensor float8_linear(const at::Tensor& x, const at::Tensor& weight,
                         const Float8LinearOptions& options, const Float8Tensor* weight8,
                         const DeferTarget& defer) {
  std::vector<int64_t> out_sizes = x.sizes().vec();
  out_sizes.back() = weight.size(0);
  const at::Tensor rows = x.reshape({-1, x.size(-1)});  // (rows, in)
  const at::Tensor none = at::empty({0}, x.options());
  at::Tensor w8_data = none, w8_scale = none;
  if (weight8 != nullptr) {
    TITAN_CHECK(options.recipe == Float8Recipe::kTensorwise,
                "float8_linear: a weight cast ahead (FSDP's float8 all-gather) needs the "
                "tensorwise recipe, not ",
                float8_recipe_name(options.recipe));
    TITAN_CHECK(weight8->data.sizes() == weight.sizes() && weight8->scale.numel() == 1,
                "float8_linear: the weight cast ahead has shape ", weight8->data.sizes(), " and ",
                weight8->scale.numel(), " scales; expected ", weight.sizes(), " and one");
    w8_data = weight8->data;
    w8_scale = weight8->scale;
  }
  return savable_matmul(weight, out_sizes, [&](const at::Tensor& kept) {
    return Float8LinearFunction::apply(rows, weight,
                                       kept.defined() ? kept.reshape({-1, weight.size(0)}) : none,
                                       w8_data, w8_scale, options, defer)
        .view(out_sizes);
  });
}

}  // namespace titan
