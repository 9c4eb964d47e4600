// Shared by the data- and tensor-parallel tests: a tiny Llama built identically on every rank,
// and the unsharded model's loss and gradients on the global batch as the reference.
#pragma once

#include "../distributed/multirank.h"

#include "titan/components/loss.h"
#include "titan/components/optimizer.h"
#include "titan/distributed/parallel_dims.h"
#include "titan/models/llama3/model.h"
#include "titan/parallel/grad_norm.h"

#include <nlohmann/json.hpp>

#include <map>
#include <memory>
#include <string>

namespace titan::test {

constexpr int64_t kBatchPerRank = 2;
constexpr int64_t kSeq = 8;

inline llama3::Llama3Args tiny_args(bool tied, int64_t vocab = 61) {
  llama3::Llama3Args a;
  a.dim = 24;  // rows of 24 or 61 do not split evenly over 3 or 4 ranks: padding is exercised
  a.n_layers = 2;
  a.n_heads = 4;
  a.n_kv_heads = 2;
  a.vocab_size = vocab;
  a.multiple_of = 16;
  a.max_seq_len = 16;
  a.tie_embeddings = tied;
  return a;
}

// The model description of tiny_args(false, vocab) (a custom flavor), for code that maps names to
// Hugging Face's through it (LoRA targets, PEFT names).
inline nlohmann::json tiny_description(int64_t vocab = 61) {
  return {{"name", "llama3"},
          {"flavor", "custom"},
          {"args",
           {{"dim", 24},
            {"n_layers", 2},
            {"n_heads", 4},
            {"n_kv_heads", 2},
            {"vocab_size", vocab},
            {"multiple_of", 16},
            {"max_seq_len", 16}}}};
}

inline std::shared_ptr<llama3::Transformer> make_model(bool tied, at::ScalarType dtype = at::kFloat,
                                                       int64_t vocab = 61) {
  auto m = std::make_shared<llama3::Transformer>(tiny_args(tied, vocab), dtype);
  m->init_weights(/*seed=*/1234);
  return m;
}

struct Reference {
  at::Tensor inputs, labels;  // the global batch (ranks * kBatchPerRank rows)
  double loss = 0;
  double grad_norm = 0;
  std::map<std::string, at::Tensor> grads;
};

// The unsharded model on the whole batch.
inline Reference reference(int ranks, bool tied, int64_t micro_batches = 1, int64_t vocab = 61) {
  Reference r;
  at::manual_seed(99);
  r.inputs = at::randint(0, vocab, {ranks * kBatchPerRank * micro_batches, kSeq}, at::kLong);
  r.labels = at::randint(0, vocab, {ranks * kBatchPerRank * micro_batches, kSeq}, at::kLong);
  auto model = make_model(tied, at::kFloat, vocab);
  at::Tensor loss = lm_cross_entropy_loss(model->forward(r.inputs), r.labels);
  loss.backward();
  r.loss = loss.item<double>();
  std::vector<at::Tensor> params;
  for (const auto& item : model->named_parameters()) {
    r.grads[item.key()] = item.value().grad().clone();
    params.push_back(item.value());
  }
  r.grad_norm = clip_grad_norm(grads_of(params), 0.0);
  return r;
}

// Mesh degrees of a layout: dp_replicate x dp_shard x tp.
inline ParallelDegrees degrees(int64_t replicate, int64_t shard, int64_t tp) {
  ParallelDegrees d;
  d.dp_replicate = replicate;
  d.dp_shard = shard;
  d.tp = tp;
  return d;
}

// Rows of `t` for data-parallel rank `dp_rank` of micro-batch `micro` (the trainer's split).
inline at::Tensor rows_of(const at::Tensor& t, int64_t dp_rank, int64_t dp_size, int64_t micro) {
  return t.narrow(0, (micro * dp_size + dp_rank) * kBatchPerRank, kBatchPerRank);
}

}  // namespace titan::test
