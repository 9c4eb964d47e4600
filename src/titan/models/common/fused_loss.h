// The head and the loss of a causal LM as one op (compile.components "loss"): the mean
// cross-entropy of h @ weight^T against the labels, computed over blocks of tokens so that the
// (tokens, vocab) logits are never materialised, only one block of them at a time.
//
// Training computes the gradients during the forward: the loss is the end of the graph, so the
// gradient of each block of logits is known as soon as its log-sum-exp is (softmax minus the
// one-hot target, over the number of tokens); the block then becomes grad_h rows and a share of
// grad_weight, and is dropped. Backward only scales the two by the incoming gradient (the loss
// scale). The three GEMMs are those of the unfused head; what goes is the float32 logits, their
// log-softmax and its gradient (about 12 bytes per logit kept or allocated at once), and five of
// the eight passes over them (kernels/cross_entropy.h).
//
// Tensor parallelism's loss parallel passes its vocabulary shard: each rank then holds
// weight rows [start, start + rows) and the per-token statistics are combined over the shards
// (two float32 all-reduces of one value per token); the block logits are computed twice (once for
// the statistics, once for the gradient), one GEMM more than unsharded.
#pragma once

#include <ATen/ATen.h>

#include <functional>

namespace titan {

struct VocabShard {
  int64_t start = 0;  // the vocabulary id of weight row 0
  // In place over the ranks that hold the other shards: sum, and maximum, of a float32 tensor.
  // Unset: `weight` holds the whole vocabulary.
  std::function<void(at::Tensor&)> all_reduce_sum;
  std::function<void(at::Tensor&)> all_reduce_max;
};

// h (..., dim), weight (vocab rows, dim), labels (...) int64 -> 0-d float32: the mean over the
// labels that are not kernels::kIgnoreIndex of cross_entropy(h @ weight^T, labels), the matmuls in
// `compute_dtype` (as mixed_linear; in float32 on a CPU whose bf16 GEMMs are slow, see
// cpu_has_fast_bf16_matmul), the softmax in float32 (as lm_cross_entropy_loss).
// Differentiable in h and weight; its graph can be run backward once. `block_tokens` > 0 sets
// the tokens per block (tests); 0 takes fused_loss_block_tokens of the weight's rows.
at::Tensor fused_linear_cross_entropy(const at::Tensor& h, const at::Tensor& weight,
                                      const at::Tensor& labels, at::ScalarType compute_dtype,
                                      const VocabShard& shard = {}, int64_t block_tokens = 0);

// Tokens per block for a vocabulary of `vocab` rows: up to 2^25 logits (128 MiB in float32), from
// 256 to 1024 tokens. The weight gradient is one GEMM per block with the block's tokens as its
// inner dimension, reading and writing the whole float32 (vocab, dim) gradient each time, so
// deeper blocks are faster until the block's logits stop fitting the caches' reuse: with 64-token
// blocks a 32000-id head ran at 0.71x ATen's unfused head + loss. Whole training steps with
// compile.enable, float32, 2-core AVX-512 CPU (bench_small: vocab 8192, 2048 tokens; bench_medium:
// vocab 32000, 2048 tokens), tokens/s of blocks of 256 / 1024 tokens: 3,029-3,232 / 3,157-3,441
// and 529-566 / 570-587; whole 2048-token blocks 522-591 on bench_medium (more memory, no
// faster). A 128k-id vocabulary keeps 256 tokens (128 MiB of logits per block).
int64_t fused_loss_block_tokens(int64_t vocab);

}  // namespace titan
