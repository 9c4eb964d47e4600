// Block-causal attention of packed documents through the variable-length kernels' layout:
// pack_documents against a per-document loop (starts, count, longest, one device read), causal
// attention per packed document equals the block-causal mask (on the CPU, with SDPA per
// document), and on a GPU the variable-length flash path of causal_attention against the
// dense-mask path, forward and backward, MHA and GQA.
#include "../op_counter.h"

#include "titan/common/device.h"
#include "titan/common/host_sync.h"
#include "titan/models/common/attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

namespace titan {
namespace test_document_attention {

// Document ids of packed rows: row 0 several documents with a one-token one at the end; row 1
// starts inside a document (id 0 continuing) and has an id jump of 2; row 2 one document; row 3
// random boundaries.
at::Tensor sample_ids(int64_t seq) {
  at::Tensor starts = at::zeros({4, seq}, at::kLong);
  starts[0][2] = 1;
  starts[0][7] = 1;
  starts[0][seq - 1] = 1;
  starts[1][5] = 2;
  starts[3].copy_(at::rand({seq}).lt(0.3).to(at::kLong));
  return starts.cumsum(1);
}

// The reference: walk every row, a document starting at its first token and wherever the id
// changes.
struct Packing {
  std::vector<int32_t> cu;
  int64_t longest = 0;
};
Packing reference_packing(const at::Tensor& ids) {
  Packing p;
  const int64_t bs = ids.size(0), seq = ids.size(1);
  const at::Tensor host = ids.cpu();
  const auto a = host.accessor<int64_t, 2>();
  for (int64_t b = 0; b < bs; ++b) {
    for (int64_t t = 0; t < seq; ++t) {
      if (t == 0 || a[b][t] != a[b][t - 1]) p.cu.push_back(static_cast<int32_t>(b * seq + t));
    }
  }
  p.cu.push_back(static_cast<int32_t>(bs * seq));
  for (size_t i = 0; i + 1 < p.cu.size(); ++i) {
    p.longest = std::max<int64_t>(p.longest, p.cu[i + 1] - p.cu[i]);
  }
  return p;
}

TEST(DocumentAttention, PackingMatchesAPerDocumentLoop) {
  at::manual_seed(3);
  for (const int64_t seq : {1, 2, 17, 64}) {
    const at::Tensor ids =
        seq < 8 ? at::arange(4 * seq, at::kLong).view({4, seq}).div(3, "floor") : sample_ids(seq);
    const Packing want = reference_packing(ids);
    const int64_t before = host_sync_count();
    const DocumentPacking got = pack_documents(ids);
    EXPECT_EQ(host_sync_count() - before, 1) << "seq " << seq;  // n_docs and the longest together
    ASSERT_EQ(got.cu_seqlens.scalar_type(), at::kInt);
    const at::Tensor cu = got.cu_seqlens.contiguous();
    EXPECT_EQ(std::vector<int32_t>(cu.data_ptr<int32_t>(), cu.data_ptr<int32_t>() + cu.numel()),
              want.cu)
        << "seq " << seq;
    EXPECT_EQ(got.n_docs, static_cast<int64_t>(want.cu.size()) - 1) << "seq " << seq;
    EXPECT_EQ(got.max_seqlen, want.longest) << "seq " << seq;
  }
  // Every token its own document: n_docs = bs * seq, the last slot the total.
  const DocumentPacking each = pack_documents(at::arange(12, at::kLong).view({3, 4}));
  EXPECT_EQ(each.n_docs, 12);
  EXPECT_EQ(each.max_seqlen, 1);
  EXPECT_TRUE(at::equal(each.cu_seqlens, at::arange(13, at::kInt)));
}

// Causal attention of each packed document alone (what the variable-length kernel computes, here
// by SDPA per document on the CPU) is the block-causal attention of the rows.
TEST(DocumentAttention, PackedDocumentsAttendAsTheBlockCausalMask) {
  at::manual_seed(5);
  const int64_t seq = 24, heads = 4, kv_heads = 2, head_dim = 8;
  const at::Tensor ids = sample_ids(seq);
  const int64_t bs = ids.size(0);
  const at::Tensor q = at::randn({bs, seq, heads, head_dim});
  const at::Tensor k = at::randn({bs, seq, kv_heads, head_dim});
  const at::Tensor v = at::randn({bs, seq, kv_heads, head_dim});
  const DocumentPacking packing = pack_documents(ids);
  const at::Tensor qf = q.reshape({bs * seq, heads, head_dim});
  const at::Tensor kf = k.reshape({bs * seq, kv_heads, head_dim});
  const at::Tensor vf = v.reshape({bs * seq, kv_heads, head_dim});
  const at::Tensor cu = packing.cu_seqlens.to(at::kLong);
  std::vector<at::Tensor> parts;
  for (int64_t d = 0; d < packing.n_docs; ++d) {
    const int64_t start = cu[d].item<int64_t>(), len = cu[d + 1].item<int64_t>() - start;
    const auto doc = [&](const at::Tensor& t) { return t.narrow(0, start, len).transpose(0, 1); };
    parts.push_back(at::scaled_dot_product_attention(doc(qf), doc(kf), doc(vf), std::nullopt, 0.0,
                                                     /*is_causal=*/true, std::nullopt,
                                                     /*enable_gqa=*/true)
                        .transpose(0, 1));
  }
  const at::Tensor packed = at::cat(parts).view({bs, seq, heads, head_dim});
  const at::Tensor masked = causal_attention(q, k, v, ids);  // the dense block-causal mask
  EXPECT_LT((packed - masked).abs().max().item<double>(), 1e-5);
}

// On a GPU: causal_attention with documents runs the variable-length flash kernel (one
// _flash_attention_forward per call, no SDPA) and gives the dense-mask path's output and
// gradients (SDPA under the (bs, 1, seq, seq) mask), bf16, MHA and GQA.
TEST(DocumentAttentionCuda, VarlenFlashMatchesTheDenseMask) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const at::Device cuda(at::kCUDA, 0);
  at::manual_seed(6);
  const int64_t seq = 256, heads = 8, head_dim = 64;
  const at::Tensor ids = sample_ids(seq).to(cuda);
  const int64_t bs = ids.size(0);
  for (const int64_t kv_heads : {8, 2}) {
    const auto options = at::TensorOptions().dtype(at::kBFloat16).device(cuda);
    const at::Tensor q0 = at::randn({bs, seq, heads, head_dim}, options);
    const at::Tensor k0 = at::randn({bs, seq, kv_heads, head_dim}, options);
    const at::Tensor v0 = at::randn({bs, seq, kv_heads, head_dim}, options);
    const at::Tensor dout = at::randn({bs, seq, heads, head_dim}, options);
    const auto leaf = [](const at::Tensor& t) { return t.detach().clone().requires_grad_(); };
    at::Tensor q = leaf(q0), k = leaf(k0), v = leaf(v0);
    at::Tensor out;
    {
      test::OpCounter varlen("aten::_flash_attention_forward");
      out = causal_attention(q, k, v, ids);
      EXPECT_EQ(varlen.count(), 1) << "kv heads " << kv_heads;
    }
    out.backward(dout);
    // The dense path: SDPA under the block-causal boolean mask.
    at::Tensor qd = leaf(q0), kd = leaf(k0), vd = leaf(v0);
    const at::Tensor causal = at::ones({seq, seq}, ids.options().dtype(at::kBool)).tril();
    const at::Tensor mask = ids.unsqueeze(2).eq(ids.unsqueeze(1)).logical_and_(causal).unsqueeze(1);
    const at::Tensor dense =
        at::scaled_dot_product_attention(qd.transpose(1, 2), kd.transpose(1, 2), vd.transpose(1, 2),
                                         mask, 0.0, false, std::nullopt, /*enable_gqa=*/true)
            .transpose(1, 2);
    dense.backward(dout);
    const auto diff = [](const at::Tensor& a, const at::Tensor& b) {
      const at::Tensor w = b.to(at::kFloat);
      return ((a.to(at::kFloat) - w).abs().max() / w.abs().max().clamp_min(1.0)).item<double>();
    };
    EXPECT_LT(diff(out, dense), 2e-2) << "kv heads " << kv_heads;
    EXPECT_LT(diff(q.grad(), qd.grad()), 3e-2) << "kv heads " << kv_heads;
    EXPECT_LT(diff(k.grad(), kd.grad()), 3e-2) << "kv heads " << kv_heads;
    EXPECT_LT(diff(v.grad(), vd.grad()), 3e-2) << "kv heads " << kv_heads;
  }
}

}  // namespace test_document_attention
}  // namespace titan
