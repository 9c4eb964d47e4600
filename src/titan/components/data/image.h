// Decoding images for the image datasets: PNG (libpng) and JPEG (libjpeg-turbo) bytes to 8-bit
// RGB, the pixels Pillow's Image.open(...).convert("RGB") gives for the same file:
//   PNG   palette and grayscale expanded to RGB, an alpha channel or tRNS transparency dropped
//         (not composited), interlaced files included; 16-bit samples keep their high byte
//         (not compared with Pillow, which opens 16-bit grayscale as integers)
//   JPEG  libjpeg's defaults (accurate integer IDCT, fancy upsampling), grayscale to RGB; CMYK
//         and YCCK files are refused by name
// Images over 2^27 pixels are refused (their header's size is checked before any pixel is read).
// A file that is neither, or whose data is corrupt or truncated (a JPEG that ends early is an
// error here, where libjpeg would fill the rest with gray), throws DataError naming `origin` and,
// where the decoder knows it, the byte offset it reached.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <string_view>

namespace titan {

// Whether this build decodes images (libpng and libjpeg-turbo were found when it was configured).
bool image_codecs_built();

enum class ImageFormat { kPng, kJpeg, kUnknown };
// From the first bytes (the PNG signature, the JPEG SOI marker).
ImageFormat sniff_image_format(std::string_view bytes);

// (3, height, width) uint8 RGB. `origin` names the bytes in errors (a file, or file:row).
at::Tensor decode_image(std::string_view bytes, const std::string& origin);

// A PNG file's bytes (8-bit RGB, no interlacing, zlib's default compression) of `rgb`
// (3, height, width) uint8, for images a model generates. DataError in a build without the
// codecs (saying so).
std::string encode_png(const at::Tensor& rgb);

}  // namespace titan
