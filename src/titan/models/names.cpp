// Name checks shared by the model registry and the models' argument parsers: the "did you mean"
// suggestion and the flavor check. Kept apart from registry.cpp, which pulls in every builtin
// model, so that a parser (llama3/args.cpp) links without the model code (the fuzz build,
// tests/fuzz, compiles only the parsers).
#include "titan/models/registry.h"

#include "titan/common/check.h"
#include "titan/common/format.h"
#include "titan/common/names.h"

#include <algorithm>

namespace titan {

std::string suggestion(const std::string& name, const std::vector<std::string>& candidates,
                       const std::string& kind) {
  return did_you_mean(nearest_name(name, candidates)) + " (" + kind + ": " + join(candidates) + ")";
}

void check_flavor(const std::string& model, const std::vector<std::string>& flavors,
                  const std::string& flavor) {
  if (std::find(flavors.begin(), flavors.end(), flavor) != flavors.end()) {
    return;
  }
  throw ConfigError(message("unknown model.flavor '", flavor, "' for model '", model, "'",
                            suggestion(flavor, flavors, "flavors")));
}

}  // namespace titan
