// Loading frozen components' weights (see load.h).
#include "titan/models/encoders/load.h"

#include "titan/common/check.h"

namespace titan::encoders {

void load_named_tensors(torch::nn::Module& module, const TensorMap& tensors,
                        const std::string& what, const std::map<std::string, std::string>& aliases,
                        const std::set<std::string>& ignored) {
  std::set<std::string> used;
  at::NoGradGuard no_grad;
  for (auto& item : module.named_parameters()) {
    const std::string& name = item.key();
    auto it = tensors.find(name);
    if (it == tensors.end()) {
      const auto alias = aliases.find(name);
      if (alias != aliases.end()) it = tensors.find(alias->second);
    }
    if (it == tensors.end()) {
      throw DataError(message(what, ": the weights lack '", name, "'"));
    }
    if (it->second.sizes() != item.value().sizes()) {
      throw DataError(message(what, ": '", it->first, "' is ", it->second.sizes(),
                              ", the configuration's parameter is ", item.value().sizes()));
    }
    item.value().copy_(it->second);
    used.insert(it->first);
  }
  for (const auto& [name, tensor] : tensors) {
    if (used.count(name) == 0 && ignored.count(name) == 0) {
      // An alias of a parameter loaded under its own name (a tied embedding saved twice).
      bool alias_of_loaded = false;
      for (const auto& [param, alias] : aliases) alias_of_loaded |= alias == name;
      if (!alias_of_loaded) {
        throw DataError(
            message(what, ": tensor '", name, "' is not a parameter of this configuration"));
      }
    }
  }
}

}  // namespace titan::encoders
