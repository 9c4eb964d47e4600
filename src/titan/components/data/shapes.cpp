#include "titan/components/data/shapes.h"

#include "titan/common/check.h"
#include "titan/common/splitmix.h"

#include <array>
#include <cmath>

namespace titan {
namespace {

struct Color {
  const char* name;
  std::array<uint8_t, 3> rgb;
};

const std::vector<Color>& palette() {
  static const std::vector<Color> kPalette = {
      {"red", {220, 40, 40}},     {"green", {40, 170, 60}},   {"blue", {40, 80, 220}},
      {"yellow", {240, 210, 40}}, {"purple", {140, 60, 190}}, {"orange", {245, 140, 30}},
      {"white", {245, 245, 245}}, {"black", {20, 20, 20}},
  };
  return kPalette;
}

using Stream = SplitMix64;

bool inside(const std::string& shape, double x, double y, double cx, double cy, double r) {
  const double dx = x - cx, dy = y - cy;
  if (shape == "circle") return dx * dx + dy * dy <= r * r;
  if (shape == "square") return std::abs(dx) <= r && std::abs(dy) <= r;
  if (shape == "diamond") return std::abs(dx) + std::abs(dy) <= r;
  // An upward triangle: apex (cx, cy - r), base from (cx - r, cy + r) to (cx + r, cy + r).
  if (dy < -r || dy > r) return false;
  return std::abs(dx) <= r * (dy + r) / (2 * r);
}

std::string position_words(double cx, double cy, double size) {
  const char* across[] = {"left", "center", "right"};
  const char* down[] = {"top", "middle", "bottom"};
  const int col = std::min(2, static_cast<int>(cx / (size / 3)));
  const int row = std::min(2, static_cast<int>(cy / (size / 3)));
  if (row == 1 && col == 1) return "in the center";
  if (row == 1) return std::string("on the ") + across[col];
  if (col == 1) return std::string("at the ") + down[row];
  return std::string("at the ") + down[row] + " " + across[col];
}

}  // namespace

ShapesDataset::ShapesDataset(int64_t size, uint64_t seed) : size_(size), seed_(seed) {
  TITAN_CHECK(size >= 8, "shapes: images of ", size, " pixels a side (at least 8)");
}

const std::vector<std::string>& ShapesDataset::shapes() {
  static const std::vector<std::string> kShapes = {"circle", "square", "triangle", "diamond"};
  return kShapes;
}

const std::vector<std::string>& ShapesDataset::colors() {
  static const std::vector<std::string> kColors = [] {
    std::vector<std::string> names;
    for (const Color& c : palette()) names.push_back(c.name);
    return names;
  }();
  return kColors;
}

std::vector<uint8_t> ShapesDataset::rgb(const std::string& color) {
  for (const Color& c : palette()) {
    if (color == c.name) return {c.rgb[0], c.rgb[1], c.rgb[2]};
  }
  TITAN_CHECK(false, "shapes: no colour named '", color, "'");
}

ShapeSample ShapesDataset::get(int64_t index) const {
  TITAN_CHECK(index >= 0, "shapes: sample ", index);
  // The sample's own stream: the seed and the index mixed, then a few draws discarded so that
  // neighbouring indices start far apart.
  Stream stream(seed_ * 0x9E3779B97F4A7C15ull ^ static_cast<uint64_t>(index));
  stream.next();
  const auto& colors = palette();
  ShapeSample s;
  s.shape = shapes()[stream.below(static_cast<int64_t>(shapes().size()))];
  const int64_t color = stream.below(static_cast<int64_t>(colors.size()));
  int64_t background = stream.below(static_cast<int64_t>(colors.size()) - 1);
  if (background >= color) ++background;  // never the shape's own colour
  s.color = colors[color].name;
  s.background = colors[background].name;
  const double size = static_cast<double>(size_);
  s.radius = size * (0.12 + 0.18 * stream.uniform());
  s.center_x = s.radius + (size - 2 * s.radius) * stream.uniform();
  s.center_y = s.radius + (size - 2 * s.radius) * stream.uniform();

  s.image = at::empty({3, size_, size_}, at::kByte);
  uint8_t* out = s.image.data_ptr<uint8_t>();
  const int64_t plane = size_ * size_;
  for (int64_t y = 0; y < size_; ++y) {
    for (int64_t x = 0; x < size_; ++x) {
      const bool in = inside(s.shape, static_cast<double>(x) + 0.5, static_cast<double>(y) + 0.5,
                             s.center_x, s.center_y, s.radius);
      const std::array<uint8_t, 3>& c = in ? colors[color].rgb : colors[background].rgb;
      for (int64_t ch = 0; ch < 3; ++ch) out[ch * plane + y * size_ + x] = c[ch];
    }
  }
  s.caption = std::string("a ") + (s.radius < 0.2 * size ? "small " : "large ") + s.color + " " +
              s.shape + " on a " + s.background + " background, " +
              position_words(s.center_x, s.center_y, size);
  return s;
}

}  // namespace titan
