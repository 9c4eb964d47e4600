// Context parallelism (TorchTitan's `cp`): the sequence is sharded over the cp group and
// attention runs as ring attention, each rank keeping its queries and visiting every rank's keys
// and values. ContextParallel (at the end) is the piece parallelize applies to a model part; it
// is made of the two things the model does not see:
//
//   SequenceLayout layout = SequenceLayout::make(seq_len, cp, SequenceSharding::kHeadTail);
//   at::Tensor tokens_local = shard_sequence(tokens, layout, rank);        // (bs, seq_len / cp)
//   at::Tensor positions = layout.positions(rank, device);                 // RoPE positions
//   attention->inner_attention = std::make_shared<RingAttention>(
//       RingGroups{dims.group_ptr("cp"), dims.group_ptr("cp_up"), dims.group_ptr("cp_down")},
//       layout, RotateMethod::kAllToAll);
//
// Sequence sharding. kNone: rank r holds positions [r * L, (r + 1) * L) with L = seq_len / cp.
// kHeadTail (causal load balancing): the sequence is cut into 2 * cp chunks of seq_len / (2 cp)
// and rank r holds chunks r and 2 cp - 1 - r, in that order, so every rank has the same amount
// of causal work. Everything sharded along the sequence (tokens, labels, positions, document
// ids) must use the same layout.
//
// RingAttention is an InnerAttention (models/common/attention.h): causal softmax(q k^T /
// sqrt(head_dim)) v over the whole sequence, for this rank's queries, with GQA. With document ids
// it is block-causal: a token attends only to earlier tokens of its own document. Each (query
// chunk, key chunk) pair is computed by one of two kernels (RingKernel, chosen per device and
// mask: ring_attention_pairs.h) and merged with the running output by log-sum-exp; pairs that
// the mask hides entirely are skipped:
//   fused     ATen's fused attention that returns the log-sum-exp: on the CPU
//             _scaled_dot_product_flash_attention_for_cpu (causal on the diagonal pair, full
//             below it; with documents an additive mask per block of at most 1024 x 1024
//             positions), on CUDA _scaled_dot_product_flash_attention (or the memory-efficient
//             kernel where flash cannot take the dtype) for causal masks. No score matrix exists.
//             Backward runs the kernels' backward per pair with the merged output and the global
//             log-sum-exp (the ring flash-attention construction).
//   explicit  float32 matmuls in blocks of at most 1024 x 1024 positions (32 MiB of scores for 8
//             heads whatever the sequence), any mask; backward recomputes each block's
//             probabilities from q, k, v and the global log-sum-exp. It serves document masks on
//             CUDA, where no fused kernel takes an arbitrary mask with GQA and returns the
//             log-sum-exp, and shapes no fused kernel takes (head_dim not a multiple of 8,
//             float64).
// Either way the gradients of remote keys and values go back to their owners.
//
// Communication per attention call and rank, with B = the bytes of this rank's K and V
// (2 * bs * L * n_kv_heads * head_dim * element size) and B32 the same in float32:
//   kAllGather  forward: one all-gather of K and V ((cp - 1) B received; cp B of memory),
//               issued before the own chunk is computed and waited after it. Backward: the same
//               all-gather again, then one reduce-scatter of the float32 dK/dV of every chunk
//               ((cp - 1) B32 each way; cp B32 of memory).
//   kAllToAll   (the ring) forward: cp - 1 hops, each passing K and V (B) to the next rank while
//               the current chunk is computed. Backward: cp - 1 hops of K and V (B) and cp hops
//               of the float32 dK/dV accumulators (B32), each posted as soon as its chunk is done
//               and received while the next one is computed; the last hop brings every
//               accumulator home. Memory: two K/V and two dK/dV buffers. The hops travel on two
//               communicators of the cp ranks, one per direction (to a higher cp rank, to a lower
//               one: ParallelDims' "cp_up" / "cp_down"), as the pipeline's do: on NCCL two ranks
//               that send to each other over one communicator before receiving wait on each other
//               once the messages outgrow NCCL's buffers.
#pragma once

#include "titan/distributed/comm.h"
#include "titan/models/common/attention.h"
#include "titan/models/model.h"
#include "titan/parallel/piece.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace titan {

enum class SequenceSharding { kNone, kHeadTail };
// "none" / "headtail" (TorchTitan's context_parallel_load_balancer); throws ConfigError.
SequenceSharding parse_sequence_sharding(const std::string& name);
const char* to_string(SequenceSharding sharding);

enum class RotateMethod { kAllGather, kAllToAll };
// "allgather" / "alltoall" (TorchTitan's context_parallel_rotate_method); throws ConfigError.
RotateMethod parse_rotate_method(const std::string& name);
const char* to_string(RotateMethod method);

// Global positions [start, end) of the sequence.
struct PositionRange {
  int64_t start = 0;
  int64_t end = 0;
  int64_t size() const { return end - start; }
};

// Which global positions each rank of the cp group holds.
struct SequenceLayout {
  int64_t seq_len = 0;
  int64_t cp = 1;
  SequenceSharding sharding = SequenceSharding::kNone;
  // ranges[r]: the chunks rank r holds, in local order (one for kNone, two for kHeadTail).
  std::vector<std::vector<PositionRange>> ranges;

  // Throws (with the arithmetic) unless seq_len divides by cp (kNone) or 2 * cp (kHeadTail).
  static SequenceLayout make(int64_t seq_len, int64_t cp, SequenceSharding sharding);
  // seq_len / cp, the same on every rank.
  int64_t local_len() const { return seq_len / cp; }
  // Rank r's global positions in local order: (local_len) int64 on `device`.
  at::Tensor positions(int rank, at::Device device = at::kCPU) const;
};

// x (bs, seq_len, ...) -> rank r's (bs, local_len, ...) along dim 1, contiguous.
at::Tensor shard_sequence(const at::Tensor& x, const SequenceLayout& layout, int rank);

// The communicators of a ring: `cp` for the all-gather and reduce-scatter, and (kAllToAll) `up`
// and `down`, over the same ranks, for the hops to a higher and to a lower cp rank.
struct RingGroups {
  std::shared_ptr<dist::Group> cp, up, down;
  // Makes up and down as sub-groups of `cp` (every cp rank must call it, in the same order).
  static RingGroups split(std::shared_ptr<dist::Group> cp);
};

// How each chunk pair is computed (see the top of this file): kAuto chooses per device, dtype
// and mask (choose_ring_kernel in ring_attention_pairs.h); the others force one, for tests and
// benchmarks (kFused falls back to kExplicit where no fused kernel takes the pair).
enum class RingKernel { kAuto, kFused, kExplicit };
const char* to_string(RingKernel kernel);

// Ring attention over the cp group (see the top of this file). It keeps no per-call state besides
// the stats, so the layers of a model may share one instance; it must outlive the backward of its
// outputs (the autograd node refers to it). Like the group, driven by one thread at a time.
class RingAttention final : public InnerAttention {
 public:
  // layout.cp must equal groups.cp->size(); kAllToAll needs groups.up and groups.down.
  RingAttention(RingGroups groups, SequenceLayout layout, RotateMethod rotate,
                RingKernel kernel = RingKernel::kAuto);
  // The cp group alone: kAllToAll splits its direction groups off it (RingGroups::split, a
  // collective over the group).
  RingAttention(std::shared_ptr<dist::Group> group, SequenceLayout layout, RotateMethod rotate,
                RingKernel kernel = RingKernel::kAuto);

  // q (bs, local_len, n_heads, head_dim), k and v (bs, local_len, n_kv_heads, head_dim), this
  // rank's positions of the layout -> (bs, local_len, n_heads, head_dim), contiguous, v's dtype.
  // With `document_ids` (bs, seq_len) int64 for the whole sequence (the batch before sharding,
  // the same on every cp rank) the mask is block-causal.
  at::Tensor forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     const at::Tensor& document_ids) override;
  // gpt-oss's and Llama 4's attention over the ring: the sliding window or the chunks join the
  // mask (pairs wholly outside are skipped; partly visible ones take an additive mask), the
  // scale replaces
  // head_dim^-0.5, and the sinks correct the merged result once: out * sigmoid(lse - sink), the
  // log-sum-exp becoming logaddexp(lse, sink) (a key of value 0 that every query sees), which the
  // pairs' backward then uses unchanged; the sinks' gradient is -sum over queries of
  // exp(sink - lse) * rowsum(dO * O).
  at::Tensor forward_variant(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             const at::Tensor& document_ids,
                             const AttentionVariant& variant) override;

  // (query block, key block) pairs computed and skipped as fully masked, forward and backward
  // together, since construction or reset_stats(). A block is a whole chunk for the fused causal
  // path, else at most 1024 positions of one. fused_pairs: those of computed_pairs that ran an
  // ATen fused kernel.
  struct Stats {
    int64_t computed_pairs = 0;
    int64_t skipped_pairs = 0;
    int64_t fused_pairs = 0;
  };
  const Stats& stats() const { return stats_; }
  void reset_stats() { stats_ = {}; }

  dist::Group& group() const { return *groups_.cp; }
  const RingGroups& groups() const { return groups_; }
  const SequenceLayout& layout() const { return layout_; }
  RotateMethod rotate() const { return rotate_; }
  RingKernel kernel() const { return kernel_; }

  // Internal, for the autograd function.
  Stats& mutable_stats() { return stats_; }

 private:
  RingGroups groups_;
  SequenceLayout layout_;
  RotateMethod rotate_;
  RingKernel kernel_;
  Stats stats_;
};

// What context parallelism installs in every attention layer: one RingAttention per sequence
// length the model runs at (training.seq_len, validation.seq_len), chosen by the local length
// of the queries.
class ContextParallelAttention final : public InnerAttention {
 public:
  explicit ContextParallelAttention(std::vector<std::shared_ptr<RingAttention>> rings);
  at::Tensor forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     const at::Tensor& document_ids) override;
  at::Tensor forward_variant(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             const at::Tensor& document_ids,
                             const AttentionVariant& variant) override;
  const std::vector<std::shared_ptr<RingAttention>>& rings() const { return rings_; }

 private:
  // The ring set up for q's local length.
  RingAttention& ring_for(const at::Tensor& q);
  std::vector<std::shared_ptr<RingAttention>> rings_;
};

// Context parallelism applied to a model part: a ContextParallelAttention in every attention
// layer (grouped-query and multi-head latent attention), and batches cut to this rank's share
// of each sequence, with its tokens' positions.
class ContextParallel final : public ParallelPiece {
 public:
  // `load_balancer`: parallelism.context_parallel_load_balancer ("headtail", or "none" / "" for
  // contiguous shards); `rotate_method`: context_parallel_rotate_method. Every sequence length
  // (with the key that sets it) must divide by 2 x cp with headtail, cp without, and the share by
  // `tp` (sequence parallelism): ConfigError with the arithmetic otherwise.
  ContextParallel(Model& model, const RingGroups& groups, int cp_rank, int64_t tp,
                  const std::string& load_balancer, const std::string& rotate_method,
                  const std::vector<std::pair<std::string, int64_t>>& seq_lens);

  // "context parallelism: ring attention (allgather) over cp 2, headtail sequence sharding; ..."
  std::string describe() const override;
  void shard_batch(ForwardBatch& batch) const override;

 private:
  int cp_rank_;
  RotateMethod rotate_;
  std::map<int64_t, SequenceLayout> layouts_;  // by sequence length
};

}  // namespace titan
