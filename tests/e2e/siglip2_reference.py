"""transformers' Siglip2VisionModel on a tiny random configuration, for test_vlm.sh: the folder as
save_pretrained writes it plus io.safetensors with one forward's inputs (two images of different
patch grids, padded to 16 patch slots) and outputs (the last hidden state and the attention-pooled
output), which titan's Siglip2.MatchesTransformers unit test reproduces from the folder alone.

  siglip2_reference.py OUT_DIR [--seed N]
"""
import argparse
import os

import torch
from safetensors.torch import save_file
from transformers import Siglip2VisionConfig, Siglip2VisionModel


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out_dir")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    config = Siglip2VisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                 num_attention_heads=4, num_channels=3, patch_size=4,
                                 num_patches=16, vision_use_head=True)
    model = Siglip2VisionModel(config).eval()
    # Random values everywhere (the init leaves norms at one and biases at zero).
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.2)
    model.save_pretrained(args.out_dir)

    length = 16
    shapes = torch.tensor([[3, 5], [2, 4]])  # 15 and 8 real patches; the grid is 4 x 4
    pixels = torch.randn(2, length, 3 * 4 * 4)
    mask = torch.zeros(2, length, dtype=torch.long)
    for i, (h, w) in enumerate(shapes.tolist()):
        mask[i, : h * w] = 1
    with torch.no_grad():
        out = model(pixel_values=pixels, pixel_attention_mask=mask, spatial_shapes=shapes)
    save_file({"pixel_values": pixels, "pixel_attention_mask": mask, "spatial_shapes": shapes,
               "last_hidden_state": out.last_hidden_state.contiguous(),
               "pooler_output": out.pooler_output.contiguous()},
              os.path.join(args.out_dir, "io.safetensors"))


if __name__ == "__main__":
    main()
