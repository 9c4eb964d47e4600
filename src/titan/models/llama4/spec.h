// Llama 4 text models (model "llama4": Meta's Scout 17B-16E and Maverick 17B-128E, TorchTitan's
// flavors): the Llama 3 decoder with MoE layers of a shared expert and top-1 sigmoid routing,
// interleaved with dense layers, and iRoPE: RoPE layers attending within chunks (with the L2 qk
// norm where the model has it) and every 4th layer without RoPE, attending globally with
// temperature-tuned queries (see llama3/args.h and common/attention.h).
#pragma once

#include "titan/models/llama3/args.h"
#include "titan/models/registry.h"

#include <string>
#include <utility>
#include <vector>

namespace titan::llama4 {

const std::vector<std::pair<std::string, llama3::Llama3Args>>& flavors();
const llama3::Family& family();

}  // namespace titan::llama4

namespace titan {

ModelSpec make_llama4_spec();

}  // namespace titan
