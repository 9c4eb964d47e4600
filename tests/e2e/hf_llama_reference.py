#!/usr/bin/python3
"""An independent reference for Hugging Face Llama folders, in plain PyTorch (no transformers,
no safetensors package): it parses safetensors with json + struct and runs transformers'
LlamaForCausalLM forward as that library defines it (RMSNorm in float32, rotate_half RoPE with
cat(freqs, freqs) tables and llama3 frequency scaling, repeat_kv for grouped-query attention,
causal softmax attention, SiLU-gated MLP, tied or separate lm_head). Used by test_hf_interop.sh.

  hf_llama_reference.py check [--logits HF_DIR OURS.safetensors --ids "1 2 3"] [--atol 1e-4]
                             [--same HF_A HF_B]...
      --logits: reference logits of HF_DIR on the ids, compared with tensor "logits"
      (seqlen, vocab) of OURS; --same: every tensor of the two folders has the same name, dtype,
      shape and bytes. Exit 1 if any check fails. (One process: importing torch takes seconds.)
  hf_llama_reference.py random HF_DIR --seed N
      writes a random LlamaForCausalLM folder (float32; GQA, llama3 rope scaling, odd sizes)
"""
import argparse
import json
import math
import os
import struct
import sys

import torch

DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "F64": torch.float64}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}


def read_safetensors(path):
    """name -> (dtype name, shape, raw bytes), from the file format's definition."""
    with open(path, "rb") as f:
        data = f.read()
    (header_len,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + header_len].decode("utf-8"))
    body = data[8 + header_len :]
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        out[name] = (entry["dtype"], entry["shape"], body[begin:end])
    return out


def raw_tensors(hf_dir):
    index = os.path.join(hf_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            weight_map = json.load(f)["weight_map"]
        out = {}
        for file in sorted(set(weight_map.values())):
            tensors = read_safetensors(os.path.join(hf_dir, file))
            for name, value in tensors.items():
                assert weight_map.get(name) == file, f"{name} in {file} but index says otherwise"
                out[name] = value
        assert set(out) == set(weight_map), "index and shard contents differ"
        return out
    return read_safetensors(os.path.join(hf_dir, "model.safetensors"))


def to_tensor(dtype, shape, raw):
    t = torch.frombuffer(bytearray(raw), dtype=DTYPES[dtype]) if raw else torch.empty(0)
    return t.reshape(shape).to(torch.float32)


def write_safetensors(path, tensors):
    header, offset, blobs = {}, 0, []
    for name, t in tensors.items():
        blob = t.contiguous().numpy().tobytes()
        header[name] = {"dtype": DTYPE_NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(blob)]}
        offset += len(blob)
        blobs.append(blob)
    header["__metadata__"] = {"format": "pt"}
    text = json.dumps(header).encode("utf-8")
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


# ---- transformers' Llama, written out ---------------------------------------------------------

def inv_freq(config, head_dim):
    base = config.get("rope_theta", 10000.0)
    freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    scaling = config.get("rope_scaling")
    if not scaling or scaling.get("rope_type", scaling.get("type")) == "default":
        return freq
    assert scaling.get("rope_type", scaling.get("type")) == "llama3", scaling
    factor = scaling["factor"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_context = scaling["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_context / low, old_context / high
    wavelen = 2 * math.pi / freq
    scaled = torch.where(wavelen > low_wavelen, freq / factor, freq)
    smooth = (old_context / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def rms_norm(x, weight, eps):
    variance = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
    return weight * (x * torch.rsqrt(variance + eps))


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def repeat_kv(x, n_rep):
    heads, seqlen, head_dim = x.shape
    expanded = x[:, None].expand(heads, n_rep, seqlen, head_dim)
    return expanded.reshape(heads * n_rep, seqlen, head_dim)


def llama_logits(hf_dir, ids):
    with open(os.path.join(hf_dir, "config.json")) as f:
        config = json.load(f)
    assert config["model_type"] == "llama" and config.get("hidden_act", "silu") == "silu"
    w = {name: to_tensor(*value) for name, value in raw_tensors(hf_dir).items()}
    n_heads = config["num_attention_heads"]
    n_kv = config.get("num_key_value_heads") or n_heads
    head_dim = config.get("head_dim") or config["hidden_size"] // n_heads
    eps = config.get("rms_norm_eps", 1e-6)
    seqlen = len(ids)

    positions = torch.arange(seqlen, dtype=torch.float32)
    freqs = positions[:, None] * inv_freq(config, head_dim)[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()  # (seqlen, head_dim)
    mask = torch.full((seqlen, seqlen), float("-inf")).triu(1)

    h = w["model.embed_tokens.weight"][torch.tensor(ids)]
    for layer in range(config["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        x = rms_norm(h, w[p + "input_layernorm.weight"], eps)
        q = (x @ w[p + "self_attn.q_proj.weight"].T).view(seqlen, n_heads, head_dim).transpose(0, 1)
        k = (x @ w[p + "self_attn.k_proj.weight"].T).view(seqlen, n_kv, head_dim).transpose(0, 1)
        v = (x @ w[p + "self_attn.v_proj.weight"].T).view(seqlen, n_kv, head_dim).transpose(0, 1)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k, v = repeat_kv(k, n_heads // n_kv), repeat_kv(v, n_heads // n_kv)
        scores = q @ k.transpose(1, 2) / math.sqrt(head_dim) + mask
        attn = torch.softmax(scores, dim=-1, dtype=torch.float32) @ v
        attn = attn.transpose(0, 1).reshape(seqlen, n_heads * head_dim)
        h = h + attn @ w[p + "self_attn.o_proj.weight"].T
        x = rms_norm(h, w[p + "post_attention_layernorm.weight"], eps)
        gate = torch.nn.functional.silu(x @ w[p + "mlp.gate_proj.weight"].T)
        h = h + (gate * (x @ w[p + "mlp.up_proj.weight"].T)) @ w[p + "mlp.down_proj.weight"].T
    h = rms_norm(h, w["model.norm.weight"], eps)
    tied = config.get("tie_word_embeddings")
    head = w["model.embed_tokens.weight"] if tied else w["lm_head.weight"]
    return h @ head.T


# ---- commands ---------------------------------------------------------------------------------

def check_logits(hf_dir, ours_path, ids, atol):
    ref = llama_logits(hf_dir, ids)
    ours = to_tensor(*read_safetensors(ours_path)["logits"])
    if ours.shape != ref.shape:
        print(f"FAIL: shapes differ: ours {tuple(ours.shape)}, reference {tuple(ref.shape)}")
        return False
    diff = (ours - ref).abs().max().item()
    print(f"{hf_dir}: logits {tuple(ref.shape)}: max |ours - reference| = {diff:.3e} "
          f"(max |logit| {ref.abs().max().item():.3f}, tolerance {atol:g}); "
          f"argmax equal: {bool(torch.equal(ours.argmax(-1), ref.argmax(-1)))}")
    return diff <= atol


def check_same_tensors(dir_a, dir_b):
    a, b = raw_tensors(dir_a), raw_tensors(dir_b)
    if set(a) != set(b):
        print(f"FAIL: names differ: only in {dir_a} {sorted(set(a) - set(b))}, "
              f"only in {dir_b} {sorted(set(b) - set(a))}")
        return False
    bad = [name for name in sorted(a) if a[name] != b[name]]
    for name in bad:
        print(f"differs: {name}")
    print(f"{dir_a} vs {dir_b}: {len(a) - len(bad)} of {len(a)} tensors identical")
    return not bad


def cmd_check(args):
    ok = True
    if args.logits:
        ids = [int(t) for t in args.ids.split()]
        ok &= check_logits(args.logits[0], args.logits[1], ids, args.atol)
    for dir_a, dir_b in args.same or []:
        ok &= check_same_tensors(dir_a, dir_b)
    return 0 if ok else 1


def cmd_random(args):
    torch.manual_seed(args.seed)
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 96,
        "intermediate_size": 200, "num_hidden_layers": 2, "num_attention_heads": 6,
        "num_key_value_heads": 2, "vocab_size": 130, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
        "max_position_embeddings": 256, "tie_word_embeddings": False, "hidden_act": "silu",
        "torch_dtype": "float32", "bos_token_id": 1, "eos_token_id": 2,
    }
    d, f, v, hd = 96, 200, 130, 16
    shapes = {"model.embed_tokens.weight": (v, d), "model.norm.weight": (d,),
              "lm_head.weight": (v, d)}
    for layer in range(2):
        p = f"model.layers.{layer}."
        shapes.update({p + "self_attn.q_proj.weight": (6 * hd, d),
                       p + "self_attn.k_proj.weight": (2 * hd, d),
                       p + "self_attn.v_proj.weight": (2 * hd, d),
                       p + "self_attn.o_proj.weight": (d, 6 * hd),
                       p + "mlp.gate_proj.weight": (f, d), p + "mlp.up_proj.weight": (f, d),
                       p + "mlp.down_proj.weight": (d, f), p + "input_layernorm.weight": (d,),
                       p + "post_attention_layernorm.weight": (d,)})
    tensors = {name: torch.randn(shape) * (0.3 if len(shape) == 2 else 1.0)
               for name, shape in shapes.items()}
    os.makedirs(args.hf_dir)
    write_safetensors(os.path.join(args.hf_dir, "model.safetensors"), tensors)
    with open(os.path.join(args.hf_dir, "config.json"), "w") as out:
        json.dump(config, out, indent=2)
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("check")
    p.add_argument("--logits", nargs=2, metavar=("HF_DIR", "OURS"))
    p.add_argument("--ids", default="")
    p.add_argument("--atol", type=float, default=1e-4)
    p.add_argument("--same", nargs=2, action="append", metavar=("HF_A", "HF_B"))
    p = sub.add_parser("random")
    p.add_argument("hf_dir")
    p.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(2)
    return {"check": cmd_check, "random": cmd_random}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
