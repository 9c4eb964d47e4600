// The registry entry for Llama 3 (registered by registry.cpp on first use).
#pragma once

#include "titan/models/llama3/args.h"
#include "titan/models/registry.h"

namespace titan {

// Spec "llama3": every flavor of llama3::flavors(); build() constructs and initializes.
ModelSpec make_llama3_spec();

// The spec of a family built on the Llama 3 decoder (llama3::Family: Llama 3, Qwen3), without a
// Hugging Face adapter.
ModelSpec make_decoder_spec(const llama3::Family& family);

}  // namespace titan
