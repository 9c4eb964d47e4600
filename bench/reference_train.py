"""PyTorch-eager reference for `titan bench`: the same Llama 3 block structure, AdamW, clipping
and random-token batches, trained by a plain Python loop. Used only to compare speed on the same
machine and libtorch (Debian's python3-torch); titan.cpp itself has no Python.

    /usr/bin/python3 bench/reference_train.py --dim 256 --layers 6 --heads 8 --kv-heads 4 \
        --vocab 8192 --seq 256 --batch 8 --dtype bfloat16 --steps 10 --threads 2
"""
import argparse
import math
import resource
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def ffn_hidden(dim, multiple_of, mult):
    hidden = int(2 * 4 * dim / 3)
    if mult:
        hidden = int(mult * hidden)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


def rope_tables(head_dim, seq, theta=500000.0):
    freqs = 1.0 / (theta ** (torch.arange(0, head_dim, 2)[: head_dim // 2].float() / head_dim))
    angles = torch.outer(torch.arange(seq).float(), freqs)
    return torch.polar(torch.ones_like(angles), angles)


def apply_rope(x, freqs):
    xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    out = torch.view_as_real(xc * freqs.view(1, x.shape[1], 1, -1)).flatten(3)
    return out.type_as(x)


class Block(nn.Module):
    def __init__(self, dim, heads, kv_heads, hidden):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.wq = nn.Linear(dim, heads * self.head_dim, bias=False)
        self.wk = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(heads * self.head_dim, dim, bias=False)
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)
        self.attention_norm = RMSNorm(dim)
        self.ffn_norm = RMSNorm(dim)

    def attention(self, x, freqs, mask):
        bs, seq, _ = x.shape
        q = self.wq(x).view(bs, seq, self.heads, self.head_dim)
        k = self.wk(x).view(bs, seq, self.kv_heads, self.head_dim)
        v = self.wv(x).view(bs, seq, self.kv_heads, self.head_dim)
        q, k = apply_rope(q, freqs), apply_rope(k, freqs)
        rep = self.heads // self.kv_heads
        k = k.repeat_interleave(rep, dim=2)
        v = v.repeat_interleave(rep, dim=2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_dim) + mask
        probs = F.softmax(scores.float(), dim=-1).type_as(q)
        out = (probs @ v).transpose(1, 2).reshape(bs, seq, -1)
        return self.wo(out)

    def forward(self, x, freqs, mask):
        h = x + self.attention(self.attention_norm(x), freqs, mask)
        n = self.ffn_norm(h)
        return h + self.w2(F.silu(self.w1(n)) * self.w3(n))


class Transformer(nn.Module):
    def __init__(self, a):
        super().__init__()
        hidden = ffn_hidden(a.dim, a.multiple_of, None)
        self.tok_embeddings = nn.Embedding(a.vocab, a.dim)
        self.layers = nn.ModuleList(Block(a.dim, a.heads, a.kv_heads, hidden) for _ in range(a.layers))
        self.norm = RMSNorm(a.dim)
        self.output = nn.Linear(a.dim, a.vocab, bias=False)
        self.register_buffer("freqs", rope_tables(a.dim // a.heads, a.seq), persistent=False)
        mask = torch.full((a.seq, a.seq), float("-inf")).triu(1)
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, tokens):
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h, self.freqs, self.mask)
        return self.output(self.norm(h)).float()


def main():
    p = argparse.ArgumentParser()
    for name, default in [("dim", 256), ("layers", 6), ("heads", 8), ("kv-heads", 4), ("vocab", 8192),
                          ("seq", 256), ("batch", 8), ("steps", 10), ("threads", 2), ("multiple-of", 256)]:
        p.add_argument("--" + name, type=int, default=default)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = Transformer(a)
    opt = torch.optim.AdamW(model.parameters(), lr=8e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1,
                            foreach=True)
    n_params = sum(p.numel() for p in model.parameters())

    def step():
        tokens = torch.randint(a.vocab, (a.batch, a.seq + 1))
        inputs, labels = tokens[:, :-1], tokens[:, 1:]
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.dtype == "bfloat16"):
            logits = model(inputs)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(0, 1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss.item()

    for _ in range(2):
        step()
    t0 = time.time()
    for _ in range(a.steps):
        step()
    dt = time.time() - t0
    tps = a.steps * a.batch * a.seq / dt
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (1024 * 1024)
    print(f"reference dtype={a.dtype} batch={a.batch} seq={a.seq} params={n_params} steps={a.steps} "
          f"tokens_per_s={tps:.1f} peak_rss_gib={rss:.3f} step_s={dt / a.steps:.4f}")


if __name__ == "__main__":
    main()
