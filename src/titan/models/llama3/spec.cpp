// Llama 3's ModelSpec: flavors, builders, analytic description and the Hugging Face adapter.
#include "titan/models/llama3/spec.h"

#include "titan/models/llama3/args.h"
#include "titan/models/llama3/hf_adapter.h"
#include "titan/models/llama3/model.h"

namespace titan {

ModelSpec make_decoder_spec(const llama3::Family& family) {
  ModelSpec spec;
  spec.name = family.name;
  for (const auto& [name, args] : *family.flavors) {
    spec.flavors.push_back(name);
  }
  spec.describe = [family](const std::string& flavor, int64_t batch, int64_t seq_len,
                           at::ScalarType compute_dtype) {
    return llama3::compute_stats(llama3::args_for_flavor(flavor, family), batch, seq_len,
                                 compute_dtype);
  };
  spec.build = [family](const std::string& flavor,
                        const ModelBuildOptions& options) -> std::shared_ptr<Model> {
    llama3::Llama3Args args = llama3::args_for_flavor(flavor, family);
    args.max_seq_len = options.max_seq_len;
    ParamDeviceGuard device(options.meta ? at::Device(at::kMeta) : at::Device(at::kCPU));
    auto model = std::make_shared<llama3::Transformer>(args, options.compute_dtype);
    if (!options.meta) model->init_weights(options.seed);
    return model;
  };
  spec.describe_flavor = [family](const std::string& flavor) {
    return llama3::describe(llama3::args_for_flavor(flavor, family));
  };
  spec.resolve_args = [family](const nlohmann::json& model) {
    return llama3::resolved_args(llama3::args_from_description(model, family));
  };
  spec.build_uninitialized = [family](const nlohmann::json& model,
                                      const ModelBuildOptions& options) -> std::shared_ptr<Model> {
    llama3::Llama3Args args = llama3::args_from_description(model, family);
    args.max_seq_len = options.max_seq_len;
    ParamDeviceGuard device(options.meta ? at::Device(at::kMeta) : at::Device(at::kCPU));
    return std::make_shared<llama3::Transformer>(args, options.compute_dtype);
  };
  return spec;
}

ModelSpec make_llama3_spec() {
  ModelSpec spec = make_decoder_spec(llama3::llama3_family());
  spec.hf = llama3::make_hf_adapter();
  return spec;
}

}  // namespace titan
