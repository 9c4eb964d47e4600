"""PyTorch reference for `titan bench`: the same Llama 3 model, AdamW and gradient clipping as
titan.cpp's training step, on random-token batches (titan's come from its dataset through the
trainer's loader; the token values do not change the work), trained by a plain Python loop,
either eagerly or through torch.compile. Used only to compare speed on the same machine
(bench/run_bench.sh); titan.cpp itself has no Python. Runs in the project's Python environment
(scripts/python_env.sh: the torch 2.15 whose libtorch titan links).

What mirrors titan (src/titan/models/common, src/titan/models/llama3, src/titan/trainer):
  - attention: q, k, v projections, RoPE on q and k, then
    F.scaled_dot_product_attention(is_causal=True, enable_gqa=True) (titan:
    at::scaled_dot_product_attention with enable_gqa), so no repeated K/V and no score matrix;
  - RoPE: float32 tables cos/sin of outer(positions, 1 / theta^(2i/head_dim)), theta 500000,
    each (even, odd) pair rotated in float32 and cast back to the input dtype;
  - RMSNorm: eps 1e-5, the math in float32 (input * rsqrt(mean(x^2) + eps) * weight), the result
    in the input's dtype;
  - SwiGLU feed-forward w2(silu(w1 x) * w3 x), hidden size as Llama 3 (2/3 of 4 dim, rounded up to
    multiple_of); untied output head; titan's init (only the loss depends on it, not the speed);
  - loss: cross-entropy on float32 logits; gradients clipped to a global L2 norm of 1.0;
    torch.optim.AdamW(foreach=True), lr 8e-4, betas (0.9, 0.95), eps 1e-8, weight decay 0.1 on
    every parameter (titan's [optimizer] defaults).

bfloat16 (titan's --training.mixed_precision_param bfloat16): titan keeps float32 master weights,
gradients and AdamW state; every Linear casts its input and weight to bf16 for the matmul (the
bf16 weight copy is kept for backward), attention runs in bf16, RMSNorm and RoPE compute in
float32 and hand back bf16, the residual stream is bf16 from the embedding on, and the logits go
back to float32 for the loss. The eager counterpart chosen here is torch.autocast("cpu",
bfloat16) around the forward, which does the same for Linear (one cached bf16 weight copy per
step) and scaled_dot_product_attention; the embedding output is cast to bf16 as in titan, so that
the residual sums stay bf16 rather than promoting to float32.

--compile (= --compile step): the train step through torch.compile with the default backend
(inductor, C++/OpenMP kernels on the CPU), in two graphs: forward + cross-entropy (fullgraph; its
backward is compiled by AOTAutograd, so loss.backward() runs compiled kernels too), and gradient
clipping + the AdamW step. Only the Python glue (random batch, zero_grad, loss.item()) stays
eager. --compile model compiles the model's forward (and its backward) only, close to
TorchTitan's compile.enable (which compiles each transformer block); the loss, clipping and AdamW
stay eager. Measured on the 2-core CPU (busy, so indicative), model (a) at seq 256, alternating
steps in one process, fastest of 6: float32 eager 0.57 s, model 0.50 s, step 0.47 s; bfloat16
0.50 / 0.32 / 0.32 s; on one thread, clip + AdamW alone went from 68 to 30 ms for (a) and from
516 to 202 ms for (b) when compiled. So the whole step is the default. Compilation happens in the
warm-up steps and is reported separately (compile_s: the warm-up time beyond that many steps at
the timed speed; first-run cost with an empty TORCHINDUCTOR_CACHE_DIR, a few seconds with a warm
one). The timed steps count only if nothing compiled during them (recompiles=0).

    "$(scripts/python_env.sh)" bench/reference_train.py --dim 256 --layers 6 --heads 8 \
        --kv-heads 4 --vocab 8192 --seq 256 --batch 8 --dtype bfloat16 --steps 10 --threads 2 \
        [--compile]
"""
import argparse
import math
import resource
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def ffn_hidden(dim, multiple_of):
    hidden = int(2 * 4 * dim / 3)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        xf = x.float()
        rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * rstd * self.weight).to(x.dtype)


def rope_tables(head_dim, seq, theta=500000.0):
    freqs = (theta ** (torch.arange(0, head_dim, 2).float() / head_dim)).reciprocal()
    angles = torch.outer(torch.arange(seq).float(), freqs)  # (seq, head_dim / 2)
    return angles.cos(), angles.sin()


def apply_rope(x, cos, sin):
    # x (bs, seq, heads, head_dim); each (even, odd) pair times (cos + i sin), in float32.
    bs, seq, heads, head_dim = x.shape
    pairs = x.float().reshape(bs, seq, heads, head_dim // 2, 2)
    x0, x1 = pairs[..., 0], pairs[..., 1]
    c, s = cos[:seq].unsqueeze(1), sin[:seq].unsqueeze(1)  # (seq, 1, head_dim / 2)
    return torch.stack((x0 * c - x1 * s, x0 * s + x1 * c), -1).flatten(3).to(x.dtype)


class Block(nn.Module):
    def __init__(self, dim, heads, kv_heads, hidden):
        super().__init__()
        self.head_dim = dim // heads
        self.wq = nn.Linear(dim, heads * self.head_dim, bias=False)
        self.wk = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(heads * self.head_dim, dim, bias=False)
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)
        self.attention_norm = RMSNorm(dim)
        self.ffn_norm = RMSNorm(dim)

    def attention(self, x, cos, sin):
        bs, seq, _ = x.shape
        q = apply_rope(self.wq(x).view(bs, seq, -1, self.head_dim), cos, sin)
        k = apply_rope(self.wk(x).view(bs, seq, -1, self.head_dim), cos, sin)
        v = self.wv(x).view(bs, seq, -1, self.head_dim)
        # (bs, heads, seq, head_dim); query head h reads kv head h // (heads / kv_heads).
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                             v.transpose(1, 2), is_causal=True,
                                             enable_gqa=k.shape[2] != q.shape[2])
        return self.wo(out.transpose(1, 2).reshape(bs, seq, -1))

    def forward(self, x, cos, sin):
        h = x + self.attention(self.attention_norm(x), cos, sin)
        n = self.ffn_norm(h)
        return h + self.w2(F.silu(self.w1(n)) * self.w3(n))

    def init_weights(self, out_std):
        for w in (self.wq, self.wk, self.wv, self.w1):
            nn.init.trunc_normal_(w.weight, mean=0.0, std=0.02)
        for w in (self.wo, self.w2, self.w3):
            nn.init.trunc_normal_(w.weight, mean=0.0, std=out_std)


class Transformer(nn.Module):
    def __init__(self, a):
        super().__init__()
        hidden = ffn_hidden(a.dim, a.multiple_of)
        self.tok_embeddings = nn.Embedding(a.vocab, a.dim)
        self.layers = nn.ModuleList(Block(a.dim, a.heads, a.kv_heads, hidden)
                                    for _ in range(a.layers))
        self.norm = RMSNorm(a.dim)
        self.output = nn.Linear(a.dim, a.vocab, bias=False)
        cos, sin = rope_tables(a.dim // a.heads, a.seq)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        # Residual stream dtype: bf16 under bf16 compute, as titan's residual_dtype().
        self.residual_dtype = torch.bfloat16 if a.dtype == "bfloat16" else torch.float32
        with torch.no_grad():
            nn.init.normal_(self.tok_embeddings.weight, mean=0.0, std=1.0)
            for i, layer in enumerate(self.layers):
                layer.init_weights(0.02 / math.sqrt(2.0 * (i + 1)))  # depth_init
            std = a.dim ** -0.5
            nn.init.trunc_normal_(self.output.weight, mean=0.0, std=std, a=-3 * std, b=3 * std)

    def forward(self, tokens):
        h = self.tok_embeddings(tokens).to(self.residual_dtype)  # (bs, seq, dim)
        for layer in self.layers:
            h = layer(h, self.cos, self.sin)
        return self.output(self.norm(h)).float()  # (bs, seq, vocab)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for name, default in [("dim", 256), ("layers", 6), ("heads", 8), ("kv-heads", 4),
                          ("vocab", 8192), ("seq", 256), ("batch", 8), ("steps", 10),
                          ("warmup", 2), ("threads", 2), ("multiple-of", 256)]:
        p.add_argument("--" + name, type=int, default=default)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--compile", nargs="?", const="step", choices=["step", "model"],
                   help="torch.compile (inductor): the train step (default) or the model only")
    p.add_argument("--profile", action="store_true",
                   help="after the timed steps, as many again under torch.profiler: each op's "
                        "(and inductor kernel's) self CPU ms per step, the largest first (what "
                        "`titan bench --breakdown` prints for titan)")
    return p.parse_args()


def main():
    a = parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = Transformer(a)
    params = list(model.parameters())
    n_params = sum(p.numel() for p in params)
    opt = torch.optim.AdamW(params, lr=8e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1,
                            foreach=True)
    bf16 = a.dtype == "bfloat16"
    net = torch.compile(model) if a.compile == "model" else model

    def forward_loss(inputs, labels):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = net(inputs)  # (bs, seq, vocab), float32
        return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(0, 1))

    def update():
        torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True)
        opt.step()

    if a.compile == "step":
        forward_loss = torch.compile(forward_loss, fullgraph=True)
        update = torch.compile(update)

    def step():
        tokens = torch.randint(a.vocab, (a.batch, a.seq + 1))
        opt.zero_grad(set_to_none=True)
        loss = forward_loss(tokens[:, :-1], tokens[:, 1:])
        loss.backward()
        update()
        return loss.item()

    def compiled_frames():
        if not a.compile:
            return 0
        from torch._dynamo.utils import counters
        return sum(counters["frames"].values()) + sum(counters["recompiles"].values())

    step_times = []  # every step's wall time, the warm-up's too

    def timed_step():
        s0 = time.perf_counter()
        loss = step()
        step_times.append(time.perf_counter() - s0)
        return loss

    t0 = time.perf_counter()
    for _ in range(a.warmup):
        timed_step()
    warmup_s = time.perf_counter() - t0
    frames = compiled_frames()
    losses = []
    t0 = time.perf_counter()
    for _ in range(a.steps):
        losses.append(timed_step())
    dt = time.perf_counter() - t0
    step_s = dt / a.steps
    tps = a.steps * a.batch * a.seq / dt
    if a.profile:
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(a.steps):
                step()
        events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
        total = sum(e.self_cpu_time_total for e in events) / 1e3 / a.steps
        print(f"profile of a step (mean of {a.steps}): {total:.1f} ms of ops' self CPU time, "
              f"{step_s * 1e3:.1f} ms per step without the profiler")
        for e in events[:25]:
            ms = e.self_cpu_time_total / 1e3 / a.steps
            print(f"  {e.key[:60]:60s} {ms:9.2f} ms {100 * ms / total:5.1f}%  x{e.count // a.steps}")
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (1024 * 1024)
    mode = f"compile_{a.compile}" if a.compile else "eager"
    extra = ""
    if a.compile:
        extra = (f" compile_s={max(0.0, warmup_s - a.warmup * step_s):.1f}"
                 f" recompiles={compiled_frames() - frames}")
    print(f"reference mode={mode} dtype={a.dtype} batch={a.batch} seq={a.seq} params={n_params} "
          f"steps={a.steps} tokens_per_s={tps:.1f} peak_rss_gib={rss:.3f} step_s={step_s:.4f} "
          f"warmup_s={warmup_s:.1f} loss={losses[-1]:.4f} threads={torch.get_num_threads()}"
          f" step_times={','.join(f'{t:.4f}' for t in step_times)}"
          f" torch={torch.__version__}{extra}")


if __name__ == "__main__":
    main()
