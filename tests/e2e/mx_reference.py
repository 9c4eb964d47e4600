"""torchao's MX reference cast (torchao.prototype.mx_formats.mx_tensor.to_mx, e4m3 elements,
blocks of 32, the FLOOR scale rule of the mxfp8_cublas recipe, and the RCEIL rule of its MXFP8
grouped GEMMs) and its inverse (to_dtype) on random and edge-case inputs, for test_mx.sh: writes
each input with torchao's element bytes, E8M0 scale bytes and dequantized values to a
safetensors file that titan's Mx.MatchesTorchao unit test reads; and the MoE experts' grouped
GEMMs in MXFP8 (torchao's emulated kernels) and float8 rowwise (torchao's casts), forward and
backward, for the MoeQuant tests.

Inputs: float32 blocks spread over 60 decades, bfloat16, and a float32 matrix of edge blocks
(zeros, subnormals, an infinity, a NaN, maxima at and around the e4m3 saturation point, values
on e4m3 rounding ties).

  mx_reference.py OUT.safetensors [--seed N]
"""
import argparse
import sys

import torch
from safetensors.torch import save_file
from torchao.float8.config import ScalingGranularity
from torchao.float8.float8_utils import tensor_to_scale, to_fp8_saturated
from torchao.prototype.moe_training.config import KernelPreference
from torchao.prototype.moe_training.mxfp8_grouped_mm import _to_mxfp8_then_scaled_grouped_mm
from torchao.prototype.mx_formats.config import ScaleCalculationMode
from torchao.prototype.mx_formats.mx_tensor import to_dtype, to_mx


def edge_cases():
    rows = []
    rows.append(torch.zeros(32))
    rows.append(torch.full((32,), 1e-40) * torch.arange(1, 33))  # float32 subnormals
    r = torch.randn(32)
    r[5] = float("inf")
    rows.append(r)
    r = torch.randn(32)
    r[7] = float("nan")
    rows.append(r)
    for top in (448.0, 479.0, 480.0, 511.0, 512.0, 1.75 * 2**-100, 2.0**-130):
        r = torch.rand(32) * top
        r[0] = -top
        rows.append(r)
    # e4m3 ties: between 1 and 1.125 the grid is 1/8 apart; 1.0625 is halfway.
    rows.append(torch.tensor([1.0625, 1.1875, -1.0625, 3.0 + 1 / 16] + [0.5] * 27 + [256.0]))
    return torch.stack(rows).reshape(-1, 64)


# Routed experts' grouped GEMM: x (tokens, K) grouped by expert (counts, one expert empty, none a
# multiple of 16), w (experts, N, K); out = each expert's rows @ w[e]^T, with a gradient g.
GROUP_COUNTS = [37, 0, 64, 5]


def grouped_inputs(dtype):
    torch.manual_seed(7)
    tokens, k, n = sum(GROUP_COUNTS), 64, 96
    x = (torch.randn(tokens, k) * 2).to(dtype)
    w = (torch.randn(len(GROUP_COUNTS), n, k) * 0.1).to(dtype)
    g = torch.randn(tokens, n).to(dtype)
    return x, w, g


def grouped_mx():
    """torchao's MXFP8 grouped GEMM for MoE training (its emulated kernels: RCEIL scales, groups
    padded to 32, dequantized bf16 operands through torch._grouped_mm), forward and backward."""
    x, w, g = grouped_inputs(torch.bfloat16)
    offs = torch.tensor(GROUP_COUNTS).cumsum(0).to(torch.int32)
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    out = _to_mxfp8_then_scaled_grouped_mm(
        xr, wr.transpose(-2, -1), offs, out_dtype=torch.bfloat16,
        kernel_preference=KernelPreference.EMULATED,
        scale_calculation_mode=ScaleCalculationMode.RCEIL, pad_token_groups_for_grouped_mm=True)
    out.backward(g)
    return {"grouped.counts": torch.tensor(GROUP_COUNTS), "grouped_mx.x": x, "grouped_mx.w": w,
            "grouped_mx.g": g, "grouped_mx.out": out.detach(), "grouped_mx.grad_x": xr.grad,
            "grouped_mx.grad_w": wr.grad}


def grouped_float8():
    """torchao's float8 rowwise grouped GEMM for MoE training (_Float8GroupedMM) computed with its
    reference casts (tensor_to_scale, power-of-2 scales, e4m3, to_fp8_saturated) and float32
    products of the dequantized operands, per expert group: forward scales A per token and B per
    (expert, column) along K; grad_A scales grad_out per token and B per (expert, row of K) along
    N; grad_B scales grad_out and A per (group, column) over the group's tokens."""
    x, w, g = grouped_inputs(torch.float32)

    def cast(t, dim):
        scale = tensor_to_scale(t, torch.float8_e4m3fn, scaling_granularity=ScalingGranularity.AXISWISE,
                                axiswise_dim=dim, round_scales_to_power_of_2=True)
        return to_fp8_saturated(t.to(torch.float32) * scale, torch.float8_e4m3fn).to(torch.float32) / scale

    out = torch.zeros(x.shape[0], w.shape[1])
    grad_x = torch.zeros_like(x)
    grad_w = torch.zeros_like(w)
    x_rows, g_rows = cast(x, -1), cast(g, -1)     # per token: along K, along N
    w_for_out = cast(w.transpose(-2, -1), -2)     # B_t (E, K, N): per (expert, n) along K
    w_for_grad_x = cast(w.transpose(-2, -1), -1)  # per (expert, k) along N
    start = 0
    for e, count in enumerate(GROUP_COUNTS):
        rows = slice(start, start + count)
        start += count
        if count == 0:
            continue
        out[rows] = x_rows[rows] @ w_for_out[e]
        grad_x[rows] = g_rows[rows] @ w_for_grad_x[e].t()
        grad_w[e] = cast(g[rows], 0).t() @ cast(x[rows], 0)  # (N, K)
    return {"grouped_f8.x": x, "grouped_f8.w": w, "grouped_f8.g": g, "grouped_f8.out": out,
            "grouped_f8.grad_x": grad_x, "grouped_f8.grad_w": grad_w}


def main(argv):
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    torch.manual_seed(args.seed)
    spread = torch.randn(16, 128) * 10.0 ** torch.randint(-30, 30, (16, 4, 1)).float().repeat_interleave(32, 2).reshape(16, 128)
    inputs = {
        "spread": spread,
        "bf16": (torch.randn(8, 64) * 3).to(torch.bfloat16),
        "edges": edge_cases(),
    }
    tensors = {}
    for name, x in inputs.items():
        tensors[name] = x
        for suffix, mode in (("", ScaleCalculationMode.FLOOR),
                             (".rceil", ScaleCalculationMode.RCEIL)):
            scale, data = to_mx(x.contiguous(), torch.float8_e4m3fn, 32, scaling_mode=mode)
            tensors[name + suffix + ".data"] = data.view(torch.uint8)
            tensors[name + suffix + ".scale"] = scale.view(torch.uint8)
            tensors[name + suffix + ".dequantized"] = to_dtype(data, scale, torch.float8_e4m3fn,
                                                               32, torch.float32)
    # torchao's MX linear arithmetic with its casts: y = x W^T, grad_x = g W, grad_W = g^T x,
    # each GEMM of operands cast along the reduced dim and dequantized, multiplied in float32.
    def mm_nt(a, b):
        deq = [to_dtype(d, s, torch.float8_e4m3fn, 32, torch.float32)
               for s, d in (to_mx(a.contiguous(), torch.float8_e4m3fn, 32),
                            to_mx(b.contiguous(), torch.float8_e4m3fn, 32))]
        return deq[0] @ deq[1].t()
    x = torch.randn(64, 96)
    w = torch.randn(32, 96) * 0.1
    g = torch.randn(64, 32)
    tensors.update({"linear.x": x, "linear.w": w, "linear.g": g,
                    "linear.y": mm_nt(x, w), "linear.grad_x": mm_nt(g, w.t()),
                    "linear.grad_w": mm_nt(g.t(), x.t())})
    tensors.update(grouped_mx())
    tensors.update(grouped_float8())
    save_file({k: v.contiguous() for k, v in tensors.items()}, args.out)
    import torchao
    print(f"torchao {torchao.__version__}: {len(inputs)} MX inputs written to {args.out}")


if __name__ == "__main__":
    main(sys.argv[1:])
