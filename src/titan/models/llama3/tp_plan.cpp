// Llama 3's tensor-parallel plan (TorchTitan's parallelize_llama, as data). The model's code has no
// parallelism in it; src/titan/parallel/tensor_parallel.cpp applies the plan.
#include "titan/models/llama3/model.h"

namespace titan::llama3 {

std::vector<TpRule> Transformer::tensor_parallel_plan() const {
  // Only rules for present modules: a pipeline stage holds some of them (keep_only), and a rule
  // that matches nothing is an error.
  std::vector<TpRule> plan;
  if (tok_embeddings) plan.push_back({"tok_embeddings", TpStyle::kEmbedding});
  const std::vector<TpRule> block_rules = {
      {"layers.*.attention_norm", TpStyle::kSequenceParallel},
      {"layers.*.attention", TpStyle::kGatherInput},
      {"layers.*.attention.wq", TpStyle::kColwise},
      {"layers.*.attention.wk", TpStyle::kColwise},
      {"layers.*.attention.wv", TpStyle::kColwise},
      {"layers.*.attention.wo", TpStyle::kRowwise},
      {"layers.*.ffn_norm", TpStyle::kSequenceParallel},
      {"layers.*.feed_forward", TpStyle::kGatherInput},
      {"layers.*.feed_forward.w1", TpStyle::kColwise},
      {"layers.*.feed_forward.w3", TpStyle::kColwise},
      {"layers.*.feed_forward.w2", TpStyle::kRowwise},
  };
  if (!layers.empty()) plan.insert(plan.end(), block_rules.begin(), block_rules.end());
  if (norm) plan.push_back({"norm", TpStyle::kSequenceParallel});
  if (output) plan.push_back({"output", TpStyle::kOutput});
  return plan;
}

}  // namespace titan::llama3
