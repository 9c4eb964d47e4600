// FLUX.1's transformer pieces (see layers.h).
#include "titan/models/flux/layers.h"

#include "titan/common/check.h"

#include <cmath>

namespace titan::flux {
namespace {

constexpr double kNormEps = 1e-6;

// Splits x (bs, len, 3 * heads * head_dim) into q, k, v, each (bs, heads, len, head_dim). The
// heads are counted from the width: tensor parallelism hands a rank the q, k and v of its heads.
std::vector<at::Tensor> split_qkv(const at::Tensor& qkv, int64_t head_dim) {
  const int64_t bs = qkv.size(0), len = qkv.size(1);
  TITAN_CHECK(qkv.size(2) % (3 * head_dim) == 0, "flux: q, k, v of width ", qkv.size(2),
              " are not whole heads of ", head_dim);
  // (bs, len, 3, heads, head_dim) -> (3, bs, heads, len, head_dim)
  const at::Tensor parts = qkv.reshape({bs, len, 3, -1, head_dim}).permute({2, 0, 3, 1, 4});
  return {parts[0], parts[1], parts[2]};
}

}  // namespace

MLPEmbedder::MLPEmbedder(int64_t in_dim, int64_t hidden, at::ScalarType compute_dtype) {
  in_layer =
      register_module("in_layer", std::make_shared<BiasedLinear>(in_dim, hidden, compute_dtype));
  out_layer =
      register_module("out_layer", std::make_shared<BiasedLinear>(hidden, hidden, compute_dtype));
}

at::Tensor MLPEmbedder::forward(const at::Tensor& x) {
  return out_layer->forward(at::silu(in_layer->forward(x)));
}

QKNorm::QKNorm(int64_t head_dim) {
  query_norm = register_module("query_norm", std::make_shared<RMSNorm>(head_dim, kNormEps));
  key_norm = register_module("key_norm", std::make_shared<RMSNorm>(head_dim, kNormEps));
}

StreamAttention::StreamAttention(int64_t hidden, int64_t head_dim, at::ScalarType compute_dtype) {
  qkv = register_module("qkv", std::make_shared<BiasedLinear>(hidden, 3 * hidden, compute_dtype));
  norm = register_module("norm", std::make_shared<QKNorm>(head_dim));
  proj = register_module("proj", std::make_shared<BiasedLinear>(hidden, hidden, compute_dtype));
}

StreamMlp::StreamMlp(int64_t hidden, int64_t mlp_hidden, at::ScalarType compute_dtype) {
  fc1 = register_module("0", std::make_shared<BiasedLinear>(hidden, mlp_hidden, compute_dtype));
  fc2 = register_module("2", std::make_shared<BiasedLinear>(mlp_hidden, hidden, compute_dtype));
}

at::Tensor StreamMlp::forward(const at::Tensor& x) {
  return fc2->forward(at::gelu(fc1->forward(x), "tanh"));
}

Modulation::Modulation(int64_t hidden, bool is_double, at::ScalarType compute_dtype)
    : is_double(is_double) {
  lin = register_module(
      "lin", std::make_shared<BiasedLinear>(hidden, (is_double ? 6 : 3) * hidden, compute_dtype));
}

std::vector<ModulationOut> Modulation::forward(const at::Tensor& vec) {
  // (bs, 1, m * hidden) -> m pieces of (bs, 1, hidden)
  const std::vector<at::Tensor> parts =
      lin->forward(at::silu(vec)).unsqueeze(1).chunk(is_double ? 6 : 3, -1);
  std::vector<ModulationOut> out{{parts[0], parts[1], parts[2]}};
  if (is_double) out.push_back({parts[3], parts[4], parts[5]});
  return out;
}

FluxRope flux_rope(const at::Tensor& ids, const std::vector<int64_t>& axes_dim, double theta) {
  TITAN_CHECK(ids.dim() == 3 && ids.size(2) == static_cast<int64_t>(axes_dim.size()),
              "flux: position ids must be (bs, len, ", axes_dim.size(), "), got ", ids.sizes());
  const at::Tensor pos = ids.to(at::kDouble);
  std::vector<at::Tensor> angles;
  for (size_t i = 0; i < axes_dim.size(); ++i) {
    const int64_t dim = axes_dim[i];
    // omega_j = theta^(-2j / dim), j < dim / 2
    const at::Tensor omega =
        at::pow(theta, -at::arange(0, dim, 2, pos.options()) / static_cast<double>(dim));
    angles.push_back(pos.select(2, static_cast<int64_t>(i)).unsqueeze(-1) * omega);
  }
  // (bs, len, head_dim / 2) -> (bs, 1, len, head_dim / 2)
  const at::Tensor angle = at::cat(angles, -1).unsqueeze(1);
  return {at::cos(angle).to(at::kFloat), at::sin(angle).to(at::kFloat)};
}

at::Tensor apply_flux_rope(const at::Tensor& x, const FluxRope& rope) {
  const at::ScalarType compute = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  // (bs, heads, len, head_dim / 2, 2)
  const at::Tensor pairs = x.to(compute).unflatten(-1, {-1, 2});
  const at::Tensor x0 = pairs.select(-1, 0), x1 = pairs.select(-1, 1);
  const at::Tensor cos = rope.cos.to(compute), sin = rope.sin.to(compute);
  const at::Tensor out = at::stack({cos * x0 - sin * x1, sin * x0 + cos * x1}, -1);
  return out.flatten(-2).to(x.scalar_type());
}

at::Tensor timestep_embedding(const at::Tensor& t, int64_t dim) {
  const int64_t half = dim / 2;
  const at::Tensor freqs =
      at::exp(-std::log(10000.0) * at::arange(half, t.options().dtype(at::kFloat)) /
              static_cast<double>(half));
  const at::Tensor args = (t.to(at::kFloat) * 1000.0).unsqueeze(1) * freqs.unsqueeze(0);
  at::Tensor out = at::cat({at::cos(args), at::sin(args)}, -1);
  if (dim % 2 != 0) out = at::cat({out, at::zeros_like(out.narrow(1, 0, 1))}, -1);
  return out;
}

at::Tensor plain_layer_norm(const at::Tensor& x) {
  const at::Tensor wide = x.to(upcast_dtype(x.scalar_type()));
  return at::layer_norm(wide, {x.size(-1)}, /*weight=*/{}, /*bias=*/{}, kNormEps)
      .to(x.scalar_type());
}

at::Tensor modulate(const at::Tensor& normed, const ModulationOut& mod) {
  return (1 + mod.scale) * normed + mod.shift;
}

at::Tensor joint_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  // (bs, heads, len, head_dim) -> (bs, len, heads * head_dim)
  const at::Tensor out = at::scaled_dot_product_attention(q, k, v);
  return out.transpose(1, 2).flatten(2);
}

DoubleStreamBlock::DoubleStreamBlock(int64_t hidden, int64_t num_heads, int64_t mlp_hidden,
                                     at::ScalarType compute_dtype)
    : num_heads(num_heads), head_dim(hidden / num_heads) {
  img_mod = register_module("img_mod", std::make_shared<Modulation>(hidden, true, compute_dtype));
  img_attn = register_module("img_attn",
                             std::make_shared<StreamAttention>(hidden, head_dim, compute_dtype));
  img_mlp =
      register_module("img_mlp", std::make_shared<StreamMlp>(hidden, mlp_hidden, compute_dtype));
  txt_mod = register_module("txt_mod", std::make_shared<Modulation>(hidden, true, compute_dtype));
  txt_attn = register_module("txt_attn",
                             std::make_shared<StreamAttention>(hidden, head_dim, compute_dtype));
  txt_mlp =
      register_module("txt_mlp", std::make_shared<StreamMlp>(hidden, mlp_hidden, compute_dtype));
}

at::Tensor DoubleStreamBlock::forward(const at::Tensor& x, int64_t txt_len, const at::Tensor& vec,
                                      const FluxRope& rope) {
  const at::Tensor txt = x.narrow(1, 0, txt_len);
  const at::Tensor img = x.narrow(1, txt_len, x.size(1) - txt_len);
  const std::vector<ModulationOut> img_m = img_mod->forward(vec);
  const std::vector<ModulationOut> txt_m = txt_mod->forward(vec);

  // Each stream's q, k, v from its own weights, (bs, heads, len, head_dim).
  const auto project = [&](StreamAttention& attn, const at::Tensor& stream,
                           const ModulationOut& mod) {
    std::vector<at::Tensor> qkv =
        split_qkv(attn.qkv->forward(modulate(plain_layer_norm(stream), mod)), head_dim);
    const at::ScalarType dtype = qkv[2].scalar_type();
    qkv[0] = attn.norm->query_norm->forward(qkv[0]).to(dtype);
    qkv[1] = attn.norm->key_norm->forward(qkv[1]).to(dtype);
    return qkv;
  };
  const std::vector<at::Tensor> t = project(*txt_attn, txt, txt_m[0]);
  const std::vector<at::Tensor> i = project(*img_attn, img, img_m[0]);
  const at::Tensor q = apply_flux_rope(at::cat({t[0], i[0]}, 2), rope);
  const at::Tensor k = apply_flux_rope(at::cat({t[1], i[1]}, 2), rope);
  const at::Tensor attn = joint_attention(q, k, at::cat({t[2], i[2]}, 2));

  const auto finish = [](StreamAttention& a, StreamMlp& mlp, const at::Tensor& stream,
                         const at::Tensor& attended, const std::vector<ModulationOut>& mod) {
    const at::Tensor h = stream + mod[0].gate * a.proj->forward(attended);
    return h + mod[1].gate * mlp.forward(modulate(plain_layer_norm(h), mod[1]));
  };
  const at::Tensor txt_out = finish(*txt_attn, *txt_mlp, txt, attn.narrow(1, 0, txt_len), txt_m);
  const at::Tensor img_out =
      finish(*img_attn, *img_mlp, img, attn.narrow(1, txt_len, attn.size(1) - txt_len), img_m);
  return at::cat({txt_out, img_out}, 1);
}

SingleStreamBlock::SingleStreamBlock(int64_t hidden, int64_t num_heads, int64_t mlp_hidden,
                                     at::ScalarType compute_dtype)
    : num_heads(num_heads), hidden(hidden), mlp_hidden(mlp_hidden) {
  linear1 = register_module(
      "linear1", std::make_shared<BiasedLinear>(hidden, 3 * hidden + mlp_hidden, compute_dtype));
  linear2 = register_module(
      "linear2", std::make_shared<BiasedLinear>(hidden + mlp_hidden, hidden, compute_dtype));
  norm = register_module("norm", std::make_shared<QKNorm>(hidden / num_heads));
  modulation =
      register_module("modulation", std::make_shared<Modulation>(hidden, false, compute_dtype));
}

at::Tensor SingleStreamBlock::forward(const at::Tensor& x, const at::Tensor& vec,
                                      const FluxRope& rope) {
  const ModulationOut mod = modulation->forward(vec)[0];
  const at::Tensor joint = linear1->forward(modulate(plain_layer_norm(x), mod));
  // Tensor parallelism gives a rank the same share (1 / split) of each of linear1's parts.
  const int64_t width = 3 * hidden + mlp_hidden;
  TITAN_CHECK(width % joint.size(-1) == 0, "flux: linear1 gives ", joint.size(-1),
              " features, not a share of ", width);
  const int64_t split = width / joint.size(-1);
  const int64_t mlp_width = mlp_hidden / split;
  const int64_t qkv_width = joint.size(-1) - mlp_width;
  std::vector<at::Tensor> qkv = split_qkv(joint.narrow(-1, 0, qkv_width), hidden / num_heads);
  const at::ScalarType dtype = qkv[2].scalar_type();
  const at::Tensor q = apply_flux_rope(norm->query_norm->forward(qkv[0]).to(dtype), rope);
  const at::Tensor k = apply_flux_rope(norm->key_norm->forward(qkv[1]).to(dtype), rope);
  const at::Tensor attn = joint_attention(q, k, qkv[2]);
  const at::Tensor mlp = at::gelu(joint.narrow(-1, qkv_width, mlp_width), "tanh");
  return x + mod.gate * linear2->forward(at::cat({attn, mlp}, -1));
}

LastLayer::LastLayer(int64_t hidden, int64_t out_channels, at::ScalarType compute_dtype) {
  linear = register_module("linear",
                           std::make_shared<BiasedLinear>(hidden, out_channels, compute_dtype));
  auto seq = register_module("adaLN_modulation", std::make_shared<torch::nn::Module>());
  adaln =
      seq->register_module("1", std::make_shared<BiasedLinear>(hidden, 2 * hidden, compute_dtype));
}

at::Tensor LastLayer::forward(const at::Tensor& img, const at::Tensor& vec) {
  // (bs, 2 hidden) -> shift, scale (bs, 1, hidden) each
  const std::vector<at::Tensor> parts = adaln->forward(at::silu(vec)).unsqueeze(1).chunk(2, -1);
  const ModulationOut mod{parts[0], parts[1], {}};
  return linear->forward(modulate(plain_layer_norm(img), mod));
}

}  // namespace titan::flux
