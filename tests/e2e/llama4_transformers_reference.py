"""Hugging Face transformers as the reference for titan's Llama 4 interop (test_llama4_hf.sh).

The Llama 4 counterpart of gpt_oss_transformers_reference.py: check-logits, same-tensors and
check-greedy as in deepseek_v3_transformers_reference.py, with Llama4ForCausalLM (eager
attention: chunked masks, NoPE layers with temperature tuning, the L2 qk norm). Run with the
project's Python ($TITAN_PYTHON).

Commands (several per process, separated by a lone "+"):

  save-random OUT [--seed N] [--hidden 64] [--layers 4] [--heads 4] [--kv-heads 2]
              [--head-dim 16] [--vocab 300] [--experts 4] [--top-k 1] [--intermediate 64]
              [--intermediate-mlp 128] [--moe-step 2] [--nope-every 4] [--chunk 8]
              [--qk-norm 1] [--floor 4] [--rope-scaling 1] [--conditional DIR]
      A random Llama4TextConfig model saved with save_pretrained: weights redrawn at unit scale
      (norms around 1) so that every tensor moves the logits, chunks and a temperature floor
      shorter than the test sequences. --conditional also saves the same text model inside a
      Llama4ForConditionalGeneration (with a small vision tower) to DIR.
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
from transformers import (  # noqa: E402
    AutoModelForCausalLM, Llama4Config, Llama4ForConditionalGeneration, Llama4TextConfig,
    Llama4VisionConfig)


def save_random(args):
    rope = {"rope_type": "default", "rope_theta": 500000.0}
    if args.rope_scaling:
        rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 16.0,
                "low_freq_factor": 1.0, "high_freq_factor": 1.0,
                "original_max_position_embeddings": 8192}
    no_rope = [int(args.nope_every == 0 or (i + 1) % args.nope_every != 0)
               for i in range(args.layers)]
    config = Llama4TextConfig(
        vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
        intermediate_size_mlp=args.intermediate_mlp, num_hidden_layers=args.layers,
        num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
        head_dim=args.head_dim, num_local_experts=args.experts,
        num_experts_per_tok=args.top_k, interleave_moe_layer_step=args.moe_step,
        no_rope_layers=no_rope, attention_chunk_size=args.chunk,
        use_qk_norm=bool(args.qk_norm), attn_temperature_tuning=args.floor > 0,
        floor_scale=max(args.floor, 1), attn_scale=0.1, max_position_embeddings=256,
        rms_norm_eps=1e-5, rope_parameters=rope, tie_word_embeddings=False)
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
    print(f"{args.out}: random {type(model).__name__} ({args.layers} layers, chunks "
          f"{args.chunk}, NoPE every {args.nope_every}, {args.experts} experts top-{args.top_k})")
    if args.conditional:
        vision = Llama4VisionConfig(
            hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
            vision_output_dim=32, image_size=28, patch_size=14, projector_input_dim=32,
            projector_output_dim=args.hidden, rope_parameters={"rope_type": "default",
                                                               "rope_theta": 10000.0})
        whole = Llama4ForConditionalGeneration(
            Llama4Config(text_config=config.to_dict(), vision_config=vision.to_dict()))
        missing, unexpected = whole.language_model.load_state_dict(model.state_dict(),
                                                                   strict=True)
        assert not missing and not unexpected
        whole.save_pretrained(args.conditional)
        print(f"{args.conditional}: the same text model in {type(whole).__name__}")
    return True


def parser():
    p = ds.BASE_PARSER()
    sub = next(a for a in p._actions if a.dest == "command")
    s = sub.choices["save-random"] = ref.argparse.ArgumentParser(prog="save-random")
    s.add_argument("out")
    for name, default in [("seed", 0), ("hidden", 64), ("layers", 4), ("heads", 4),
                          ("kv-heads", 2), ("head-dim", 16), ("vocab", 300), ("experts", 4),
                          ("top-k", 1), ("intermediate", 64), ("intermediate-mlp", 128),
                          ("moe-step", 2), ("nope-every", 4), ("chunk", 8), ("qk-norm", 1),
                          ("floor", 4), ("rope-scaling", 1)]:
        s.add_argument(f"--{name}", type=int, default=default)
    s.add_argument("--conditional", default="")
    s.set_defaults(run=save_random)
    greedy = ds.parser()
    gsub = next(a for a in greedy._actions if a.dest == "command")
    sub.choices["check-greedy"] = gsub.choices["check-greedy"]
    return p


if __name__ == "__main__":
    ref.load_model = load_model  # check-logits loads through this module's global
    ref.parser = parser
    sys.exit(ref.main(sys.argv[1:]))
