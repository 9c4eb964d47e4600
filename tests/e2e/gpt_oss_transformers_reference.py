"""Hugging Face transformers as the reference for titan's gpt-oss interop (test_gpt_oss_hf.sh).

The gpt-oss counterpart of deepseek_v3_transformers_reference.py, whose check-logits,
same-tensors and check-greedy commands it reuses with GptOssForCausalLM (its eager attention,
the one with sinks). Run with the project's Python ($TITAN_PYTHON).

Commands (several per process, separated by a lone "+"):

  save-random OUT [--seed N] [--hidden 64] [--layers 2] [--heads 4] [--kv-heads 2]
              [--head-dim 16] [--vocab 300] [--experts 4] [--top-k 2] [--intermediate 64]
              [--window 8] [--yarn 32]
      A random GptOssConfig model (--yarn 0: plain RoPE) saved with save_pretrained: weights
      redrawn at unit scale (biases, sinks and norms around 1) so that every tensor moves the
      logits, and sliding windows shorter than the test sequences.
  check-logits, same-tensors, check-greedy
      As in deepseek_v3_transformers_reference.py.
"""
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import deepseek_v3_transformers_reference as ds  # noqa: E402
import hf_transformers_reference as ref  # noqa: E402  (its imports report a missing package)
from qwen3_transformers_reference import load_model  # noqa: E402

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, GptOssConfig  # noqa: E402


def save_random(args):
    rope = {"rope_type": "default", "rope_theta": 150000.0}
    if args.yarn > 1:
        rope = {"rope_type": "yarn", "rope_theta": 150000.0, "factor": args.yarn,
                "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                "original_max_position_embeddings": 4096}
    config = GptOssConfig(
        vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
        num_hidden_layers=args.layers, num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads, head_dim=args.head_dim,
        num_local_experts=args.experts, num_experts_per_tok=args.top_k,
        sliding_window=args.window, max_position_embeddings=256, rms_norm_eps=1e-5,
        rope_parameters=rope, tie_word_embeddings=False)
    torch.manual_seed(args.seed)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape))
            elif p.dim() == 3:  # experts (E, in, out): scaled by their input size
                p.copy_(torch.randn(p.shape) / math.sqrt(p.shape[1]))
            else:
                p.copy_(torch.randn(p.shape) / math.sqrt(p.shape[-1]))
    model.save_pretrained(args.out)
    print(f"{args.out}: random {type(model).__name__} ({args.layers} layers, window "
          f"{args.window}, yarn {args.yarn}, {args.experts} experts top-{args.top_k})")
    return True


def parser():
    p = ds.BASE_PARSER()
    sub = next(a for a in p._actions if a.dest == "command")
    s = sub.choices["save-random"] = ref.argparse.ArgumentParser(prog="save-random")
    s.add_argument("out")
    for name, default in [("seed", 0), ("hidden", 64), ("layers", 2), ("heads", 4),
                          ("kv-heads", 2), ("head-dim", 16), ("vocab", 300), ("experts", 4),
                          ("top-k", 2), ("intermediate", 64), ("window", 8)]:
        s.add_argument(f"--{name}", type=int, default=default)
    s.add_argument("--yarn", type=float, default=32.0)
    s.set_defaults(run=save_random)
    greedy = ds.parser()
    gsub = next(a for a in greedy._actions if a.dest == "command")
    sub.choices["check-greedy"] = gsub.choices["check-greedy"]
    return p


if __name__ == "__main__":
    ref.load_model = load_model  # check-logits loads through this module's global
    ref.parser = parser
    sys.exit(ref.main(sys.argv[1:]))
