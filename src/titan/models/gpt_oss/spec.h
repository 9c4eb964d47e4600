// gpt-oss (OpenAI's open-weight MoE models; model "gpt_oss"): the Llama 3 decoder with attention
// biases and sinks, sliding-window attention in every other layer, YaRN RoPE, and MoE layers
// with a biased router, biased experts and the clamped SwiGLU (see llama3/args.h and moe.h).
#pragma once

#include "titan/models/llama3/args.h"
#include "titan/models/registry.h"

#include <string>
#include <utility>
#include <vector>

namespace titan::gpt_oss {

const std::vector<std::pair<std::string, llama3::Llama3Args>>& flavors();
const llama3::Family& family();

}  // namespace titan::gpt_oss

namespace titan {

ModelSpec make_gpt_oss_spec();

}  // namespace titan
