// FLUX.1's registry entry (see spec.h).
#include "titan/models/flux/spec.h"

#include "titan/common/check.h"
#include "titan/models/common/init.h"
#include "titan/models/flux/args.h"
#include "titan/models/flux/hf_adapter.h"
#include "titan/models/flux/model.h"

#include <algorithm>

namespace titan {
namespace {

// The args of a model description: the flavor's, with "args" overriding them.
flux::FluxArgs description_args(const nlohmann::json& model) {
  const std::string flavor = model.value("flavor", std::string());
  const std::vector<std::string> names = flux::flavor_names();
  const bool known = std::find(names.begin(), names.end(), flavor) != names.end();
  // Without "args" the flavor must be known (args_for_flavor names the nearest).
  if (!model.contains("args")) return flux::args_for_flavor(flavor);
  return flux::args_from_json(model.at("args"),
                              known ? flux::args_for_flavor(flavor) : flux::FluxArgs{});
}

}  // namespace

ModelSpec make_flux_spec() {
  ModelSpec spec;
  spec.name = "flux";
  spec.objective = ModelObjective::kFlowMatching;
  spec.flavors = flux::flavor_names();
  spec.describe = [](const std::string& flavor, int64_t /*batch*/, int64_t /*seq_len*/,
                     at::ScalarType /*compute_dtype*/) {
    return flux::model_stats(flux::args_for_flavor(flavor));
  };
  spec.build = [](const std::string& flavor,
                  const ModelBuildOptions& options) -> std::shared_ptr<Model> {
    const flux::FluxArgs args = flux::args_for_flavor(flavor);
    ParamDeviceGuard device(options.meta ? at::Device(at::kMeta) : at::Device(at::kCPU));
    auto model = std::make_shared<flux::FluxTransformer>(args, options.compute_dtype);
    if (!options.meta) model->init_weights(options.seed);
    return model;
  };
  spec.describe_flavor = [](const std::string& flavor) {
    return flux::describe(flux::args_for_flavor(flavor));
  };
  spec.resolve_args = [](const nlohmann::json& model) {
    return flux::args_to_json(description_args(model));
  };
  spec.build_uninitialized = [](const nlohmann::json& model,
                                const ModelBuildOptions& options) -> std::shared_ptr<Model> {
    ParamDeviceGuard device(options.meta ? at::Device(at::kMeta) : at::Device(at::kCPU));
    return std::make_shared<flux::FluxTransformer>(description_args(model), options.compute_dtype);
  };
  // diffusers' FluxTransformer2DModel folders (the "transformer" folder of a FLUX pipeline).
  spec.hf.model_type = "FluxTransformer2DModel";
  spec.hf.weights_name = "diffusion_pytorch_model";
  spec.hf.to_hf_config = [](const nlohmann::json& model) {
    return flux::to_diffusers_config(description_args(model));
  };
  spec.hf.from_hf_config = [](const nlohmann::json& config) {
    return nlohmann::json{{"name", "flux"},
                          {"flavor", "custom"},
                          {"args", flux::args_to_json(flux::from_diffusers_config(config))}};
  };
  spec.hf.to_hf = [](const TensorMap& ours, const nlohmann::json& model) {
    return flux::to_diffusers(ours, description_args(model));
  };
  spec.hf.from_hf = [](const TensorMap& hf, const nlohmann::json& model) {
    return flux::from_diffusers(hf, description_args(model));
  };
  return spec;
}

}  // namespace titan
