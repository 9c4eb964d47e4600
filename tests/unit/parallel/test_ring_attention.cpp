// Context parallelism: sequence layouts (headtail and contiguous), and ring attention over cp 2,
// 3 and 4 ranks in threads (Gloo), both rotate methods, GQA and MHA, causal and block-causal,
// with each pair kernel (ATen's fused CPU flash kernel and the explicit float32 blocks), against
// full single-process attention on the whole sequence: each rank's output rows and its dq/dk/dv
// equal the reference's at its positions (float32 within 1e-5, bf16 within a bf16 tolerance;
// the fused pairs against float64), fully masked chunk pairs are skipped (counted exactly for
// causal masks), and the ring's hops travel on the two direction groups only. On a CUDA device
// also the CUDA kernels (flash, memory-efficient) against float64.
#include "../distributed/multirank.h"

#include "titan/common/check.h"
#include "titan/common/device.h"
#include "titan/distributed/flight_recorder.h"
#include "titan/distributed/parallel_dims.h"
#include "titan/models/common/attention.h"
#include "titan/parallel/context_parallel.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <utility>
#include <vector>

namespace titan {
namespace test_ring_attention {

using test::run_ranks;

TEST(SequenceLayout, HeadTailAndContiguousChunks) {
  const SequenceLayout ht = SequenceLayout::make(16, 2, SequenceSharding::kHeadTail);
  ASSERT_EQ(ht.ranges.size(), 2u);
  EXPECT_EQ(ht.local_len(), 8);
  EXPECT_EQ(ht.ranges[0][0].start, 0);
  EXPECT_EQ(ht.ranges[0][1].start, 12);
  EXPECT_EQ(ht.ranges[1][0].start, 4);
  EXPECT_EQ(ht.ranges[1][1].start, 8);
  EXPECT_TRUE(at::equal(ht.positions(1), at::tensor({4, 5, 6, 7, 8, 9, 10, 11}, at::kLong)));
  EXPECT_TRUE(at::equal(ht.positions(0), at::tensor({0, 1, 2, 3, 12, 13, 14, 15}, at::kLong)));

  const SequenceLayout none = SequenceLayout::make(12, 3, SequenceSharding::kNone);
  EXPECT_TRUE(at::equal(none.positions(2), at::arange(8, 12, at::kLong)));

  // Sharding a (bs, seq, d) tensor takes exactly the rows at the layout's positions.
  const at::Tensor x = at::arange(2 * 16 * 3, at::kFloat).view({2, 16, 3});
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(at::equal(shard_sequence(x, ht, r), x.index_select(1, ht.positions(r))));
  }
  EXPECT_EQ(parse_sequence_sharding("headtail"), SequenceSharding::kHeadTail);
  EXPECT_EQ(parse_rotate_method("alltoall"), RotateMethod::kAllToAll);
  EXPECT_THROW(parse_rotate_method("ring"), ConfigError);
}

TEST(SequenceLayout, ErrorsShowTheArithmetic) {
  try {
    SequenceLayout::make(12, 4, SequenceSharding::kHeadTail);
    FAIL() << "expected an error";
  } catch (const c10::Error& e) {
    const std::string msg = e.what_without_backtrace();
    EXPECT_NE(msg.find("seq_len 12 is not divisible by 2 * cp = 2 * 4 = 8"), std::string::npos)
        << msg;
  }
  try {
    SequenceLayout::make(10, 4, SequenceSharding::kNone);
    FAIL() << "expected an error";
  } catch (const c10::Error& e) {
    const std::string msg = e.what_without_backtrace();
    EXPECT_NE(msg.find("seq_len 10 is not divisible by cp = 4"), std::string::npos) << msg;
  }
}

struct Case {
  RotateMethod rotate;
  SequenceSharding sharding;
  int64_t n_heads, n_kv;
  bool block_causal;
  at::ScalarType dtype;
  RingKernel kernel = RingKernel::kAuto;
  std::string name() const {
    return std::string(to_string(rotate)) + "/" + to_string(sharding) + "/" +
           (n_heads == n_kv ? "mha" : "gqa") + "/" + (block_causal ? "block_causal" : "causal") +
           "/" + c10::toString(dtype) + "/" + to_string(kernel);
  }
};

constexpr int64_t kBs = 2;
constexpr int64_t kHeadDim = 8;

// Explicit full attention in float64: causal, and within documents when docs (bs, seq) is given.
at::Tensor masked_reference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& docs) {
  const int64_t seq = q.size(1);
  const int64_t rep = q.size(2) / k.size(2);
  const at::Tensor qh = q.transpose(1, 2);  // (bs, n_heads, seq, hd)
  const at::Tensor kh = k.repeat_interleave(rep, 2).transpose(1, 2);
  const at::Tensor vh = v.repeat_interleave(rep, 2).transpose(1, 2);
  const at::Tensor pos = at::arange(seq, at::kLong);
  at::Tensor keep = pos.unsqueeze(0).le(pos.unsqueeze(1)).unsqueeze(0);  // (1, seq, seq)
  if (docs.defined()) keep = keep.logical_and(docs.unsqueeze(2).eq(docs.unsqueeze(1)));
  const at::Tensor s =
      at::matmul(qh, kh.transpose(-1, -2))
          .div(std::sqrt(static_cast<double>(q.size(3))))
          .masked_fill(keep.unsqueeze(1).logical_not(), -std::numeric_limits<double>::infinity());
  return at::matmul(at::softmax(s, -1), vh).transpose(1, 2);  // (bs, seq, n_heads, hd)
}

struct Reference {
  at::Tensor q, k, v, dout, docs;  // the whole sequence, in the case's dtype; docs int64
  at::Tensor out, dq, dk, dv;      // float32 or float64
};

// Packed documents: row 0 has a document [3, seq - 3) that spans several ranks' chunks; row 1
// random boundaries, or (`one_row`) one document, so that blocks where row 0's queries see no key
// are still computed for row 1.
at::Tensor packed_document_ids(int64_t seq, bool one_row = false) {
  at::Tensor starts = at::zeros({kBs, seq}, at::kLong);
  starts[0][3] = 1;
  starts[0][seq - 3] = 1;
  if (!one_row) starts[1].copy_(at::rand({seq}).lt(0.25));
  return starts.cumsum(1);
}

// `float64`: the explicit float64 reference for every case (else libtorch's fused kernel for
// causal float32).
Reference reference(const Case& c, int64_t seq, uint64_t seed, bool float64 = false,
                    bool one_row = false) {
  at::manual_seed(seed);
  Reference r;
  r.q = at::randn({kBs, seq, c.n_heads, kHeadDim}).to(c.dtype);
  r.k = at::randn({kBs, seq, c.n_kv, kHeadDim}).to(c.dtype);
  r.v = at::randn({kBs, seq, c.n_kv, kHeadDim}).to(c.dtype);
  r.dout = at::randn({kBs, seq, c.n_heads, kHeadDim}).to(c.dtype);
  if (c.block_causal) r.docs = packed_document_ids(seq, one_row);
  // Causal float32: libtorch's fused single-process kernel. Block-causal or bf16: the explicit
  // float64 reference of the same (rounded) inputs.
  const bool fused = !float64 && !c.block_causal && c.dtype == at::kFloat;
  const at::ScalarType ref_dtype = fused ? at::kFloat : at::kDouble;
  at::Tensor q = r.q.to(ref_dtype).clone().requires_grad_();
  at::Tensor k = r.k.to(ref_dtype).clone().requires_grad_();
  at::Tensor v = r.v.to(ref_dtype).clone().requires_grad_();
  r.out = fused ? causal_attention(q, k, v) : masked_reference(q, k, v, r.docs);
  r.out.backward(r.dout.to(ref_dtype));
  r.out = r.out.detach();
  r.dq = q.grad();
  r.dk = k.grad();
  r.dv = v.grad();
  return r;
}

// max |got - want| / max(1, max |want|): relative to the values' scale, which grows with the
// sequence (a long sequence's key gradients sum thousands of float32 terms).
double max_diff(const at::Tensor& got, const at::Tensor& want) {
  const at::Tensor w = want.to(at::kDouble);
  const double scale = std::max(1.0, w.abs().max().item<double>());
  return (got.to(at::kDouble) - w).abs().max().item<double>() / scale;
}

// Every case on `cp` ranks at sequence length `seq`, in one set of rank threads, against
// reference() (`float64`, `one_row` as there). With chunks of at most 1024 positions each chunk
// pair is one block pair, whose counts are checked.
void check_ring_attention(int cp, int64_t seq, const std::vector<Case>& cases, bool float64 = false,
                          bool one_row = false) {
  std::vector<Reference> refs;
  for (size_t i = 0; i < cases.size(); ++i) {
    refs.push_back(reference(cases[i], seq, 100 + i, float64, one_row));
  }
  // errors[case][rank] = {out, dq, dk, dv}; stats[case][rank]
  std::vector<std::vector<std::vector<double>>> errors(cases.size(),
                                                       std::vector<std::vector<double>>(cp));
  std::vector<std::vector<RingAttention::Stats>> stats(cases.size(),
                                                       std::vector<RingAttention::Stats>(cp));
  run_ranks(cp, [&](int rank, std::shared_ptr<dist::Group> world) {
    for (size_t i = 0; i < cases.size(); ++i) {
      const Case& c = cases[i];
      const Reference& r = refs[i];
      const SequenceLayout layout = SequenceLayout::make(seq, cp, c.sharding);
      RingAttention ring(world, layout, c.rotate, c.kernel);
      at::Tensor q = shard_sequence(r.q, layout, rank).requires_grad_();
      at::Tensor k = shard_sequence(r.k, layout, rank).requires_grad_();
      at::Tensor v = shard_sequence(r.v, layout, rank).requires_grad_();
      const at::Tensor out = ring.forward(q, k, v, c.block_causal ? r.docs : at::Tensor());
      EXPECT_EQ(out.scalar_type(), c.dtype);
      EXPECT_TRUE(out.is_contiguous());
      out.backward(shard_sequence(r.dout, layout, rank));
      errors[i][rank] = {max_diff(out, shard_sequence(r.out, layout, rank)),
                         max_diff(q.grad(), shard_sequence(r.dq, layout, rank)),
                         max_diff(k.grad(), shard_sequence(r.dk, layout, rank)),
                         max_diff(v.grad(), shard_sequence(r.dv, layout, rank))};
      stats[i][rank] = ring.stats();
    }
  });
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    // bf16: the output and the gradients are rounded once to bf16 (8 bits of mantissa) from
    // float32 sums; the reference sees the same bf16 inputs.
    const double tol = c.dtype == at::kFloat ? 1e-5 : 3e-2;
    std::vector<double> worst(4, 0.0);
    int64_t skipped = 0, computed = 0, fused = 0;
    for (int rank = 0; rank < cp; ++rank) {
      if (errors[i][rank].size() != 4) continue;  // the rank failed: reported by run_ranks
      for (int t = 0; t < 4; ++t) worst[t] = std::max(worst[t], errors[i][rank][t]);
      skipped += stats[i][rank].skipped_pairs;
      computed += stats[i][rank].computed_pairs;
      fused += stats[i][rank].fused_pairs;
    }
    const std::string what = "cp " + std::to_string(cp) + " " + c.name();
    const char* names[] = {"out", "dq", "dk", "dv"};
    for (int t = 0; t < 4; ++t) EXPECT_LE(worst[t], tol) << what << " " << names[t];
    std::printf(
        "[ring attention] %-53s max err out %.2e dq %.2e dk %.2e dv %.2e, pairs %lld "
        "computed (%lld fused) %lld skipped\n",
        what.c_str(), worst[0], worst[1], worst[2], worst[3], static_cast<long long>(computed),
        static_cast<long long>(fused), static_cast<long long>(skipped));
    // On the CPU every pair of the fused kernel runs in ATen's flash kernel.
    if (c.kernel == RingKernel::kExplicit) {
      EXPECT_EQ(fused, 0) << what;
    }
    if (c.kernel == RingKernel::kFused) {
      EXPECT_EQ(fused, computed) << what;
    }
    // Each of the layout's global chunks meets every chunk once per pass (forward, backward);
    // with a causal mask the pairs whose key chunk is later than the query chunk are skipped.
    const int64_t chunks = c.sharding == SequenceSharding::kHeadTail ? 2 * cp : cp;
    const int64_t hidden = chunks * (chunks - 1) / 2;
    if (seq / chunks > 1024 && (c.block_causal || c.kernel == RingKernel::kExplicit)) {
      // Chunks of several blocks: the blocks above the diagonal of the diagonal pairs are
      // skipped too.
      EXPECT_GT(skipped, 2 * hidden) << what;
      continue;
    }
    if (c.block_causal) {
      EXPECT_GE(skipped, 2 * hidden) << what;  // documents hide more
    } else {
      EXPECT_EQ(skipped, 2 * hidden) << what;
    }
    EXPECT_EQ(computed + skipped, 2 * chunks * chunks) << what;
  }
}

std::vector<Case> all_cases(bool with_bf16, RingKernel kernel) {
  std::vector<Case> cases;
  for (RotateMethod rotate : {RotateMethod::kAllGather, RotateMethod::kAllToAll}) {
    for (SequenceSharding sharding : {SequenceSharding::kHeadTail, SequenceSharding::kNone}) {
      for (int64_t n_kv : {2, 4}) {
        for (bool block_causal : {false, true}) {
          cases.push_back({rotate, sharding, 4, n_kv, block_causal, at::kFloat, kernel});
        }
      }
      if (with_bf16) {
        cases.push_back({rotate, sharding, 4, 2, false, at::kBFloat16, kernel});
        cases.push_back({rotate, sharding, 4, 2, true, at::kBFloat16, kernel});
      }
    }
  }
  return cases;
}

std::vector<Case> both_kernels(bool with_bf16) {
  std::vector<Case> cases = all_cases(with_bf16, RingKernel::kExplicit);
  for (const Case& c : all_cases(with_bf16, RingKernel::kAuto)) cases.push_back(c);
  return cases;
}

TEST(RingAttention, MatchesFullAttentionCp2) { check_ring_attention(2, 16, both_kernels(true)); }

TEST(RingAttention, MatchesFullAttentionCp4) { check_ring_attention(4, 16, both_kernels(true)); }

// cp 3: an odd ring; 24 positions divide by 3 and by 2 * 3.
TEST(RingAttention, MatchesFullAttentionCp3) { check_ring_attention(3, 24, both_kernels(false)); }

// The fused pairs (ATen's CPU flash kernel per pair, merged by log-sum-exp; backward through the
// kernel's backward with the merged output and the global log-sum-exp) against float64, forward
// and backward, GQA and MHA, headtail and none, causal and block-causal (row 0's queries see no
// key in some computed blocks: the kernel's rows there must add nothing), both rotations.
TEST(RingAttention, FusedPairsMatchFloat64Cp2) {
  check_ring_attention(2, 16, all_cases(true, RingKernel::kFused), /*float64=*/true,
                       /*one_row=*/true);
}

TEST(RingAttention, FusedPairsMatchFloat64Cp4) {
  check_ring_attention(4, 32, all_cases(true, RingKernel::kFused), /*float64=*/true,
                       /*one_row=*/true);
}

// Chunks of 1280 positions (causal: the reference is the fused kernel; a float64 masked
// reference would need 400 MB): the explicit kernel computes them in blocks of 1024 and 256,
// the fused one whole (each chunk pair one kernel call).
TEST(RingAttention, LongChunksRunInBlocks) {
  std::vector<Case> cases;
  for (RingKernel kernel : {RingKernel::kExplicit, RingKernel::kFused}) {
    for (RotateMethod rotate : {RotateMethod::kAllGather, RotateMethod::kAllToAll}) {
      cases.push_back({rotate, SequenceSharding::kNone, 4, 2, false, at::kFloat, kernel});
    }
  }
  check_ring_attention(2, 2560, cases);
}

// gpt-oss's attention over the ring (forward_variant): sinks, a sliding window shorter than a
// chunk and longer than one, its own scale, with and without documents, both kernels and both
// rotate methods, against sink_window_attention of the whole sequence in float64; the sinks'
// gradient summed over the ranks equals the whole sequence's. Llama 4's chunked attention
// (chunks of 5 positions, across the ranks' sequence chunks) the same way.
TEST(RingAttention, SinksAndSlidingWindowsMatchOneProcess) {
  const int64_t seq = 24, heads = 4, kv = 2;
  const double scale = 0.4;
  for (const int cp : {2, 3}) {
    for (const auto& local : std::vector<std::pair<int64_t, int64_t>>{{3, 0}, {9, 0}, {0, 5}}) {
      const int64_t window = local.first, chunk = local.second;
      for (const bool block_causal : {false, true}) {
        at::manual_seed(31 + cp * 7 + window);
        const at::Tensor q = at::randn({kBs, seq, heads, kHeadDim});
        const at::Tensor k = at::randn({kBs, seq, kv, kHeadDim});
        const at::Tensor v = at::randn({kBs, seq, kv, kHeadDim});
        const at::Tensor sinks = at::randn({heads});
        const at::Tensor dout = at::randn({kBs, seq, heads, kHeadDim});
        const at::Tensor docs = block_causal ? packed_document_ids(seq) : at::Tensor();
        at::Tensor rq = q.to(at::kDouble).requires_grad_(), rk = k.to(at::kDouble).requires_grad_(),
                   rv = v.to(at::kDouble).requires_grad_(),
                   rs = sinks.to(at::kDouble).requires_grad_();
        const at::Tensor want =
            sink_window_attention(rq, rk.transpose(1, 2), rv.transpose(1, 2), 0,
                                  AttentionVariant{rs, window, scale, chunk}, docs);
        want.backward(dout.to(at::kDouble));
        for (const RingKernel kernel : {RingKernel::kExplicit, RingKernel::kFused}) {
          for (const RotateMethod rotate : {RotateMethod::kAllGather, RotateMethod::kAllToAll}) {
            const SequenceLayout layout =
                SequenceLayout::make(seq, cp, SequenceSharding::kHeadTail);
            std::vector<std::vector<double>> errors(cp);
            std::vector<at::Tensor> dsinks(cp);
            std::vector<RingAttention::Stats> stats(cp);
            run_ranks(cp, [&](int rank, std::shared_ptr<dist::Group> world) {
              RingAttention ring(world, layout, rotate, kernel);
              at::Tensor lq = shard_sequence(q, layout, rank).requires_grad_();
              at::Tensor lk = shard_sequence(k, layout, rank).requires_grad_();
              at::Tensor lv = shard_sequence(v, layout, rank).requires_grad_();
              at::Tensor ls = sinks.clone().requires_grad_();
              const at::Tensor out = ring.forward_variant(
                  lq, lk, lv, docs, AttentionVariant{ls, window, scale, chunk});
              out.backward(shard_sequence(dout, layout, rank));
              errors[rank] = {max_diff(out, shard_sequence(want.detach(), layout, rank)),
                              max_diff(lq.grad(), shard_sequence(rq.grad(), layout, rank)),
                              max_diff(lk.grad(), shard_sequence(rk.grad(), layout, rank)),
                              max_diff(lv.grad(), shard_sequence(rv.grad(), layout, rank))};
              dsinks[rank] = ls.grad();
              stats[rank] = ring.stats();
            });
            const std::string what = "cp " + std::to_string(cp) + " window " +
                                     std::to_string(window) + " chunk " + std::to_string(chunk) +
                                     (block_causal ? " docs " : " ") + to_string(kernel) + " " +
                                     to_string(rotate);
            at::Tensor dsink_sum = at::zeros({heads}, at::kDouble);
            int64_t skipped = 0;
            for (int rank = 0; rank < cp; ++rank) {
              ASSERT_EQ(errors[rank].size(), 4u) << what;
              for (double e : errors[rank]) EXPECT_LE(e, 1e-5) << what << " rank " << rank;
              dsink_sum += dsinks[rank].to(at::kDouble);
              skipped += stats[rank].skipped_pairs;
            }
            EXPECT_LE(max_diff(dsink_sum, rs.grad()), 1e-5) << what;
            // Chunks of seq / (2 cp) = 4 or 6 positions: windows of 3 hide every pair of chunks
            // more than one chunk apart, besides the causal ones.
            const int64_t chunks = 2 * cp, causal_hidden = chunks * (chunks - 1) / 2;
            if (window == 3) EXPECT_GT(skipped, 2 * causal_hidden) << what;
            if (chunk == 5) EXPECT_GT(skipped, causal_hidden) << what;
          }
        }
      }
    }
  }
}

// The all-to-all ring over ParallelDims' groups (dp_shard 2 x cp 2 and cp 4): its hops travel
// on cp_up (to a higher cp rank) and cp_down (to a lower one) only, never point to point on the
// cp group, so that no communicator carries messages both ways between two ranks (which NCCL can
// deadlock on); and the result still equals one process's attention.
TEST(RingAttention, HopsTravelOnOneDirectionPerGroup) {
  for (const int64_t cp : {2, 4}) {
    const int world_size = 4;
    const int64_t seq = 16;
    const Case c{RotateMethod::kAllToAll, SequenceSharding::kHeadTail, 4, 2, false, at::kFloat};
    const Reference r = reference(c, seq, 7);
    auto recorder = std::make_shared<dist::FlightRecorder>(1 << 14, "", 0, world_size);
    dist::GroupOptions options = test::loopback_options();
    options.recorder = recorder;
    std::vector<double> errors(world_size, 1.0);
    run_ranks(
        world_size,
        [&](int rank, std::shared_ptr<dist::Group> world) {
          ParallelDegrees d;
          d.dp_shard = world_size / cp;
          d.cp = cp;
          ParallelDims dims(d, world_size);
          dims.build_groups(world);
          const SequenceLayout layout = SequenceLayout::make(seq, cp, c.sharding);
          RingAttention ring(
              RingGroups{dims.group_ptr("cp"), dims.group_ptr("cp_up"), dims.group_ptr("cp_down")},
              layout, c.rotate);
          const int cp_rank = dims.group("cp").rank();
          at::Tensor q = shard_sequence(r.q, layout, cp_rank).requires_grad_();
          at::Tensor k = shard_sequence(r.k, layout, cp_rank).requires_grad_();
          at::Tensor v = shard_sequence(r.v, layout, cp_rank).requires_grad_();
          const at::Tensor out = ring.forward(q, k, v, at::Tensor());
          out.backward(shard_sequence(r.dout, layout, cp_rank));
          errors[rank] = std::max({max_diff(out, shard_sequence(r.out, layout, cp_rank)),
                                   max_diff(q.grad(), shard_sequence(r.dq, layout, cp_rank)),
                                   max_diff(k.grad(), shard_sequence(r.dk, layout, cp_rank)),
                                   max_diff(v.grad(), shard_sequence(r.dv, layout, cp_rank))});
        },
        options);
    for (int rank = 0; rank < world_size; ++rank) {
      EXPECT_LE(errors[rank], 1e-5) << "cp " << cp << " rank " << rank;
    }
    int64_t up = 0, down = 0;
    for (const dist::FlightEntry& e : recorder->entries()) {
      if (e.op != "send" && e.op != "recv") continue;
      const bool send = e.op == "send";
      const std::string what = "cp " + std::to_string(cp) + ": " + e.op + " on '" + e.group +
                               "' from group rank " + std::to_string(e.group_rank) + " to " +
                               std::to_string(e.peer);
      if (e.group == "cp_up") {
        ++up;
        EXPECT_EQ(send ? e.peer > e.group_rank : e.peer < e.group_rank, true) << what;
      } else if (e.group == "cp_down") {
        ++down;
        EXPECT_EQ(send ? e.peer < e.group_rank : e.peer > e.group_rank, true) << what;
      } else {
        ADD_FAILURE() << what;
      }
    }
    // Forward: cp - 1 K/V hops, backward: cp - 1 K/V and cp gradient hops, a send and a receive
    // each on every rank; of the cp ranks' hops one (the wrap to rank 0) goes down.
    const int64_t per_rank = 2 * ((cp - 1) + (cp - 1) + cp);
    EXPECT_EQ(up + down, world_size * per_rank) << "cp " << cp;
    EXPECT_GT(down, 0) << "cp " << cp;
    EXPECT_EQ(up, (cp - 1) * down) << "cp " << cp;
  }
}

// One rank: no communication, the kernel alone.
TEST(RingAttention, MatchesFullAttentionCp1) { check_ring_attention(1, 8, both_kernels(false)); }

// On a GPU: the CUDA pair kernels on one rank with head-tail chunks (a causal diagonal pair, a
// full pair below it and a second diagonal pair, merged by log-sum-exp) against float64 on the
// CPU, forward and backward: flash in bf16 and the memory-efficient kernel in float32 (its K and
// V repeated for GQA), MHA and GQA; documents take the explicit kernel there.
TEST(RingAttentionCuda, FusedPairsMatchFloat64) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const at::Device cuda(at::kCUDA, 0);
  const int64_t seq = 512, head_dim = 64;
  struct GpuCase {
    at::ScalarType dtype;
    int64_t n_kv;
    bool documents;
    double tol;
  };
  const std::vector<GpuCase> cases = {{at::kBFloat16, 4, false, 3e-2},
                                      {at::kBFloat16, 2, false, 3e-2},
                                      {at::kFloat, 4, false, 1e-3},
                                      {at::kFloat, 2, false, 1e-3},
                                      {at::kBFloat16, 2, true, 3e-2}};
  run_ranks(1, [&](int, std::shared_ptr<dist::Group> world) {
    for (const GpuCase& c : cases) {
      at::manual_seed(11);
      const std::string what = std::string(c10::toString(c.dtype)) + " kv heads " +
                               std::to_string(c.n_kv) + (c.documents ? " block-causal" : "");
      const auto rounded = [&](std::vector<int64_t> shape) {
        return at::randn(shape).to(c.dtype).to(at::kDouble);
      };
      const at::Tensor q = rounded({kBs, seq, 4, head_dim});
      const at::Tensor k = rounded({kBs, seq, c.n_kv, head_dim});
      const at::Tensor v = rounded({kBs, seq, c.n_kv, head_dim});
      const at::Tensor dout = rounded({kBs, seq, 4, head_dim});
      const at::Tensor docs = c.documents ? packed_document_ids(seq) : at::Tensor();
      at::Tensor q64 = q.clone().requires_grad_(), k64 = k.clone().requires_grad_(),
                 v64 = v.clone().requires_grad_();
      const at::Tensor want = masked_reference(q64, k64, v64, docs);
      want.backward(dout);
      const auto on_gpu = [&](const at::Tensor& t) {
        return t.to(cuda, c.dtype).detach().requires_grad_();
      };
      at::Tensor qg = on_gpu(q), kg = on_gpu(k), vg = on_gpu(v);
      RingAttention ring(world, SequenceLayout::make(seq, 1, SequenceSharding::kHeadTail),
                         RotateMethod::kAllGather);
      const at::Tensor out = ring.forward(qg, kg, vg, c.documents ? docs.to(cuda) : at::Tensor());
      out.backward(dout.to(cuda, c.dtype));
      EXPECT_LE(max_diff(out.cpu(), want), c.tol) << what;
      EXPECT_LE(max_diff(qg.grad().cpu(), q64.grad()), c.tol) << what;
      EXPECT_LE(max_diff(kg.grad().cpu(), k64.grad()), c.tol) << what;
      EXPECT_LE(max_diff(vg.grad().cpu(), v64.grad()), c.tol) << what;
      const RingAttention::Stats& stats = ring.stats();
      // Causal: 3 of the 4 chunk pairs in forward and in backward, each one fused kernel call.
      if (!c.documents) {
        EXPECT_EQ(stats.computed_pairs, 6) << what;
      }
      EXPECT_EQ(stats.fused_pairs, c.documents ? 0 : stats.computed_pairs) << what;
    }
  });
}

// The document of each token counts the EOS tokens before it: an EOS closes its own document.
TEST(BlockCausalAttention, DocumentIdsCountEndsBeforeEachToken) {
  constexpr int64_t kEos = 9;
  const at::Tensor tokens =
      at::tensor({5, 9, 8, 5, 9, 8, 9, 9, /**/ 8, 1, 2, 3, 4, 5, 6, 9}, at::kLong).view({2, 8});
  const at::Tensor want =
      at::tensor({0, 0, 1, 1, 1, 2, 2, 3, /**/ 0, 0, 0, 0, 0, 0, 0, 0}, at::kLong).view({2, 8});
  EXPECT_TRUE(at::equal(document_ids(tokens, kEos), want)) << document_ids(tokens, kEos);
  EXPECT_EQ(parse_attention_mask("block_causal"), AttentionMask::kBlockCausal);
  try {
    parse_attention_mask("block-causal");
    FAIL() << "expected an error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("did you mean 'block_causal'"), std::string::npos)
        << e.what();
  }
}

// The one-process kernel (libtorch's fused SDPA under a block-causal mask), GQA, forward and
// backward, against the explicit float64 reference.
TEST(BlockCausalAttention, FusedKernelMatchesTheReference) {
  at::manual_seed(7);
  const int64_t seq = 24;
  const at::Tensor docs = packed_document_ids(seq);
  const at::Tensor q = at::randn({kBs, seq, 4, kHeadDim}).requires_grad_();
  const at::Tensor k = at::randn({kBs, seq, 2, kHeadDim}).requires_grad_();
  const at::Tensor v = at::randn({kBs, seq, 2, kHeadDim}).requires_grad_();
  const at::Tensor dout = at::randn({kBs, seq, 4, kHeadDim});
  const at::Tensor out = causal_attention(q, k, v, docs);
  out.backward(dout);
  at::Tensor q64 = q.detach().to(at::kDouble).requires_grad_();
  at::Tensor k64 = k.detach().to(at::kDouble).requires_grad_();
  at::Tensor v64 = v.detach().to(at::kDouble).requires_grad_();
  const at::Tensor want = masked_reference(q64, k64, v64, docs);
  want.backward(dout.to(at::kDouble));
  EXPECT_LT(max_diff(out, want), 1e-5);
  EXPECT_LT(max_diff(q.grad(), q64.grad()), 1e-5);
  EXPECT_LT(max_diff(k.grad(), k64.grad()), 1e-5);
  EXPECT_LT(max_diff(v.grad(), v64.grad()), 1e-5);
  // Not the causal result: the documents matter.
  EXPECT_GT(max_diff(out, masked_reference(q64, k64, v64, at::Tensor())), 1e-2);
}

TEST(RingAttention, RejectsMismatchedShapes) {
  run_ranks(2, [&](int rank, std::shared_ptr<dist::Group> world) {
    EXPECT_THROW(RingAttention(world, SequenceLayout::make(16, 4, SequenceSharding::kNone),
                               RotateMethod::kAllToAll),
                 c10::Error);
    RingAttention ring(world, SequenceLayout::make(16, 2, SequenceSharding::kHeadTail),
                       RotateMethod::kAllToAll);
    const at::Tensor q = at::randn({1, 4, 4, kHeadDim});  // 4 local positions, layout wants 8
    try {
      ring.forward(q, q, q, {});
      ADD_FAILURE() << "expected an error on rank " << rank;
    } catch (const c10::Error& e) {
      const std::string msg = e.what_without_backtrace();
      EXPECT_NE(msg.find("4 != seq_len / cp = 16 / 2 = 8"), std::string::npos) << msg;
    }
  });
}

}  // namespace test_ring_attention
}  // namespace titan
