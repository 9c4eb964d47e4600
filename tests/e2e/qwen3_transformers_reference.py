"""Hugging Face transformers as the reference for titan's Qwen3 interop (test_qwen3_hf.sh).

The Qwen3 counterpart of hf_transformers_reference.py, whose commands it reuses with
Qwen3ForCausalLM / Qwen3MoeForCausalLM (AutoModelForCausalLM picks the class from config.json's
model_type) in place of LlamaForCausalLM. Run with the project's Python ($TITAN_PYTHON).

Commands (several per process, separated by a lone "+"):

  save-random OUT [--seed N] [--hidden 64] [--layers 2] [--heads 4] [--kv-heads 2]
              [--head-dim 32] [--vocab 300] [--intermediate 128] [--rope-theta 1e6] [--tied]
              [--experts E --top-k K --moe-intermediate H] [--dtype float32|bfloat16]
      A random Qwen3Config (or Qwen3MoeConfig with --experts, norm_topk_prob true) model saved
      with save_pretrained, weights redrawn at unit scale so that every tensor moves the logits.
  check-logits HF_DIR LOGITS.safetensors --ids "1 2 3" [--atol 1e-4]
  same-tensors A B
      As in hf_transformers_reference.py, for any model type transformers knows.
  same-names A B
      Both folders hold the same tensor names with the same shapes (values may differ).
"""
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_transformers_reference as ref  # noqa: E402  (its imports report a missing package)

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, Qwen3Config, Qwen3MoeConfig  # noqa: E402


def load_model(hf_dir):
    """The model of hf_dir in float32; fails if a weight is missing or left over."""
    model, info = AutoModelForCausalLM.from_pretrained(
        hf_dir, dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
    problems = {k: v for k, v in info.items() if v}
    if problems:
        raise ref.CheckFailed(f"{hf_dir}: transformers could not load every weight: {problems}")
    return model.eval()


def save_random(args):
    common = dict(
        vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
        num_hidden_layers=args.layers, num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads, head_dim=args.head_dim, rms_norm_eps=1e-6,
        max_position_embeddings=256, tie_word_embeddings=args.tied,
        rope_parameters={"rope_type": "default", "rope_theta": args.rope_theta})
    if args.experts:
        config = Qwen3MoeConfig(num_experts=args.experts, num_experts_per_tok=args.top_k,
                                moe_intermediate_size=args.moe_intermediate,
                                norm_topk_prob=True, **common)
    else:
        config = Qwen3Config(**common)
    torch.manual_seed(args.seed)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape))
            else:
                p.copy_(torch.randn(p.shape) / math.sqrt(p.shape[-1]))
    model.to(ref.DTYPES[args.dtype]).save_pretrained(args.out)
    print(f"{args.out}: random {type(model).__name__} ({args.dtype}, head_dim {args.head_dim}, "
          f"experts {args.experts}, tied {args.tied})")
    return True


def same_names(args):
    a, b = ref.folder_tensors(args.a), ref.folder_tensors(args.b)
    shapes = [{n: tuple(h.get_slice(n).get_shape()) for n, h in f.items()} for f in (a, b)]
    ok = shapes[0] == shapes[1]
    if not ok:
        print(f"only in {args.a}: {sorted(set(shapes[0].items()) - set(shapes[1].items()))}; "
              f"only in {args.b}: {sorted(set(shapes[1].items()) - set(shapes[0].items()))}")
    print(f"{'ok' if ok else 'FAIL'}: {args.a} vs {args.b}: {len(a)} tensor names and shapes "
          f"{'equal' if ok else 'differ'}")
    return ok


BASE_PARSER = ref.parser


def parser():
    p = BASE_PARSER()
    sub = next(a for a in p._actions if a.dest == "command")
    s = sub.choices["save-random"] = ref.argparse.ArgumentParser(prog="save-random")
    s.add_argument("out")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--hidden", type=int, default=64)
    s.add_argument("--layers", type=int, default=2)
    s.add_argument("--heads", type=int, default=4)
    s.add_argument("--kv-heads", type=int, default=2)
    s.add_argument("--head-dim", type=int, default=32)
    s.add_argument("--vocab", type=int, default=300)
    s.add_argument("--intermediate", type=int, default=128)
    s.add_argument("--rope-theta", type=float, default=1e6)
    s.add_argument("--tied", action="store_true")
    s.add_argument("--experts", type=int, default=0)
    s.add_argument("--top-k", type=int, default=2)
    s.add_argument("--moe-intermediate", type=int, default=64)
    s.add_argument("--dtype", choices=sorted(ref.DTYPES), default="float32")
    s.set_defaults(run=save_random)
    s = sub.choices["same-names"] = ref.argparse.ArgumentParser(prog="same-names")
    s.add_argument("a")
    s.add_argument("b")
    s.set_defaults(run=same_names)
    return p


if __name__ == "__main__":
    ref.load_model = load_model  # check-logits loads through this module's global
    ref.parser = parser
    sys.exit(ref.main(sys.argv[1:]))
