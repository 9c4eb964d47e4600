// Mixture-of-experts layer (see moe.h).
#include "titan/models/common/moe.h"

#include "titan/common/check.h"
#include "titan/common/cpu.h"
#include "titan/common/host_sync.h"
#include "titan/models/common/float8.h"
#include "titan/models/common/float8_grouped.h"
#include "titan/models/common/fused_ops.h"
#include "titan/models/common/init.h"
#include "titan/models/common/mx.h"
#include "titan/models/common/savable_ops.h"

#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <limits>
#include <optional>
#include <string>

namespace titan {
namespace {

// Rows of an expert group handed to a grouped GEMM are padded to a multiple of this (CUDA's
// grouped kernels need 16-byte aligned group offsets for 16-bit types).
constexpr int64_t kGroupAlign = 16;
// Elements per 16 bytes of the narrowest compute dtype (16-bit).
constexpr int64_t kRankAlign = 8;

// The dtype the experts' GEMMs multiply in for operands of `dtype` on `device`: float32 on the
// operands as rounded to bf16 where the CPU has no fast bf16 GEMMs (ATen's generic loop there;
// the result is rounded once, as Linear does), else the operands' own.
at::ScalarType gemm_dtype(at::ScalarType dtype, const at::Device& device) {
  return widens_reduced_matmul(dtype, device) ? at::kFloat : dtype;
}

// x (rows, in) @ w (out, in)^T in gemm_dtype, the result in x's dtype.
at::Tensor expert_linear(const at::Tensor& x, const at::Tensor& w) {
  const at::ScalarType dtype = gemm_dtype(x.scalar_type(), x.device());
  if (dtype == x.scalar_type()) return at::linear(x, w);
  return at::linear(x.to(dtype), w.to(dtype)).to(x.scalar_type());
}

// Expert e's tokens zero-padded to a multiple of the MX block.
at::Tensor mx_expert_linear(const at::Tensor& x, const at::Tensor& w) {
  const int64_t n = x.size(0);
  const int64_t pad = (kMxBlock - n % kMxBlock) % kMxBlock;
  if (pad == 0) return mx_linear(x, w, MxScaleRule::kRceil);
  const at::Tensor out = mx_linear(at::constant_pad_nd(x, {0, 0, 0, pad}), w, MxScaleRule::kRceil);
  return out.narrow(0, 0, n);
}

}  // namespace

const char* expert_gemm_name(ExpertGemm gemm) {
  switch (gemm) {
    case ExpertGemm::kHighPrecision: return "high precision";
    case ExpertGemm::kFloat8Rowwise: return "float8 rowwise";
    case ExpertGemm::kMxfp8: return "MXFP8";
  }
  return "?";
}

at::Tensor quantized_expert_linear(const at::Tensor& x, const at::Tensor& w,
                                   const ExpertQuantization& q) {
  switch (q.gemm) {
    case ExpertGemm::kHighPrecision: return expert_linear(x, w);
    case ExpertGemm::kFloat8Rowwise: {
      Float8LinearOptions options;
      options.recipe = Float8Recipe::kRowwise;
      options.emulate = q.emulate;
      return float8_linear(x, w, options);
    }
    case ExpertGemm::kMxfp8: return mx_expert_linear(x, w);
  }
  TITAN_CHECK(false, "unknown expert GEMM");
}

at::Tensor quantized_grouped_linear(const at::Tensor& x, const at::Tensor& w,
                                    const std::vector<int64_t>& counts,
                                    const ExpertQuantization& q) {
  TITAN_CHECK(w.dim() == 3 && static_cast<int64_t>(counts.size()) == w.size(0) && x.dim() == 2 &&
                  x.size(1) == w.size(2),
              "quantized_grouped_linear: x ", x.sizes(), ", w ", w.sizes(), ", ", counts.size(),
              " counts");
  const std::vector<at::Tensor> per_expert = w.unbind(0);
  std::vector<at::Tensor> outs;
  int64_t offset = 0;
  for (size_t e = 0; e < counts.size(); ++e) {
    if (counts[e] == 0) continue;
    outs.push_back(quantized_expert_linear(x.narrow(0, offset, counts[e]), per_expert[e], q));
    offset += counts[e];
  }
  TITAN_CHECK(offset == x.size(0), "quantized_grouped_linear: the counts add up to ", offset,
              " rows, x has ", x.size(0));
  if (outs.empty()) return at::zeros({0, w.size(1)}, x.options());
  return outs.size() == 1 ? outs[0] : at::cat(outs, 0);
}

ExpertWeight::ExpertWeight(int64_t experts, int64_t out_features, int64_t in_features) {
  weight = register_parameter("weight", new_parameter({experts, out_features, in_features}));
}

GroupedExperts::GroupedExperts(int64_t experts, int64_t dim, int64_t hidden_dim,
                               at::ScalarType compute_dtype, bool use_grouped_mm, bool biases)
    : compute_dtype(compute_dtype), use_grouped_mm(use_grouped_mm) {
  w1 = register_module("w1", std::make_shared<ExpertWeight>(experts, hidden_dim, dim));
  w2 = register_module("w2", std::make_shared<ExpertWeight>(experts, dim, hidden_dim));
  w3 = register_module("w3", std::make_shared<ExpertWeight>(experts, hidden_dim, dim));
  if (biases) {
    b1 = register_module("b1", std::make_shared<Bias>(at::IntArrayRef{experts, hidden_dim}));
    b2 = register_module("b2", std::make_shared<Bias>(at::IntArrayRef{experts, dim}));
    b3 = register_module("b3", std::make_shared<Bias>(at::IntArrayRef{experts, hidden_dim}));
  }
}

at::Tensor GroupedExperts::activate(const at::Tensor& h1, const at::Tensor& h3) const {
  if (swiglu_limit <= 0) return at::silu(h1) * h3;
  const at::Tensor g = h1.clamp_max(swiglu_limit);
  return g * at::sigmoid(g * swiglu_alpha) * (h3.clamp(-swiglu_limit, swiglu_limit) + 1);
}

at::Tensor GroupedExperts::forward(const at::Tensor& x, const std::vector<int64_t>& counts) {
  TITAN_CHECK(static_cast<int64_t>(counts.size()) == experts(), "GroupedExperts: ", counts.size(),
              " token counts for ", experts(), " experts");
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  TITAN_CHECK(x.dim() == 2 && x.size(0) == total, "GroupedExperts: x ", x.sizes(),
              " does not hold the ", total, " tokens the counts add up to");
  if (groups_on_device()) return forward_grouped(x, counts);
  return forward_loop(x, counts);
}

bool GroupedExperts::groups_on_device() const {
  // The grouped kernel for 16-bit compute, on CUDA and on the CPU (bench/moe_bench compares it
  // with the loop in both dtypes).
  switch (quantization.gemm) {
    case ExpertGemm::kHighPrecision: return use_grouped_mm && is_reduced_float(compute_dtype);
    case ExpertGemm::kFloat8Rowwise: return use_grouped_mm && quantization.grouped;
    case ExpertGemm::kMxfp8: return false;
  }
  return false;
}

at::Tensor GroupedExperts::forward_loop(const at::Tensor& x, const std::vector<int64_t>& counts) {
  const at::Tensor xc = to_compute(x, compute_dtype);
  // unbind: one backward that stacks the experts' gradients; indexing each expert would add a
  // zero-filled gradient of the whole (experts, out, in) weight per expert.
  const std::vector<at::Tensor> a = to_compute(w1->weight, compute_dtype).unbind(0);
  const std::vector<at::Tensor> b = to_compute(w2->weight, compute_dtype).unbind(0);
  const std::vector<at::Tensor> c = to_compute(w3->weight, compute_dtype).unbind(0);
  const auto per_expert = [&](const std::shared_ptr<ExpertWeight>& w) {
    return w ? to_compute(w->weight, compute_dtype).unbind(0) : std::vector<at::Tensor>();
  };
  const std::vector<at::Tensor> a13 = per_expert(w1->lora_a), b1 = per_expert(w1->lora_b),
                                b3 = per_expert(w3->lora_b), a2 = per_expert(w2->lora_a),
                                b2 = per_expert(w2->lora_b);
  const auto biases = [&](const std::shared_ptr<Bias>& bias) {
    return bias ? to_compute(bias->weight, compute_dtype).unbind(0) : std::vector<at::Tensor>();
  };
  const std::vector<at::Tensor> c1 = biases(this->b1), c2 = biases(this->b2), c3 = biases(this->b3);
  // The base weights' GEMMs (quantized when converted); the adapters' stay in the compute dtype.
  const auto base = [&](const at::Tensor& in, const at::Tensor& w) {
    return quantized_expert_linear(in, w, quantization);
  };
  std::vector<at::Tensor> outs;
  int64_t offset = 0;
  for (size_t e = 0; e < counts.size(); ++e) {
    if (counts[e] == 0) continue;
    const at::Tensor xe = xc.narrow(0, offset, counts[e]);
    at::Tensor h1 = base(xe, a[e]);
    at::Tensor h3 = base(xe, c[e]);
    if (gate_up_adapted()) {
      const at::Tensor xa = expert_linear(xe, a13[e]);
      h1 = h1 + expert_linear(xa, b1[e]) * lora_scaling;
      h3 = h3 + expert_linear(xa, b3[e]) * lora_scaling;
    }
    if (!c1.empty()) {
      h1 = h1 + c1[e];
      h3 = h3 + c3[e];
    }
    const at::Tensor h = activate(h1, h3);
    at::Tensor out = base(h, b[e]);
    if (down_adapted()) out = out + expert_linear(expert_linear(h, a2[e]), b2[e]) * lora_scaling;
    if (!c2.empty()) out = out + (down_bias_here ? c2[e] : c2[e] * 0);
    outs.push_back(out);
    offset += counts[e];
  }
  if (outs.empty()) return at::zeros({0, w2->weight.size(1)}, xc.options());
  return outs.size() == 1 ? outs[0] : at::cat(outs, 0);
}

at::Tensor GroupedExperts::forward_grouped(const at::Tensor& x,
                                           const std::vector<int64_t>& counts) {
  return forward_grouped(x, at::tensor(counts, at::kLong).to(x.device()));
}

at::Tensor GroupedExperts::forward_grouped(const at::Tensor& x, const at::Tensor& counts) {
  TITAN_CHECK(counts.dim() == 1 && counts.size(0) == experts() && x.dim() == 2,
              "GroupedExperts: counts ", counts.sizes(), " for ", experts(), " experts, x ",
              x.sizes());
  // Each expert's rows padded to a multiple of kGroupAlign in a buffer sized for the worst case
  // (every expert a row short of a multiple), all on the device from the counts: no host read.
  // The slack after the last expert's padded rows joins the last group: zero rows, whose outputs
  // are dropped with the padding.
  const int64_t n = x.size(0);
  const int64_t buffer_rows =
      (n + experts() * (kGroupAlign - 1) + kGroupAlign - 1) / kGroupAlign * kGroupAlign;
  const at::Tensor padded = (counts + (kGroupAlign - 1)).div(kGroupAlign, "floor") * kGroupAlign;
  const at::Tensor padded_end = padded.cumsum(0);
  const at::Tensor padded_start = padded_end - padded;
  const at::Tensor start = counts.cumsum(0) - counts;
  // Row i of x belongs to expert expert_of[i] (x is grouped by expert, in order).
  const at::Tensor rows = at::arange(n, counts.options());
  const at::Tensor expert_of =
      at::searchsorted(counts.cumsum(0), rows, /*out_int32=*/false, /*right=*/true);
  const at::Tensor dest = padded_start.index_select(0, expert_of) + rows -
                          start.index_select(0, expert_of);  // (n): x's rows in the buffer
  // Every buffer row's source row of x, or n (a zero row appended to x) for padding.
  const at::Tensor source = at::full({buffer_rows}, n, counts.options()).scatter_(0, dest, rows);
  const at::Tensor xc = to_compute(x, compute_dtype);
  const at::Tensor xp =
      at::cat({xc, at::zeros({1, xc.size(1)}, xc.options())}, 0).index_select(0, source);
  at::Tensor offs = padded_end.to(at::kInt);
  offs = at::cat({offs.narrow(0, 0, experts() - 1), at::full({1}, buffer_rows, offs.options())});
  const at::ScalarType dtype = gemm_dtype(xc.scalar_type(), xc.device());
  const bool widen = dtype != xc.scalar_type();
  // The grouped product in the GEMM dtype (float32 when widening); gmm's result in in's dtype.
  const auto product = [&](const at::Tensor& in, const at::Tensor& w) {
    // w (experts, out, in) -> (experts, in, out): the layout _grouped_mm multiplies by.
    const at::Tensor wc = widen ? widened_weight(w, compute_dtype) : to_compute(w, compute_dtype);
    return at::_grouped_mm(in.to(dtype), wc.transpose(-2, -1), offs);
  };
  const auto gmm = [&](const at::Tensor& in, const at::Tensor& w) {
    return product(in, w).to(in.scalar_type());
  };
  // LoRA adapters' rank padded with zeros to a multiple of kRankAlign: the (rows, r) product
  // between A and B is an operand of the grouped kernel, whose rows CUDA wants 16-byte aligned.
  const auto pad_a = [](const at::Tensor& a) {  // (experts, r, in)
    const int64_t pad = (kRankAlign - a.size(1) % kRankAlign) % kRankAlign;
    return pad == 0 ? a : at::constant_pad_nd(a, {0, 0, 0, pad});
  };
  const auto pad_b = [](const at::Tensor& b) {  // (experts, out, r)
    const int64_t pad = (kRankAlign - b.size(2) % kRankAlign) % kRankAlign;
    return pad == 0 ? b : at::constant_pad_nd(b, {0, pad});
  };
  // The base weights' GEMMs: float8 grouped ones when converted (groups_on_device), the adapters'
  // in the compute dtype.
  const auto base = [&](const at::Tensor& in, const at::Tensor& w) {
    if (quantization.gemm == ExpertGemm::kHighPrecision) return gmm(in, w);
    return float8_grouped_mm(in, to_compute(w, compute_dtype), offs, quantization.emulate);
  };
  if (widen && compute_dtype == at::kBFloat16 && quantization.gemm == ExpertGemm::kHighPrecision &&
      swiglu_limit <= 0 && !gate_up_adapted() && !down_adapted() && !b1) {
    // The widened products stay in float32 through the activation (the roundings the bf16 ops
    // would make happen inside widened_swiglu): two passes over the hidden activations instead
    // of about ten. fp16 compute takes the casts below (widened_swiglu rounds to bf16).
    const at::Tensor xw = xp.to(dtype);  // one cast for both w1 and w3
    const at::Tensor h = widened_swiglu(product(xw, w1->weight), product(xw, w3->weight));
    return product(h, w2->weight).to(xc.scalar_type()).index_select(0, dest);
  }
  at::Tensor h1 = base(xp, w1->weight);
  at::Tensor h3 = base(xp, w3->weight);
  if (gate_up_adapted()) {
    const at::Tensor xa = gmm(xp, pad_a(w1->lora_a->weight));  // (rows, r), shared by w1 and w3
    h1 = h1 + gmm(xa, pad_b(w1->lora_b->weight)) * lora_scaling;
    h3 = h3 + gmm(xa, pad_b(w3->lora_b->weight)) * lora_scaling;
  }
  // Each buffer row's expert (padding rows too; their outputs are dropped) for the biases.
  at::Tensor row_expert;
  if (b1) {
    row_expert = at::searchsorted(offs.to(at::kLong), at::arange(buffer_rows, counts.options()),
                                  /*out_int32=*/false, /*right=*/true)
                     .clamp_max_(experts() - 1);
    h1 =
        h1 + to_compute(b1->weight, compute_dtype).index_select(0, row_expert).to(h1.scalar_type());
    h3 =
        h3 + to_compute(b3->weight, compute_dtype).index_select(0, row_expert).to(h3.scalar_type());
  }
  const at::Tensor h = activate(h1, h3);
  at::Tensor out = base(h, w2->weight);
  if (down_adapted()) {
    out = out + gmm(gmm(h, pad_a(w2->lora_a->weight)), pad_b(w2->lora_b->weight)) * lora_scaling;
  }
  if (b2) {
    const at::Tensor rows_b2 =
        to_compute(b2->weight, compute_dtype).index_select(0, row_expert).to(out.scalar_type());
    out = out + (down_bias_here ? rows_b2 : rows_b2 * 0);
  }
  return out.index_select(0, dest);
}

std::vector<int64_t> host_counts(const at::Tensor& counts) {
  const at::Tensor host = to_host(counts).to(at::kLong).contiguous();
  return std::vector<int64_t>(host.data_ptr<int64_t>(), host.data_ptr<int64_t>() + host.numel());
}

at::Tensor LocalExperts::run(GroupedExperts& experts, const at::Tensor& x,
                             const at::Tensor& counts) {
  if (experts.groups_on_device()) return experts.forward_grouped(x, counts);
  return experts.forward_loop(x, host_counts(counts));
}

MoE::MoE(int64_t dim, const MoEArgs& args, at::ScalarType compute_dtype)
    : args_(args), compute_dtype_(compute_dtype) {
  args_.validate();
  gate = register_module("gate", std::make_shared<Linear>(dim, args.num_experts, compute_dtype));
  if (args.router_bias) {
    gate_bias =
        register_module("gate_bias", std::make_shared<Bias>(at::IntArrayRef{args.num_experts}));
  }
  experts = register_module("experts", std::make_shared<GroupedExperts>(
                                           args.num_experts, dim, args.hidden_dim, compute_dtype,
                                           args.use_grouped_mm, args.expert_biases));
  experts->swiglu_limit = args.swiglu_limit;
  experts->swiglu_alpha = args.swiglu_alpha;
  if (args.num_shared_experts > 0) {
    shared_experts = register_module(
        "shared_experts", std::make_shared<FeedForward>(
                              dim, args.hidden_dim * args.num_shared_experts, compute_dtype));
  }
  if (args.shared_expert_gate) {
    shared_gate = register_module("shared_gate", std::make_shared<Linear>(dim, 1, compute_dtype));
  }

  expert_bias = register_buffer("expert_bias", at::zeros({args.num_experts}, at::kFloat));
  tokens_per_expert =
      register_buffer("tokens_per_expert", at::zeros({args.num_experts}, at::kFloat));
}

Routing MoE::route(const at::Tensor& x) {
  const int64_t n_tokens = x.size(0);
  const int64_t n_experts = args_.num_experts;
  const int64_t k = args_.top_k;
  // Scores in float32 for 16-bit compute (float64 in tests stays float64).
  const at::Tensor logits = gate->forward(x);
  at::Tensor logits_wide = logits.to(upcast_dtype(logits.scalar_type()));
  if (gate_bias) logits_wide = logits_wide + gate_bias->weight.to(logits_wide.scalar_type());
  const at::Tensor scores = args_.score_func == MoEArgs::Score::kSigmoid ? logits_wide.sigmoid()
                                                                         : logits_wide.softmax(-1);
  Routing r;
  {
    at::NoGradGuard no_grad;
    if (force_load_balance) {
      r.experts = at::arange(n_tokens * k, x.options().dtype(at::kLong))
                      .remainder(n_experts)
                      .view({n_tokens, k});
    } else {
      at::Tensor choice = scores.detach();
      if (args_.load_balance_coeff > 0) choice = choice + expert_bias.to(choice.device());
      if (args_.num_expert_groups > 0) {
        const int64_t groups = args_.num_expert_groups;
        const at::Tensor grouped = choice.view({n_tokens, groups, n_experts / groups});
        const at::Tensor group_scores = args_.score_func == MoEArgs::Score::kSigmoid
                                            ? std::get<0>(grouped.topk(2, -1)).sum(-1)
                                            : std::get<0>(grouped.max(-1));
        const at::Tensor best = std::get<1>(group_scores.topk(args_.num_limited_groups, -1));
        const at::Tensor allowed = at::zeros({n_tokens, groups}, choice.options().dtype(at::kBool))
                                       .scatter_(1, best, true);
        choice = grouped
                     .masked_fill(allowed.unsqueeze(-1).logical_not(),
                                  -std::numeric_limits<double>::infinity())
                     .view({n_tokens, n_experts});
      }
      r.experts = std::get<1>(choice.topk(k, -1));
    }
  }
  r.weights = scores.gather(1, r.experts);
  if (args_.route_norm) r.weights = r.weights / (r.weights.sum(-1, /*keepdim=*/true) + 1e-20);
  if (args_.route_scale != 1.0) r.weights = r.weights * args_.route_scale;
  return r;
}

at::Tensor MoE::forward(const at::Tensor& x) {
  return hooked(x, [this](const at::Tensor& in) {
    const int64_t dim = in.size(-1);
    const at::Tensor tokens = to_compute(in, compute_dtype_).reshape({-1, dim});
    const int64_t k = args_.top_k;
    const Routing r = route(tokens);
    const at::Tensor flat = r.experts.reshape({-1});  // (tokens * k)
    // Tokens per expert on the device (bincount would read the largest id back to the host).
    const at::Tensor counts =
        flat.unsqueeze(1).eq(at::arange(args_.num_experts, flat.options())).sum(0);
    // Each training forward counts once: not a checkpointed block's recomputation during
    // backward (its first forward, under no-grad, counted), not evaluation (count_tokens off).
    if (count_tokens && !recomputing()) {
      at::NoGradGuard no_grad;
      tokens_per_expert.add_(counts.to(tokens_per_expert.device(), at::kFloat));
    }
    // Group the (token, choice) pairs by expert, in token order within each expert.
    const at::Tensor order =
        std::get<1>(at::sort(flat, /*stable=*/std::optional<bool>(true), /*dim=*/0));
    const at::Tensor token_of = order.div(k, "floor");
    at::Tensor routed = tokens.index_select(0, token_of);  // (tokens * k, dim)
    const at::Tensor w = r.weights.reshape({-1}).index_select(0, order).unsqueeze(1);
    const at::ScalarType wide = w.scalar_type();  // float32, or wider
    if (args_.score_before_experts) routed = (routed.to(wide) * w).to(routed.scalar_type());
    at::Tensor out = runner->run(*experts, routed, counts);
    if (!args_.score_before_experts) out = (out.to(wide) * w).to(out.scalar_type());
    at::Tensor y = at::zeros({tokens.size(0), dim}, out.options()).index_add(0, token_of, out);
    if (shared_experts) {
      at::Tensor shared = shared_experts->forward(tokens);
      if (shared_gate) shared = shared * at::sigmoid(shared_gate->forward(tokens));
      y = y + shared;
    }
    return y.view(in.sizes());
  });
}

void MoE::update_expert_bias(const at::Tensor& loads) {
  at::NoGradGuard no_grad;
  const at::Tensor load = (loads.defined() ? loads : tokens_per_expert).to(at::kFloat);
  if (args_.load_balance_coeff > 0 && !expert_bias_frozen) {
    at::Tensor delta = (load.mean() - load).sign().mul_(args_.load_balance_coeff);
    delta.sub_(delta.mean());
    expert_bias.add_(delta.to(expert_bias.device()));
  }
  tokens_per_expert.zero_();
}

at::Tensor load_imbalance(const at::Tensor& tokens_per_expert) {
  const at::Tensor t = tokens_per_expert.to(at::kDouble);
  const at::Tensor mean = t.mean();
  return at::where(mean > 0, t.max() / mean, at::ones_like(mean));
}

std::vector<std::pair<std::string, MoE*>> moe_layers(const torch::nn::Module& model) {
  std::vector<std::pair<std::string, MoE*>> out;
  for (const auto& item : model.named_modules()) {
    if (auto* moe = dynamic_cast<MoE*>(item.value().get())) out.emplace_back(item.key(), moe);
  }
  return out;
}

std::vector<std::pair<std::string, at::Tensor>> state_buffers(const torch::nn::Module& model) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& [name, moe] : moe_layers(model)) {
    out.emplace_back(name + ".expert_bias", moe->expert_bias);
  }
  return out;
}

MoELoads balance_expert_loads(const std::vector<torch::nn::Module*>& models,
                              const std::function<at::Tensor(at::Tensor)>& sum_over_ranks) {
  std::vector<std::pair<std::string, MoE*>> layers;
  for (torch::nn::Module* model : models) {
    for (const auto& layer : moe_layers(*model)) layers.push_back(layer);
  }
  MoELoads loads;
  if (layers.empty()) return loads;
  std::vector<at::Tensor> counts;
  for (const auto& [name, moe] : layers) counts.push_back(moe->tokens_per_expert);
  const at::Tensor all = sum_over_ranks(at::cat(counts));
  int64_t offset = 0;
  std::vector<at::Tensor> ratios;
  for (const auto& [name, moe] : layers) {
    const int64_t n = moe->tokens_per_expert.numel();
    const at::Tensor layer_loads = all.narrow(0, offset, n);
    offset += n;
    loads.layers.push_back(name);
    ratios.push_back(load_imbalance(layer_loads));
    moe->update_expert_bias(layer_loads);
  }
  loads.max_over_mean = at::stack(ratios);
  return loads;
}

NoTokenCounting::NoTokenCounting(const std::vector<torch::nn::Module*>& models) {
  for (torch::nn::Module* model : models) {
    for (const auto& [name, moe] : moe_layers(*model)) {
      moe->count_tokens = false;
      layers_.push_back(moe);
    }
  }
}

NoTokenCounting::~NoTokenCounting() {
  for (MoE* moe : layers_) moe->count_tokens = true;
}

}  // namespace titan
