// Image transforms for the image datasets, with the numbers of the Python pipelines they mirror:
// Pillow's resize (TorchTitan's FLUX data calls PIL.Image.resize, bicubic by default) and the
// square crop and [-1, 1] scaling of TorchTitan's FLUX preprocessing (_process_cc12m_image).
//
// Images are (3, height, width) uint8 RGB tensors on the CPU (image.h's decode_image).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <optional>

namespace titan {

// Pillow's Image.resize(size, Resampling.BICUBIC) on an 8-bit RGB image, bit for bit: the cubic
// convolution kernel (a = -0.5) widened by the scale when shrinking (antialiasing), coefficients
// normalized per output pixel and rounded to 22-bit fixed point, a horizontal and a vertical pass
// (in Pillow 13's order: vertical first when the height loses more than twice as many pixels as
// the width), each rounding and clamping to 8 bits.
at::Tensor resize_bicubic(const at::Tensor& rgb, int64_t width, int64_t height);

// TorchTitan's FLUX preprocessing of one image: nullopt when either side is under `size` (the
// image is skipped); otherwise the shorter side resized to `size` (the longer to
// ceil(size / shorter * longer)), a size x size window cut at `offset` along the longer side
// (0 <= offset <= longer' - size; the caller draws it), and the pixels scaled to [-1, 1] as
// float32 (v / 255 * 2 - 1, in that order).
std::optional<at::Tensor> flux_preprocess(const at::Tensor& rgb, int64_t size, int64_t offset);

// The range of offsets flux_preprocess takes for an image of this size: longer' - size + 1 choices
// (0 when the image is too small).
int64_t flux_crop_choices(int64_t width, int64_t height, int64_t size);

}  // namespace titan
