"""FLUX.1 with pretrained encoders, against transformers and diffusers (run by
tests/e2e/test_flux.sh with the project's Python).

  flux_pretrained_reference.py write CORPUS_DIR OUT_DIR
      the files a pretrained FLUX run reads, tiny and random, sized for the debugmodel flavor:
        OUT_DIR/FLUX/text_encoder_2   a whole T5 (T5ForConditionalGeneration: the decoder must
                                      be left out), d_model 64, as diffusers' FLUX folders hold it
        OUT_DIR/FLUX/tokenizer_2      its tokenizer: SentencePiece unigram trained on the corpus
                                      (spiece.model + tokenizer_config.json), the sibling layout
        OUT_DIR/FLUX/vae              an AutoencoderKL of FLUX.1's layout, 4 levels, 16 latents
        OUT_DIR/clip                  a whole CLIPModel (the vision tower must be left out),
                                      hidden 64, with CLIP's vocab.json + merges.txt beside it
        OUT_DIR/images                6 PNGs with captions.jsonl (capitals, accents, long ones)
  flux_pretrained_reference.py pipeline OUT_DIR PIPE_DIR PROMPT SEED STEPS
      diffusers FluxPipeline folders made of those encoders, tokenizers and autoencoder with a
      tiny random transformer: PIPE_DIR/dev (guidance embedding, dynamically shifted schedule,
      T5 length 512) and PIPE_DIR/schnell (neither, T5 length 256); and what FluxPipeline draws
      for PROMPT at 64x64 in STEPS steps from the noise torch.randn((1, 16, 8, 8)) of a CPU
      generator seeded with SEED: PIPE_DIR/dev.png (guidance 3.5, true_cfg_scale 2 against the
      empty prompt) and PIPE_DIR/schnell.png (no guidance).
  flux_pretrained_reference.py check OUT_DIR ENCODED_DIR T5_LEN
      `titan flux encode`'s first shard against the references: T5 features of
      T5Tokenizer(caption, max_length=T5_LEN, padding="max_length", truncation=True) through
      T5EncoderModel, CLIP's pooled vector of CLIPTokenizer(..., 77) through CLIPTextModel, the
      empty caption's both, and the autoencoder's moments of each image (AutoencoderKL's
      encoder); exit 1 on a difference above 1e-4 (relative to the largest value).
"""
import json
import os
import shutil
import sys
import types

import numpy as np
import torch
from PIL import Image
from safetensors.torch import load_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tokenizer_reference  # noqa: E402

CAPTIONS = [
    "a red square on a blue background",
    "A GREEN Circle, at the TOP left",
    "naïve café: two ﬁsh & three birds!!",
    "   spaces   and\ttabs\nand lines   ",
    "",
    " ".join(["a very long caption that the tokenizers have to cut"] * 12),
]


def randomize(model, std, seed):
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, std)


def write(corpus, out):
    from diffusers import AutoencoderKL
    from transformers import CLIPConfig, CLIPModel, T5Config, T5ForConditionalGeneration
    tokenizer_reference.prepare_t5_clip(types.SimpleNamespace(corpus=corpus, out_dir=out + "/tok"))
    flux = os.path.join(out, "FLUX")
    os.makedirs(os.path.join(flux, "tokenizer_2"))
    for f in ("spiece.model", "tokenizer_config.json"):
        shutil.copy(os.path.join(out, "tok", "t5_spm", f), os.path.join(flux, "tokenizer_2", f))
    t5 = T5ForConditionalGeneration(T5Config(
        vocab_size=1005, d_model=64, d_kv=16, d_ff=96, num_layers=2, num_decoder_layers=1,
        num_heads=4, feed_forward_proj="gated-gelu", dropout_rate=0.0,
        tie_word_embeddings=False)).eval()
    randomize(t5, 0.2, 1)
    t5.save_pretrained(os.path.join(flux, "text_encoder_2"))

    clip = CLIPModel(CLIPConfig(
        text_config=dict(vocab_size=1711, hidden_size=64, intermediate_size=96,
                         num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=77,
                         bos_token_id=1709, eos_token_id=1710, pad_token_id=1710),
        vision_config=dict(hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                           num_attention_heads=2, image_size=32, patch_size=16),
        projection_dim=16)).eval()
    randomize(clip, 0.2, 2)
    clip.save_pretrained(os.path.join(out, "clip"))
    for f in ("vocab.json", "merges.txt"):
        shutil.copy(os.path.join(out, "tok", "clip_files", f), os.path.join(out, "clip", f))

    vae = AutoencoderKL(
        in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 4,
        up_block_types=("UpDecoderBlock2D",) * 4, block_out_channels=(32, 32, 64, 64),
        layers_per_block=1, latent_channels=16, norm_num_groups=32, sample_size=64,
        scaling_factor=0.3611, shift_factor=0.1159, use_quant_conv=False,
        use_post_quant_conv=False).eval()
    randomize(vae, 0.05, 3)
    vae.save_pretrained(os.path.join(flux, "vae"), safe_serialization=True)

    images = os.path.join(out, "images")
    os.makedirs(images)
    rng = np.random.default_rng(4)
    with open(os.path.join(images, "captions.jsonl"), "w", encoding="utf-8") as f:
        for i, caption in enumerate(CAPTIONS):
            pixels = rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(os.path.join(images, f"{i}.png"))
            f.write(json.dumps({"image": f"{i}.png", "caption": caption}) + "\n")
    return 0


# Sized so that the prompt, classifier-free guidance and the guidance embedding each move most
# pixels (test_flux.sh checks that a changed prompt does).
VAE_GAIN = 12.0
TRANSFORMER_STD = 0.25


def pipeline(out, pipe_dir, prompt, seed, steps):
    from diffusers import (AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxPipeline,
                           FluxTransformer2DModel)
    from transformers import CLIPTextModel, CLIPTokenizer, T5EncoderModel, T5Tokenizer
    clip_dir = os.path.join(out, "clip")
    vae = AutoencoderKL.from_pretrained(os.path.join(out, "FLUX", "vae")).eval()
    # The random decoder's output barely varies; widened, the pixels show what the transformer
    # did (a small change of its prediction moves many of them).
    with torch.no_grad():
        vae.decoder.conv_out.weight.mul_(VAE_GAIN)
        vae.decoder.conv_out.bias.zero_()
    parts = dict(
        vae=vae,
        text_encoder=CLIPTextModel.from_pretrained(clip_dir).eval(),
        tokenizer=CLIPTokenizer(os.path.join(clip_dir, "vocab.json"),
                                os.path.join(clip_dir, "merges.txt"), model_max_length=77),
        text_encoder_2=T5EncoderModel.from_pretrained(
            os.path.join(out, "FLUX", "text_encoder_2")).eval(),
        tokenizer_2=T5Tokenizer.from_pretrained(os.path.join(out, "FLUX", "tokenizer_2")),
    )
    noise = torch.randn((1, 16, 8, 8), generator=torch.Generator().manual_seed(seed))
    # diffusers' packing: 2 x 2 patches of the latent channels, row-major.
    latents = noise.view(1, 16, 4, 2, 4, 2).permute(0, 2, 4, 1, 3, 5).reshape(1, 16, 64)
    for name, guidance in (("dev", True), ("schnell", False)):
        torch.manual_seed(10 + guidance)
        transformer = FluxTransformer2DModel(
            patch_size=1, in_channels=64, num_layers=1, num_single_layers=1,
            attention_head_dim=16, num_attention_heads=2, joint_attention_dim=64,
            pooled_projection_dim=64, guidance_embeds=guidance, axes_dims_rope=(4, 6, 6)).eval()
        with torch.no_grad():
            for p in transformer.parameters():
                p.normal_(0.0, TRANSFORMER_STD)
        scheduler = FlowMatchEulerDiscreteScheduler(
            shift=3.0 if guidance else 1.0, use_dynamic_shifting=guidance, base_shift=0.5,
            max_shift=1.15, base_image_seq_len=256, max_image_seq_len=4096)
        pipe = FluxPipeline(scheduler=scheduler, transformer=transformer, **parts)
        pipe.save_pretrained(os.path.join(pipe_dir, name))
        extra = dict(guidance_scale=3.5, true_cfg_scale=2.0, negative_prompt="") if guidance \
            else dict(guidance_scale=0.0)
        with torch.no_grad():
            image = pipe(prompt, height=64, width=64, num_inference_steps=steps,
                         latents=latents.clone(), max_sequence_length=512 if guidance else 256,
                         output_type="np", **extra).images[0]
        pixels = (image * 255).round().astype(np.uint8)
        Image.fromarray(pixels).save(os.path.join(pipe_dir, name + ".png"))
        inside = float(((pixels > 0) & (pixels < 255)).mean())
        print(f"FluxPipeline {name}: 64x64, {steps} steps, {inside:.0%} of the values unclipped, "
              f"std {pixels.std():.1f}")
    return 0


def check(out, encoded, t5_len):
    from diffusers import AutoencoderKL
    from transformers import CLIPTextModel, CLIPTokenizer, T5EncoderModel, T5Tokenizer
    flux = os.path.join(out, "FLUX")
    t5_tok = T5Tokenizer.from_pretrained(os.path.join(flux, "tokenizer_2"))
    t5 = T5EncoderModel.from_pretrained(os.path.join(flux, "text_encoder_2")).eval()
    clip_tok = CLIPTokenizer.from_pretrained(os.path.join(out, "clip"))
    clip = CLIPTextModel.from_pretrained(os.path.join(out, "clip")).eval()
    vae = AutoencoderKL.from_pretrained(os.path.join(flux, "vae")).eval()
    got = load_file(os.path.join(encoded, "latents-00000.safetensors"))
    rows = got["t5"].shape[0]
    texts = CAPTIONS[:rows]
    with torch.no_grad():
        t5_ids = t5_tok(texts + [""], max_length=t5_len, padding="max_length", truncation=True,
                        return_tensors="pt").input_ids
        clip_ids = clip_tok(texts + [""], max_length=77, padding="max_length", truncation=True,
                            return_tensors="pt").input_ids
        want_t5 = t5(input_ids=t5_ids).last_hidden_state
        want_clip = clip(input_ids=clip_ids).pooler_output
        pixels = [np.asarray(Image.open(os.path.join(out, "images", f"{i}.png")).convert("RGB"))
                  for i in range(rows)]
        x = torch.tensor(np.stack(pixels)).permute(0, 3, 1, 2).float() / 255.0 * 2.0 - 1.0
        want_moments = vae.encoder(x)
    ok = True
    for name, ours, want in (("T5 features", got["t5"], want_t5[:rows]),
                             ("CLIP pooled", got["clip"], want_clip[:rows]),
                             ("empty caption's T5", got["empty_t5"], want_t5[rows:]),
                             ("empty caption's CLIP", got["empty_clip"], want_clip[rows:]),
                             ("autoencoder moments", got["moments"], want_moments)):
        ours = ours.float()
        err = (ours - want).abs().max().item() if ours.shape == want.shape else float("inf")
        scale = max(1.0, want.abs().max().item())
        print(f"{name}: {tuple(ours.shape)}, max abs diff {err:.2e} (largest {scale:.2f})")
        if err > 1e-4 * scale:
            print(f"FAIL: {name} differ from the reference", file=sys.stderr)
            ok = False
    print(f"{rows} captions (T5 {t5_len} ids, CLIP 77) and images: titan == transformers / "
          f"diffusers" if ok else "")
    return 0 if ok else 1


if __name__ == "__main__":
    if sys.argv[1] == "write":
        sys.exit(write(sys.argv[2], sys.argv[3]))
    if sys.argv[1] == "pipeline":
        sys.exit(pipeline(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]),
                          int(sys.argv[6])))
    sys.exit(check(sys.argv[2], sys.argv[3], int(sys.argv[4])))
