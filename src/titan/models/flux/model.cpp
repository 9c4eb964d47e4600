// FLUX.1's transformer (see model.h).
#include "titan/models/flux/model.h"

#include "titan/common/check.h"

#include <cmath>
#include <sstream>

namespace titan::flux {
namespace {

// The sinusoidal timestep (and guidance) features the embedders take.
constexpr int64_t kTimestepDim = 256;

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

bool starts_with(const std::string& s, const std::string& head) {
  return s.compare(0, head.size(), head) == 0;
}

std::string sizes_text(const std::vector<int64_t>& sizes) {
  std::ostringstream out;
  out << "(";
  for (size_t i = 0; i < sizes.size(); ++i) {
    out << (i ? ", " : "");
    if (sizes[i] < 0) {
      out << "*";
    } else {
      out << sizes[i];
    }
  }
  out << ")";
  return out.str();
}

// Position ids conditioning[key] as (bs, len, n_axes): given per sample, or shared by the batch
// as (1, len, n_axes) or (len, n_axes) (as diffusers takes them).
at::Tensor position_ids(const ForwardInputs& inputs, const std::string& key, int64_t bs,
                        int64_t len, int64_t n_axes) {
  const auto it = inputs.conditioning.find(key);
  if (it != inputs.conditioning.end() && it->second.defined() && it->second.dim() == 2 &&
      it->second.size(0) == len && it->second.size(1) == n_axes) {
    return it->second.unsqueeze(0).expand({bs, len, n_axes});
  }
  const at::Tensor t = conditioning_entry(inputs, key, {-1, len, n_axes});
  if (t.size(0) != 1 && t.size(0) != bs) {
    throw ConfigError(message("flux: conditioning '", key, "' has batch ", t.size(0),
                              ", neither 1 (shared) nor the batch ", bs));
  }
  return t.expand({bs, len, n_axes});
}

}  // namespace

at::Tensor conditioning_entry(const ForwardInputs& inputs, const std::string& key,
                              const std::vector<int64_t>& sizes) {
  const auto it = inputs.conditioning.find(key);
  if (it == inputs.conditioning.end() || !it->second.defined()) {
    throw ConfigError(message("flux: forward needs the conditioning '", key, "' ",
                              sizes_text(sizes), "; it was not given"));
  }
  const at::Tensor& t = it->second;
  bool ok = t.dim() == static_cast<int64_t>(sizes.size());
  for (size_t i = 0; ok && i < sizes.size(); ++i) ok = sizes[i] < 0 || t.size(i) == sizes[i];
  if (!ok) {
    throw ConfigError(
        message("flux: conditioning '", key, "' must be ", sizes_text(sizes), ", got ", t.sizes()));
  }
  return t;
}

FluxTransformer::FluxTransformer(const FluxArgs& args, at::ScalarType compute_dtype)
    : args_(args), compute_dtype_(compute_dtype) {
  args_.validate();
  const int64_t h = args_.hidden_size, m = args_.mlp_hidden_dim();
  img_in = register_module("img_in",
                           std::make_shared<BiasedLinear>(args_.in_channels, h, compute_dtype));
  time_in =
      register_module("time_in", std::make_shared<MLPEmbedder>(kTimestepDim, h, compute_dtype));
  vector_in = register_module("vector_in",
                              std::make_shared<MLPEmbedder>(args_.vec_in_dim, h, compute_dtype));
  if (args_.guidance_embed) {
    guidance_in = register_module("guidance_in",
                                  std::make_shared<MLPEmbedder>(kTimestepDim, h, compute_dtype));
  }
  txt_in = register_module("txt_in",
                           std::make_shared<BiasedLinear>(args_.context_in_dim, h, compute_dtype));
  auto doubles = register_module("double_blocks", std::make_shared<torch::nn::Module>());
  for (int64_t i = 0; i < args_.depth; ++i) {
    double_blocks.push_back(doubles->register_module(
        std::to_string(i),
        std::make_shared<DoubleStreamBlock>(h, args_.num_heads, m, compute_dtype)));
  }
  auto singles = register_module("single_blocks", std::make_shared<torch::nn::Module>());
  for (int64_t i = 0; i < args_.depth_single_blocks; ++i) {
    single_blocks.push_back(singles->register_module(
        std::to_string(i),
        std::make_shared<SingleStreamBlock>(h, args_.num_heads, m, compute_dtype)));
  }
  final_layer = register_module("final_layer",
                                std::make_shared<LastLayer>(h, args_.out_channels, compute_dtype));

  for (const auto& item : named_parameters()) {
    const std::string& name = item.key();
    const at::Tensor& p = item.value();
    ParamInit init = ParamInit::zeros();
    if (ends_with(name, "_norm.weight")) {
      init = ParamInit::ones();
    } else if (ends_with(name, ".bias.weight") || starts_with(name, "final_layer.") ||
               name.find("_mod.lin.") != std::string::npos ||
               name.find(".modulation.lin.") != std::string::npos) {
      init = ParamInit::zeros();
    } else if (starts_with(name, "time_in.") || starts_with(name, "vector_in.") ||
               starts_with(name, "guidance_in.")) {
      init = ParamInit::normal(/*mean=*/0.0, /*std=*/0.02);
    } else {
      TITAN_CHECK(p.dim() == 2, "flux: no init rule for ", name);
      const double bound = std::sqrt(6.0 / static_cast<double>(p.size(0) + p.size(1)));
      init = ParamInit::uniform(-bound, bound);
    }
    inits_[name] = init;
  }
}

ParamInit FluxTransformer::param_init(const std::string& name) const {
  const auto it = inits_.find(name);
  TITAN_CHECK(it != inits_.end(), "flux: unknown parameter ", name);
  return it->second;
}

at::Tensor FluxTransformer::run_forward(const at::Tensor& img, const ForwardInputs& inputs) {
  TITAN_CHECK(img.dim() == 3 && img.size(2) == args_.in_channels && img.is_floating_point(),
              "flux: forward takes packed latents (bs, img_len, ", args_.in_channels,
              ") floating point, got ", img.sizes(), " ", img.scalar_type());
  const int64_t bs = img.size(0), img_len = img.size(1);
  const at::Tensor txt = conditioning_entry(inputs, "txt", {bs, -1, args_.context_in_dim});
  const int64_t txt_len = txt.size(1);
  const at::Tensor y = conditioning_entry(inputs, "y", {bs, args_.vec_in_dim});
  const at::Tensor timesteps = conditioning_entry(inputs, "timesteps", {bs});
  const auto n_axes = static_cast<int64_t>(args_.axes_dim.size());
  const at::Tensor joint_ids = at::cat({position_ids(inputs, "txt_ids", bs, txt_len, n_axes),
                                        position_ids(inputs, "img_ids", bs, img_len, n_axes)},
                                       1);
  const FluxRope rope = flux_rope(joint_ids, args_.axes_dim, args_.theta);
  at::Tensor guidance;
  if (args_.guidance_embed) guidance = conditioning_entry(inputs, "guidance", {bs});

  int64_t unit = 0;
  const at::Tensor vec = run_unit(unit++, timesteps, [this, y, guidance](const at::Tensor& t) {
    const at::ScalarType dtype = upcast_dtype(y.scalar_type());
    at::Tensor v = time_in->forward(timestep_embedding(t, kTimestepDim).to(dtype));
    if (guidance_in) {
      v = v + guidance_in->forward(timestep_embedding(guidance, kTimestepDim).to(dtype));
    }
    return v + vector_in->forward(y);
  });
  at::Tensor x = run_unit(unit++, img, [this, txt](const at::Tensor& latents) {
    return at::cat({txt_in->forward(txt), img_in->forward(latents)}, 1);
  });
  for (const auto& block : double_blocks) {
    DoubleStreamBlock* b = block.get();
    x = run_unit(unit++, x, [b, txt_len, vec, rope](const at::Tensor& in) {
      return b->forward(in, txt_len, vec, rope);
    });
  }
  for (const auto& block : single_blocks) {
    SingleStreamBlock* b = block.get();
    x = run_unit(unit++, x,
                 [b, vec, rope](const at::Tensor& in) { return b->forward(in, vec, rope); });
  }
  return run_unit(unit, x, [this, txt_len, vec](const at::Tensor& in) {
    const at::Tensor out = final_layer->forward(in.narrow(1, txt_len, in.size(1) - txt_len), vec);
    return out.to(upcast_dtype(out.scalar_type()));
  });
}

std::vector<ModelUnit> FluxTransformer::units() const {
  std::vector<ModelUnit> out;
  const auto unit = [&](const std::string& name, const std::vector<std::string>& modules,
                        int64_t block) {
    ModelUnit u{name, {}};
    u.block = block;
    for (const auto& item : named_parameters()) {
      for (const std::string& module : modules) {
        if (starts_with(item.key(), module + ".")) u.params.push_back(item.key());
      }
    }
    out.push_back(std::move(u));
  };
  std::vector<std::string> embedders = {"time_in", "vector_in"};
  if (guidance_in) embedders.push_back("guidance_in");
  std::string embedder_names = "time_in, vector_in";
  if (guidance_in) embedder_names += ", guidance_in";
  unit(embedder_names, embedders, -1);
  unit("img_in, txt_in", {"img_in", "txt_in"}, -1);
  int64_t block = 0;
  for (size_t i = 0; i < double_blocks.size(); ++i) {
    const std::string name = "double_blocks." + std::to_string(i);
    unit(name, {name}, block++);
  }
  for (size_t i = 0; i < single_blocks.size(); ++i) {
    const std::string name = "single_blocks." + std::to_string(i);
    unit(name, {name}, block++);
  }
  unit("final_layer", {"final_layer"}, -1);
  return out;
}

ModelStats FluxTransformer::stats(int64_t /*batch*/, int64_t /*seq_len*/) const {
  return model_stats(args_);
}

std::string FluxTransformer::refuses(const std::string& parallelism) const {
  if (parallelism == "pipeline" || parallelism == "context") {
    return "the flux model does not take " + parallelism +
           " parallelism yet. HINT: train it with data parallelism (FSDP, HSDP, DDP), tensor "
           "parallelism and activation checkpointing";
  }
  return {};
}

std::vector<TpRule> FluxTransformer::tensor_parallel_plan() const {
  const int64_t h = args_.hidden_size, m = args_.mlp_hidden_dim();
  std::vector<TpRule> plan;
  const auto head_local = [&plan](const std::string& attention) {
    plan.push_back({attention + ".norm.query_norm", TpStyle::kHeadLocal});
    plan.push_back({attention + ".norm.key_norm", TpStyle::kHeadLocal});
  };
  if (!double_blocks.empty()) {
    for (const std::string stream : {"img", "txt"}) {
      const std::string block = "double_blocks.*." + stream;
      plan.push_back({block + "_attn.qkv", TpStyle::kColwise, {h, h, h}});
      plan.push_back({block + "_attn.proj", TpStyle::kRowwise});
      head_local(block + "_attn");
      plan.push_back({block + "_mlp.0", TpStyle::kColwise});
      plan.push_back({block + "_mlp.2", TpStyle::kRowwise});
      plan.push_back({block + "_mod.lin", TpStyle::kColwiseGathered});
    }
  }
  if (!single_blocks.empty()) {
    plan.push_back({"single_blocks.*.linear1", TpStyle::kColwise, {h, h, h, m}});
    plan.push_back({"single_blocks.*.linear2", TpStyle::kRowwise, {h, m}});
    head_local("single_blocks.*");
    plan.push_back({"single_blocks.*.modulation.lin", TpStyle::kColwiseGathered});
  }
  // The modulations' weights are a quarter of FLUX.1's; their outputs are one vector per sample.
  plan.push_back({"final_layer.adaLN_modulation.1", TpStyle::kColwiseGathered});
  return plan;
}

std::vector<std::pair<std::string, int64_t>> FluxTransformer::tp_split_counts() const {
  return {{"flux num_heads", args_.num_heads}};
}

}  // namespace titan::flux
