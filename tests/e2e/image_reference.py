"""PNG and JPEG files written by the pinned Pillow, with the RGB pixels Pillow decodes from each
(Image.open(f).convert("RGB")), for test_images.sh: titan's decoder (components/data/image.h,
unit test Image.MatchesPillow) must give the same bytes. Also corrupt files (truncated, garbage)
and a CMYK JPEG, which titan refuses; Pillow's bicubic resizes (resize.txt) and TorchTitan's FLUX
preprocessing (flux.txt) of PNG sources, for image_transforms.h.

  image_reference.py OUT_DIR       writes OUT_DIR/<case>.<png|jpg>, OUT_DIR/<case>.rgb (Pillow's
                                   pixels, height x width x 3 bytes) and OUT_DIR/manifest.txt
                                   (a line per case: file, width, height)
"""
import json
import math
import os
import sys

import numpy as np
import torch
from PIL import Image


def picture(width, height, seed):
    """Smooth gradients with edges and noise: the kinds of content JPEG's stages treat apart."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    r = 127 + 120 * np.sin(x / 7.0 + seed)
    g = 127 + 120 * np.cos(y / 5.0 - seed)
    b = np.where((x // 8 + y // 8) % 2 == 0, 230.0, 25.0)
    rgb = np.stack([r, g, b], -1) + rng.normal(0, 12, (height, width, 3))
    return Image.fromarray(np.clip(rgb, 0, 255).astype(np.uint8), "RGB")


def resizes(out):
    """Pillow's bicubic resize (Image.resize's default) of PNG sources, shrinking, enlarging and
    one axis at a time: resize.txt lines "source width height pixels-file"."""
    lines = []
    sources = {"landscape.png": picture(61, 37, 4), "portrait.png": picture(29, 53, 5)}
    for name, image in sources.items():
        image.save(os.path.join(out, name))
    for name, (w, h) in [("landscape.png", (16, 16)), ("landscape.png", (100, 70)),
                         ("landscape.png", (61, 12)), ("landscape.png", (20, 37)),
                         ("landscape.png", (7, 3)), ("portrait.png", (29, 200)),
                         ("portrait.png", (30, 31)), ("portrait.png", (1, 1)),
                         # Pillow's pass order: vertical first when the height loses more than
                         # twice as many pixels as the width (60 x 36: not; 62 x 36, 60 x 10: so).
                         ("landscape.png", (60, 36)), ("landscape.png", (62, 36)),
                         ("landscape.png", (60, 10))]:
        with Image.open(os.path.join(out, name)) as src:
            rgb = np.ascontiguousarray(np.asarray(src.convert("RGB").resize((w, h))))
        target = f"resize_{name[:-4]}_{w}x{h}.rgb"
        open(os.path.join(out, target), "wb").write(rgb.tobytes())
        lines.append(f"{name} {w} {h} {target}\n")
    open(os.path.join(out, "resize.txt"), "w").write("".join(lines))


def flux_reference(image, output_size, offset):
    """TorchTitan's FLUX preprocessing (_process_cc12m_image) with the crop offset given."""
    width, height = image.size
    if width < output_size or height < output_size:
        return None
    if width >= height:
        new_width, new_height = math.ceil(output_size / height * width), output_size
        image = image.resize((new_width, new_height))
        image = image.crop((offset, 0, offset + output_size, output_size))
    else:
        new_width, new_height = output_size, math.ceil(output_size / width * height)
        image = image.resize((new_width, new_height))
        image = image.crop((0, offset, output_size, offset + output_size))
    if image.mode != "RGB":
        image = image.convert("RGB")
    np_img = np.array(image).transpose((2, 0, 1))
    return (torch.tensor(np_img).float() / 255.0 * 2.0 - 1.0).numpy()


def flux(out):
    """flux.txt lines "source size offset values-file" (float32 (3, size, size))."""
    lines = []
    sources = {"flux_wide.png": picture(300, 200, 6), "flux_tall.png": picture(150, 261, 7)}
    for name, image in sources.items():
        image.save(os.path.join(out, name))
    for name, size, offset in [("flux_wide.png", 128, 0), ("flux_wide.png", 128, 64),
                               ("flux_tall.png", 96, 71), ("flux_tall.png", 150, 0)]:
        with Image.open(os.path.join(out, name)) as src:
            values = flux_reference(src.convert("RGB"), size, offset)
        target = f"flux_{name[5:-4]}_{size}_{offset}.f32"
        open(os.path.join(out, target), "wb").write(np.ascontiguousarray(values).tobytes())
        lines.append(f"{name} {size} {offset} {target}\n")
    open(os.path.join(out, "flux.txt"), "w").write("".join(lines))


def datasets(out):
    """Image-caption datasets: dataset/captions.jsonl (paths into the folder; row 3's file is
    missing, row 4's truncated), hf.parquet (Hugging Face's Image feature: a struct of bytes and
    path) and raw.parquet (a binary column), each row's image one of the PNG or JPEG files above."""
    import shutil

    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = os.path.join(out, "dataset")
    os.makedirs(os.path.join(folder, "sub"), exist_ok=True)
    shutil.copy(os.path.join(out, "png_rgb.png"), os.path.join(folder, "a.png"))
    shutil.copy(os.path.join(out, "jpeg_420.jpg"), os.path.join(folder, "sub", "b.jpg"))
    shutil.copy(os.path.join(out, "truncated_png_rgb.png"), os.path.join(folder, "bad.png"))
    rows = [{"image": "a.png", "caption": "first"}, {"image": "sub/b.jpg", "caption": "second"},
            {"image": "missing.png", "caption": "third"}, {"image": "bad.png", "caption": "fourth"},
            {"image": "a.png", "caption": "fifth"}]
    with open(os.path.join(folder, "captions.jsonl"), "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    images = [open(os.path.join(out, name), "rb").read() for name in ("jpeg_444.jpg", "png_palette.png")]
    captions = ["a jpeg", "a palette png"]
    image_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    hf = pa.table({"image": pa.array([{"bytes": b, "path": None} for b in images], image_type),
                   "caption": captions})
    pq.write_table(hf, os.path.join(out, "hf.parquet"))
    raw = pa.table({"image": pa.array(images, pa.binary()), "caption": captions})
    pq.write_table(raw, os.path.join(out, "raw.parquet"))


def main(out):
    os.makedirs(out, exist_ok=True)
    base = picture(37, 23, 1)
    cases = {}
    cases["png_rgb.png"] = (base, {})
    rgba = base.copy()
    rgba.putalpha(Image.linear_gradient("L").resize(base.size))
    cases["png_rgba.png"] = (rgba, {})
    cases["png_gray.png"] = (base.convert("L"), {})
    cases["png_gray_alpha.png"] = (rgba.convert("LA"), {})
    cases["png_bilevel.png"] = (base.convert("1"), {})
    palette = base.convert("P", palette=Image.Palette.ADAPTIVE, colors=16)
    cases["png_palette.png"] = (palette, {"transparency": 3})
    big = picture(64, 48, 2)
    cases["jpeg_420.jpg"] = (big, {"quality": 90})
    cases["jpeg_444.jpg"] = (big, {"quality": 95, "subsampling": 0})
    cases["jpeg_422_odd.jpg"] = (picture(33, 21, 3), {"quality": 75, "subsampling": 1})
    cases["jpeg_gray.jpg"] = (big.convert("L"), {"quality": 85})
    cases["jpeg_progressive.jpg"] = (big, {"quality": 80, "progressive": True})
    manifest = []
    for name, (image, options) in cases.items():
        path = os.path.join(out, name)
        image.save(path, **options)
        with Image.open(path) as back:
            rgb = np.ascontiguousarray(np.asarray(back.convert("RGB")))
        open(path + ".rgb", "wb").write(rgb.tobytes())
        manifest.append(f"{name} {rgb.shape[1]} {rgb.shape[0]}\n")
    big.convert("CMYK").save(os.path.join(out, "cmyk.jpg"), quality=90)
    # Corrupt files: the first half of a PNG and of a JPEG, and bytes that are neither.
    for name in ("png_rgb.png", "jpeg_420.jpg"):
        data = open(os.path.join(out, name), "rb").read()
        open(os.path.join(out, "truncated_" + name), "wb").write(data[: len(data) // 2])
    png = bytearray(open(os.path.join(out, "png_rgb.png"), "rb").read())
    png[60] ^= 0xFF  # inside the image data: its CRC no longer matches
    open(os.path.join(out, "crc_png_rgb.png"), "wb").write(bytes(png))
    open(os.path.join(out, "garbage.png"), "wb").write(b"GIF89a not an image we read")
    open(os.path.join(out, "manifest.txt"), "w").write("".join(manifest))
    resizes(out)
    flux(out)
    datasets(out)
    import PIL
    print(f"Pillow {PIL.__version__}: {len(cases)} images written to {out}")


if __name__ == "__main__":
    main(sys.argv[1])
