// PNG and JPEG decoding (see image.h). libpng and libjpeg report errors through longjmp: each
// decoder's setjmp frame holds only plain data (no object with a destructor is created after
// it), and the C++ error is thrown once back in ordinary code.
#include "titan/components/data/image.h"

#include "titan/common/check.h"
#include "titan/common/format.h"

#include <cstring>
#include <vector>

#ifndef TITAN_HAS_IMAGE_CODECS
#define TITAN_HAS_IMAGE_CODECS 0
#endif

#if TITAN_HAS_IMAGE_CODECS
#include <csetjmp>
#include <cstdio>

#include <jpeglib.h>
#include <png.h>
#endif

namespace titan {

bool image_codecs_built() { return TITAN_HAS_IMAGE_CODECS != 0; }

ImageFormat sniff_image_format(std::string_view bytes) {
  static const unsigned char kPng[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  if (bytes.size() >= 8 && std::memcmp(bytes.data(), kPng, 8) == 0) return ImageFormat::kPng;
  if (bytes.size() >= 3 && static_cast<unsigned char>(bytes[0]) == 0xFF &&
      static_cast<unsigned char>(bytes[1]) == 0xD8 &&
      static_cast<unsigned char>(bytes[2]) == 0xFF) {
    return ImageFormat::kJpeg;
  }
  return ImageFormat::kUnknown;
}

#if TITAN_HAS_IMAGE_CODECS
namespace {

// The largest image read: 2^27 pixels (384 MiB of RGB), so that a header cannot ask for more
// memory than a training image needs.
constexpr int64_t kMaxPixels = int64_t{1} << 27;

bool too_large(int64_t width, int64_t height, char* error, size_t size) {
  if (width * height <= kMaxPixels) return false;
  std::snprintf(error, size, "%lld x %lld pixels, more than the %lld this reader takes",
                static_cast<long long>(width), static_cast<long long>(height),
                static_cast<long long>(kMaxPixels));
  return true;
}

// What a decoder hands back: the RGB rows, or an error text with the offset reached (-1: unknown).
struct Decoded {
  std::vector<uint8_t> rgb;
  int64_t width = 0, height = 0;
  char error[JMSG_LENGTH_MAX + 64] = {0};
  int64_t offset = -1;       // the byte offset reached, -1 if unknown
  int64_t left = -1;         // JPEG: the bytes the source had not handed over yet
  bool unsupported = false;  // a well-formed image this reader does not take (CMYK, too large)
};

// ---- PNG ----

struct PngReader {
  const unsigned char* data;
  size_t size;
  size_t pos;
  Decoded* out;
  jmp_buf jump;
};

void png_read_from_memory(png_structp png, png_bytep dest, png_size_t length) {
  auto* r = static_cast<PngReader*>(png_get_io_ptr(png));
  if (length > r->size - r->pos) png_error(png, "the file ends early (truncated)");
  std::memcpy(dest, r->data + r->pos, length);
  r->pos += length;
}

void png_on_error(png_structp png, png_const_charp text) {
  auto* r = static_cast<PngReader*>(png_get_error_ptr(png));
  std::snprintf(r->out->error, sizeof(r->out->error), "%s", text);
  r->out->offset = static_cast<int64_t>(r->pos);
  std::longjmp(r->jump, 1);
}

void png_on_warning(png_structp, png_const_charp) {}  // as Pillow: warnings do not stop it

void decode_png(const unsigned char* data, size_t size, Decoded* out) {
  PngReader reader{data, size, 0, out, {}};
  png_structp png =
      png_create_read_struct(PNG_LIBPNG_VER_STRING, &reader, png_on_error, png_on_warning);
  png_infop info = png == nullptr ? nullptr : png_create_info_struct(png);
  if (png == nullptr || info == nullptr) {
    std::snprintf(out->error, sizeof(out->error), "libpng could not start (out of memory)");
    png_destroy_read_struct(&png, &info, nullptr);
    return;
  }
  std::vector<png_bytep> rows;  // created before the jump point: always destroyed
  if (setjmp(reader.jump)) {
    png_destroy_read_struct(&png, &info, nullptr);
    return;
  }
  png_set_read_fn(png, &reader, png_read_from_memory);
  png_read_info(png, info);
  const png_uint_32 width = png_get_image_width(png, info);
  const png_uint_32 height = png_get_image_height(png, info);
  const int depth = png_get_bit_depth(png, info);
  const int color = png_get_color_type(png, info);
  if (too_large(width, height, out->error, sizeof(out->error))) {
    out->unsupported = true;
    png_destroy_read_struct(&png, &info, nullptr);
    return;
  }
  if (color == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
  if (color == PNG_COLOR_TYPE_GRAY && depth < 8) png_set_expand_gray_1_2_4_to_8(png);
  if (depth == 16) png_set_strip_16(png);  // the high byte, as Pillow keeps
  // An alpha channel, or a palette's transparency (which the expansion above turns into one).
  if ((color & PNG_COLOR_MASK_ALPHA) || png_get_valid(png, info, PNG_INFO_tRNS)) {
    png_set_strip_alpha(png);
  }
  if (color == PNG_COLOR_TYPE_GRAY || color == PNG_COLOR_TYPE_GRAY_ALPHA) png_set_gray_to_rgb(png);
  png_set_interlace_handling(png);
  png_read_update_info(png, info);
  if (png_get_rowbytes(png, info) != static_cast<size_t>(width) * 3) {
    png_error(png, "unexpected row layout after the RGB transforms");
  }
  out->width = width;
  out->height = height;
  out->rgb.resize(static_cast<size_t>(width) * height * 3);
  rows.resize(height);
  for (png_uint_32 y = 0; y < height; ++y)
    rows[y] = out->rgb.data() + static_cast<size_t>(y) * width * 3;
  png_read_image(png, rows.data());
  png_read_end(png, nullptr);
  png_destroy_read_struct(&png, &info, nullptr);
}

// ---- JPEG ----

struct JpegError {
  jpeg_error_mgr mgr;
  jmp_buf jump;
  Decoded* out;
};

void jpeg_on_error(j_common_ptr cinfo) {
  auto* e = reinterpret_cast<JpegError*>(cinfo->err);
  char text[JMSG_LENGTH_MAX];
  (*cinfo->err->format_message)(cinfo, text);
  std::snprintf(e->out->error, sizeof(e->out->error), "%s", text);
  auto* d = reinterpret_cast<j_decompress_ptr>(cinfo);
  if (d->src != nullptr) e->out->left = static_cast<int64_t>(d->src->bytes_in_buffer);
  std::longjmp(e->jump, 1);
}

// Warnings (level -1: corrupt data libjpeg would paper over, e.g. a premature end) are errors.
void jpeg_on_message(j_common_ptr cinfo, int level) {
  if (level < 0) jpeg_on_error(cinfo);
}

void decode_jpeg(const unsigned char* data, size_t size, Decoded* out) {
  jpeg_decompress_struct cinfo;
  JpegError err;
  err.out = out;
  cinfo.err = jpeg_std_error(&err.mgr);
  err.mgr.error_exit = jpeg_on_error;
  err.mgr.emit_message = jpeg_on_message;
  if (setjmp(err.jump)) {
    if (out->left >= 0) out->offset = static_cast<int64_t>(size) - out->left;
    jpeg_destroy_decompress(&cinfo);
    return;
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, data, static_cast<unsigned long>(size));
  jpeg_read_header(&cinfo, TRUE);
  if (cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK) {
    std::snprintf(out->error, sizeof(out->error),
                  "a CMYK JPEG (only RGB, YCbCr and grayscale JPEGs are read)");
    out->unsupported = true;
    jpeg_destroy_decompress(&cinfo);
    return;
  }
  if (too_large(cinfo.image_width, cinfo.image_height, out->error, sizeof(out->error))) {
    out->unsupported = true;
    jpeg_destroy_decompress(&cinfo);
    return;
  }
  cinfo.out_color_space = JCS_RGB;
  jpeg_start_decompress(&cinfo);
  out->width = cinfo.output_width;
  out->height = cinfo.output_height;
  out->rgb.resize(static_cast<size_t>(out->width) * out->height * 3);
  while (cinfo.output_scanline < cinfo.output_height) {
    JSAMPROW row = out->rgb.data() + static_cast<size_t>(cinfo.output_scanline) * out->width * 3;
    jpeg_read_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
}

// ---- PNG writing ----

struct PngWriter {
  std::string* out;
  char error[256];
  jmp_buf jump;
};

void png_write_to_string(png_structp png, png_bytep data, png_size_t length) {
  auto* w = static_cast<PngWriter*>(png_get_io_ptr(png));
  w->out->append(reinterpret_cast<const char*>(data), length);
}

void png_flush_nothing(png_structp) {}

void png_on_write_error(png_structp png, png_const_charp text) {
  auto* w = static_cast<PngWriter*>(png_get_error_ptr(png));
  std::snprintf(w->error, sizeof(w->error), "%s", text);
  std::longjmp(w->jump, 1);
}

// Writes `rows` (height pointers to width * 3 bytes) into *out; false with w->error set on
// failure.
bool write_png(PngWriter* w, png_bytep* rows, int64_t width, int64_t height) {
  png_structp png =
      png_create_write_struct(PNG_LIBPNG_VER_STRING, w, png_on_write_error, png_on_warning);
  png_infop info = png == nullptr ? nullptr : png_create_info_struct(png);
  if (png == nullptr || info == nullptr) {
    std::snprintf(w->error, sizeof(w->error), "libpng could not start (out of memory)");
    png_destroy_write_struct(&png, &info);
    return false;
  }
  if (setjmp(w->jump)) {
    png_destroy_write_struct(&png, &info);
    return false;
  }
  png_set_write_fn(png, w, png_write_to_string, png_flush_nothing);
  png_set_IHDR(png, info, static_cast<png_uint_32>(width), static_cast<png_uint_32>(height), 8,
               PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT,
               PNG_FILTER_TYPE_DEFAULT);
  png_write_info(png, info);
  png_write_image(png, rows);
  png_write_end(png, nullptr);
  png_destroy_write_struct(&png, &info);
  return true;
}

}  // namespace
#endif

std::string encode_png(const at::Tensor& rgb) {
  TITAN_CHECK(rgb.dim() == 3 && rgb.size(0) == 3 && rgb.scalar_type() == at::kByte &&
                  rgb.size(1) > 0 && rgb.size(2) > 0,
              "encode_png takes (3, height, width) uint8 RGB, got ", rgb.sizes(), " ",
              rgb.scalar_type());
#if TITAN_HAS_IMAGE_CODECS
  const at::Tensor hwc = rgb.permute({1, 2, 0}).contiguous().to(at::kCPU);
  const int64_t height = hwc.size(0), width = hwc.size(1);
  std::vector<png_bytep> rows(static_cast<size_t>(height));
  for (int64_t y = 0; y < height; ++y) rows[y] = hwc.data_ptr<uint8_t>() + y * width * 3;
  std::string out;
  PngWriter writer{&out, {0}, {}};
  if (!write_png(&writer, rows.data(), width, height)) {
    throw DataError(message("encode_png: libpng failed: ", writer.error));
  }
  return out;
#else
  throw DataError(
      "this build writes no images (libpng was not found when it was configured). "
      "HINT: run scripts/setup.sh (apt-get install libpng-dev) and rebuild");
#endif
}

at::Tensor decode_image(std::string_view bytes, const std::string& origin) {
  const ImageFormat format = sniff_image_format(bytes);
  if (format == ImageFormat::kUnknown) {
    throw DataError(message(origin, ": not a PNG or JPEG image (", bytes.size(),
                            " bytes; neither signature at offset 0)"));
  }
  const char* name = format == ImageFormat::kPng ? "PNG" : "JPEG";
#if TITAN_HAS_IMAGE_CODECS
  Decoded out;
  const auto* data = reinterpret_cast<const unsigned char*>(bytes.data());
  if (format == ImageFormat::kPng) {
    decode_png(data, bytes.size(), &out);
  } else {
    decode_jpeg(data, bytes.size(), &out);
  }
  if (out.error[0] != '\0') {
    throw DataError(message(
        origin, out.unsupported ? ": unsupported " : ": corrupt ", name, " image: ", out.error,
        out.offset >= 0 ? message(" (at byte offset ", out.offset, " of ", bytes.size(), ")")
                        : std::string()));
  }
  at::Tensor hwc = at::empty({out.height, out.width, 3}, at::kByte);
  std::memcpy(hwc.data_ptr<uint8_t>(), out.rgb.data(), out.rgb.size());
  return hwc.permute({2, 0, 1}).contiguous();
#else
  throw DataError(message(origin, ": a ", name,
                          " image, and this build decodes no images (libpng and libjpeg-turbo "
                          "were not found when it was configured). HINT: run scripts/setup.sh "
                          "(apt-get install libpng-dev libjpeg62-turbo-dev) and rebuild"));
#endif
}

}  // namespace titan
