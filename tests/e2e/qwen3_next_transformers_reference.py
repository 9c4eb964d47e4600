"""Hugging Face transformers as the reference for titan's Qwen3-Next interop
(test_qwen3_next_hf.sh).

check-logits, same-tensors and check-greedy as in deepseek_v3_transformers_reference.py, with
Qwen3NextForCausalLM (its pure-torch linear-attention and convolution paths). Run with the
project's Python ($TITAN_PYTHON).

Commands (several per process, separated by a lone "+"):

  save-random OUT [--seed N] [--hidden 64] [--layers 4] [--heads 4] [--kv-heads 2]
              [--head-dim 32] [--vocab 300] [--experts 8] [--top-k 2] [--moe-intermediate 32]
              [--intermediate 128] [--k-heads 2] [--v-heads 4] [--k-dim 16] [--v-dim 16]
              [--interval 4] [--partial 0.25]
      A random Qwen3NextConfig model (the tiny flavor's sizes by default) saved with
      save_pretrained: weights redrawn at unit scale, norm weights around 0 (zero-centred), decays
      spread (A_log), so that every tensor moves the logits.
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
from transformers import AutoModelForCausalLM, Qwen3NextConfig  # noqa: E402


def save_random(args):
    types = ["full_attention" if (i + 1) % args.interval == 0 else "linear_attention"
             for i in range(args.layers)]
    config = Qwen3NextConfig(
        vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
        num_hidden_layers=args.layers, num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads, head_dim=args.head_dim, rms_norm_eps=1e-6,
        max_position_embeddings=256, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                         "partial_rotary_factor": args.partial},
        linear_conv_kernel_dim=4, linear_key_head_dim=args.k_dim,
        linear_value_head_dim=args.v_dim, linear_num_key_heads=args.k_heads,
        linear_num_value_heads=args.v_heads, decoder_sparse_step=1,
        moe_intermediate_size=args.moe_intermediate,
        shared_expert_intermediate_size=args.moe_intermediate, num_experts_per_tok=args.top_k,
        num_experts=args.experts, norm_topk_prob=True, mlp_only_layers=[], layer_types=types)
    torch.manual_seed(args.seed)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.log(torch.empty(p.shape).uniform_(0.5, 4.0)))
            elif name.endswith("linear_attn.norm.weight") or name.endswith("dt_bias"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape))
            elif p.dim() == 1:  # zero-centred norms: scale 1 + weight
                p.copy_(0.2 * torch.randn(p.shape))
            else:
                p.copy_(torch.randn(p.shape) / math.sqrt(p[0].numel()))
    model.save_pretrained(args.out)
    print(f"{args.out}: random {type(model).__name__} ({args.layers} layers, full attention every "
          f"{args.interval}, {args.experts} experts top-{args.top_k})")
    return True


def parser():
    p = ds.BASE_PARSER()
    sub = next(a for a in p._actions if a.dest == "command")
    s = sub.choices["save-random"] = ref.argparse.ArgumentParser(prog="save-random")
    s.add_argument("out")
    for name, default in [("seed", 0), ("hidden", 64), ("layers", 4), ("heads", 4),
                          ("kv-heads", 2), ("head-dim", 32), ("vocab", 300), ("experts", 8),
                          ("top-k", 2), ("moe-intermediate", 32), ("intermediate", 128),
                          ("k-heads", 2), ("v-heads", 4), ("k-dim", 16), ("v-dim", 16),
                          ("interval", 4)]:
        s.add_argument(f"--{name}", type=int, default=default)
    s.add_argument("--partial", type=float, default=0.25)
    s.set_defaults(run=save_random)
    greedy = ds.parser()
    gsub = next(a for a in greedy._actions if a.dest == "command")
    sub.choices["check-greedy"] = gsub.choices["check-greedy"]
    return p


if __name__ == "__main__":
    ref.load_model = load_model  # check-logits loads through this module's global
    ref.parser = parser
    sys.exit(ref.main(sys.argv[1:]))
