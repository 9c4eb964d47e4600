"""diffusers' FluxTransformer2DModel on tiny random configurations, for test_flux.sh: for each
configuration (with and without the guidance embedding) a folder as save_pretrained writes it
(config.json, diffusion_pytorch_model.safetensors) plus io.safetensors holding the inputs of one
forward (packed latents, T5-like text features, pooled vector, timesteps, guidance, image and
text position ids) and diffusers' output, which titan's FluxDiffusers.MatchesDiffusers unit
test reproduces from the folder alone.

  flux_reference.py OUT_DIR [--seed N]
"""
import argparse
import os

import torch
from diffusers import AutoencoderKL, FluxTransformer2DModel
from safetensors.torch import save_file
from transformers import CLIPTextConfig, CLIPTextModel, T5Config, T5EncoderModel


def image_ids(rows, cols):
    """FLUX.1's latent patch positions: (0, row, column) for each patch, row-major."""
    ids = torch.zeros(rows, cols, 3)
    ids[..., 1] = torch.arange(rows)[:, None]
    ids[..., 2] = torch.arange(cols)[None, :]
    return ids.reshape(rows * cols, 3)


def write(out_dir, guidance, seed):
    torch.manual_seed(seed)
    model = FluxTransformer2DModel(
        patch_size=1,
        in_channels=16,
        num_layers=2,
        num_single_layers=2,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=24,
        pooled_projection_dim=12,
        guidance_embeds=guidance,
        axes_dims_rope=(4, 6, 6),
    ).eval()
    # Random values everywhere (diffusers' init leaves the norms at one and the biases at zero,
    # which would hide a misplaced scale or bias).
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.2)
    model.save_pretrained(out_dir, safe_serialization=True)

    bs, rows, cols, txt_len = 2, 3, 4, 5
    io = {
        "hidden_states": torch.randn(bs, rows * cols, 16),
        "encoder_hidden_states": torch.randn(bs, txt_len, 24),
        "pooled_projections": torch.randn(bs, 12),
        "timestep": torch.tensor([0.25, 0.875]),
        "img_ids": image_ids(rows, cols),
        "txt_ids": torch.zeros(txt_len, 3),
    }
    if guidance:
        io["guidance"] = torch.tensor([3.5, 1.0])
    with torch.no_grad():
        io["sample"] = model(**io, return_dict=False)[0]
    save_file({k: v.contiguous() for k, v in io.items()}, os.path.join(out_dir, "io.safetensors"))


def write_vae(out_dir, seed):
    """A tiny AutoencoderKL of FLUX.1's layout (no quantization convolutions, mid-block
    attention, scaling and shift factors): the encoder's Gaussian moments of an image and the
    decoding of a latent."""
    torch.manual_seed(seed)
    vae = AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * 3,
        up_block_types=("UpDecoderBlock2D",) * 3,
        block_out_channels=(16, 32, 32),
        layers_per_block=1,
        latent_channels=4,
        norm_num_groups=8,
        sample_size=32,
        scaling_factor=0.3611,
        shift_factor=0.1159,
        use_quant_conv=False,
        use_post_quant_conv=False,
    ).eval()
    with torch.no_grad():
        for p in vae.parameters():
            p.normal_(0.0, 0.1)
    vae.save_pretrained(out_dir, safe_serialization=True)
    image = torch.rand(2, 3, 16, 24) * 2 - 1
    latent = torch.randn(2, 4, 4, 6)
    with torch.no_grad():
        moments = vae.encoder(image)
        mean = vae.encode(image).latent_dist.mean
        # What the FLUX pipelines give the transformer, and what they decode.
        io = {
            "image": image,
            "moments": moments,
            "latents": (mean - vae.config.shift_factor) * vae.config.scaling_factor,
            "decode_in": latent,
            "decoded": vae.decode(latent / vae.config.scaling_factor + vae.config.shift_factor).sample,
        }
    save_file({k: v.contiguous() for k, v in io.items()}, os.path.join(out_dir, "io.safetensors"))


def randomize(model, std):
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, std)


def write_t5(out_dir, seed):
    """A tiny T5 v1.1 encoder (gated GELU, relative position buckets reaching past the
    sequence) and its last hidden state for two sequences of 20 tokens."""
    torch.manual_seed(seed)
    config = T5Config(vocab_size=50, d_model=16, d_kv=4, d_ff=24, num_layers=2, num_heads=4,
                      relative_attention_num_buckets=8, relative_attention_max_distance=12,
                      feed_forward_proj="gated-gelu", dropout_rate=0.0)
    model = T5EncoderModel(config).eval()
    randomize(model, 0.3)
    model.save_pretrained(out_dir)
    ids = torch.randint(0, 50, (2, 20))
    with torch.no_grad():
        hidden = model(input_ids=ids).last_hidden_state
    save_file({"ids": ids, "last_hidden_state": hidden}, os.path.join(out_dir, "io.safetensors"))


def write_clip(out_dir, seed, eos_token_id):
    """A tiny CLIPTextModel (quick GELU, causal) and its hidden states and pooled output; with
    eos_token_id 2 (transformers' legacy value) the pooled position is the largest id's,
    otherwise the first end-of-text token's."""
    torch.manual_seed(seed)
    config = CLIPTextConfig(vocab_size=60, hidden_size=16, intermediate_size=32,
                            num_hidden_layers=2, num_attention_heads=2,
                            max_position_embeddings=16, hidden_act="quick_gelu",
                            eos_token_id=eos_token_id)
    model = CLIPTextModel(config).eval()
    randomize(model, 0.3)
    model.save_pretrained(out_dir)
    # Ids below the end-of-text token but for one id above it (59, the vocabulary's last),
    # which the legacy rule's argmax picks and the eos rule passes over.
    ids = torch.randint(3, 40, (2, 10))
    ids[:, 8] = 59
    ids[0, 6] = eos_token_id
    ids[1, 3] = eos_token_id
    with torch.no_grad():
        out = model(input_ids=ids)
    save_file({"ids": ids, "last_hidden_state": out.last_hidden_state,
               "pooled": out.pooler_output}, os.path.join(out_dir, "io.safetensors"))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out_dir")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    for name, guidance in (("schnell", False), ("dev", True)):
        write(os.path.join(args.out_dir, name), guidance, args.seed)
    write_vae(os.path.join(args.out_dir, "vae"), args.seed)
    write_t5(os.path.join(args.out_dir, "t5"), args.seed)
    write_clip(os.path.join(args.out_dir, "clip_legacy"), args.seed, eos_token_id=2)
    write_clip(os.path.join(args.out_dir, "clip"), args.seed, eos_token_id=45)


if __name__ == "__main__":
    main()
