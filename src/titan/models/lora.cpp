// LoRA adapters: the converter, merging, and PEFT's names (see lora.h).
#include "titan/models/lora.h"

#include "titan/common/check.h"
#include "titan/common/format.h"
#include "titan/common/names.h"
#include "titan/models/common/init.h"
#include "titan/models/common/linear.h"
#include "titan/models/common/moe.h"

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

// lora.target_modules entries that name the routed experts of MoE layers: all of them, PEFT's
// two parameters (the fused gate/up projection, the down projection), or ours (w1 and w3
// together: they share one A).
constexpr const char* kExpertTargets[] = {"experts",    "experts.gate_up_proj", "experts.down_proj",
                                          "experts.w1", "experts.w2",           "experts.w3"};

// Which parts of the routed experts a target list adapts. ConfigError for experts.w1 without
// experts.w3 or the reverse (they share one A).
struct ExpertParts {
  bool gate_up = false;  // w1 and w3 (one A)
  bool down = false;     // w2
};
ExpertParts expert_parts(const std::vector<std::string>& targets) {
  const auto has = [&](const char* t) { return std::count(targets.begin(), targets.end(), t) > 0; };
  const bool w1 = has("experts.w1");
  const bool w3 = has("experts.w3");
  TITAN_CONFIG_CHECK(w1 == w3, "lora.target_modules names experts.", w1 ? "w1" : "w3",
                     " without experts.", w1 ? "w3" : "w1",
                     ": the routed experts' w1 and w3 read the same input and share one "
                     "adapter A, as PEFT's adapter of the fused experts.gate_up_proj does. "
                     "HINT: list both, or experts.gate_up_proj");
  const bool all = has("experts");
  return {all || has("experts.gate_up_proj") || w1,
          all || has("experts.down_proj") || has("experts.w2")};
}

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
// The Hugging Face tensors the model's adapter writes for `ours` alone: what it writes for
// {ours: value} less what it writes for nothing (tensors it always adds, such as DeepSeek-V3's
// zero e_score_correction_bias per MoE layer). Empty when it has no adapter or refuses.
TensorMap hf_tensors_of(const ModelSpec& spec, const nlohmann::json& description,
                        const std::string& ours, const at::Tensor& value) {
  if (!spec.hf.to_hf) return {};
  try {
    const nlohmann::json base = base_description(description);
    TensorMap hf = spec.hf.to_hf({{ours, value}}, base);
    for (const auto& [name, t] : spec.hf.to_hf({}, base)) hf.erase(name);
    return hf;
  } catch (const DataError&) {
    return {};
  }
}

std::pair<std::string, at::Tensor> hf_entry(const ModelSpec& spec,
                                            const nlohmann::json& description,
                                            const std::string& ours, const at::Tensor& value) {
  const TensorMap hf = hf_tensors_of(spec, description, ours, value);
  if (hf.size() != 1) return {};
  return *hf.begin();
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

// The routed experts' w3 has no A of its own: it uses w1's ("<experts>.w1.lora_a.weight").
bool shares_a(const std::string& module) { return ends_with(module, ".experts.w3"); }
std::string adapter_a_name(const std::string& module) {
  return shares_a(module) ? module.substr(0, module.size() - 2) + "w1" + kLoraA : module + kLoraA;
}

// The routed experts' module ("layers.1.moe.experts") of an adapter of theirs, or "".
std::string experts_module(const std::string& param) {
  for (const char* w : {".w1", ".w2", ".w3"}) {
    for (const char* suffix : {kLoraA, kLoraB}) {
      const std::string tail = std::string(".experts") + w + suffix;
      if (ends_with(param, tail)) return param.substr(0, param.size() - tail.size() + 8);
    }
  }
  return "";
}

// PEFT adapts the routed experts through their parameters (target_parameters), in this order of
// the Hugging Face experts module; several on one module nest: the i-th of k adapted ones sits
// under k - 1 - i "base_layer." levels.
constexpr const char* kHfExpertParams[] = {"gate_up_proj", "down_proj"};

// The Hugging Face experts module ("model.layers.1.mlp.experts") of ours, through the model's
// adapter (which names each expert's weights, or the fused parameters, below it).
std::string hf_experts_module(const ModelSpec& spec, const nlohmann::json& description,
                              const std::string& experts, const at::Tensor& w2) {
  for (const auto& [name, t] : hf_tensors_of(spec, description, experts + ".w2.weight", w2)) {
    const size_t at = name.find(".experts.");
    if (at != std::string::npos) return name.substr(0, at + 8);
  }
  throw DataError(message("LoRA adapter of ", experts, ": model ", spec.name,
                          " has no Hugging Face name for its routed experts"));
}

// Whether the model's Hugging Face gate_up_proj interleaves gate and up along its output
// features (gpt-oss: gate in the even ones) rather than stacking gate then up (Qwen3-MoE,
// DeepSeek-V3): PEFT's B of gate_up_proj has its rows in that order.
bool gate_up_interleaved(const ModelSpec& spec, const nlohmann::json& description) {
  return spec.hf.to_hf_config &&
         spec.hf.to_hf_config(base_description(description)).value("model_type", "") == "gpt_oss";
}

// Whether PEFT reads the model's Hugging Face expert parameters with their last two dimensions
// swapped: Llama 4's are (experts, in, out), as gpt-oss's, but its experts module does not say
// so (transformers' is_transposed), and PEFT takes them as (experts, out, in). Its adapter is then
// the same low-rank update with the roles swapped: PEFT's A of expert e is our B's transpose, its
// B our A's.
bool experts_swapped_in_peft(const ModelSpec& spec, const nlohmann::json& description) {
  return spec.hf.to_hf_config &&
         spec.hf.to_hf_config(base_description(description)).value("model_type", "") ==
             "llama4_text";
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
  bool has_blocks = false;
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    has_blocks = has_blocks || item.key().rfind("layers.", 0) == 0;
  }
  TITAN_CONFIG_CHECK(has_blocks || model_spec.objective == ModelObjective::kNextToken,
                     "LoRA adapts the linear layers of a decoder's transformer blocks "
                     "(layers.N), and the ",
                     model_spec.name,
                     " model has none; its LoRA is not supported yet. HINT: fine-tune it "
                     "without model.converters \"lora\"");
  const bool all = std::find(spec.target_modules.begin(), spec.target_modules.end(), kAllLinear) !=
                   spec.target_modules.end();
  std::set<std::string> unmatched(spec.target_modules.begin(), spec.target_modules.end());
  unmatched.erase(kAllLinear);
  std::set<std::string> names_here;  // last parts of the blocks' layers, ours and HF's
  std::vector<std::pair<std::string, Linear*>> chosen;
  const ExpertParts parts = expert_parts(spec.target_modules);
  std::vector<std::pair<std::string, GroupedExperts*>> experts_chosen;
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    const std::string& name = item.key();
    if (name.rfind("layers.", 0) != 0) continue;
    if (auto* experts = dynamic_cast<GroupedExperts*>(item.value().get())) {
      // The routed experts are adapted only when named (PEFT's all-linear leaves them too).
      for (const char* n : kExpertTargets) {
        names_here.insert(n);
        unmatched.erase(n);
      }
      if (parts.gate_up || parts.down) experts_chosen.emplace_back(name, experts);
      continue;
    }
    if (dynamic_cast<ExpertWeight*>(item.value().get()) != nullptr) continue;
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
                         " is not a linear layer. HINT: target the attention projections, the "
                         "feed-forward layers, or the routed experts (\"experts\")");
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
  TITAN_CONFIG_CHECK(!chosen.empty() || !experts_chosen.empty(),
                     "lora.target_modules selects no layer of this model part");
  TITAN_CONFIG_CHECK(experts_chosen.empty() || spec.dropout == 0.0, "lora.dropout = ", spec.dropout,
                     " with adapters on the routed experts: their adapter (as PEFT's on expert "
                     "parameters) has no dropout. HINT: set lora.dropout = 0");

  LoraApplied out;
  // Everything the model held so far is the frozen base, the routers' load-balancing bias too.
  for (auto& p : model.parameters()) {
    p.set_requires_grad(false);
    out.frozen_params += p.numel();
  }
  for (const auto& [name, moe] : moe_layers(model)) moe->expert_bias_frozen = true;
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
  for (const auto& [experts_name, experts] : experts_chosen) {
    GroupedExperts& g = *experts;
    const at::Tensor w1 = g.w1->named_parameters(/*recurse=*/false)["weight"];
    const int64_t n_experts = w1.size(0), hidden = w1.size(1), dim = w1.size(2);
    ParamDeviceGuard on(w1.device());
    const auto adapter = [&](const std::string& param, int64_t out_features, int64_t in_features,
                             bool is_a) {
      auto w = std::make_shared<ExpertWeight>(n_experts, out_features, in_features);
      w->is_adapter = true;
      if (w1.scalar_type() != w->weight.scalar_type()) {
        w->replace_weight(w->weight.to(w1.scalar_type()).detach().requires_grad_(true));
      }
      out.adapter_params += w->weight.numel();
      // PEFT's init for expert parameters: A as for a Linear of in_features, B zeros.
      const double bound = 1.0 / std::sqrt(static_cast<double>(in_features));
      model.set_param_init(experts_name + param,
                           is_a ? ParamInit::uniform(-bound, bound) : ParamInit::zeros());
      return w;
    };
    if (parts.gate_up) {
      TITAN_CHECK(g.w1->lora_a == nullptr, "LoRA applied twice to ", experts_name);
      g.w1->lora_a = g.w1->register_module(
          "lora_a", adapter(".w1" + std::string(kLoraA), spec.rank, dim, true));
      g.w1->lora_b = g.w1->register_module(
          "lora_b", adapter(".w1" + std::string(kLoraB), hidden, spec.rank, false));
      g.w3->lora_a = g.w1->lora_a;
      g.w3->lora_b = g.w3->register_module(
          "lora_b", adapter(".w3" + std::string(kLoraB), hidden, spec.rank, false));
    }
    if (parts.down) {
      TITAN_CHECK(g.w2->lora_a == nullptr, "LoRA applied twice to ", experts_name);
      g.w2->lora_a = g.w2->register_module(
          "lora_a", adapter(".w2" + std::string(kLoraA), spec.rank, hidden, true));
      g.w2->lora_b = g.w2->register_module(
          "lora_b", adapter(".w2" + std::string(kLoraB), dim, spec.rank, false));
    }
    g.lora_scaling = spec.scaling();
    out.adapted_experts.push_back(experts_name);
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
  // The layers quantize_frozen_nf4 takes.
  const auto params = built->named_parameters();
  for (const std::string& layer : frozen_block_linears(*built)) {
    c.frozen_block += params[layer + ".weight"].numel();
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
  for (const auto& [name, t] : params) {
    if (!is_lora_param(name)) continue;
    const std::string module = adapted_module(name);
    const std::string a_name = adapter_a_name(module);
    const auto a = params.find(a_name);
    const auto b = params.find(module + kLoraB);
    const auto w = out.find(module + ".weight");
    if (a == params.end() || b == params.end() || w == out.end()) {
      const std::string missing = a == params.end()   ? a_name
                                  : b == params.end() ? module + kLoraB
                                                      : module + ".weight";
      throw DataError(message("merging LoRA: ", name, " has no ", missing));
    }
    if (name != b->first) continue;  // each layer once, at its B
    // (out, r) @ (r, in), or per expert (experts, out, r) @ (experts, r, in).
    const at::Tensor delta =
        b->second.to(at::kFloat).matmul(a->second.to(at::kFloat)) * spec.scaling();
    w->second = (w->second.to(at::kFloat) + delta.to(w->second.device())).to(w->second.dtype());
  }
  return out;
}

TensorMap to_peft_tensors(const TensorMap& params, const nlohmann::json& description) {
  const ModelSpec& spec = spec_for_description(description);
  TensorMap out;
  std::set<std::string> experts;
  for (const auto& [name, a] : params) {
    if (!ends_with(name, kLoraA)) continue;
    if (const std::string e = experts_module(name); !e.empty()) {
      experts.insert(e);
      continue;
    }
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
  // The routed experts, as PEFT's adapters of their parameters: A (experts * r, in) with expert
  // e's rows at e * r ..., B (out, r * experts) with expert e's columns at e, e + experts, ...
  // (PEFT's layout); gate_up_proj's B is w1's rows then w3's (gpt-oss: interleaved).
  const bool interleaved = !experts.empty() && gate_up_interleaved(spec, description);
  const bool swapped = !experts.empty() && experts_swapped_in_peft(spec, description);
  const auto find = [&](const std::string& name) {
    const auto it = params.find(name);
    if (it == params.end()) throw DataError(message("LoRA adapter: missing ", name));
    return it->second;
  };
  for (const std::string& e : experts) {
    std::vector<std::pair<at::Tensor, at::Tensor>> parts;  // (A, B), in kHfExpertParams order
    if (params.count(e + ".w1" + kLoraA)) {
      const at::Tensor b1 = find(e + ".w1" + kLoraB), b3 = find(e + ".w3" + kLoraB);
      const at::Tensor b = interleaved
                               ? at::stack({b1, b3}, 2).reshape({b1.size(0), -1, b1.size(2)})
                               : at::cat({b1, b3}, 1);
      parts.emplace_back(find(e + ".w1" + kLoraA), b);
    }
    if (params.count(e + ".w2" + kLoraA)) {
      parts.emplace_back(find(e + ".w2" + kLoraA), find(e + ".w2" + kLoraB));
    }
    const at::Tensor& a0 = parts.front().first;  // (experts, r, in)
    const at::Tensor& b0 = parts.front().second;
    const std::string module =
        kPeftPrefix +
        hf_experts_module(spec, description, e, at::empty({a0.size(0), b0.size(1), 1}, at::kMeta));
    for (size_t i = 0; i < parts.size(); ++i) {
      // a (experts, r, in), b (experts, out, r); swapped: PEFT's A_e = b_e^T, B_e = a_e^T.
      const at::Tensor a = swapped ? parts[i].second.transpose(1, 2) : parts[i].first;
      const at::Tensor b = swapped ? parts[i].first.transpose(1, 2) : parts[i].second;
      std::string nest;
      for (size_t d = i + 1; d < parts.size(); ++d) nest += ".base_layer";
      out.emplace(module + nest + std::string(kPeftA), a.reshape({-1, a.size(2)}));
      out.emplace(module + nest + std::string(kPeftB),
                  b.permute({1, 2, 0}).reshape({b.size(1), -1}));
    }
  }
  if (out.empty()) throw DataError("no LoRA adapters to export (the model has none)");
  return out;
}

TensorMap from_peft_tensors(const TensorMap& peft, const nlohmann::json& description,
                            const LoraSpec& lora) {
  const ModelSpec& spec = spec_for_description(description);
  TITAN_CHECK(spec.hf.from_hf != nullptr, "model ", spec.name, " has no Hugging Face adapter");
  // The experts' parameters the adapter targets, in the module's order (their nesting).
  std::vector<std::string> expert_params;
  const ExpertParts parts = expert_parts(lora.target_modules);
  if (parts.gate_up) expert_params.push_back(kHfExpertParams[0]);
  if (parts.down) expert_params.push_back(kHfExpertParams[1]);
  // The Hugging Face layout of the experts' adapters (each derived from the model's config).
  const bool interleaved = !expert_params.empty() && gate_up_interleaved(spec, description);
  const bool swapped = !expert_params.empty() && experts_swapped_in_peft(spec, description);
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
    // An adapter of the routed experts' parameters: "<...>.experts[.base_layer]*".
    std::string base = hf_module;
    int64_t depth = 0;
    while (ends_with(base, ".base_layer")) {
      base = base.substr(0, base.size() - 11);
      ++depth;
    }
    if (ends_with(base, ".experts") && (a->second.dim() == 2 && b.dim() == 2)) {
      const int64_t k = static_cast<int64_t>(expert_params.size());
      if (depth >= k) {
        throw DataError(message("PEFT adapter: ", name,
                                " adapts a parameter of the routed "
                                "experts, and adapter_config.json's target_parameters name ",
                                k, " of them (gate_up_proj, down_proj)"));
      }
      const std::string param = expert_params[k - 1 - depth];
      const int64_t r = lora.rank;
      if (r < 1 || a->second.size(0) % r != 0 || b.size(1) != a->second.size(0)) {
        throw DataError(message("PEFT adapter: ", name, " ", b.sizes(), " and its lora_A ",
                                a->second.sizes(), " are not rank-", r,
                                " adapters of a stack of experts"));
      }
      const int64_t n_experts = a->second.size(0) / r;
      TensorMap ours;
      try {
        ours = spec.hf.from_hf(
            {{base + "." + param, at::empty({n_experts, b.size(0), a->second.size(1)}, at::kMeta)}},
            base_description(description));
      } catch (const DataError& e) {
        throw DataError(message("PEFT adapter: ", base, ".", param, " is no parameter of model ",
                                spec.name, " (", e.what(), ")"));
      }
      const std::string experts = experts_module(module_of(ours.begin()->first) + kLoraA);
      TITAN_CHECK(!experts.empty(), "PEFT adapter: ", base, ".", param, " maps to ",
                  ours.begin()->first);
      const at::Tensor a_peft = a->second.reshape({n_experts, r, a->second.size(1)});
      const at::Tensor b_peft = b.reshape({b.size(0), r, n_experts}).permute({2, 0, 1});
      // (experts, r, in) and (experts, out, r) in our orientation (see experts_swapped_in_peft).
      const at::Tensor a_ours = swapped ? b_peft.transpose(1, 2) : a_peft;
      const at::Tensor b_ours = swapped ? a_peft.transpose(1, 2) : b_peft;
      if (param == "gate_up_proj") {
        const int64_t hidden = b_ours.size(1) / 2;
        out.emplace(experts + ".w1" + kLoraA, a_ours.contiguous());
        if (interleaved) {  // gate rows even, up rows odd
          const at::Tensor pairs = b_ours.reshape({n_experts, hidden, 2, r});
          out.emplace(experts + ".w1" + kLoraB, pairs.select(2, 0).contiguous());
          out.emplace(experts + ".w3" + kLoraB, pairs.select(2, 1).contiguous());
        } else {
          out.emplace(experts + ".w1" + kLoraB, b_ours.narrow(1, 0, hidden).contiguous());
          out.emplace(experts + ".w3" + kLoraB, b_ours.narrow(1, hidden, hidden).contiguous());
        }
      } else {
        out.emplace(experts + ".w2" + kLoraA, a_ours.contiguous());
        out.emplace(experts + ".w2" + kLoraB, b_ours.contiguous());
      }
      continue;
    }
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
  // On transformers' fused-experts MoE models peft reads the target_modules names gate_proj,
  // up_proj, down_proj and gate as the routed experts' and router's (their names before the
  // experts were fused) and moves them to target_parameters; a dense or shared-expert layer of
  // those names is then targeted through its parameter ("shared_experts.down_proj.weight"),
  // which gives the same adapter names and math (no dropout there, as for any parameter).
  const ModelSpec& model_spec = spec_for_description(description);
  bool fused_moe = false;
  if (model_spec.hf.to_hf_config) {
    const std::string type =
        model_spec.hf.to_hf_config(base_description(description)).value("model_type", "");
    fused_moe = type == "qwen3_moe" || type == "deepseek_v3";
  }
  std::set<std::string> targets;
  std::set<std::string> param_targets;  // PEFT's target_parameters
  for (const auto& [name, t] : to_peft_tensors(params, description)) {
    if (!ends_with(name, std::string(kPeftA)) || name.find(".experts.") != std::string::npos) {
      continue;
    }
    const std::string module = name.substr(0, name.size() - kPeftA.size());
    const std::string leaf = last_part(module);
    if (fused_moe &&
        (leaf == "gate_proj" || leaf == "up_proj" || leaf == "down_proj" || leaf == "gate")) {
      const std::string parent = last_part(module.substr(0, module.size() - leaf.size() - 1));
      param_targets.insert(parent + "." + leaf + ".weight");
    } else {
      targets.insert(leaf);
    }
  }
  for (const auto& [name, t] : params) {
    if (ends_with(name, ".experts.w1" + std::string(kLoraA))) {
      param_targets.insert("experts.gate_up_proj");
    }
    if (ends_with(name, ".experts.w2" + std::string(kLoraA))) {
      param_targets.insert("experts.down_proj");
    }
  }
  if (!param_targets.empty() && spec.dropout != 0) {
    throw DataError(message(
        "a PEFT adapter of this model targets ",
        join(std::vector<std::string>(param_targets.begin(), param_targets.end())),
        " as parameters, which peft adapts without dropout, and these adapters were trained with "
        "lora.dropout = ",
        spec.dropout, ". HINT: export the merged model (titan convert to-hf --merge-lora)"));
  }
  nlohmann::json config = {
      {"peft_type", "LORA"},
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
  if (!param_targets.empty()) {
    config["target_parameters"] =
        std::vector<std::string>(param_targets.begin(), param_targets.end());
    if (targets.empty()) config["target_modules"] = nullptr;
  }
  return config;
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
    const nlohmann::json& t =
        config.contains("target_modules") ? config["target_modules"] : nlohmann::json();
    if (t.is_string()) {
      spec.target_modules = {t.get<std::string>()};
    } else if (!t.is_null()) {
      spec.target_modules = t.get<std::vector<std::string>>();
    }
    // Parameters of the routed experts (PEFT's target_parameters, matched by name suffix).
    const nlohmann::json params = config.value("target_parameters", nlohmann::json());
    if (!params.is_null()) {
      for (const std::string& p : params.get<std::vector<std::string>>()) {
        if (ends_with(p, ".weight") && p.size() > 7) {  // a linear layer's weight
          spec.target_modules.push_back(last_part(p.substr(0, p.size() - 7)));
          continue;
        }
        const std::string leaf = last_part(p);
        if (leaf != "gate_up_proj" && leaf != "down_proj") {
          refuse("target_parameters entry \"" + p +
                 "\" (titan adapts the routed experts' gate_up_proj and down_proj, and linear "
                 "layers' weights)");
        }
        spec.target_modules.push_back("experts." + leaf);
      }
    }
    if (spec.target_modules.empty()) {
      throw DataError(message(path, ": neither target_modules nor target_parameters"));
    }
  } catch (const nlohmann::json::exception& e) {
    throw DataError(message(path, ": ", e.what()));
  }
  return spec;
}

}  // namespace titan
