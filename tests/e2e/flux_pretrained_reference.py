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
    sys.exit(check(sys.argv[2], sys.argv[3], int(sys.argv[4])))
