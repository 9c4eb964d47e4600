// LoRA adapters: the converter, merging, and PEFT's names (see lora.h).
#include "titan/models/lora.h"

#include "titan/common/check.h"
#include "titan/common/format.h"
#include "titan/common/names.h"
#include "titan/models/common/init.h"
#include "titan/models/common/linear.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <set>
#include <string_view>

namespace titan {
namespace {

constexpr const char* kLoraA = ".lora_a.weight";
constexpr const char* kLoraB = ".lora_b.weight";
constexpr const char* kPeftPrefix = "base_model.model.";
constexpr std::string_view kPeftA = ".lora_A.weight";
constexpr std::string_view kPeftB = ".lora_B.weight";

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string last_part(const std::string& name) {
  const size_t dot = name.rfind('.');
  return dot == std::string::npos ? name : name.substr(dot + 1);
}

// The module an adapter parameter belongs to ("layers.0.attention.wq").
std::string adapted_module(const std::string& param) {
  const std::string suffix = ends_with(param, kLoraA) ? kLoraA : kLoraB;
  return param.substr(0, param.size() - std::string(suffix).size());
}

// The Hugging Face name of parameter `ours` (a module's weight) through the model's adapter, with
// `value` as its tensor (row layouts follow: Llama's q/k permutation). Empty when the model has
// no adapter or the adapter knows no such name.
std::pair<std::string, at::Tensor> hf_entry(const ModelSpec& spec,
                                            const nlohmann::json& description,
                                            const std::string& ours, const at::Tensor& value) {
  if (!spec.hf.to_hf) return {};
  try {
    const TensorMap hf = spec.hf.to_hf({{ours, value}}, base_description(description));
    if (hf.size() != 1) return {};
    return *hf.begin();
  } catch (const DataError&) {
    return {};
  }
}

// Only the Hugging Face module name of layer `module` (a weight of `sizes`), for matching target
// names: "" where there is none, or where the description does not fit the model at hand (a
// test model built without one): target names then match our names only.
std::string hf_module_name(const ModelSpec& spec, const nlohmann::json& description,
                           const std::string& module, at::IntArrayRef sizes) {
  try {
    const std::string name =
        hf_entry(spec, description, module + ".weight", at::empty(sizes, at::kMeta)).first;
    return name.empty() ? "" : last_part(name.substr(0, name.size() - 7));
  } catch (const std::exception&) {
    return "";
  }
}

// "model.layers.0.self_attn.q_proj.weight" -> "model.layers.0.self_attn.q_proj".
std::string module_of(const std::string& weight_name) {
  TITAN_CHECK(ends_with(weight_name, ".weight"), "not a weight name: ", weight_name);
  return weight_name.substr(0, weight_name.size() - 7);
}

}  // namespace

double LoraSpec::scaling() const {
  return use_rslora ? alpha / std::sqrt(static_cast<double>(rank))
                    : alpha / static_cast<double>(rank);
}

LoraSpec LoraSpec::from_section(const LoraSection& section) {
  LoraSpec spec;
  spec.rank = section.rank;
  spec.alpha = section.alpha;
  spec.dropout = section.dropout;
  spec.target_modules = section.target_modules;
  spec.use_rslora = section.use_rslora;
  return spec;
}

nlohmann::json LoraSpec::to_json() const {
  return {{"rank", rank},
          {"alpha", alpha},
          {"dropout", dropout},
          {"target_modules", target_modules},
          {"use_rslora", use_rslora}};
}

LoraSpec LoraSpec::from_json(const nlohmann::json& entry) {
  LoraSpec spec;
  try {
    spec.rank = entry.at("rank").get<int64_t>();
    spec.alpha = entry.at("alpha").get<double>();
    spec.dropout = entry.value("dropout", 0.0);
    spec.target_modules = entry.at("target_modules").get<std::vector<std::string>>();
    spec.use_rslora = entry.value("use_rslora", false);
  } catch (const nlohmann::json::exception& e) {
    throw DataError(
        message("model description: malformed \"lora\" entry ", entry.dump(), ": ", e.what()));
  }
  if (spec.rank < 1 || !(spec.alpha > 0)) {
    throw DataError(message("model description: \"lora\" entry ", entry.dump(),
                            " needs rank >= 1 and alpha > 0"));
  }
  return spec;
}

bool is_lora_param(const std::string& name) {
  return ends_with(name, kLoraA) || ends_with(name, kLoraB);
}

bool lora_enabled(const ModelSection& model) {
  return std::find(model.converters.begin(), model.converters.end(), "lora") !=
         model.converters.end();
}

nlohmann::json trained_model_description(const ModelSection& model, const LoraSection& lora) {
  nlohmann::json description = model_description(model);
  return lora_enabled(model) ? with_lora(description, LoraSpec::from_section(lora)) : description;
}

nlohmann::json with_lora(nlohmann::json description, const LoraSpec& spec) {
  description["lora"] = spec.to_json();
  return description;
}

nlohmann::json base_description(nlohmann::json description) {
  if (description.is_object()) description.erase("lora");
  return description;
}

LoraApplied apply_lora(Model& model, const LoraSpec& spec, const nlohmann::json& description) {
  const ModelSpec& model_spec = spec_for_description(description);
  const bool all = std::find(spec.target_modules.begin(), spec.target_modules.end(), kAllLinear) !=
                   spec.target_modules.end();
  std::set<std::string> unmatched(spec.target_modules.begin(), spec.target_modules.end());
  unmatched.erase(kAllLinear);
  std::set<std::string> names_here;  // last parts of the blocks' layers, ours and HF's
  std::vector<std::pair<std::string, Linear*>> chosen;
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    const std::string& name = item.key();
    if (name.rfind("layers.", 0) != 0) continue;
    auto* linear = dynamic_cast<Linear*>(item.value().get());
    auto* layer = dynamic_cast<WeightLayer*>(item.value().get());
    if (layer == nullptr || (linear != nullptr && linear->is_adapter)) continue;
    std::vector<std::string> leaf = {last_part(name)};
    const at::Tensor w = layer->named_parameters(/*recurse=*/false)["weight"];
    if (linear != nullptr) {
      const std::string hf = hf_module_name(model_spec, description, name, w.sizes());
      if (!hf.empty()) leaf.push_back(hf);
    }
    bool hit = false;
    for (const std::string& l : leaf) {
      names_here.insert(l);
      if (unmatched.erase(l) > 0 ||
          std::count(spec.target_modules.begin(), spec.target_modules.end(), l) > 0) {
        hit = true;
      }
    }
    if (linear == nullptr) {
      TITAN_CONFIG_CHECK(!hit, "lora.target_modules names ", leaf[0], ", and ", name,
                         " is not a linear layer (the routed experts of a mixture-of-experts "
                         "layer have no LoRA path yet). HINT: target the attention projections "
                         "or the dense feed-forward layers");
      continue;
    }
    if (hit || all) chosen.emplace_back(name, linear);
  }
  if (!unmatched.empty()) {
    const std::string target = *unmatched.begin();
    const std::vector<std::string> candidates(names_here.begin(), names_here.end());
    throw ConfigError(message("lora.target_modules entry '", target,
                              "' matches no linear layer of the transformer blocks",
                              did_you_mean(nearest_name(target, candidates)),
                              " (layers here: ", join(candidates), "; or \"", kAllLinear, "\")"));
  }
  TITAN_CONFIG_CHECK(!chosen.empty(), "lora.target_modules selects no layer of this model part");

  LoraApplied out;
  // Everything the model held so far is the frozen base.
  for (auto& p : model.parameters()) {
    p.set_requires_grad(false);
    out.frozen_params += p.numel();
  }
  for (const auto& [name, linear] : chosen) {
    TITAN_CHECK(linear->lora_a == nullptr, "LoRA applied twice to ", name);
    const at::Tensor w = linear->named_parameters(/*recurse=*/false)["weight"];
    const int64_t out_features = w.size(0), in_features = w.size(1);
    ParamDeviceGuard on(w.device());
    auto a = std::make_shared<Linear>(in_features, spec.rank, linear->compute_dtype);
    auto b = std::make_shared<Linear>(spec.rank, out_features, linear->compute_dtype);
    for (Linear* adapter : {a.get(), b.get()}) {
      adapter->is_adapter = true;
      if (w.scalar_type() != adapter->weight.scalar_type()) {
        adapter->replace_weight(adapter->weight.to(w.scalar_type()).detach().requires_grad_(true));
      }
      out.adapter_params += adapter->weight.numel();
    }
    linear->lora_a = linear->register_module("lora_a", a);
    linear->lora_b = linear->register_module("lora_b", b);
    linear->lora_scaling = spec.scaling();
    linear->lora_dropout = spec.dropout;
    // PEFT's init: kaiming_uniform(a = sqrt(5)) on A, bound 1 / sqrt(in_features); B zeros.
    const double bound = 1.0 / std::sqrt(static_cast<double>(in_features));
    model.set_param_init(name + kLoraA, ParamInit::uniform(-bound, bound));
    model.set_param_init(name + kLoraB, ParamInit::zeros());
    out.adapted.push_back(name);
  }
  return out;
}

std::shared_ptr<Model> build_described_model(const nlohmann::json& description,
                                             const ModelBuildOptions& options) {
  const nlohmann::json base = base_description(description);
  std::shared_ptr<Model> model = spec_for_description(base).build_uninitialized(base, options);
  if (description.is_object() && description.contains("lora")) {
    apply_lora(*model, LoraSpec::from_json(description["lora"]), base);
  }
  return model;
}

namespace {

struct LoraCounts {
  int64_t trained = 0;       // adapter elements
  int64_t frozen_block = 0;  // frozen weights of the blocks' linear layers (QLoRA's NF4 base)
};

// Counted on a meta build of the LoRA model, once per description.
LoraCounts lora_counts(const ModelSection& model, const LoraSection& lora) {
  const nlohmann::json description = trained_model_description(model, lora);
  const std::string key = description.dump();
  static std::mutex mutex;
  static std::map<std::string, LoraCounts> counted;
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (auto it = counted.find(key); it != counted.end()) return it->second;
  }
  ModelBuildOptions options;
  options.meta = true;
  const std::shared_ptr<Model> built = build_described_model(description, options);
  LoraCounts c;
  for (const at::Tensor& p : built->parameters()) {
    if (p.requires_grad()) c.trained += p.numel();
  }
  // The layers quantize_frozen_nf4 takes: under "layers.", not adapters, weight frozen.
  for (const auto& item : built->named_modules()) {
    const auto* layer = dynamic_cast<const Linear*>(item.value().get());
    if (layer == nullptr || layer->is_adapter || item.key().rfind("layers.", 0) != 0) continue;
    if (layer->weight.defined() && !layer->weight.requires_grad()) {
      c.frozen_block += layer->weight.numel();
    }
  }
  std::lock_guard<std::mutex> lock(mutex);
  counted[key] = c;
  return c;
}

}  // namespace

int64_t lora_trained_params(const ModelSection& model, const LoraSection& lora) {
  return lora_counts(model, lora).trained;
}

int64_t qlora_base_params(const ModelSection& model, const LoraSection& lora) {
  return lora.quantize_base.empty() ? 0 : lora_counts(model, lora).frozen_block;
}

TensorMap merge_lora(const TensorMap& params, const LoraSpec& spec) {
  TensorMap out;
  for (const auto& [name, t] : params) {
    if (!is_lora_param(name)) out.emplace(name, t);
  }
  at::NoGradGuard no_grad;
  for (const auto& [name, a] : params) {
    if (!ends_with(name, kLoraA)) continue;
    const std::string module = adapted_module(name);
    const auto b = params.find(module + kLoraB);
    const auto w = out.find(module + ".weight");
    if (b == params.end() || w == out.end()) {
      throw DataError(message("merging LoRA: ", name, " has no ",
                              b == params.end() ? module + kLoraB : module + ".weight"));
    }
    const at::Tensor delta = b->second.to(at::kFloat).mm(a.to(at::kFloat)) * spec.scaling();
    w->second = (w->second.to(at::kFloat) + delta.to(w->second.device())).to(w->second.dtype());
  }
  return out;
}

TensorMap to_peft_tensors(const TensorMap& params, const nlohmann::json& description) {
  const ModelSpec& spec = spec_for_description(description);
  TensorMap out;
  for (const auto& [name, a] : params) {
    if (!ends_with(name, kLoraA)) continue;
    const std::string module = adapted_module(name);
    const auto b = params.find(module + kLoraB);
    if (b == params.end())
      throw DataError(message("LoRA adapter ", name, " has no ", module, kLoraB));
    // B's rows are the layer's output rows: they take the base weight's HF layout; A's columns
    // are its inputs, which no adapter reorders.
    const auto [hf_name, b_hf] = hf_entry(spec, description, module + ".weight", b->second);
    if (hf_name.empty()) {
      throw DataError(message("LoRA adapter of ", module, ": model ", spec.name,
                              " has no Hugging Face name for ", module, ".weight"));
    }
    const std::string peft = kPeftPrefix + module_of(hf_name);
    out.emplace(peft + std::string(kPeftA), a);
    out.emplace(peft + std::string(kPeftB), b_hf);
  }
  if (out.empty()) throw DataError("no LoRA adapters to export (the model has none)");
  return out;
}

TensorMap from_peft_tensors(const TensorMap& peft, const nlohmann::json& description) {
  const ModelSpec& spec = spec_for_description(description);
  TITAN_CHECK(spec.hf.from_hf != nullptr, "model ", spec.name, " has no Hugging Face adapter");
  TensorMap out;
  for (const auto& [name, b] : peft) {
    if (ends_with(name, std::string(kPeftA))) continue;
    const std::string suffix(kPeftB);
    if (!ends_with(name, suffix) || name.rfind(kPeftPrefix, 0) != 0) {
      throw DataError(message("PEFT adapter tensor '", name,
                              "' is not a LoRA matrix (want base_model.model.<module>.lora_A / "
                              "lora_B.weight; biases, DoRA magnitudes and embeddings are not "
                              "supported)"));
    }
    const std::string hf_module =
        name.substr(std::string(kPeftPrefix).size(),
                    name.size() - suffix.size() - std::string(kPeftPrefix).size());
    const auto a = peft.find(kPeftPrefix + hf_module + std::string(kPeftA));
    if (a == peft.end()) throw DataError(message("PEFT adapter: ", name, " has no lora_A"));
    TensorMap ours;
    try {
      ours = spec.hf.from_hf({{hf_module + ".weight", b}}, base_description(description));
    } catch (const DataError& e) {
      throw DataError(message("PEFT adapter: ", hf_module, " is no layer of model ", spec.name,
                              " (", e.what(), ")"));
    }
    TITAN_CHECK(ours.size() == 1, "PEFT adapter: ", hf_module, " maps to ", ours.size(),
                " parameters");
    const std::string module = module_of(ours.begin()->first);
    out.emplace(module + kLoraB, ours.begin()->second);
    out.emplace(module + kLoraA, a->second);
  }
  for (const auto& [name, t] : peft) {
    if (ends_with(name, std::string(kPeftA)) &&
        !peft.count(name.substr(0, name.size() - kPeftA.size()) + std::string(kPeftB))) {
      throw DataError(message("PEFT adapter: ", name, " has no lora_B"));
    }
  }
  return out;
}

nlohmann::json peft_adapter_config(const TensorMap& params, const nlohmann::json& description,
                                   const LoraSpec& spec) {
  std::set<std::string> targets;
  for (const auto& [name, t] : to_peft_tensors(params, description)) {
    if (ends_with(name, std::string(kPeftA))) {
      targets.insert(last_part(name.substr(0, name.size() - kPeftA.size())));
    }
  }
  return {{"peft_type", "LORA"},
          {"task_type", "CAUSAL_LM"},
          {"base_model_name_or_path", nullptr},
          {"r", spec.rank},
          {"lora_alpha", spec.alpha},
          {"lora_dropout", spec.dropout},
          {"use_rslora", spec.use_rslora},
          {"target_modules", std::vector<std::string>(targets.begin(), targets.end())},
          {"bias", "none"},
          {"fan_in_fan_out", false},
          {"inference_mode", true},
          {"init_lora_weights", true},
          {"use_dora", false},
          {"modules_to_save", nullptr},
          {"rank_pattern", nlohmann::json::object()},
          {"alpha_pattern", nlohmann::json::object()}};
}

LoraSpec lora_spec_from_peft_config(const nlohmann::json& config, const std::string& path) {
  const auto refuse = [&](const std::string& what) {
    throw ConfigError(message(path, ": ", what, " is not supported (titan trains plain LoRA)"));
  };
  if (config.value("peft_type", std::string()) != "LORA") refuse("peft_type other than LORA");
  if (config.value("bias", std::string("none")) != "none")
    refuse("bias = " + config["bias"].dump());
  if (config.value("use_dora", false)) refuse("use_dora");
  for (const char* key : {"rank_pattern", "alpha_pattern"}) {
    if (config.contains(key) && !config[key].is_null() && !config[key].empty()) {
      refuse(std::string(key) + " (per-module ranks)");
    }
  }
  if (config.contains("modules_to_save") && !config["modules_to_save"].is_null()) {
    refuse("modules_to_save");
  }
  LoraSpec spec;
  try {
    spec.rank = config.at("r").get<int64_t>();
    spec.alpha = config.at("lora_alpha").get<double>();
    spec.dropout = config.value("lora_dropout", 0.0);
    spec.use_rslora = config.value("use_rslora", false);
    const nlohmann::json& t = config.at("target_modules");
    if (t.is_string()) {
      spec.target_modules = {t.get<std::string>()};
    } else {
      spec.target_modules = t.get<std::vector<std::string>>();
    }
  } catch (const nlohmann::json::exception& e) {
    throw DataError(message(path, ": ", e.what()));
  }
  return spec;
}

}  // namespace titan
