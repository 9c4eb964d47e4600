"""torchao's MX reference cast (torchao.prototype.mx_formats.mx_tensor.to_mx, e4m3 elements,
blocks of 32, the FLOOR scale rule of the mxfp8_cublas recipe) and its inverse (to_dtype) on
random and edge-case inputs, for test_mx.sh: writes each input with torchao's element bytes,
E8M0 scale bytes and dequantized values to a safetensors file that titan's Mx.MatchesTorchao
unit test reads.

Inputs: float32 blocks spread over 60 decades, bfloat16, and a float32 matrix of edge blocks
(zeros, subnormals, an infinity, a NaN, maxima at and around the e4m3 saturation point, values
on e4m3 rounding ties).

  mx_reference.py OUT.safetensors [--seed N]
"""
import argparse
import sys

import torch
from safetensors.torch import save_file
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
        scale, data = to_mx(x.contiguous(), torch.float8_e4m3fn, 32)
        tensors[name] = x
        tensors[name + ".data"] = data.view(torch.uint8)
        tensors[name + ".scale"] = scale.view(torch.uint8)
        tensors[name + ".dequantized"] = to_dtype(data, scale, torch.float8_e4m3fn, 32,
                                                  torch.float32)
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
    save_file({k: v.contiguous() for k, v in tensors.items()}, args.out)
    import torchao
    print(f"torchao {torchao.__version__}: {len(inputs)} MX inputs written to {args.out}")


if __name__ == "__main__":
    main(sys.argv[1:])
