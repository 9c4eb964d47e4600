// Llama 3's tensor-parallel plan (TorchTitan's parallelize_llama, as data). The model's code has no
// parallelism in it; src/titan/parallel/tensor_parallel.cpp applies the plan.
#include "titan/models/llama3/model.h"

#include <algorithm>

namespace titan::llama3 {

std::vector<std::pair<std::string, int64_t>> Transformer::tp_split_counts() const {
  if (!args_.mla.enabled()) return {};
  return {{"n_heads", args_.n_heads}};
}

std::vector<TpRule> Transformer::tensor_parallel_plan() const {
  // Only rules for present modules: a pipeline stage holds some of them (keep_only), and a rule
  // that matches nothing is an error.
  std::vector<TpRule> plan;
  if (tok_embeddings) plan.push_back({"tok_embeddings", TpStyle::kEmbedding});
  std::vector<TpRule> block_rules = {
      {"layers.*.attention_norm", TpStyle::kSequenceParallel},
      {"layers.*.attention", TpStyle::kGatherInput},
      {"layers.*.attention.wq", TpStyle::kColwise},
      {"layers.*.attention.wk", TpStyle::kColwise},
      {"layers.*.attention.wv", TpStyle::kColwise},
      {"layers.*.attention.wo", TpStyle::kRowwise},
      {"layers.*.ffn_norm", TpStyle::kSequenceParallel},
  };
  // gpt-oss: the q/k/v biases and the sinks split with the heads; wo's bias stays whole (the
  // attention adds it after wo's output is reduced; its gradient is summed over tp).
  if (args_.attention_bias) {
    for (const char* bias : {"bq", "bk", "bv"}) {
      block_rules.push_back({std::string("layers.*.attention.") + bias, TpStyle::kColwise});
    }
  }
  if (args_.attention_sinks) block_rules.push_back({"layers.*.attention.sinks", TpStyle::kColwise});
  if (args_.mla.enabled()) {
    // TorchTitan's MLA plan: heads split by the query and wkv_b rows, wo by columns; wq_a, wkv_a
    // and the latent norms replicated (their gradients are partial over heads and summed).
    block_rules = {
        {"layers.*.attention_norm", TpStyle::kSequenceParallel},
        {"layers.*.attention", TpStyle::kGatherInput},
        {args_.mla.q_lora_rank > 0 ? "layers.*.attention.wq_b" : "layers.*.attention.wq",
         TpStyle::kColwise},
        {"layers.*.attention.wkv_b", TpStyle::kColwise},
        {"layers.*.attention.wo", TpStyle::kRowwise},
        {"layers.*.ffn_norm", TpStyle::kSequenceParallel},
    };
  }
  const std::vector<TpRule> dense_rules = {
      {"layers.*.feed_forward", TpStyle::kGatherInput},
      {"layers.*.feed_forward.w1", TpStyle::kColwise},
      {"layers.*.feed_forward.w3", TpStyle::kColwise},
      {"layers.*.feed_forward.w2", TpStyle::kRowwise},
  };
  // Qwen3's q_norm / k_norm and MoE blocks need no rule: replicated weights whose gradients are
  // partial over tp (heads, sequence shards) and summed like the norms'. An MoE runs on the
  // sequence shard it gets: its tokens are routed independently.
  if (!layers.empty()) plan.insert(plan.end(), block_rules.begin(), block_rules.end());
  const bool dense_present = std::any_of(layers.begin(), layers.end(),
                                         [](const auto& layer) { return layer->feed_forward; });
  if (dense_present) plan.insert(plan.end(), dense_rules.begin(), dense_rules.end());
  // Qwen3-Next's linear attention runs whole sequences, replicated (its weights' gradients summed).
  if (std::any_of(layers.begin(), layers.end(),
                  [](const auto& layer) { return layer->linear_attention; })) {
    plan.push_back({"layers.*.linear_attention", TpStyle::kReplicated});
  }
  if (norm) plan.push_back({"norm", TpStyle::kSequenceParallel});
  if (output) plan.push_back({"output", TpStyle::kOutput});
  return plan;
}

}  // namespace titan::llama3
