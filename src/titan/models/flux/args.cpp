// FLUX.1 arguments, flavors and sizes (see args.h).
#include "titan/models/flux/args.h"

#include "titan/common/check.h"
#include "titan/models/registry.h"

#include <numeric>
#include <sstream>

namespace titan::flux {
namespace {

// Visits every field of `args` once as (key, reference): the single list that the JSON
// conversions read, so a new field cannot be forgotten by one of them.
template <typename Args, typename Fn>
void visit_fields(Args& args, Fn&& fn) {
  fn("in_channels", args.in_channels);
  fn("out_channels", args.out_channels);
  fn("vec_in_dim", args.vec_in_dim);
  fn("context_in_dim", args.context_in_dim);
  fn("hidden_size", args.hidden_size);
  fn("mlp_ratio", args.mlp_ratio);
  fn("num_heads", args.num_heads);
  fn("depth", args.depth);
  fn("depth_single_blocks", args.depth_single_blocks);
  fn("axes_dim", args.axes_dim);
  fn("theta", args.theta);
  fn("guidance_embed", args.guidance_embed);
}

// The released FLUX.1 transformer (12B): 3072 hidden, 24 heads of 128, 19 + 38 blocks, T5-XXL
// text features (4096) and CLIP-L's pooled vector (768).
FluxArgs released(bool guidance) {
  FluxArgs a;
  a.guidance_embed = guidance;
  return a;
}

// TorchTitan's flux-debug: the released layout at hidden 1536 (12 heads) with 2 + 2 blocks.
FluxArgs torchtitan_debug() {
  FluxArgs a;
  a.hidden_size = 1536;
  a.num_heads = 12;
  a.depth = 2;
  a.depth_single_blocks = 2;
  return a;
}

// Small enough for CPU debug runs and tests: heads of 32 (8 + 12 + 12 rotary dims), text and
// pooled features of 64 (what the debug text encoders produce).
FluxArgs debugmodel() {
  FluxArgs a;
  a.vec_in_dim = 64;
  a.context_in_dim = 64;
  a.hidden_size = 128;
  a.num_heads = 4;
  a.depth = 2;
  a.depth_single_blocks = 2;
  a.axes_dim = {8, 12, 12};
  return a;
}

}  // namespace

void FluxArgs::validate() const {
  const auto positive = [](const char* key, auto value) {
    if (!(value > 0)) throw ConfigError(message("flux: ", key, " must be > 0, got ", value));
  };
  positive("in_channels", in_channels);
  positive("out_channels", out_channels);
  positive("vec_in_dim", vec_in_dim);
  positive("context_in_dim", context_in_dim);
  positive("hidden_size", hidden_size);
  positive("mlp_ratio", mlp_ratio);
  positive("num_heads", num_heads);
  positive("theta", theta);
  if (depth < 0 || depth_single_blocks < 0 || depth + depth_single_blocks == 0) {
    throw ConfigError(message("flux: depth (", depth, ") and depth_single_blocks (",
                              depth_single_blocks, ") must be >= 0 with at least one block"));
  }
  if (hidden_size % num_heads != 0) {
    throw ConfigError(message("flux: hidden_size ", hidden_size, " is not divisible by num_heads ",
                              num_heads, " (", hidden_size, " % ", num_heads, " = ",
                              hidden_size % num_heads, ")"));
  }
  if (axes_dim.empty()) throw ConfigError("flux: axes_dim is empty (one entry per position axis)");
  std::ostringstream sum;
  int64_t total = 0;
  for (size_t i = 0; i < axes_dim.size(); ++i) {
    if (axes_dim[i] <= 0 || axes_dim[i] % 2 != 0) {
      throw ConfigError(message("flux: axes_dim[", i, "] = ", axes_dim[i],
                                " must be positive and even (rotary dims come in pairs)"));
    }
    sum << (i ? " + " : "") << axes_dim[i];
    total += axes_dim[i];
  }
  if (total != head_dim()) {
    throw ConfigError(message("flux: the rotary axes must cover the head: ", sum.str(), " = ",
                              total, " != hidden_size / num_heads = ", hidden_size, " / ",
                              num_heads, " = ", head_dim()));
  }
  if (mlp_hidden_dim() <= 0) throw ConfigError("flux: int(hidden_size * mlp_ratio) must be > 0");
}

const std::vector<std::pair<std::string, FluxArgs>>& flavors() {
  static const std::vector<std::pair<std::string, FluxArgs>> kFlavors = {
      {"debugmodel", debugmodel()},
      {"flux-debug", torchtitan_debug()},
      {"flux-schnell", released(/*guidance=*/false)},
      {"flux-dev", released(/*guidance=*/true)},
  };
  return kFlavors;
}

std::vector<std::string> flavor_names() {
  std::vector<std::string> names;
  for (const auto& [name, args] : flavors()) names.push_back(name);
  return names;
}

FluxArgs args_for_flavor(const std::string& flavor) {
  for (const auto& [name, args] : flavors()) {
    if (name == flavor) return args;
  }
  check_flavor("flux", flavor_names(), flavor);  // throws, naming the nearest
  return {};
}

int64_t count_params(const FluxArgs& a) {
  const int64_t h = a.hidden_size, m = a.mlp_hidden_dim(), hd = a.head_dim();
  const auto linear = [](int64_t in, int64_t out) { return in * out + out; };
  const int64_t embedder = [&](int64_t in) { return linear(in, h) + linear(h, h); }(256);
  int64_t n = linear(a.in_channels, h) + linear(a.context_in_dim, h) + embedder +
              linear(a.vec_in_dim, h) + linear(h, h) + (a.guidance_embed ? embedder : 0);
  // One stream of a double block: modulation (6h), qkv, q/k norms, proj, MLP.
  const int64_t stream =
      linear(h, 6 * h) + linear(h, 3 * h) + 2 * hd + linear(h, h) + linear(h, m) + linear(m, h);
  const int64_t single = linear(h, 3 * h) + linear(h, 3 * h + m) + linear(h + m, h) + 2 * hd;
  n += a.depth * 2 * stream + a.depth_single_blocks * single;
  n += linear(h, 2 * h) + linear(h, a.out_channels);  // final layer: adaLN and projection
  return n;
}

double flops_per_image_token(const FluxArgs& a, int64_t txt_len, int64_t img_len) {
  const double h = static_cast<double>(a.hidden_size), m = static_cast<double>(a.mlp_hidden_dim());
  const double seq = static_cast<double>(txt_len + img_len);
  const double per_img = static_cast<double>(img_len);
  // Weights every token of a stream multiplies by (qkv, proj, MLP), per block.
  const double stream = 3 * h * h + h * h + 2 * h * m;
  const double single = h * (3 * h + m) + (h + m) * h;
  // Image tokens pass through the image stream and the single blocks; the text tokens' share
  // of the work (text stream, their single-block rows) is spread over the image tokens.
  const double token_weights =
      (a.depth * stream + a.depth_single_blocks * single) * (seq / per_img);
  const double embed =
      a.in_channels * h + a.context_in_dim * h * (txt_len / per_img) + h * a.out_channels;
  // Per-sample weights (modulations, time/text embedders) amortized over the image tokens.
  const double per_sample = (a.depth * 12 * h * h + a.depth_single_blocks * 3 * h * h + 2 * h * h +
                             (256 + a.vec_in_dim + 2 * h) * h) /
                            per_img;
  const double attention = 12 * h * seq * (a.depth + a.depth_single_blocks) * (seq / per_img);
  return 6 * (token_weights + embed + per_sample) + attention;
}

ModelStats model_stats(const FluxArgs& a) {
  ModelStats s;
  s.n_params = count_params(a);
  s.n_layers = a.depth + a.depth_single_blocks;
  s.n_heads = a.num_heads;
  s.head_dim = a.head_dim();
  s.dim = a.hidden_size;
  return s;
}

std::string describe(const FluxArgs& a) {
  std::ostringstream out;
  out << "hidden " << a.hidden_size << ", " << a.depth << " double + " << a.depth_single_blocks
      << " single blocks, " << a.num_heads << " heads, text " << a.context_in_dim << ", pooled "
      << a.vec_in_dim << (a.guidance_embed ? ", guidance" : "");
  return out.str();
}

nlohmann::json args_to_json(const FluxArgs& args) {
  nlohmann::json json = nlohmann::json::object();
  visit_fields(args, [&](const char* key, const auto& value) { json[key] = value; });
  return json;
}

FluxArgs args_from_json(const nlohmann::json& json, FluxArgs base) {
  if (!json.is_object()) throw ConfigError("flux: model args must be a JSON object");
  std::vector<std::string> keys;
  visit_fields(base, [&](const char* key, const auto&) { keys.push_back(key); });
  for (const auto& [key, value] : json.items()) {
    bool known = false;
    visit_fields(base, [&, k = key](const char* name, auto& field) {
      if (k != name) return;
      known = true;
      try {
        field = value.get<std::decay_t<decltype(field)>>();
      } catch (const nlohmann::json::exception&) {
        throw ConfigError(
            message("flux: args key '", name, "' has the wrong type: ", value.dump()));
      }
    });
    if (!known) {
      throw ConfigError(
          message("flux: unknown args key '", key, "'", suggestion(key, keys, "keys")));
    }
  }
  base.validate();
  return base;
}

}  // namespace titan::flux
