// The built-in procedural image dataset ("shapes", for the image models' default runs and CI: no
// downloads): sample i is a size x size RGB image of one flat shape (circle, square, triangle,
// diamond) of one colour on a background of another, with the caption that says what is drawn:
//
//   "a small red circle on a blue background, at the top left"
//
// Every choice (shape, colours, radius, centre) comes from sample i's own generator, seeded by
// (seed, i), so samples are random access (any index, any order, resumable from a position), the
// same on every machine, and a caption always matches its pixels:
//   size word    small for a radius under 0.2 x size, else large; radii in [0.12, 0.3] x size
//   position     the centre's third of the image across (left, center, right) and down (top,
//                middle, bottom): "at the top left", "on the left", "at the top", "in the center"
// A pixel is inside the shape when its centre is (no anti-aliasing): exact colours, so tests
// and captions can read the image back.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <vector>

namespace titan {

struct ShapeSample {
  at::Tensor image;  // (3, size, size) uint8 RGB
  std::string caption;
  std::string shape, color, background;           // the caption's words
  double center_x = 0, center_y = 0, radius = 0;  // in pixels, x across and y down
};

class ShapesDataset {
 public:
  // size: the images' side in pixels (at least 8).
  ShapesDataset(int64_t size, uint64_t seed);

  ShapeSample get(int64_t index) const;
  int64_t size() const { return size_; }

  static const std::vector<std::string>& shapes();
  static const std::vector<std::string>& colors();
  // The RGB values of colors()[i].
  static std::vector<uint8_t> rgb(const std::string& color);

 private:
  int64_t size_;
  uint64_t seed_;
};

}  // namespace titan
