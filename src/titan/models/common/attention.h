// Causal self-attention with grouped-query attention (GQA): n_kv_heads key/value heads, each
// shared by n_heads / n_kv_heads consecutive query heads. Head counts are read from tensor
// shapes, so a tensor-parallel plan can shard heads (wq/wk/wv by rows, wo by columns) without
// this code knowing.
#pragma once

#include "titan/models/common/kv_cache.h"
#include "titan/models/common/linear.h"
#include "titan/models/common/norms.h"
#include "titan/models/common/rope.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <memory>
#include <string>

namespace titan {

// softmax(q k^T / sqrt(head_dim) + causal mask) v, with the softmax in float32 (or wider), by
// libtorch's fused kernel. For backward it keeps q, k, v, the output and float32 log-sum-exp
// statistics (bs, n_heads, seqlen): no probability matrix.
// q (bs, seqlen, n_heads, head_dim), k and v (bs, seqlen, n_kv_heads, head_dim), n_kv_heads
// dividing n_heads; query head h reads kv head h / (n_heads / n_kv_heads).
// With `document_ids` (bs, seqlen) int64 the mask is block-causal: a token attends only to the
// tokens at or before it with the same id (its document, see document_ids()). On CUDA, where the
// flash kernel takes q's dtype and head_dim (fp16 / bf16, head_dim a multiple of 8 up to 256),
// the documents run through the variable-length flash kernel as separate sequences
// (pack_documents; forward and backward through _flash_attention_forward / _backward, MHA and
// GQA); elsewhere SDPA reads a (bs, 1, seqlen, seqlen) boolean mask (on CUDA that leaves the
// memory-efficient or the math kernel).
// Returns (bs, seqlen, n_heads, head_dim), contiguous, in v's dtype.
at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& document_ids = {});

// The same attention computed by titan with the scores materialised, as the KV-cache path does
// (cached_attention): the query heads that share a kv head are folded into rows, so one batched
// matmul serves them without copying K and V n_rep times; queries go in chunks of 128 that skip
// the fully masked part of the score matrix; the softmax runs in float32 and the probabilities
// are kept, in the compute dtype, for a backward of batched matmuls. Memory for backward:
// about seqlen^2 / 2 probabilities per head instead of causal_attention's O(seqlen) statistics.
// Same arguments, masks and result as causal_attention. Not savable by selective activation
// checkpointing (savable_ops.h): a checkpointed block recomputes it.
at::Tensor materialised_causal_attention(const at::Tensor& q, const at::Tensor& k,
                                         const at::Tensor& v, const at::Tensor& document_ids = {});

// Whether materialised_causal_attention beats causal_attention (forward + backward) for CPU
// tensors of `dtype` over sequences of `seqlen` tokens, by measurement (bench/attention_bench;
// the numbers are in attention.cpp).
bool materialised_attention_is_faster(at::ScalarType dtype, int64_t seqlen);

// The document of every token of packed sequences tokens (bs, seqlen): the number of
// `end_token`s (EOS) before it in its row, so a document's EOS still belongs to it and the next
// document starts after it (a row that starts inside a document gives that part id 0).
// (bs, seqlen) int64 on the tokens' device.
at::Tensor document_ids(const at::Tensor& tokens, int64_t end_token);

// Packed documents as the variable-length attention kernels take them: the rows of all
// sequences one after the other (bs * seqlen tokens), cut at every document start.
struct DocumentPacking {
  at::Tensor cu_seqlens;   // (n_docs + 1) int32 on the ids' device: each document's first token
                           // in the packed rows, then bs * seqlen
  int64_t n_docs = 0;      // documents over all rows (a row's start always starts one)
  int64_t max_seqlen = 0;  // the longest document's length
};
// The packing of document_ids (bs, seqlen) int64 (document_ids(): a new document wherever the id
// changes along a row). Computed on the ids' device; the two host ints (n_docs, max_seqlen) cost
// one counted device read (host_sync.h) together: the kernels size their grid by them, and the
// number of documents cannot be bounded without one (a bound of bs * seqlen documents would
// launch that many mostly empty sequences).
DocumentPacking pack_documents(const at::Tensor& document_ids);

// model.attn_mask_type: how attention masks a training sequence.
enum class AttentionMask {
  kCausal,       // every earlier token of the sequence
  kBlockCausal,  // every earlier token of the same document (packed documents stay apart)
};
// "causal" / "block_causal"; throws ConfigError naming the closest.
AttentionMask parse_attention_mask(const std::string& name);

// Inference attention of n new queries at positions [start_pos, start_pos + n) over the keys and
// values of positions [0, start_pos + n), causal within the new block. q (bs, n, n_heads,
// head_dim); k and v in the cache layout (bs, n_kv_heads, >= start_pos + n, head_dim), of which
// only the first start_pos + n positions are read. Returns (bs, n, n_heads, head_dim),
// contiguous, in v's dtype. Not differentiable (no autograd bookkeeping for inference).
at::Tensor cached_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            int64_t start_pos);

// The kernel between the projections: q (bs, seqlen, n_heads, head_dim), k and v
// (bs, seqlen, n_kv_heads, head_dim) -> (bs, seqlen, n_heads, head_dim), contiguous.
// `document_ids`: undefined (causal), or the document of every token of the whole sequence
// (bs, whole seqlen) int64 (block-causal). The default is causal_attention over the local
// sequence; context parallelism swaps in a kernel that also attends to the other ranks' keys and
// values (its local sequence is a share of the whole one the document ids cover).
class InnerAttention {
 public:
  virtual ~InnerAttention() = default;
  virtual at::Tensor forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             const at::Tensor& document_ids) = 0;
};

class CausalAttention final : public InnerAttention {
 public:
  at::Tensor forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     const at::Tensor& document_ids) override;
  // compile.enable: materialised_causal_attention for the CPU inputs where it is faster
  // (materialised_attention_is_faster); causal_attention for the others and when false.
  bool fused = false;
};

// Incremental inference: the layer's cache, the position of the first new token, and the cache's
// capacity in positions.
struct KVCacheStep {
  LayerKVCache* cache = nullptr;
  int64_t start_pos = 0;
  int64_t max_len = 0;
};

// Multi-head causal self-attention with RoPE on q and k. Parameters: wq (n_heads * head_dim, dim),
// wk and wv (n_kv_heads * head_dim, dim), wo (dim, n_heads * head_dim); with qk_norm (Qwen3) also
// q_norm and k_norm (head_dim): an RMSNorm of every head of q and of k before RoPE.
class Attention : public HookedModule {
 public:
  Attention(int64_t dim, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
            at::ScalarType compute_dtype = at::kFloat, bool qk_norm = false,
            double norm_eps = 1e-6);

  // x (bs, seqlen, dim) -> (bs, seqlen, dim) in the compute dtype. `positions` (seqlen) int64
  // are the tokens' absolute positions for RoPE (undefined: [0, seqlen), or with `cache`
  // [start_pos, start_pos + n)). Training runs
  // inner_attention over the sequence, block-causal with `document_ids` (see InnerAttention;
  // undefined: causal); with `cache` (incremental inference, no autograd) x holds
  // positions [start_pos, start_pos + n), their keys and values are written into the cache
  // (allocated on first use, or when bs / heads / dtype change at start_pos 0) and the queries
  // attend over positions [0, start_pos + n) of it (cached_attention).
  at::Tensor forward(const at::Tensor& x, const RotaryEmbedding& rope,
                     const at::Tensor& positions = {}, const KVCacheStep* cache = nullptr,
                     const at::Tensor& document_ids = {});

  std::shared_ptr<Linear> wq, wk, wv, wo;
  std::shared_ptr<RMSNorm> q_norm, k_norm;  // null without qk_norm
  std::shared_ptr<InnerAttention> inner_attention = std::make_shared<CausalAttention>();
  // wq, wk and wv packed into one matrix for inference (prepare_for_inference); used while intact.
  PackedLinear packed_qkv;
  int64_t head_dim;
  at::ScalarType compute_dtype;

 private:
  // Writes k and v into the cache at step.start_pos and attends over the cached prefix.
  at::Tensor attend_cached(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const KVCacheStep& step);
};

}  // namespace titan
