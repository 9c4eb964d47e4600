// DeepSeek-V3 (TorchTitan's deepseek_v3): the Llama 3 decoder with multi-head latent attention
// (low-rank q and kv projections, RoPE on qk_rope_head_dim extra dimensions per head with one
// rotary key shared by all heads, YaRN frequencies and softmax correction) in every block, and
// from layer n_dense_layers on a mixture of experts instead of the SwiGLU: shared experts, sigmoid
// or softmax router scores, group-limited top-k, route scale, weights applied after the experts,
// auxiliary-loss-free bias balancing; multi-token prediction (Llama3Args::num_mtp_layers, the
// _mtp flavors and Hugging Face folders with num_nextn_predict_layers) trains the MTP modules
// with training.mtp_loss_weight.
#pragma once

#include "titan/models/llama3/args.h"
#include "titan/models/registry.h"

#include <string>
#include <utility>
#include <vector>

namespace titan::deepseek_v3 {

// tiny (unit tests: 3 layers, the first dense, q latent, sigmoid groups; its norms use HF's eps
// 1e-6 so that it converts to Hugging Face exactly) and tiny_mtp (tiny with 2 prediction depths),
// then TorchTitan's debugmodel, debugmodel_mtp (with DeepSeek-V3's one prediction depth), 16B
// (DeepSeek-V2-Lite's sizes), 236B (DeepSeek-V2) and 671B (DeepSeek-V3).
const std::vector<std::pair<std::string, llama3::Llama3Args>>& flavors();
const llama3::Family& family();

}  // namespace titan::deepseek_v3

namespace titan {

// Spec "deepseek_v3". Its parallelize is the decoder's, refusing context parallelism (the ring
// attention seam serves the GQA attention only) and tensor parallel degrees that split a head.
ModelSpec make_deepseek_v3_spec();

}  // namespace titan
