"""transformers' gated delta rule (Qwen3-Next's torch_chunk_gated_delta_rule and
torch_recurrent_gated_delta_rule, the pure-torch paths) on random inputs, for
test_gated_delta_reference.sh: writes the inputs and both functions' outputs and final states to
a safetensors file that titan's GatedDelta.MatchesTransformers unit test reads; and a random
Qwen3NextGatedDeltaNet layer (2 key heads serving 4 value heads, a 4-tap convolution) with its
input and output ("layer.*", "layer_x", "layer_out", its sizes as "layer_sizes"), for
GatedDeltaNet.MatchesTransformers; and a random Qwen3NextAttention (partial RoPE, zero-centred
q/k norms, output gate: "attention.*", "attention_x", "attention_out") for
Qwen3NextParts.AttentionMatchesTransformers.

  gated_delta_reference.py OUT.safetensors [--seed N]
"""
import argparse
import sys

import torch
from safetensors.torch import save_file
from transformers.models.qwen3_next import modeling_qwen3_next as qn


def main(argv):
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    torch.manual_seed(args.seed)
    # 21 positions in chunks of 8 (the last one padded), 2 sequences, 3 heads of 8 keys and 6
    # values; unit keys (the model normalizes them), decays in (0.6, 1], betas in (0, 1).
    bs, length, heads, dk, dv, chunk = 2, 21, 3, 8, 6, 8
    q = torch.randn(bs, length, heads, dk)
    k = torch.nn.functional.normalize(torch.randn(bs, length, heads, dk), dim=-1)
    v = torch.randn(bs, length, heads, dv)
    g = -0.5 * torch.rand(bs, length, heads)
    beta = torch.sigmoid(torch.randn(bs, length, heads))
    state = torch.randn(bs, heads, dk, dv)
    out_c, state_c = qn.torch_chunk_gated_delta_rule(
        q, k, v, g, beta, chunk_size=chunk, initial_state=state, output_final_state=True,
        use_qk_l2norm_in_kernel=False)
    out_r, state_r = qn.torch_recurrent_gated_delta_rule(
        q, k, v, g, beta, initial_state=state, output_final_state=True,
        use_qk_l2norm_in_kernel=False)
    tensors = {"q": q, "k": k, "v": v, "g": g, "beta": beta, "state": state,
               "chunk_size": torch.tensor(chunk, dtype=torch.int64),
               "out_chunk": out_c, "state_chunk": state_c,
               "out_recurrent": out_r, "state_recurrent": state_r}
    # The layer: its pure-torch path (no cache), every weight drawn at unit scale so that each
    # moves the output; chunk 64 over 21 positions (one padded chunk).
    config = qn.Qwen3NextConfig(
        hidden_size=32, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
        linear_value_head_dim=6, linear_conv_kernel_dim=4, rms_norm_eps=1e-6,
        num_hidden_layers=1, layer_types=["linear_attention"])
    layer = qn.Qwen3NextGatedDeltaNet(config, 0).to(torch.float32).eval()
    with torch.no_grad():
        for name, p in layer.named_parameters():
            if name == "A_log":
                p.copy_(torch.log(torch.empty(p.shape).uniform_(0.5, 4.0)))
            elif p.dim() == 1:
                p.copy_(1.0 + 0.3 * torch.randn(p.shape))
            else:
                p.copy_(torch.randn(p.shape) / p[0].numel() ** 0.5)
        x = torch.randn(2, 21, 32)
        out = layer(x)
    for name, p in layer.named_parameters():
        tensors[f"layer.{name}"] = p.detach()
    tensors["layer_x"] = x
    tensors["layer_out"] = out
    tensors["layer_sizes"] = torch.tensor([32, 2, 4, 8, 6, 4], dtype=torch.int64)
    # Qwen3-Next's gated full attention: 4 heads of 8 over 2 kv heads, RoPE on the first half of
    # each head (theta 1e4), zero-centred q/k norms, the sigmoid output gate; causal over 21
    # positions.
    aconfig = qn.Qwen3NextConfig(
        hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
        rms_norm_eps=1e-6, num_hidden_layers=1, layer_types=["full_attention"],
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                         "partial_rotary_factor": 0.5},
        attn_implementation="eager")
    attention = qn.Qwen3NextAttention(aconfig, 0).to(torch.float32).eval()
    rotary = qn.Qwen3NextRotaryEmbedding(aconfig)
    with torch.no_grad():
        for name, p in attention.named_parameters():
            if p.dim() == 1:
                p.copy_(0.3 * torch.randn(p.shape))
            else:
                p.copy_(torch.randn(p.shape) / p.shape[1] ** 0.5)
        ax = torch.randn(2, 21, 32)
        positions = torch.arange(21)[None].expand(2, -1)
        mask = torch.full((21, 21), float("-inf")).triu(1)[None, None].expand(2, 1, 21, 21)
        aout, _ = attention(ax, rotary(ax, positions), mask)
    for name, p in attention.named_parameters():
        tensors[f"attention.{name}"] = p.detach()
    tensors["attention_x"] = ax
    tensors["attention_out"] = aout
    save_file({n: t.contiguous() for n, t in tensors.items()}, args.out)
    print(f"{args.out}: transformers' chunked and recurrent gated delta rule "
          f"(max |chunked - recurrent| {float((out_c - out_r).abs().max()):.3g})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
