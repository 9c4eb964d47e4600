// The model registry (see registry.h). Builtin models are registered explicitly the first time
// the registry is touched: static-initializer registration would be dropped by the linker, since
// nothing references those objects in a static library.
#include "titan/models/registry.h"

#include "titan/common/check.h"
#include "titan/config/job_config.h"
#include "titan/models/deepseek_v3/spec.h"
#include "titan/models/flux/spec.h"
#include "titan/models/gpt_oss/spec.h"
#include "titan/models/llama3/spec.h"
#include "titan/models/llama4/spec.h"
#include "titan/models/qwen3/spec.h"
#include "titan/models/qwen3_next/spec.h"
#include "titan/models/vlm/model.h"

#include <algorithm>
#include <mutex>
#include <sstream>

namespace titan {
namespace {

// Specs by registration order; unique_ptr keeps references stable as the list grows.
struct Registry {
  std::mutex mutex;
  std::vector<std::unique_ptr<ModelSpec>> specs;
};

Registry& registry_storage() {
  static Registry registry;
  return registry;
}

void add_spec(ModelSpec spec) {
  Registry& registry = registry_storage();
  std::lock_guard<std::mutex> lock(registry.mutex);
  for (const auto& existing : registry.specs) {
    TITAN_CHECK(existing->name != spec.name, "model '", spec.name, "' is registered twice");
  }
  registry.specs.push_back(std::make_unique<ModelSpec>(std::move(spec)));
}

Registry& registry() {
  static std::once_flag builtins;
  std::call_once(builtins, [] {
    add_spec(make_llama3_spec());
    add_spec(make_qwen3_spec());
    add_spec(make_deepseek_v3_spec());
    add_spec(make_gpt_oss_spec());
    add_spec(make_llama4_spec());
    add_spec(make_qwen3_next_spec());
    add_spec(make_flux_spec());
    add_spec(make_vlm_spec());
  });
  return registry_storage();
}

}  // namespace

void register_model(ModelSpec spec) {
  registry();  // builtins first, so a clash with one is reported here
  add_spec(std::move(spec));
}

const ModelSpec& get_model_spec(const std::string& name) {
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mutex);
  for (const auto& spec : reg.specs) {
    if (spec->name == name) {
      return *spec;
    }
  }
  std::vector<std::string> names;
  for (const auto& spec : reg.specs) {
    names.push_back(spec->name);
  }
  throw ConfigError(message("unknown model.name '", name, "'", suggestion(name, names, "models")));
}

void check_flavor(const ModelSpec& spec, const std::string& flavor) {
  check_flavor(spec.name, spec.flavors, flavor);
}

nlohmann::json model_description(const ModelSection& model) {
  return {{"name", model.name}, {"flavor", model.flavor}};
}

const ModelSpec& spec_for_description(const nlohmann::json& model) {
  if (!model.is_object() || !model.contains("name") || !model["name"].is_string()) {
    throw ConfigError(message("model description ", model.dump(),
                              " has no \"name\" (want {\"name\": \"llama3\", \"flavor\": ...})"));
  }
  return get_model_spec(model["name"].get<std::string>());
}

const ModelSpec& spec_for_hf_model_type(const std::string& model_type) {
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mutex);
  std::vector<std::string> types;
  for (const auto& spec : reg.specs) {
    if (spec->hf.model_type.empty()) {
      continue;
    }
    const auto& others = spec->hf.other_model_types;
    if (spec->hf.model_type == model_type ||
        std::find(others.begin(), others.end(), model_type) != others.end()) {
      return *spec;
    }
    types.push_back(spec->hf.model_type);
    types.insert(types.end(), others.begin(), others.end());
  }
  throw ConfigError(message("Hugging Face model_type '", model_type, "' is not supported",
                            suggestion(model_type, types, "supported")));
}

std::vector<std::string> registered_models() {
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mutex);
  std::vector<std::string> names;
  for (const auto& spec : reg.specs) {
    names.push_back(spec->name);
  }
  return names;
}

}  // namespace titan
