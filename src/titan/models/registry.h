// The model registry. Each model (e.g. models/llama3) provides a `make_<model>_spec()` that
// registry.cpp registers on first use (explicitly, since static-init registration is dropped by
// the linker from static libraries); the trainer and `inspect` look models up by name.
#pragma once

#include "titan/models/model.h"

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace titan {

struct ModelSpec {
  std::string name;
  std::vector<std::string> flavors;  // in registration order (small to large)
  // Analytic stats of `flavor` at (batch, seq_len); never allocates weights.
  std::function<ModelStats(const std::string& flavor, int64_t batch, int64_t seq_len,
                           at::ScalarType compute_dtype)>
      describe;
  // A freshly built, initialized model of `flavor` (uses the global RNG for init).
  std::function<std::shared_ptr<Model>(const std::string& flavor, const ModelBuildOptions&)> build;
  // One line per flavor (dims) for `--help`-style listings.
  std::function<std::string(const std::string& flavor)> describe_flavor;
};

// Registers a spec; a duplicate name is a programming error.
void register_model(ModelSpec spec);

// The spec for `name`. Throws ConfigError naming the nearest registered model if unknown.
const ModelSpec& get_model_spec(const std::string& name);

// Throws ConfigError naming the nearest flavor of `spec` if `flavor` is unknown.
void check_flavor(const ModelSpec& spec, const std::string& flavor);
// The same check against a plain list, for code that has the flavors but not the spec.
void check_flavor(const std::string& model, const std::vector<std::string>& flavors,
                  const std::string& flavor);

std::vector<std::string> registered_models();

}  // namespace titan
