// ATen's fused attention kernels, forward and backward (see attention_kernels.h). The arguments
// follow what scaled_dot_product_attention passes them (aten/src/ATen/native/transformers), so a
// kernel called here computes what SDPA's own call of it would.
#include "titan/models/common/attention_kernels.h"

#include "titan/common/check.h"

#include <cmath>
#include <limits>
#include <utility>

namespace titan {
namespace {

// The memory-efficient kernel pads its log-sum-exp to a multiple of 32 query rows.
int64_t efficient_lse_width(int64_t rows) { return (rows + 31) / 32 * 32; }

// K or V (bs, kv_heads, l, hd) repeated to `heads` heads (kv head g serves query heads g * rep ..
// (g + 1) * rep - 1), for the kernel without grouped-query attention.
at::Tensor repeat_heads(const at::Tensor& t, int64_t heads) {
  const int64_t rep = heads / t.size(1);
  return rep == 1 ? t : t.repeat_interleave(rep, 1);
}

// The gradient of repeated heads (bs, heads, l, hd) summed back onto their kv head.
at::Tensor sum_repeated(const at::Tensor& grad, int64_t kv_heads) {
  const int64_t heads = grad.size(1);
  if (heads == kv_heads) return grad;
  return grad.view({grad.size(0), kv_heads, heads / kv_heads, grad.size(2), grad.size(3)}).sum(2);
}

double scale_of(const AttentionCall& call, const at::Tensor& q) {
  return call.scale ? *call.scale : 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
}

}  // namespace

const char* attention_kernel_name(AttentionKernel kernel) {
  switch (kernel) {
    case AttentionKernel::kNone: return "none";
    case AttentionKernel::kCpuFlash: return "cpu_flash";
    case AttentionKernel::kCudaFlash: return "cuda_flash";
    case AttentionKernel::kEfficient: return "efficient";
    case AttentionKernel::kCudnn: return "cudnn";
    case AttentionKernel::kVarlenFlash: return "varlen_flash";
  }
  return "?";
}

std::vector<at::Tensor> AttentionResults::to_vector() const {
  std::vector<at::Tensor> all{out, lse};
  all.insert(all.end(), aux.begin(), aux.end());
  return all;
}

AttentionResults AttentionResults::from_vector(std::vector<at::Tensor> kept) {
  TITAN_CHECK(kept.size() >= 2, "attention results: expected the output and the log-sum-exp, got ",
              kept.size(), " tensors");
  AttentionResults r;
  r.out = std::move(kept[0]);
  r.lse = std::move(kept[1]);
  r.aux.assign(std::make_move_iterator(kept.begin() + 2), std::make_move_iterator(kept.end()));
  return r;
}

size_t attention_results_size(AttentionKernel kernel) {
  switch (kernel) {
    case AttentionKernel::kCpuFlash: return 2;
    case AttentionKernel::kCudaFlash: return 6;    // + cum_seq_q, cum_seq_k, philox seed, offset
    case AttentionKernel::kEfficient: return 4;    // + philox seed, offset
    case AttentionKernel::kCudnn: return 6;        // + cum_seq_q, cum_seq_k, philox seed, offset
    case AttentionKernel::kVarlenFlash: return 4;  // + rng state, unused
    case AttentionKernel::kNone: break;
  }
  return 0;
}

AttentionResults attention_forward(const AttentionCall& call, const at::Tensor& q,
                                   const at::Tensor& k, const at::Tensor& v) {
  const double scale = scale_of(call, q);
  switch (call.kernel) {
    case AttentionKernel::kCpuFlash: {
      auto [out, lse] = at::_scaled_dot_product_flash_attention_for_cpu(
          q, k, v, /*dropout_p=*/0.0, call.causal, call.mask, scale);
      return {out, lse, {}};
    }
    case AttentionKernel::kCudaFlash: {
      TITAN_CHECK(!call.mask, "the CUDA flash attention kernel takes no mask");
      auto r = at::_scaled_dot_product_flash_attention(q, k, v, /*dropout_p=*/0.0, call.causal,
                                                       /*return_debug_mask=*/false, scale);
      return {std::get<0>(r),
              std::get<1>(r),
              {std::get<2>(r), std::get<3>(r), std::get<6>(r), std::get<7>(r)}};
    }
    case AttentionKernel::kEfficient: {
      const int64_t heads = q.size(1);
      auto [out, lse, seed, offset] = at::_scaled_dot_product_efficient_attention(
          q, repeat_heads(k, heads), repeat_heads(v, heads), call.mask,
          /*compute_log_sumexp=*/true, /*dropout_p=*/0.0, call.causal, scale);
      return {out, lse, {seed, offset}};
    }
    case AttentionKernel::kCudnn: {
      TITAN_CHECK(!call.mask, "titan calls the cuDNN attention kernel without a mask");
      auto r = at::_scaled_dot_product_cudnn_attention(
          q, k, v, /*attn_bias=*/std::nullopt, /*compute_log_sumexp=*/true, /*dropout_p=*/0.0,
          call.causal, /*return_debug_mask=*/false, scale);
      return {std::get<0>(r),
              std::get<1>(r),
              {std::get<2>(r), std::get<3>(r), std::get<6>(r), std::get<7>(r)}};
    }
    case AttentionKernel::kVarlenFlash: {
      TITAN_CHECK(call.cu_seqlens.defined() && call.max_seqlen > 0,
                  "variable-length flash attention needs cumulative sequence lengths");
      auto [out, lse, rng_state, unused, debug] = at::_flash_attention_forward(
          q, k, v, call.cu_seqlens, call.cu_seqlens, call.max_seqlen, call.max_seqlen,
          /*dropout_p=*/0.0, call.causal, /*return_debug_mask=*/false,
          std::optional<double>(scale));
      return {out, lse, {rng_state, unused}};
    }
    case AttentionKernel::kNone: break;
  }
  TITAN_CHECK(false, "attention_forward: no fused kernel to call (",
              attention_kernel_name(call.kernel), ")");
  return {};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> attention_backward(
    const AttentionCall& call, const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
    const at::Tensor& v, const AttentionResults& r) {
  const double scale = scale_of(call, q);
  switch (call.kernel) {
    case AttentionKernel::kCpuFlash:
      return at::_scaled_dot_product_flash_attention_for_cpu_backward(
          dout, q, k, v, r.out, r.lse, /*dropout_p=*/0.0, call.causal, call.mask, scale);
    case AttentionKernel::kCudaFlash:
      // The random state is read only with dropout.
      return at::_scaled_dot_product_flash_attention_backward(
          dout, q, k, v, r.out, r.lse, r.aux.at(0), r.aux.at(1), /*max_q=*/q.size(2),
          /*max_k=*/k.size(2), /*dropout_p=*/0.0, call.causal, r.aux.at(2), r.aux.at(3), scale);
    case AttentionKernel::kEfficient: {
      const int64_t bs = q.size(0), heads = q.size(1), rows = q.size(2);
      at::Tensor lse = r.lse;
      if (lse.size(2) != efficient_lse_width(rows)) {
        lse = at::zeros({bs, heads, efficient_lse_width(rows)}, r.lse.options());
        lse.narrow(2, 0, rows).copy_(r.lse);
      }
      const at::Tensor bias = call.mask ? *call.mask : at::Tensor();
      auto [dq, dk, dv, dbias] = at::_scaled_dot_product_efficient_attention_backward(
          dout, q, repeat_heads(k, heads), repeat_heads(v, heads), bias, r.out, lse, r.aux.at(0),
          r.aux.at(1), /*dropout_p=*/0.0, {true, true, true, false}, call.causal, scale);
      return {dq, sum_repeated(dk, k.size(1)), sum_repeated(dv, v.size(1))};
    }
    case AttentionKernel::kCudnn: {
      // cuDNN reads dout with the output's strides: a dout of another layout gives wrong
      // gradients (measured on an H200, libtorch 2.11: relative error 1.3), so it is copied
      // into that layout first.
      at::Tensor grad_out = dout;
      if (grad_out.strides() != r.out.strides()) {
        grad_out = at::empty_strided(r.out.sizes(), r.out.strides(), dout.options());
        grad_out.copy_(dout);
      }
      return at::_scaled_dot_product_cudnn_attention_backward(
          grad_out, q, k, v, r.out, r.lse, r.aux.at(2), r.aux.at(3), /*attn_bias=*/at::Tensor(),
          r.aux.at(0), r.aux.at(1), /*max_q=*/q.size(2), /*max_k=*/k.size(2), /*dropout_p=*/0.0,
          call.causal, scale);
    }
    case AttentionKernel::kVarlenFlash:
      return at::_flash_attention_backward(dout, q, k, v, r.out, r.lse, call.cu_seqlens,
                                           call.cu_seqlens, call.max_seqlen, call.max_seqlen,
                                           /*dropout_p=*/0.0, call.causal, r.aux.at(0), r.aux.at(1),
                                           std::optional<double>(scale));
    case AttentionKernel::kNone: break;
  }
  TITAN_CHECK(false, "attention_backward: no fused kernel to call (",
              attention_kernel_name(call.kernel), ")");
  return {};
}

at::Tensor efficient_lse_rows(const at::Tensor& lse, int64_t rows) {
  return lse.narrow(2, 0, rows);
}

}  // namespace titan
