// Loading a frozen component's weights (text encoders, the autoencoder) from tensors named as
// its parameters are (Hugging Face names, for modules that keep them).
#pragma once

#include "titan/models/registry.h"

#include <torch/nn/module.h>

#include <map>
#include <set>
#include <string>

namespace titan::encoders {

// Copies tensors[name] into each parameter `name` of `module` (converted to the parameter's
// dtype); `aliases` gives other names a parameter may be stored under (a tied embedding saved
// once: "encoder.embed_tokens.weight" for "shared.weight"), `ignored` tensors that hold no
// parameter (position-id buffers of older saves). DataError naming `what` and the first
// parameter missing, a shape that differs, or a tensor that no parameter takes.
void load_named_tensors(torch::nn::Module& module, const TensorMap& tensors,
                        const std::string& what,
                        const std::map<std::string, std::string>& aliases = {},
                        const std::set<std::string>& ignored = {});

}  // namespace titan::encoders
