"""Hugging Face transformers as the reference for titan's Llama interop (test_hf_interop.sh).

Run with the project's Python ($TITAN_PYTHON, made by scripts/python_env.sh: torch, transformers,
safetensors, numpy). Nothing here reimplements Llama: folders are written by
LlamaForCausalLM.save_pretrained and read by LlamaForCausalLM.from_pretrained, and logits and
losses are transformers' own forward (eager attention, float32).

Commands (several may run in one process, separated by a lone "+", so that torch and transformers
are imported once; a failing check prints FAIL, the others still run, and the exit status is 1):

  save-random OUT [--seed N] [--hidden 96] [--layers 2] [--heads 6] [--kv-heads N] [--vocab 130]
              [--intermediate 200] [--norm-eps 1e-6] [--max-positions 256] [--rope-theta 1e4]
              [--llama3-rope FACTOR LOW_FREQ HIGH_FREQ ORIGINAL_MAX] [--tied]
              [--dtype float32|bfloat16]
      A random LlamaConfig/LlamaForCausalLM saved with save_pretrained. Weights are redrawn with
      unit-scale values (norm weights around 1) so that every tensor moves the logits.
  check-logits HF_DIR LOGITS.safetensors --ids "1 2 3" [--atol 1e-4]
      transformers' logits of HF_DIR (weights cast to float32) on the ids against tensor "logits"
      (seqlen, vocab) of the file (written by `titan convert logits`).
  check-peft HF_DIR PEFT_DIR LOGITS.safetensors --ids "1 2 3" [--atol 1e-4]
      peft's PeftModel.from_pretrained(HF_DIR's model, any architecture transformers knows,
      PEFT_DIR) logits against titan's (a LoRA
      checkpoint's `titan convert logits`); the adapters must move the base logits.
  same-tensors A B
      Both folders hold the same tensor names, and each has the same dtype, shape and bytes
      (single-file or sharded folders).
  same-config A B
      The LlamaConfig fields that define the model (sizes, norm eps, RoPE parameters after
      transformers' standardization, tied embeddings, dtype) are equal.
  token-file OUT.bin --vocab-size V --tokens N [--seed S]
      One document of N random ids below min(V, 256) in titan's token file format (see
      src/titan/components/data/token_file.h), for `--training.dataset tokens`.
  batch-loss HF_DIR TOKENS.bin --seq-len S --batch-size B --bos ID --eos ID --expect LOSS
             [--rtol 1e-5]
      transformers' mean cross-entropy on titan's first training batch of the token file (the
      stream BOS + document + EOS cut into windows of S + 1 tokens; see data_loader.h) against
      LOSS, the step-1 loss titan logged.
"""
import argparse
import json
import math
import os
import struct
import sys

try:
    import torch
    import torch.nn.functional as F
    from safetensors import safe_open
    from safetensors.torch import load_file
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging as hf_logging
except ImportError as e:
    sys.exit(f"FAIL: {sys.executable} cannot import {e.name}: run the tests with TITAN_PYTHON set "
             "to the project's environment (scripts/python_env.sh)")

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


class CheckFailed(Exception):
    pass


def load_model(hf_dir):
    """The model of hf_dir (LlamaForCausalLM for Llama folders, whatever architecture its config
    names otherwise) in float32; fails if a weight is missing or left over."""
    from transformers import AutoModelForCausalLM
    model, info = AutoModelForCausalLM.from_pretrained(
        hf_dir, dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
    problems = {k: v for k, v in info.items() if v}
    if problems:
        raise CheckFailed(f"{hf_dir}: transformers could not load every weight: {problems}")
    return model.eval()


# ---- commands ------------------------------------------------------------------------------------

def save_random(args):
    rope = {"rope_type": "default", "rope_theta": args.rope_theta}
    if args.llama3_rope:
        factor, low, high, original = args.llama3_rope
        rope.update(rope_type="llama3", factor=factor, low_freq_factor=low,
                    high_freq_factor=high, original_max_position_embeddings=int(original))
    config = LlamaConfig(
        vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
        num_hidden_layers=args.layers, num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads, rms_norm_eps=args.norm_eps,
        max_position_embeddings=args.max_positions, tie_word_embeddings=args.tied,
        rope_parameters=rope)
    torch.manual_seed(args.seed)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for p in model.parameters():  # a tied lm_head is the embedding, listed once
            if p.dim() == 1:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape))
            else:
                p.copy_(torch.randn(p.shape) / math.sqrt(p.shape[1]))
    model.to(DTYPES[args.dtype]).save_pretrained(args.out)
    print(f"{args.out}: random Llama ({args.dtype}, {args.heads} heads, "
          f"{config.num_key_value_heads} kv heads, rope {rope['rope_type']}, tied {args.tied})")
    return True


def check_logits(args):
    ids = [int(t) for t in args.ids.split()]
    with torch.no_grad():
        ref = load_model(args.hf_dir)(torch.tensor([ids])).logits[0]  # (seqlen, vocab)
    ours = load_file(args.logits)["logits"].to(torch.float32)
    if ours.shape != ref.shape:
        print(f"FAIL: {args.hf_dir}: logits shape titan {tuple(ours.shape)}, "
              f"transformers {tuple(ref.shape)}")
        return False
    diff = (ours - ref).abs().max().item()
    ok = diff <= args.atol
    print(f"{'ok' if ok else 'FAIL'}: {args.hf_dir}: logits {tuple(ref.shape)}: "
          f"max |titan - transformers| = {diff:.3e} (tolerance {args.atol:g}, "
          f"max |logit| {ref.abs().max().item():.3f}, "
          f"argmax equal: {torch.equal(ours.argmax(-1), ref.argmax(-1))})")
    return ok


def check_peft(args):
    """peft's PeftModel of a base folder and an adapter folder against titan's logits."""
    from peft import PeftModel
    ids = torch.tensor([[int(t) for t in args.ids.split()]])
    base = load_model(args.hf_dir)
    with torch.no_grad():
        base_logits = base(ids).logits[0]
    model = PeftModel.from_pretrained(base, args.peft_dir).eval()
    adapted = sum(1 for n, _ in model.named_modules() if n.endswith(".lora_A"))
    with torch.no_grad():
        ref = model(ids).logits[0]
    ours = load_file(args.logits)["logits"].to(torch.float32)
    if ours.shape != ref.shape:
        print(f"FAIL: {args.peft_dir}: logits shape titan {tuple(ours.shape)}, "
              f"peft {tuple(ref.shape)}")
        return False
    diff = (ours - ref).abs().max().item()
    moved = (ref - base_logits).abs().max().item()
    ok = diff <= args.atol and moved > 10 * args.atol and adapted > 0
    print(f"{'ok' if ok else 'FAIL'}: {args.peft_dir} on {args.hf_dir}: peft loaded {adapted} "
          f"LoRA layers; logits max |titan - peft| = {diff:.3e} (tolerance {args.atol:g}); the "
          f"adapters move the base logits by up to {moved:.3e}")
    return ok


def folder_tensors(hf_dir):
    """name -> (file, open safetensors handle) over model.safetensors or its shards."""
    index = os.path.join(hf_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    out = {}
    for file in files:
        handle = safe_open(os.path.join(hf_dir, file), framework="pt")
        for name in handle.keys():
            out[name] = handle
    return out


def raw_bytes(t):
    return t.contiguous().view(-1).view(torch.uint8)


def same_tensors(args):
    a, b = folder_tensors(args.a), folder_tensors(args.b)
    if set(a) != set(b):
        print(f"FAIL: tensor names differ: only in {args.a}: {sorted(set(a) - set(b))}; "
              f"only in {args.b}: {sorted(set(b) - set(a))}")
        return False
    bad = []
    for name in sorted(a):
        x, y = a[name].get_tensor(name), b[name].get_tensor(name)
        if x.dtype != y.dtype or x.shape != y.shape or not torch.equal(raw_bytes(x), raw_bytes(y)):
            bad.append(name)
            print(f"differs: {name}: {x.dtype} {tuple(x.shape)} vs {y.dtype} {tuple(y.shape)}")
    print(f"{'ok' if not bad else 'FAIL'}: {args.a} vs {args.b}: "
          f"{len(a) - len(bad)} of {len(a)} tensors identical")
    return not bad


CONFIG_FIELDS = ["vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                 "num_attention_heads", "num_key_value_heads", "head_dim", "hidden_act",
                 "rms_norm_eps", "max_position_embeddings", "rope_parameters",
                 "tie_word_embeddings", "attention_bias", "mlp_bias", "dtype"]


def same_config(args):
    a, b = LlamaConfig.from_pretrained(args.a), LlamaConfig.from_pretrained(args.b)
    bad = [(k, getattr(a, k, None), getattr(b, k, None)) for k in CONFIG_FIELDS
           if getattr(a, k, None) != getattr(b, k, None)]
    for key, x, y in bad:
        print(f"differs: config {key}: {x!r} vs {y!r}")
    print(f"{'ok' if not bad else 'FAIL'}: {args.a} vs {args.b}: config fields "
          f"{'equal' if not bad else 'differ'} (rope {a.rope_parameters}, dtype {a.dtype})")
    return not bad


def token_file(args):
    gen = torch.Generator().manual_seed(args.seed)
    ids = torch.randint(0, min(args.vocab_size, 256), (args.tokens,), generator=gen)
    header = b"TITANTOK" + struct.pack("<IIQQQ", 1, 2, args.vocab_size, args.tokens, 1)
    with open(args.out, "wb") as f:
        f.write(header + ids.numpy().astype("<u2").tobytes() +
                struct.pack("<QQ", 0, args.tokens))
    return True


def read_token_file(path):
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == b"TITANTOK", f"{path}: not a titan token file"
    version, width, _, n_tokens, n_docs = struct.unpack("<IIQQQ", data[8:40])
    assert version == 1 and width == 2 and n_docs == 1, f"{path}: expected one uint16 document"
    return [int(x) for x in struct.unpack(f"<{n_tokens}H", data[40:40 + 2 * n_tokens])]


def batch_loss(args):
    stream = [args.bos] + read_token_file(args.tokens) + [args.eos]
    window = args.seq_len + 1
    assert len(stream) >= args.batch_size * window, "token file too short for one batch"
    windows = torch.tensor(stream[:args.batch_size * window]).view(args.batch_size, window)
    model = load_model(args.hf_dir)
    if windows.max().item() >= model.config.vocab_size:
        raise CheckFailed(f"{args.hf_dir}: token id {windows.max().item()} is outside the "
                          f"vocabulary ({model.config.vocab_size})")
    with torch.no_grad():
        logits = model(windows[:, :-1]).logits  # (batch, seq_len, vocab)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), windows[:, 1:].reshape(-1))
    loss = loss.item()
    diff = abs(loss - args.expect)
    ok = diff <= args.rtol * abs(loss)
    print(f"{'ok' if ok else 'FAIL'}: {args.hf_dir}: first-batch loss: transformers {loss:.7f}, "
          f"titan {args.expect:.7f}, |diff| {diff:.2e} (relative tolerance {args.rtol:g})")
    return ok


def parser():
    p = argparse.ArgumentParser(prog="hf_transformers_reference.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("save-random")
    s.add_argument("out")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--hidden", type=int, default=96)
    s.add_argument("--layers", type=int, default=2)
    s.add_argument("--heads", type=int, default=6)
    s.add_argument("--kv-heads", type=int, default=None, help="default: --heads")
    s.add_argument("--vocab", type=int, default=130)
    s.add_argument("--intermediate", type=int, default=200)
    s.add_argument("--norm-eps", type=float, default=1e-6)
    s.add_argument("--max-positions", type=int, default=256)
    s.add_argument("--rope-theta", type=float, default=10000.0)
    s.add_argument("--llama3-rope", type=float, nargs=4,
                   metavar=("FACTOR", "LOW_FREQ", "HIGH_FREQ", "ORIGINAL_MAX"))
    s.add_argument("--tied", action="store_true")
    s.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    s.set_defaults(run=save_random)
    s = sub.add_parser("check-logits")
    s.add_argument("hf_dir")
    s.add_argument("logits")
    s.add_argument("--ids", required=True)
    s.add_argument("--atol", type=float, default=1e-4)
    s.set_defaults(run=check_logits)
    s = sub.add_parser("check-peft")
    s.add_argument("hf_dir")
    s.add_argument("peft_dir")
    s.add_argument("logits")
    s.add_argument("--ids", required=True)
    s.add_argument("--atol", type=float, default=1e-4)
    s.set_defaults(run=check_peft)
    for name, run in (("same-tensors", same_tensors), ("same-config", same_config)):
        s = sub.add_parser(name)
        s.add_argument("a")
        s.add_argument("b")
        s.set_defaults(run=run)
    s = sub.add_parser("token-file")
    s.add_argument("out")
    s.add_argument("--vocab-size", type=int, required=True)
    s.add_argument("--tokens", type=int, required=True)
    s.add_argument("--seed", type=int, default=0)
    s.set_defaults(run=token_file)
    s = sub.add_parser("batch-loss")
    s.add_argument("hf_dir")
    s.add_argument("tokens")
    s.add_argument("--seq-len", type=int, required=True)
    s.add_argument("--batch-size", type=int, required=True)
    s.add_argument("--bos", type=int, required=True)
    s.add_argument("--eos", type=int, required=True)
    s.add_argument("--expect", type=float, required=True)
    s.add_argument("--rtol", type=float, default=1e-5)
    s.set_defaults(run=batch_loss)
    return p


def main(argv):
    torch.set_num_threads(2)
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    commands, current = [], []
    for arg in argv:
        if arg == "+":
            commands.append(current)
            current = []
        else:
            current.append(arg)
    commands.append(current)
    p = parser()
    ok = True
    for command in [p.parse_args(c) for c in commands]:  # all parsed before any runs
        try:
            ok &= command.run(command)
        except CheckFailed as e:
            print(f"FAIL: {e}")
            ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
