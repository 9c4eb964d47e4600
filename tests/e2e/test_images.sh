#!/usr/bin/env bash
# Image decoding (components/data/image.h) against the pinned Pillow: tests/e2e/image_reference.py
# writes PNG files (RGB, RGBA, grayscale with and without alpha, bilevel, a palette with
# transparency) and JPEG files (4:2:0, 4:4:4, 4:2:2 at an odd size, grayscale, progressive) with
# the RGB bytes Pillow decodes from each; the unit test Image.MatchesPillow (in test_data beside
# the titan binary) decodes them to the same bytes, and Image.CorruptFilesNameTheFileAndOffset
# checks the refusals (truncated PNG and JPEG, a bad CRC, a file of neither format, a CMYK JPEG);
# image_transforms.h's bicubic resize equals Pillow's (11 sizes, both pass orders) and its FLUX preprocessing
# TorchTitan's _process_cc12m_image (4 crops), bit for bit; image-caption datasets (a folder with
# a captions sidecar, parquet with Hugging Face's Image feature or a binary column) read them, and
# refuse or (when allowed) skip rows whose image is missing or corrupt.
# The build must have the codecs (scripts/setup.sh installs libpng-dev and libjpeg62-turbo-dev).
source "$(dirname "$0")/lib.sh"
python_and_tests test_data
expect_exit 0 "$PY" "$(dirname "$0")/image_reference.py" "$WORK/images"
TITAN_IMAGE_FIXTURE="$WORK/images" expect_exit 0 "$TESTS" \
  --gtest_filter='Image.MatchesPillow:Image.CorruptFilesNameTheFileAndOffset:ImageTransforms.*:ImageDataset.*'
! grep -q "SKIPPED" "$WORK/out" || fail "the image tests were skipped (a build without libpng / libjpeg-turbo?)"
expect_output "images vs Pillow: 11 PNG and JPEG files, [0-9]+ pixels, every byte equal"
expect_output "bicubic resize vs Pillow: 11 sizes, every byte equal"
expect_output "FLUX preprocessing vs TorchTitan's: 4 crops, every value equal"
grep "vs Pillow\|vs TorchTitan\|refused:" "$WORK/out"
echo "PASS test_images"
