"""torch.optim.Muon (the pinned torch) on random matrices and gradients, for
test_muon_reference.sh: writes each case's settings, starting matrix, three gradients, the
matrix after each of three steps and the final momentum buffer to a safetensors file that titan's
Muon.MatchesTorch unit test reads.

Cases: wide, tall and square matrices; Nesterov on and off; every learning-rate adjustment rule;
weight decay on and off; other Newton-Schulz coefficients and step counts; and a stack of 3
expert matrices (titan's batched Newton-Schulz), whose reference is torch's Muon on each expert
as its own 2-D parameter.

  muon_reference.py OUT.safetensors [--seed N]
"""
import argparse
import sys

import torch
from safetensors.torch import save_file

RULES = ["original", "match_rms_adamw", "spectral_unclamped"]

# shape, lr, weight_decay, momentum, nesterov, rule, (a, b, c), ns_steps, eps
CASES = [
    ((24, 40), 0.02, 0.1, 0.95, True, "original", (3.4445, -4.775, 2.0315), 5, 1e-7),
    ((48, 16), 0.01, 0.0, 0.9, False, "match_rms_adamw", (3.4445, -4.775, 2.0315), 5, 1e-7),
    ((32, 32), 0.05, 0.2, 0.95, True, "spectral_unclamped", (3.0, -3.2, 1.2), 7, 1e-6),
    ((40, 24), 0.02, 0.1, 0.5, True, "spectral_unclamped", (3.4445, -4.775, 2.0315), 3, 1e-7),
    ((3, 20, 12), 0.02, 0.1, 0.95, True, "original", (3.4445, -4.775, 2.0315), 5, 1e-7),
]


def run(p0, grads, lr, wd, momentum, nesterov, rule, coeffs, steps, eps):
    p = torch.nn.Parameter(p0.clone())
    opt = torch.optim.Muon([p], lr=lr, weight_decay=wd, momentum=momentum, nesterov=nesterov,
                           ns_coefficients=coeffs, ns_steps=steps, eps=eps, adjust_lr_fn=rule)
    after = []
    for g in grads:
        p.grad = g.clone()
        opt.step()
        after.append(p.detach().clone())
    return after, opt.state[p]["momentum_buffer"].clone()


def main(argv):
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    torch.manual_seed(args.seed)
    tensors = {"cases": torch.tensor([len(CASES)])}
    for i, (shape, lr, wd, mom, nesterov, rule, coeffs, steps, eps) in enumerate(CASES):
        p0 = torch.randn(shape) * 0.1
        grads = [torch.randn(shape) * 0.01 for _ in range(3)]
        if len(shape) == 2:
            after, buf = run(p0, grads, lr, wd, mom, nesterov, rule, coeffs, steps, eps)
        else:  # each expert as its own matrix
            per = [run(p0[e], [g[e] for g in grads], lr, wd, mom, nesterov, rule, coeffs, steps,
                       eps) for e in range(shape[0])]
            after = [torch.stack([per[e][0][t] for e in range(shape[0])]) for t in range(3)]
            buf = torch.stack([per[e][1] for e in range(shape[0])])
        c = f"case{i}."
        tensors[c + "settings"] = torch.tensor(
            [lr, wd, mom, float(nesterov), float(RULES.index(rule)), coeffs[0], coeffs[1],
             coeffs[2], float(steps), eps], dtype=torch.float64)
        tensors[c + "p0"] = p0
        for t in range(3):
            tensors[c + f"grad{t}"] = grads[t]
            tensors[c + f"after{t}"] = after[t]
        tensors[c + "momentum_buffer"] = buf
    save_file({k: v.contiguous() for k, v in tensors.items()}, args.out)
    print(f"torch {torch.__version__}: {len(CASES)} Muon cases written to {args.out}")


if __name__ == "__main__":
    main(sys.argv[1:])
