// Mixed-precision dense layers (see linear.h).
#include "titan/models/common/linear.h"

#include "titan/kernels/fused_layers.h"
#include "titan/models/common/mx.h"

#include "titan/common/check.h"
#include "titan/common/cpu.h"
#include "titan/models/common/init.h"
#include "titan/models/common/savable_ops.h"

#include <ATen/core/grad_mode.h>
#include <ATen/record_function.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <map>
#include <set>

namespace titan {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// A single row (a decode step of one sequence), which mixed_linear multiplies as a vector: in
// float32, and in bf16 on CPUs without fast bf16 GEMMs, where ATen's bf16 matrix-vector product
// is still quick (1 thread: 0.05-0.35 ms for weights of 256 x 768 to 1536 x 512) while widening the
// weight to float32 costs 0.2-0.6 ms, and 88 ms for a 32000 x 512 head.
bool single_row(const at::Tensor& xc) {
  if (xc.numel() != xc.size(-1) || xc.dim() <= 1) return false;
  return !is_reduced_float(xc.scalar_type()) ||
         widens_reduced_matmul(xc.scalar_type(), xc.device());
}

// Rows from which a bf16 matmul on a CPU without fast bf16 GEMMs runs in float32 on the rounded
// operands: the widening costs a pass over the weight whatever the rows; ATen's generic bf16 loop
// costs per row and is slower from about 2 rows on small weights, 8 to 24 on a 32000 x 512 head.
constexpr int64_t kMinRowsToWiden = 8;

// Whether mixed_linear multiplies xc (in the compute dtype) in float32 on the rounded operands.
bool widens(const at::Tensor& xc) {
  return widens_reduced_matmul(xc.scalar_type(), xc.device()) && !single_row(xc) &&
         xc.numel() >= kMinRowsToWiden * xc.size(-1);
}

// x @ w^T of a Linear whose weight gradient may be deferred (deferred_grad.h). x (..., in) and
// weight (out, in) in the compute dtype; `kept`: the output a per-op activation checkpoint kept,
// or an empty tensor. Backward uses the formulas autograd runs for at::linear (rows folded,
// grad_x = g @ W, grad_W = g^T @ x), so the gradients match the plain op's.
struct DeferrableLinear : public torch::autograd::Function<DeferrableLinear> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const at::Tensor& kept, Linear* layer) {
    ctx->save_for_backward({x, weight});
    ctx->saved_data["layer"] = reinterpret_cast<int64_t>(layer);
    if (kept.numel() > 0) return kept;
    return at::linear(x, weight);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor x = saved[0].reshape({-1, saved[0].size(-1)});     // (rows, in)
    const at::Tensor& weight = saved[1];                                // (out, in)
    const at::Tensor grad = grads[0].reshape({-1, grads[0].size(-1)});  // (rows, out)
    at::Tensor grad_x, grad_weight;
    if (ctx->needs_input_grad(0)) grad_x = grad.mm(weight).reshape(saved[0].sizes());
    if (ctx->needs_input_grad(1)) {
      auto* layer = reinterpret_cast<Linear*>(ctx->saved_data["layer"].toInt());
      if (DeferredGrads* deferred = DeferTarget{layer->deferral.get(), layer}.current()) {
        deferred->add_weight_grad(layer, [grad, x] { return grad.t().mm(x); });
      } else {
        grad_weight = grad.t().mm(x);
      }
    }
    return {grad_x, grad_weight, at::Tensor(), at::Tensor()};
  }
};

// x rounded to bf16 and held in float32 (kernels::round_to_bf16), the gradient rounded alike.
struct RoundToBf16 : public torch::autograd::Function<RoundToBf16> {
  static at::Tensor forward(AutogradContext* /*ctx*/, const at::Tensor& x) {
    RECORD_FUNCTION("titan::round_to_bf16", std::vector<c10::IValue>());
    return kernels::round_to_bf16(x);
  }
  static variable_list backward(AutogradContext* /*ctx*/, variable_list grads) {
    return {kernels::round_to_bf16(grads[0])};
  }
};

// a (rows, k) @ b (k, n) in a's dtype; a bf16 product on a CPU without fast bf16 GEMMs runs in
// float32 on the same operands, rounded once (as mixed_linear does).
at::Tensor reduced_mm(const at::Tensor& a, const at::Tensor& b) {
  if (widens_reduced_matmul(a.scalar_type(), a.device()) && a.size(0) >= kMinRowsToWiden) {
    return a.to(at::kFloat).mm(b.to(at::kFloat)).to(a.scalar_type());
  }
  return a.mm(b);
}

// x @ W^T with W in NF4 (see nf4_linear): x (rows, in) in the compute dtype. Backward reads the
// NF4 weight through its address (the caller's holds it, as DeferrableLinear's layer) and
// dequantizes it again.
struct Nf4LinearFunction : public torch::autograd::Function<Nf4LinearFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x,
                            const kernels::Nf4Weight* weight) {
    ctx->saved_data["weight"] = reinterpret_cast<int64_t>(weight);
    return reduced_mm(x, kernels::nf4_dequantize(*weight, x.scalar_type()).t());
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto* weight =
        reinterpret_cast<const kernels::Nf4Weight*>(ctx->saved_data["weight"].toInt());
    const at::Tensor& grad = grads[0];  // (rows, out)
    return {reduced_mm(grad, kernels::nf4_dequantize(*weight, grad.scalar_type())), at::Tensor()};
  }
};

}  // namespace

at::Tensor nf4_linear(const at::Tensor& x, const std::shared_ptr<const kernels::Nf4Weight>& weight,
                      at::ScalarType compute_dtype) {
  TITAN_CHECK(weight != nullptr && weight->sizes.size() == 2, "nf4_linear: a 2-d NF4 weight");
  const int64_t in = weight->sizes[1];
  TITAN_CHECK(x.dim() >= 1 && x.size(-1) == in, "nf4_linear: input of ", in,
              " features expected, got shape ", x.sizes());
  const at::Tensor xc = to_compute(x, compute_dtype);
  std::vector<int64_t> out_sizes = xc.sizes().vec();
  out_sizes.back() = weight->sizes[0];
  return Nf4LinearFunction::apply(xc.reshape({-1, in}), weight.get()).view(out_sizes);
}

std::vector<std::string> frozen_block_linears(torch::nn::Module& root) {
  std::vector<std::string> out;
  for (const auto& item : root.named_modules()) {
    auto* layer = dynamic_cast<Linear*>(item.value().get());
    if (layer == nullptr || layer->is_adapter || layer->nf4_weight != nullptr ||
        item.key().rfind("layers.", 0) != 0) {
      continue;
    }
    auto params = layer->named_parameters(/*recurse=*/false);
    if (params.contains("weight") && !params["weight"].requires_grad()) out.push_back(item.key());
  }
  return out;
}

Nf4Quantized quantize_frozen_nf4(torch::nn::Module& root, const kernels::Nf4Options& options) {
  Nf4Quantized done;
  at::NoGradGuard no_grad;
  const std::set<std::string> chosen = [&] {
    const std::vector<std::string> v = frozen_block_linears(root);
    return std::set<std::string>(v.begin(), v.end());
  }();
  for (const auto& item : root.named_modules()) {
    if (chosen.count(item.key()) == 0) continue;
    auto* layer = dynamic_cast<Linear*>(item.value().get());
    const at::Tensor w = layer->named_parameters(/*recurse=*/false)["weight"];
    TITAN_CHECK(!w.is_meta(), "QLoRA: ", item.key(), ".weight is on the meta device; quantize the ",
                "base after its weights are loaded");
    TITAN_CONFIG_CHECK(!layer->float8, "QLoRA: ", item.key(), " computes in float8; a layer's ",
                       "frozen base is either float8 or NF4, not both");
    TITAN_CHECK(!layer->has_forward_hooks() && layer->weight.defined() && layer->weight.is_same(w),
                "QLoRA: ", item.key(), " is already wrapped by a parallelism; quantize the base ",
                "before parallelizing the model");
    auto quantized = std::make_shared<kernels::Nf4Weight>(
        kernels::nf4_to(kernels::nf4_quantize(w.cpu(), options), w.device()));
    done.layers.push_back(item.key());
    done.elements += w.numel();
    done.dense_bytes += w.numel() * static_cast<int64_t>(w.element_size());
    done.nf4_bytes += quantized->nbytes();
    layer->nf4_weight = std::move(quantized);
    layer->weight = at::Tensor();
    layer->unregister_weight();
  }
  return done;
}

void HookedModule::add_forward_hook(std::shared_ptr<ForwardHook> hook) {
  TITAN_CHECK(hook != nullptr, "add_forward_hook: null hook");
  hooks_.push_back(std::move(hook));
}

void HookedModule::remove_forward_hook(const ForwardHook* hook) {
  hooks_.erase(std::remove_if(hooks_.begin(), hooks_.end(),
                              [hook](const auto& h) { return h.get() == hook; }),
               hooks_.end());
}

at::Tensor HookedModule::hooked(const at::Tensor& x, const ForwardBody& body) {
  if (hooks_.empty()) return body(x);
  // hooks_[depth - 1] around the inner ones, down to the body itself.
  std::function<at::Tensor(size_t, const at::Tensor&)> chain = [&](size_t depth,
                                                                   const at::Tensor& in) {
    if (depth == 0) return body(in);
    return hooks_[depth - 1]->run(
        *this, in, [&chain, depth](const at::Tensor& y) { return chain(depth - 1, y); });
  };
  return chain(hooks_.size(), x);
}

void materialize(torch::nn::Module& root, at::Device device) {
  // set_data cannot move a tensor off the meta device: each layer registers a new parameter.
  for (const auto& item : root.named_modules()) {
    auto* layer = dynamic_cast<WeightLayer*>(item.value().get());
    if (layer == nullptr) continue;
    const auto own = layer->named_parameters(/*recurse=*/false);
    if (!own.contains("weight")) continue;  // a weight held another way (Linear::nf4_weight)
    const at::Tensor old = own["weight"];
    if (!old.is_meta()) continue;
    at::Tensor fresh = at::empty(old.sizes(), old.options().device(device));
    fresh.set_requires_grad(old.requires_grad());
    layer->replace_weight(fresh);
  }
  for (const auto& item : root.named_parameters()) {
    TITAN_CHECK(!item.value().is_meta(), "parameter ", item.key(),
                " is still on the meta device: only WeightLayer weights are materialized");
  }
  // set_data keeps the members that hold the buffers.
  at::NoGradGuard no_grad;
  for (auto& buffer : root.buffers()) {
    if (buffer.device() != device) buffer.set_data(buffer.to(device));
  }
}

std::set<std::string> matrix_parameters(torch::nn::Module& root) {
  std::set<std::string> out;
  for (const auto& item : root.named_modules()) {
    const auto* layer = dynamic_cast<const WeightLayer*>(item.value().get());
    if (layer == nullptr || !layer->weight_is_matrix()) continue;
    out.insert((item.key().empty() ? "" : item.key() + ".") + "weight");
  }
  return out;
}

std::vector<ParamSlot> parameter_slots(torch::nn::Module& root) {
  std::map<std::string, at::Tensor*> by_name;
  for (const auto& item : root.named_modules()) {
    if (auto* layer = dynamic_cast<WeightLayer*>(item.value().get())) {
      const std::string prefix = item.key().empty() ? "" : item.key() + ".";
      by_name[prefix + "weight"] = &layer->weight;
    }
  }
  std::vector<ParamSlot> slots;
  for (const auto& item : root.named_parameters()) {
    auto it = by_name.find(item.key());
    // A member a parallelism has cleared (another data-parallel instance holds its shards) is
    // still the parameter's slot.
    TITAN_CHECK(it != by_name.end() &&
                    (!it->second->defined() ||
                     it->second->unsafeGetTensorImpl() == item.value().unsafeGetTensorImpl()),
                "parameter ", item.key(), " is not the weight member of a WeightLayer, so a ",
                "parallelism cannot rebind it; hold parameters in WeightLayer subclasses");
    slots.push_back({item.key(), it->second});
  }
  return slots;
}

at::Tensor widened_weight(const at::Tensor& weight, at::ScalarType compute_dtype) {
  if (compute_dtype == at::kBFloat16 && weight.scalar_type() == at::kFloat &&
      weight.device().is_cpu()) {
    return RoundToBf16::apply(weight);
  }
  return to_compute(weight, compute_dtype).to(at::kFloat);
}

at::Tensor mixed_linear(const at::Tensor& x, const at::Tensor& weight,
                        at::ScalarType compute_dtype) {
  const at::Tensor xc = to_compute(x, compute_dtype);
  if (widens(xc)) {
    // ATen would run this bf16 GEMM in a generic loop (about 50x slower than float32 here). The
    // operands as rounded to bf16, multiplied in float32 and rounded once: what a bf16 GEMM with
    // float32 accumulation computes, and so do the gradients through the casts.
    return savable_linear(xc.to(at::kFloat), widened_weight(weight, compute_dtype))
        .to(compute_dtype);
  }
  const at::Tensor wc = to_compute(weight, compute_dtype);
  if (single_row(xc)) {
    // A single row (a decode step of one sequence): a matrix-vector product. As a 1-row GEMM,
    // BLAS would repack the whole weight matrix on every call, which dominated decoding.
    std::vector<int64_t> sizes = xc.sizes().vec();
    sizes.back() = wc.size(0);
    return at::mv(wc, xc.reshape({-1})).view(sizes);
  }
  return savable_linear(xc, wc);  // at::linear, unless a block is checkpointed op by op
}

bool PackedLinear::pack(const std::vector<Linear*>& layers) {
  TITAN_CHECK(!layers.empty(), "PackedLinear: no layers");
  const at::Tensor& first = layers.front()->weight;
  for (const Linear* layer : layers) {
    const at::Tensor& w = layer->weight;
    if (!w.defined() || w.is_meta() || w.dim() != 2 || !w.is_contiguous() ||
        w.scalar_type() != first.scalar_type() || w.device() != first.device() ||
        w.size(1) != first.size(1) || layer->has_forward_hooks() || layer->float8 || layer->mx ||
        layer->lora_a != nullptr || layer->deferral != nullptr ||
        layer->compute_dtype != layers.front()->compute_dtype) {
      return false;
    }
  }
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> blocks;
  for (const Linear* layer : layers) blocks.push_back(layer->weight);
  weight_ = at::cat(blocks, 0);
  int64_t row = 0;
  for (Linear* layer : layers) {
    const int64_t rows = layer->weight.size(0);
    // set_data: the registered parameter and the member are one tensor object; both now read
    // their rows of the packed matrix.
    layer->weight.set_data(weight_.narrow(0, row, rows));
    row += rows;
  }
  layers_ = layers;
  return true;
}

bool PackedLinear::intact() const {
  if (!weight_.defined()) return false;
  int64_t row = 0;
  for (const Linear* layer : layers_) {
    const at::Tensor& w = layer->weight;
    if (!w.defined() || layer->has_forward_hooks() || layer->float8 || layer->mx || layer->lora_a ||
        w.dim() != 2 || w.size(1) != weight_.size(1) || row + w.size(0) > weight_.size(0) ||
        w.scalar_type() != weight_.scalar_type() ||
        w.const_data_ptr() != static_cast<const char*>(weight_.const_data_ptr()) +
                                  row * weight_.stride(0) * weight_.element_size()) {
      return false;
    }
    row += w.size(0);
  }
  return row == weight_.size(0);
}

std::vector<at::Tensor> PackedLinear::forward(const at::Tensor& x) const {
  const at::Tensor out = mixed_linear(x, weight_, layers_.front()->compute_dtype);
  std::vector<at::Tensor> outs;
  int64_t col = 0;
  for (const Linear* layer : layers_) {
    const int64_t n = layer->weight.size(0);
    outs.push_back(out.narrow(-1, col, n));
    col += n;
  }
  return outs;
}

at::Tensor savable_matmul(const at::Tensor& weight, at::IntArrayRef out_sizes,
                          const std::function<at::Tensor(const at::Tensor& kept)>& run) {
  OpSaver* saver = current_op_saver();
  if (saver == nullptr || !saver->keeps(SavableOp::kMatmul, weight)) return run(at::Tensor());
  if (saver->replaying()) {
    const std::vector<at::Tensor> kept = saver->take(SavableOp::kMatmul);
    TITAN_CHECK(kept.size() == 1 && kept[0].sizes() == out_sizes,
                "activation checkpointing: the recomputed matmul has output shape ", out_sizes,
                " but the forward kept ", kept.empty() ? at::IntArrayRef{} : kept[0].sizes(),
                "; the checkpointed block ran differently when recomputed");
    return run(kept[0]);
  }
  at::Tensor out = run(at::Tensor());
  saver->keep(SavableOp::kMatmul, {out});
  return out;
}

void WeightLayer::unregister_weight() { parameters_.erase("weight"); }

void WeightLayer::replace_weight(const at::Tensor& w) {
  at::Tensor& registered = parameters_["weight"];
  if (weight.defined() && weight.is_same(registered)) weight = w;
  registered = w;
}

Bias::Bias(at::IntArrayRef sizes) { weight = register_parameter("weight", new_parameter(sizes)); }

Linear::Linear(int64_t in_features, int64_t out_features, at::ScalarType compute_dtype)
    : compute_dtype(compute_dtype) {
  // Values are set by the owning model's init_weights(); empty keeps construction cheap.
  weight = register_parameter("weight", new_parameter({out_features, in_features}));
}

at::Tensor Linear::forward(const at::Tensor& x) {
  return hooked(x, [this](const at::Tensor& in) {
    if (lora_a == nullptr) return base_forward(in);
    at::Tensor h = in;
    if (lora_dropout > 0 && at::GradMode::is_enabled()) h = at::dropout(h, lora_dropout, true);
    return base_forward(in) + lora_b->forward(lora_a->forward(h)) * lora_scaling;
  });
}

bool Linear::plain_product() const {
  return !nf4_weight && !mx && !float8 && (deferral == nullptr || !at::GradMode::is_enabled());
}

bool Linear::widens_plainly(const at::Tensor& xc) const {
  return compute_dtype == at::kBFloat16 && xc.scalar_type() == at::kBFloat16 &&
         !has_forward_hooks() && lora_a == nullptr && plain_product() && widens(xc);
}

at::Tensor Linear::widened_product(const at::Tensor& xw) {
  return savable_linear(xw, widened_weight(weight, compute_dtype));
}

at::Tensor Linear::base_forward(const at::Tensor& in) {
  if (plain_product()) return mixed_linear(in, weight, compute_dtype);
  if (nf4_weight) return nf4_linear(in, nf4_weight, compute_dtype);
  if (mx) return mx_linear(to_compute(in, compute_dtype), to_compute(weight, compute_dtype), *mx);
  if (float8) {
    return float8_linear(to_compute(in, compute_dtype), to_compute(weight, compute_dtype), *float8,
                         float8_weight ? &*float8_weight : nullptr,
                         DeferTarget{deferral.get(), this});
  }
  const at::Tensor xc = to_compute(in, compute_dtype);  // a deferred weight gradient
  const at::Tensor wc = to_compute(weight, compute_dtype);
  if (single_row(xc)) return mixed_linear(in, weight, compute_dtype);
  std::vector<int64_t> out_sizes = xc.sizes().vec();
  out_sizes.back() = wc.size(0);
  return savable_matmul(wc, out_sizes, [&](const at::Tensor& kept) {
    return DeferrableLinear::apply(xc, wc, kept.defined() ? kept : at::empty({0}, xc.options()),
                                   this);
  });
}

at::Tensor Linear::forward_loss(const at::Tensor& x, const at::Tensor& labels) {
  TITAN_CHECK(!mx, "the fused linear + cross-entropy runs its GEMMs in ", compute_dtype,
              ", not MXFP8: keep the head out of the MX conversion (filter_fqns \"output\")");
  TITAN_CHECK(!float8, "the fused linear + cross-entropy runs its GEMMs in ", compute_dtype,
              ", not float8: keep the head out of the float8 conversion (filter_fqns \"output\")");
  TITAN_CHECK(lora_a == nullptr,
              "the fused linear + cross-entropy has no LoRA adapter path; the head cannot carry "
              "an adapter there");
  loss_labels_ = &labels;
  struct Clear {
    const at::Tensor*& labels;
    ~Clear() { labels = nullptr; }
  } clear{loss_labels_};
  return hooked(x, [this](const at::Tensor& in) {
    return fused_linear_cross_entropy(in, weight, *loss_labels_, compute_dtype, vocab_shard);
  });
}

std::vector<std::pair<std::string, Linear*>> float8_linears(torch::nn::Module& root) {
  std::vector<std::pair<std::string, Linear*>> out;
  for (const auto& item : root.named_modules()) {
    auto* linear = dynamic_cast<Linear*>(item.value().get());
    if (linear == nullptr || !linear->float8) continue;
    out.emplace_back(item.key().empty() ? "weight" : item.key() + ".weight", linear);
  }
  return out;
}

void Linear::pretty_print(std::ostream& stream) const {
  const auto params = named_parameters(/*recurse=*/false);
  const std::vector<int64_t> sizes =
      nf4_weight ? nf4_weight->sizes : params["weight"].sizes().vec();
  stream << "titan::Linear(in_features=" << sizes[1] << ", out_features=" << sizes[0];
  if (nf4_weight) stream << ", nf4";
  if (mx) stream << ", mx=mxfp8" << (*mx == MxScaleRule::kRceil ? " rceil" : "") << " emulated";
  if (float8) {
    stream << ", float8=" << float8_recipe_name(float8->recipe)
           << (float8->emulate ? " emulated" : "");
  }
  if (lora_a) stream << ", lora_rank=" << lora_a->named_parameters(false)["weight"].size(0);
  stream << ")";
}

Embedding::Embedding(int64_t num_embeddings, int64_t dim) {
  weight = register_parameter("weight", new_parameter({num_embeddings, dim}));
}

at::Tensor Embedding::forward(const at::Tensor& tokens) {
  return hooked(tokens, [this](const at::Tensor& in) { return at::embedding(weight, in); });
}

}  // namespace titan
