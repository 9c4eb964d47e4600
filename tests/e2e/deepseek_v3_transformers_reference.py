"""Hugging Face transformers as the reference for titan's DeepSeek-V3 interop
(test_deepseek_v3_hf.sh).

The DeepSeek-V3 counterpart of hf_transformers_reference.py, whose check-logits and same-tensors
commands it reuses with DeepseekV3ForCausalLM (AutoModelForCausalLM picks the class from
config.json's model_type). Run with the project's Python ($TITAN_PYTHON).

Commands (several per process, separated by a lone "+"):

  save-random OUT [--seed N] [--hidden 64] [--layers 3] [--dense 1] [--heads 4] [--q-lora 32]
              [--kv-lora 32] [--nope 16] [--rope 8] [--v 16] [--vocab 300] [--intermediate 128]
              [--experts 8] [--top-k 2] [--moe-intermediate 32] [--shared 1] [--groups 4]
              [--topk-groups 2] [--scale 2.5] [--no-route-norm] [--yarn FACTOR] [--mscale M]
      A random DeepseekV3Config model (--q-lora 0: no q latent; --yarn 0: no rope scaling)
      saved with save_pretrained: weights redrawn at unit scale so that every tensor moves the
      logits, and random non-zero e_score_correction_bias buffers so that the expert biases
      steer the routing.
  check-logits HF_DIR LOGITS.safetensors --ids "1 2 3" [--atol 1e-4]
  same-tensors A B
      As in hf_transformers_reference.py.
  check-mtp HF_DIR LOGITS.safetensors --ids "1 2 3" [--atol 1e-4]
      A folder with multi-token prediction layers (num_nextn_predict_layers D, tensors
      model.layers.{L..L+D-1}): the main model loads with every weight used, transformers'
      MtpModel loads the D layers from the folder (its own weight conversions), and the logits of
      the main model and of each depth k (MtpModel.forward_layer chained from the main model's
      last hidden state over the tokens k ahead) equal titan's "logits" and "mtp_logits_k" where
      titan's are defined (positions before seqlen - k).
  check-greedy HF_DIR --ids "1 2 3" --expect "1 2 3 ..." --new N [--vocab-limit V --eos E]
      transformers' greedy generate (with its cache) from the ids gives the sequence `expect`,
      with ids >= V suppressed and E ending it as `titan generate` does for its tokenizer (the
      byte tokenizer: V 258, EOS 257).
"""
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_transformers_reference as ref  # noqa: E402  (its imports report a missing package)
# AutoModelForCausalLM in float32, failing on a weight missing or left over: any model type.
from qwen3_transformers_reference import load_model  # noqa: E402

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, DeepseekV3Config  # noqa: E402


def save_random(args):
    rope = {"rope_type": "default", "rope_theta": 10000.0}
    if args.yarn > 1:
        rope = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": args.yarn,
                "beta_fast": 32.0, "beta_slow": 1.0, "mscale": args.mscale,
                "mscale_all_dim": args.mscale, "original_max_position_embeddings": 4096}
    config = DeepseekV3Config(
        vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
        moe_intermediate_size=args.moe_intermediate, num_hidden_layers=args.layers,
        num_attention_heads=args.heads, num_key_value_heads=args.heads,
        n_shared_experts=args.shared, n_routed_experts=args.experts,
        routed_scaling_factor=args.scale, kv_lora_rank=args.kv_lora,
        q_lora_rank=args.q_lora or None, qk_rope_head_dim=args.rope, v_head_dim=args.v,
        qk_nope_head_dim=args.nope, n_group=args.groups, topk_group=args.topk_groups,
        num_experts_per_tok=args.top_k, first_k_dense_replace=args.dense,
        norm_topk_prob=not args.no_route_norm, rms_norm_eps=1e-6, max_position_embeddings=256,
        tie_word_embeddings=False, rope_parameters=rope, rope_interleave=True)
    torch.manual_seed(args.seed)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape))
            else:
                p.copy_(torch.randn(p.shape) / math.sqrt(p.shape[-1]))
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.3 * torch.randn(b.shape))
    model.save_pretrained(args.out)
    print(f"{args.out}: random {type(model).__name__} (q_lora {args.q_lora}, yarn {args.yarn}, "
          f"{args.experts} experts in {args.groups} groups, {args.dense} dense layers)")
    return True


def check_greedy(args):
    ids = [int(t) for t in args.ids.split()]
    expect = [int(t) for t in args.expect.split()]
    with torch.no_grad():
        model = load_model(args.hf_dir)
        suppress = list(range(args.vocab_limit, model.config.vocab_size))
        out = model.generate(
            torch.tensor([ids]), max_new_tokens=args.new, do_sample=False, use_cache=True,
            pad_token_id=0, eos_token_id=args.eos, suppress_tokens=suppress or None)[0].tolist()
    ok = out == expect
    print(f"{'ok' if ok else 'FAIL'}: {args.hf_dir}: greedy transformers {out}"
          f"{'' if ok else f', titan {expect}'}")
    return ok


def check_mtp(args):
    import json
    from safetensors.torch import load_file
    from transformers import DeepseekV3ForCausalLM
    from transformers.modeling_layers import MtpModel
    with open(os.path.join(args.hf_dir, "config.json")) as f:
        config = json.load(f)
    layers, depths = config["num_hidden_layers"], config["num_nextn_predict_layers"]
    # transformers finds a checkpoint's MTP layers by the main model's ignored-key patterns
    # (layer 61 for the released model): name this folder's.
    DeepseekV3ForCausalLM._keys_to_ignore_on_load_unexpected = [
        rf"model\.layers\.{layers + j}\..*" for j in range(depths)]
    main, info = DeepseekV3ForCausalLM.from_pretrained(
        args.hf_dir, dtype=torch.float32, output_loading_info=True)
    main.eval()
    missing = list(info.get("missing_keys", []))
    mtp = MtpModel.from_pretrained(main).to(torch.float32).eval()
    # Every MTP weight came from the folder: each depth's eh_proj is the folder's tensor.
    stored = {}
    for name in os.listdir(args.hf_dir):
        if name.endswith(".safetensors"):
            stored.update(load_file(os.path.join(args.hf_dir, name)))
    loaded = all(torch.equal(mtp.layers[j].eh_proj.weight.detach(),
                             stored[f"model.layers.{layers + j}.eh_proj.weight"])
                 for j in range(depths))
    ids = torch.tensor([[int(t) for t in args.ids.split()]])
    n = ids.shape[1]
    ours = load_file(args.logits)
    with torch.no_grad():
        out = main(ids, output_hidden_states=True)
        diffs = [(out.logits[0] - ours["logits"]).abs().max().item()]
        hidden = out.hidden_states[-1]  # normed, as transformers' MTP drafting reads it
        for k in range(1, depths + 1):
            m = n - k
            hidden = mtp.forward_layer(k - 1, hidden[:, :m], torch.arange(m)[None], None,
                                       input_ids=ids[:, k:])
            ref_k = mtp._project_to_logits(hidden)[0]
            diffs.append((ref_k - ours[f"mtp_logits_{k}"][:m]).abs().max().item())
    ok = not missing and loaded and len(diffs) == depths + 1 and max(diffs) <= args.atol
    print(f"{'ok' if ok else 'FAIL'}: {args.hf_dir}: {depths} MTP layers loaded by MtpModel "
          f"({'from the folder' if loaded else 'NOT the folder tensors'}; main missing "
          f"{missing}); max |titan - transformers| main {diffs[0]:.3e}, depths "
          f"{', '.join(f'{d:.3e}' for d in diffs[1:])} (tolerance {args.atol:g})")
    return ok


BASE_PARSER = ref.parser


def parser():
    p = BASE_PARSER()
    sub = next(a for a in p._actions if a.dest == "command")
    s = sub.choices["save-random"] = ref.argparse.ArgumentParser(prog="save-random")
    s.add_argument("out")
    for name, default in [("seed", 0), ("hidden", 64), ("layers", 3), ("dense", 1), ("heads", 4),
                          ("q-lora", 32), ("kv-lora", 32), ("nope", 16), ("rope", 8), ("v", 16),
                          ("vocab", 300), ("intermediate", 128), ("experts", 8), ("top-k", 2),
                          ("moe-intermediate", 32), ("shared", 1), ("groups", 4),
                          ("topk-groups", 2)]:
        s.add_argument(f"--{name}", type=int, default=default)
    s.add_argument("--scale", type=float, default=2.5)
    s.add_argument("--no-route-norm", action="store_true")
    s.add_argument("--yarn", type=float, default=40.0)
    s.add_argument("--mscale", type=float, default=1.0)
    s.set_defaults(run=save_random)
    s = sub.choices["check-greedy"] = ref.argparse.ArgumentParser(prog="check-greedy")
    s.add_argument("hf_dir")
    s.add_argument("--ids", required=True)
    s.add_argument("--expect", required=True)
    s.add_argument("--new", type=int, required=True)
    s.add_argument("--vocab-limit", type=int, default=258)
    s.add_argument("--eos", type=int, default=257)
    s.set_defaults(run=check_greedy)
    s = sub.choices["check-mtp"] = ref.argparse.ArgumentParser(prog="check-mtp")
    s.add_argument("hf_dir")
    s.add_argument("logits")
    s.add_argument("--ids", required=True)
    s.add_argument("--atol", type=float, default=1e-4)
    s.set_defaults(run=check_mtp)
    return p


if __name__ == "__main__":
    ref.load_model = load_model  # check-logits loads through this module's global
    ref.parser = parser
    sys.exit(ref.main(sys.argv[1:]))
