"""PyTorch reference for scripts/gpu_check.sh: the Llama 3 model that titan.cpp trains, written in
plain PyTorch, trained on random tokens in a timed loop, either eagerly or with torch.compile, on
a GPU or the CPU. It prints one JSON object (tokens/s, TFLOP/s by titan's formula, memory) so that
gpu_check.sh can put titan's speed next to PyTorch's on the same device in the same run. titan
itself has no Python; this file only measures.

What mirrors titan (src/titan/models/llama3, src/titan/models/common, src/titan/trainer):
  - flavors: the dims of src/titan/models/llama3/args.cpp (--flavor), or any dims by flag;
    SwiGLU hidden size multiple_of * ceil(multiplier * int(8 dim / 3) / multiple_of);
  - RMSNorm (eps 1e-5) with its math in float32, the result in the input's dtype;
  - RoPE on interleaved (even, odd) pairs, theta 500000, Llama 3.1 frequency scaling (factor 8,
    low 1, high 4, original 8192 positions), float32 tables and rotation;
  - causal attention through scaled_dot_product_attention with enable_gqa (no repeated K/V);
    q, k, v and o projections without bias; the output head tied to the embedding where the
    flavor ties it (1B, 3B), else its own;
  - bf16 (titan's training.mixed_precision_param bfloat16): float32 master weights, gradients and
    AdamW state; matmuls and attention in bf16 (torch.autocast: one bf16 weight copy per forward,
    as titan's Linear keeps for backward), the residual stream bf16 from the embedding on, float32
    logits for the cross-entropy;
  - AdamW lr 8e-4, betas (0.9, 0.95), eps 1e-8, weight decay 0.1, gradients clipped to norm 1.0;
    the implementation TorchTitan defaults to (fused) on CUDA, foreach on the CPU;
  - FLOPs per token as ModelStats::flops_per_token: 6 (N - N_embedding) + 12 L H head_dim T.

--mode compile compiles as TorchTitan's compile.enable does: each transformer block with
fullgraph=True (identical blocks share one compiled graph) and the loss; the optimizer stays
eager (fused). Compilation happens in the warm-up steps; compile_s is the warm-up time beyond
that many steps at the timed speed.

    python bench/torch_reference.py --flavor debugmodel --device cpu --seq 256 --batch 8 \
        --steps 5 --mode eager
    python bench/torch_reference.py --flavor 8B_cut --device cuda --dtype bfloat16 \
        --seq 8192 --batch 1 --steps 10 --mode compile --json out.json
    python bench/torch_reference.py --flavor 8B_cut --seq 8192 --count-only   # sizes only
"""
import argparse
import json
import math
import resource
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

# The transformer block (RMSNorm, RoPE rotation, GQA attention, SwiGLU) of the CPU benchmark's
# reference, which is device-generic; this file adds RoPE scaling, the flavors, tied heads and
# the GPU loop.
from reference_train import Block, RMSNorm

# (dim, n_layers, n_heads, n_kv_heads, vocab, multiple_of, ffn_dim_multiplier, tied), as
# src/titan/models/llama3/args.cpp; n_kv_heads 0 means n_heads.
FLAVORS = {
    "tiny": (64, 2, 4, 2, 300, 32, 0.0, False),
    "debugmodel": (256, 6, 16, 0, 2048, 256, 0.0, False),
    "debugmodel_narrow": (128, 6, 16, 0, 2048, 128, 0.0, False),
    "bench_small": (256, 6, 8, 4, 8192, 256, 0.0, False),
    "bench_medium": (512, 8, 8, 8, 32000, 256, 0.0, False),
    "1B": (2048, 16, 32, 8, 128256, 256, 1.5, True),
    "3B": (3072, 28, 24, 8, 128256, 256, 1.0, True),
    "8B_cut": (4096, 8, 32, 8, 128256, 1024, 1.3, False),
    "8B": (4096, 32, 32, 8, 128256, 1024, 1.3, False),
}


def ffn_hidden_dim(dim, multiple_of, multiplier):
    hidden = 2 * (4 * dim) // 3
    if multiplier > 0:
        hidden = int(multiplier * hidden)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


def rope_frequencies(head_dim, theta=500000.0, factor=8.0, low=1.0, high=4.0, orig=8192):
    freqs = (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)).reciprocal()
    wavelen = freqs.reciprocal() * (2 * math.pi)
    # Low frequencies slowed by the factor, high ones kept, the band between blended.
    freqs = torch.where(wavelen > orig / low, freqs / factor, freqs)
    smooth = (wavelen.reciprocal() * orig - low) / (high - low)
    blended = (1 - smooth) * freqs / factor + smooth * freqs
    medium = (wavelen >= orig / high) & (wavelen <= orig / low)
    return torch.where(medium, blended, freqs)


class Transformer(nn.Module):
    def __init__(self, dims, seq, residual_dtype):
        super().__init__()
        dim, n_layers, n_heads, n_kv_heads, vocab, multiple_of, multiplier, tied = dims
        self.dims = dims
        n_kv_heads = n_kv_heads or n_heads
        hidden = ffn_hidden_dim(dim, multiple_of, multiplier)
        self.tok_embeddings = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(Block(dim, n_heads, n_kv_heads, hidden)
                                    for _ in range(n_layers))
        self.norm = RMSNorm(dim)
        self.output = None if tied else nn.Linear(dim, vocab, bias=False)
        angles = torch.outer(torch.arange(seq, dtype=torch.float32),
                             rope_frequencies(dim // n_heads))
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)
        self.residual_dtype = residual_dtype

    def init_weights(self):
        # titan's (TorchTitan's) init: the loss depends on it, the speed does not.
        dim = self.tok_embeddings.weight.shape[1]
        head_std = dim ** -0.5
        with torch.no_grad():
            if self.output is None:
                nn.init.trunc_normal_(self.tok_embeddings.weight, 0.0, head_std, -3 * head_std,
                                      3 * head_std)
            else:
                nn.init.normal_(self.tok_embeddings.weight, 0.0, 1.0)
                nn.init.trunc_normal_(self.output.weight, 0.0, head_std, -3 * head_std,
                                      3 * head_std)
            for i, layer in enumerate(self.layers):
                layer.init_weights(0.02 / math.sqrt(2.0 * (i + 1)))  # depth_init

    def forward(self, tokens):
        h = self.tok_embeddings(tokens).to(self.residual_dtype)  # (bs, seq, dim)
        for layer in self.layers:
            h = layer(h, self.cos, self.sin)
        h = self.norm(h)
        logits = self.output(h) if self.output is not None else F.linear(
            h, self.tok_embeddings.weight)
        return logits.float()  # (bs, seq, vocab)


def model_sizes(model, seq):
    # (parameters, embedding parameters, FLOPs per token) of a built model.
    dims = model.dims
    n_params = sum(p.numel() for p in model.parameters())
    n_embedding = model.tok_embeddings.weight.numel()
    dim, n_layers, n_heads = dims[0], dims[1], dims[2]
    flops_per_token = 6.0 * (n_params - n_embedding) + 12.0 * n_layers * n_heads * (
        dim // n_heads) * seq
    return n_params, n_embedding, flops_per_token


def sizes_without_allocating(dims, seq):
    # model_sizes of the model with `dims`, built on the meta device (no memory).
    with torch.device("meta"):
        return model_sizes(Transformer(dims, seq, torch.float32), seq)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--flavor", default="debugmodel", choices=sorted(FLAVORS))
    for name in ("dim", "layers", "heads", "kv-heads", "vocab"):
        p.add_argument("--" + name, type=int, help="override the flavor's " + name)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=10, help="timed steps")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first (compilation)")
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--mode", default="eager", choices=["eager", "compile"])
    p.add_argument("--compile-backend", default="inductor",
                   help="torch.compile's backend; aot_eager captures the same graphs without "
                        "generating code (gpu_check.sh's CPU dry run, where inductor's C++ "
                        "compilation takes minutes)")
    p.add_argument("--optimizer-impl", default="auto", choices=["auto", "fused", "foreach"])
    p.add_argument("--threads", type=int, default=0, help="CPU threads (0: torch's default)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--count-only", action="store_true",
                   help="print parameter count and FLOPs per token without allocating")
    p.add_argument("--json", help="also write the result to this file")
    return p.parse_args()


def flavor_dims(a):
    dims = list(FLAVORS[a.flavor])
    for i, name in enumerate(("dim", "layers", "heads", "kv_heads", "vocab")):
        if getattr(a, name) is not None:
            dims[i] = getattr(a, name)
    return tuple(dims)


def emit(result, path):
    line = json.dumps(result, sort_keys=True)
    print(line, flush=True)
    if path:
        with open(path, "w") as f:
            f.write(line + "\n")


def main():
    a = parse_args()
    dims = flavor_dims(a)
    bf16 = a.dtype == "bfloat16"
    residual_dtype = torch.bfloat16 if bf16 else torch.float32
    result = {"flavor": a.flavor, "dims": dims, "seq": a.seq, "batch": a.batch,
              "dtype": a.dtype, "torch": torch.__version__}
    if a.count_only:
        result["n_params"], result["n_embedding_params"], result["flops_per_token"] = \
            sizes_without_allocating(dims, a.seq)
        emit(result, a.json)
        return 0

    device = torch.device(a.device)
    cuda = device.type == "cuda"
    if cuda and not torch.cuda.is_available():
        print("torch_reference: --device cuda but torch sees no CUDA device", file=sys.stderr)
        return 2
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    with torch.device(device):
        model = Transformer(dims, a.seq, residual_dtype)
    model.init_weights()
    n_params, _, flops_per_token = model_sizes(model, a.seq)
    params = list(model.parameters())
    impl = a.optimizer_impl if a.optimizer_impl != "auto" else ("fused" if cuda else "foreach")
    opt = torch.optim.AdamW(params, lr=8e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1,
                            **{impl: True})

    def loss_fn(logits, labels):
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten(0, 1))

    if a.mode == "compile":
        for i, layer in enumerate(model.layers):
            model.layers[i] = torch.compile(layer, fullgraph=True, backend=a.compile_backend)
        loss_fn = torch.compile(loss_fn, backend=a.compile_backend)

    def step():
        tokens = torch.randint(dims[4], (a.batch, a.seq + 1), device=device)
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            logits = model(tokens[:, :-1])
        loss = loss_fn(logits, tokens[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True)
        opt.step()
        return loss.item()

    def sync():
        if cuda:
            torch.cuda.synchronize(device)

    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    sync()
    t0 = time.perf_counter()
    losses = [step() for _ in range(a.warmup)]
    sync()
    warmup_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    losses += [step() for _ in range(a.steps)]
    sync()
    seconds = time.perf_counter() - t0
    step_s = seconds / a.steps
    tps = a.steps * a.batch * a.seq / seconds
    result.update({
        "mode": a.mode, "device": str(device), "optimizer": impl, "n_params": n_params,
        "flops_per_token": flops_per_token, "steps": a.steps, "warmup": a.warmup,
        "tokens_per_s": tps, "tflops": flops_per_token * tps / 1e12, "step_s": step_s,
        "warmup_s": warmup_s, "losses": losses,
        "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
    })
    if a.mode == "compile":
        result["compile_s"] = max(0.0, warmup_s - a.warmup * step_s)
        result["compile_backend"] = a.compile_backend
    if cuda:
        result["device_name"] = torch.cuda.get_device_name(device)
        result["max_allocated_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
        result["max_reserved_gib"] = torch.cuda.max_memory_reserved(device) / 2**30
    emit(result, a.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
