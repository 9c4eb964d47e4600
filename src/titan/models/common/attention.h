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
// The variations of the attention an InnerAttention computes (sink_window_attention): gpt-oss's
// sinks, sliding windows and scale, Llama 4's chunked local attention.
struct AttentionVariant {
  at::Tensor sinks;    // (n_heads of q) sink logits, or undefined
  int64_t window = 0;  // > 0: sliding window of this many positions
  double scale = 0;    // > 0: the scores' scale in place of head_dim^-0.5
  // > 0: chunked attention: a query at position i sees only keys of its chunk, the positions j
  // with j / chunk == i / chunk (integer division), as Hugging Face's chunked_attention layers.
  int64_t chunk = 0;
  // Whether any keys the causal mask leaves are hidden (a window or chunks).
  bool local() const { return window > 0 || chunk > 0; }
};

class InnerAttention {
 public:
  virtual ~InnerAttention() = default;
  virtual at::Tensor forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             const at::Tensor& document_ids) = 0;
  // The same attention with `variant` applied (Attention calls it for layers with sinks, a window
  // or a scale of their own). The default refuses: a kernel that does not compute them.
  virtual at::Tensor forward_variant(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                     const at::Tensor& document_ids,
                                     const AttentionVariant& variant);
};

class CausalAttention final : public InnerAttention {
 public:
  at::Tensor forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     const at::Tensor& document_ids) override;
  // sink_window_attention over the local sequence.
  at::Tensor forward_variant(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             const at::Tensor& document_ids,
                             const AttentionVariant& variant) override;
  // compile.enable: materialised_causal_attention for the CPU inputs where it is faster
  // (materialised_attention_is_faster); causal_attention for the others and when false.
  bool fused = false;
};

// Attention with the variations of `variant`, the scores materialised (query chunks of 128, each
// against only the keys it may see): q (bs, n, n_heads, head_dim) holds positions
// [q_start, q_start + n); k and v, in the cache layout (bs, n_kv_heads, >= q_start + n, head_dim),
// positions from 0. Causal; with window > 0 a query at position i sees the keys j with
// i - window < j <= i (its `window` latest positions, itself included, as Hugging Face's
// sliding_window); with chunk > 0 only keys of its chunk (AttentionVariant); with `document_ids`
// (bs, q_start + n) int64 only keys of its own document. With sinks (n_heads), each head's softmax
// runs over its scores and the head's sink logit, which has no value: the weights of the keys sum
// to less than 1. Scores are q.k times variant.scale (0: head_dim^-0.5); softmax in float32 (or
// wider). Differentiable through ATen's autograd (training calls it with q_start 0; incremental
// inference with the cache). Returns (bs, n, n_heads, head_dim), contiguous, in v's dtype.
at::Tensor sink_window_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 int64_t q_start, const AttentionVariant& variant,
                                 const at::Tensor& document_ids = {});

// Query positions per chunk of the materialised attention kernels (sink_window_attention,
// materialised_causal_attention, cached_attention). Smaller chunks skip more of the masked
// triangle but run smaller matmuls; on the 2-core AVX-512 CPU 128 beat 64 and unchunked at
// seq_len 256 and 512.
inline constexpr int64_t kAttentionQueryChunk = 128;

// The first key position any query of [p0, ...) may see under a window and chunks (0: none).
inline int64_t first_visible_key(int64_t p0, int64_t window, int64_t chunk) {
  int64_t k0 = window > 0 && p0 - window + 1 > 0 ? p0 - window + 1 : 0;
  if (chunk > 0 && (p0 / chunk) * chunk > k0) k0 = (p0 / chunk) * chunk;
  return k0;
}

// Score elements sink_window_attention keeps for backward per sequence and head (its softmax
// outputs, the sink's column included), over seq_len positions with `window` and `chunk` (0:
// none). Inline: the analytic model sizes (llama3/args.cpp) link without the modules.
inline int64_t sink_window_kept_scores(int64_t seq_len, int64_t window, bool sinks,
                                       int64_t chunk = 0) {
  int64_t kept = 0;
  for (int64_t t0 = 0; t0 < seq_len; t0 += kAttentionQueryChunk) {
    const int64_t t1 = t0 + kAttentionQueryChunk < seq_len ? t0 + kAttentionQueryChunk : seq_len;
    const int64_t k0 = first_visible_key(t0, window, chunk);
    kept += (t1 - t0) * (t1 - k0 + (sinks ? 1 : 0));
  }
  return kept;
}

// Variations of Attention (gpt-oss's); all off by default.
struct AttentionExtras {
  bool bias = false;           // biases bq, bk, bv (of the projections' outputs) and bo
  bool sinks = false;          // a learned sink logit per query head (sink_window_attention)
  int64_t window = 0;          // > 0: sliding-window attention over this many positions
  double softmax_scale = 0.0;  // > 0: the scores' scale in place of head_dim^-0.5
  // Llama 4: chunked local attention over chunks of this many positions (AttentionVariant);
  // rope false: no rotary embedding (a NoPE layer); l2_qk_norm: q and k of every head divided by
  // their root mean square (eps l2_norm_eps, no weight) after RoPE; temperature_floor > 0: the
  // queries at position p scaled by 1 + temperature_scale * log1p(floor((p + 1) /
  // temperature_floor)) (Hugging Face's attn_temperature_tuning, floor_scale and attn_scale).
  int64_t chunk = 0;
  bool rope = true;
  bool l2_qk_norm = false;
  double l2_norm_eps = 1e-5;
  int64_t temperature_floor = 0;
  double temperature_scale = 0.1;
  // Qwen3-Next's gated attention: wq also gives every head a gate (its rows per head: head_dim of
  // q, then head_dim of gate, as transformers' q_proj), and the attention output is multiplied by
  // sigmoid(gate) before wo; RoPE on the first rope_dim dimensions of each head only (0: all, the
  // RotaryEmbedding then built for rope_dim); q_norm and k_norm zero-centred (RMSNorm).
  bool output_gate = false;
  int64_t rope_dim = 0;
  bool zero_centered_norm = false;
  // Whether the layer attends with sink_window_attention rather than the inner kernel.
  bool own_kernel() const { return sinks || window > 0 || chunk > 0 || softmax_scale > 0; }
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
            at::ScalarType compute_dtype = at::kFloat, bool qk_norm = false, double norm_eps = 1e-6,
            const AttentionExtras& extras = {});

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
  // With extras.bias: bq (n_heads * head_dim), bk and bv (n_kv_heads * head_dim), added to wq's,
  // wk's and wv's outputs, and bo (dim), added after wo (outside wo's hooks: tensor parallelism
  // reduces wo's partial products first). Null otherwise.
  std::shared_ptr<Bias> bq, bk, bv, bo;
  // With extras.sinks: (n_heads) sink logits (split with the heads by tensor parallelism).
  std::shared_ptr<Bias> sinks;
  // extras.window and extras.softmax_scale. With sinks, a window or a scale the layer attends
  // through inner_attention->forward_variant in training and sink_window_attention over the
  // cache in inference.
  AttentionExtras extras;
  std::shared_ptr<InnerAttention> inner_attention = std::make_shared<CausalAttention>();
  // wq, wk and wv packed into one matrix for inference (prepare_for_inference); used while intact.
  PackedLinear packed_qkv;
  // The scores' scale: extras.softmax_scale, else head_dim^-0.5.
  double softmax_scale() const;
  // What the layer's own kernel computes (extras.own_kernel()): sinks, window, scale, chunk.
  AttentionVariant variant() const;
  int64_t head_dim;
  at::ScalarType compute_dtype;

 private:
  // Writes k and v into the cache at step.start_pos and attends over the cached prefix.
  at::Tensor attend_cached(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const KVCacheStep& step);
};

}  // namespace titan
