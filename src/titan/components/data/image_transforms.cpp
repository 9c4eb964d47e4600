#include "titan/components/data/image_transforms.h"

#include "titan/common/check.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace titan {
namespace {

// Pillow's fixed point for 8-bit resampling: 32 bits less 8 for the value and 2 for the sign and
// the kernel's overshoot.
constexpr int kPrecisionBits = 32 - 8 - 2;
constexpr double kBicubicSupport = 2.0;

double bicubic(double x) {
  constexpr double a = -0.5;
  x = std::abs(x);
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
  if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
  return 0.0;
}

// One axis: for each output pixel, the first input pixel it reads, how many, and their
// fixed-point weights (ksize per output pixel).
struct Coefficients {
  int64_t ksize = 0;
  std::vector<int64_t> first, count;
  std::vector<int32_t> weights;
};

Coefficients precompute(int64_t in_size, int64_t out_size) {
  const double scale = static_cast<double>(in_size) / static_cast<double>(out_size);
  const double filter_scale = std::max(scale, 1.0);
  const double support = kBicubicSupport * filter_scale;
  Coefficients c;
  c.ksize = static_cast<int64_t>(std::ceil(support)) * 2 + 1;
  c.first.resize(out_size);
  c.count.resize(out_size);
  c.weights.assign(static_cast<size_t>(out_size * c.ksize), 0);
  std::vector<double> k(static_cast<size_t>(c.ksize));
  for (int64_t xx = 0; xx < out_size; ++xx) {
    const double center = (static_cast<double>(xx) + 0.5) * scale;
    const double inv = 1.0 / filter_scale;
    const int64_t xmin = std::max<int64_t>(0, static_cast<int64_t>(center - support + 0.5));
    const int64_t xmax =
        std::min<int64_t>(in_size, static_cast<int64_t>(center + support + 0.5)) - xmin;
    double total = 0.0;
    for (int64_t x = 0; x < xmax; ++x) {
      k[x] = bicubic((static_cast<double>(x + xmin) - center + 0.5) * inv);
      total += k[x];
    }
    for (int64_t x = 0; x < xmax; ++x) {
      const double w = total != 0.0 ? k[x] / total : k[x];
      const double fixed = w * (1 << kPrecisionBits);
      c.weights[xx * c.ksize + x] = static_cast<int32_t>(w < 0 ? -0.5 + fixed : 0.5 + fixed);
    }
    c.first[xx] = xmin;
    c.count[xx] = xmax;
  }
  return c;
}

uint8_t clip8(int32_t v) {
  if (v >= (1 << kPrecisionBits << 8)) return 255;
  if (v <= 0) return 0;
  return static_cast<uint8_t>(v >> kPrecisionBits);
}

}  // namespace

namespace {

// One pass along `axis` (2: across, 1: down) of a (3, h, w) uint8 image.
at::Tensor resample_axis(const at::Tensor& src, const Coefficients& c, int64_t axis,
                         int64_t out_size) {
  const int64_t h = src.size(1), w = src.size(2);
  const int64_t oh = axis == 1 ? out_size : h, ow = axis == 2 ? out_size : w;
  at::Tensor out = at::empty({3, oh, ow}, at::kByte);
  const uint8_t* in = src.data_ptr<uint8_t>();
  uint8_t* dst = out.data_ptr<uint8_t>();
  // The step between the taps along the axis, and between outputs' first taps.
  const int64_t step = axis == 2 ? 1 : w;
  for (int64_t ch = 0; ch < 3; ++ch) {
    for (int64_t y = 0; y < oh; ++y) {
      for (int64_t x = 0; x < ow; ++x) {
        const int64_t o = axis == 2 ? x : y;  // the output index along the axis
        const int32_t* k = &c.weights[o * c.ksize];
        const uint8_t* tap =
            in + ch * h * w + (axis == 2 ? y * w + c.first[o] : c.first[o] * w + x);
        int32_t sum = 1 << (kPrecisionBits - 1);
        for (int64_t t = 0; t < c.count[o]; ++t) sum += tap[t * step] * k[t];
        dst[(ch * oh + y) * ow + x] = clip8(sum);
      }
    }
  }
  return out;
}

}  // namespace

at::Tensor resize_bicubic(const at::Tensor& rgb, int64_t width, int64_t height) {
  TITAN_CHECK(rgb.dim() == 3 && rgb.size(0) == 3 && rgb.scalar_type() == at::kByte,
              "resize_bicubic: a (3, height, width) uint8 image, got ", rgb.sizes(), " ",
              rgb.scalar_type());
  TITAN_CHECK(width > 0 && height > 0, "resize_bicubic: to ", width, " x ", height);
  const int64_t in_h = rgb.size(1), in_w = rgb.size(2);
  at::Tensor image = rgb.contiguous();
  // Pillow skips a pass whose size does not change, and runs the vertical pass first when the
  // height shrinks by more than twice as many pixels as the width does.
  const bool horizontal = width != in_w, vertical = height != in_h;
  const bool horizontal_first = !(in_h - height > 0 && in_h - height > (in_w - width) * 2);
  const auto across = [&](const at::Tensor& src) {
    return horizontal ? resample_axis(src, precompute(in_w, width), 2, width) : src;
  };
  const auto down = [&](const at::Tensor& src) {
    return vertical ? resample_axis(src, precompute(in_h, height), 1, height) : src;
  };
  // (Pillow's horizontal pass skips the rows the vertical one will not read: the same values.)
  return horizontal_first ? down(across(image)) : across(down(image));
}

int64_t flux_crop_choices(int64_t width, int64_t height, int64_t size) {
  if (width < size || height < size) return 0;
  const int64_t shorter = std::min(width, height), longer = std::max(width, height);
  const auto resized = static_cast<int64_t>(std::ceil(
      static_cast<double>(size) / static_cast<double>(shorter) * static_cast<double>(longer)));
  return resized - size + 1;
}

std::optional<at::Tensor> flux_preprocess(const at::Tensor& rgb, int64_t size, int64_t offset) {
  TITAN_CHECK(rgb.dim() == 3 && rgb.size(0) == 3, "flux_preprocess: a (3, height, width) image");
  const int64_t height = rgb.size(1), width = rgb.size(2);
  const int64_t choices = flux_crop_choices(width, height, size);
  if (choices == 0) return std::nullopt;
  TITAN_CHECK(offset >= 0 && offset < choices, "flux_preprocess: crop offset ", offset, " of ",
              choices, " choices");
  at::Tensor square;
  if (width >= height) {  // the height becomes `size`, a window across
    const int64_t new_width = size + choices - 1;
    square = resize_bicubic(rgb, new_width, size).narrow(2, offset, size);
  } else {
    const int64_t new_height = size + choices - 1;
    square = resize_bicubic(rgb, size, new_height).narrow(1, offset, size);
  }
  return square.to(at::kFloat).div(255.0).mul(2.0).sub(1.0).contiguous();
}

}  // namespace titan
