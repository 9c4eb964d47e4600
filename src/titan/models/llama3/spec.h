// The registry entry for Llama 3 (registered by registry.cpp on first use).
#pragma once

#include "titan/models/registry.h"

namespace titan {

// Spec "llama3": every flavor of llama3::flavors(); build() constructs and initializes.
ModelSpec make_llama3_spec();

}  // namespace titan
