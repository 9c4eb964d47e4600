"""TorchTitan's VLM image preprocessing (experiments/vlm/datasets/utils/image.py: resize by patch
count keeping the aspect, Pillow's default resize, CLIP normalization in numpy float64, patches
flattened (row, column, channel)) written out from its description, on random images of awkward
sizes, for test_vlm.sh: OUT_DIR gets N.png, N.f32 (the patches, float32 little-endian) and
index.json ([{"png", "patches", "rows", "columns"}]), which titan's
ImageTextBatches.PreprocessingMatchesTorchTitan unit test reproduces from the PNGs.

  vlm_image_reference.py OUT_DIR
"""
import json
import math
import os
import sys

import numpy as np
from PIL import Image

PATCH = 16
MAX_PATCHES = 64
MEAN = np.array([0.48145466, 0.4578275, 0.40821073])
STD = np.array([0.26862954, 0.26130258, 0.27577711])


def smart_resize(height, width, factor, max_patches):
    if height < factor or width < factor:
        raise ValueError("smaller than a patch")
    h_bar = round(height / factor) * factor  # Python's round: half to even
    w_bar = round(width / factor) * factor
    if (h_bar * w_bar) // (factor * factor) > max_patches:
        beta = math.sqrt((h_bar * w_bar) / (max_patches * factor * factor))
        h_bar = math.floor(height / beta / factor) * factor
        w_bar = math.floor(width / beta / factor) * factor
    return h_bar, w_bar


def resize_by_patch_count(image, max_patches, factor):
    width, height = image.size
    current = (height * width) // (factor * factor)
    if current == 0:
        scale = max(factor / width, factor / height)
        h, w = smart_resize(int(height * scale), int(width * scale), factor, max_patches)
    elif current <= max_patches:
        h, w = smart_resize(height, width, factor, max_patches)
    else:
        scale = math.sqrt(max_patches / current)
        h, w = smart_resize(int(height * scale), int(width * scale), factor, max_patches)
    return image.resize((w, h))  # Pillow's default filter for RGB: bicubic


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(0)
    # Sizes through every branch: within the budget, over it, under one patch, the rounding of
    # x.5 patches (40 and 56 px: 2.5 and 3.5), a wide and a tall image.
    sizes = [(64, 48), (100, 50), (40, 56), (300, 200), (8, 12), (500, 90), (33, 171)]
    index = []
    for i, (w, h) in enumerate(sizes):
        # Smooth random images (a few blobs) so resizing does real work on every pixel.
        base = rng.integers(0, 256, size=(max(h // 8, 2), max(w // 8, 2), 3), dtype=np.uint8)
        image = Image.fromarray(base).resize((w, h), Image.Resampling.BILINEAR)
        noise = rng.integers(-20, 21, size=(h, w, 3))
        image = Image.fromarray(np.clip(np.asarray(image, dtype=np.int64) + noise, 0, 255)
                                .astype(np.uint8))
        png = f"{i}.png"
        image.save(os.path.join(out, png))
        resized = resize_by_patch_count(image, MAX_PATCHES, PATCH)
        pixels = ((np.asarray(resized) / 255.0 - MEAN) / STD).astype(np.float32)  # (H, W, 3)
        rows, columns = pixels.shape[0] // PATCH, pixels.shape[1] // PATCH
        patches = (pixels.reshape(rows, PATCH, columns, PATCH, 3)
                   .transpose(0, 2, 1, 3, 4)
                   .reshape(rows * columns, PATCH * PATCH * 3))
        patches.astype("<f4").tofile(os.path.join(out, f"{i}.f32"))
        index.append({"png": png, "patches": f"{i}.f32", "rows": rows, "columns": columns,
                      "size": [w, h]})
    with open(os.path.join(out, "index.json"), "w") as f:
        json.dump({"patch": PATCH, "max_patches": MAX_PATCHES, "images": index}, f)
    print(f"wrote {len(index)} images and their patches to {out}")


if __name__ == "__main__":
    main()
