// The procedural image dataset (components/data/shapes.h): samples are random access and
// reproducible, every caption matches its pixels (the shape's colour at its centre, the
// background's at the far corner, the shape's area, its size and position words), and the
// choices cover every shape and colour.
#include "titan/components/data/shapes.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <set>
#include <string>

namespace titan {
namespace test_shapes {

std::vector<uint8_t> pixel(const at::Tensor& image, int64_t x, int64_t y) {
  return {image[0][y][x].item<uint8_t>(), image[1][y][x].item<uint8_t>(),
          image[2][y][x].item<uint8_t>()};
}

TEST(Shapes, SamplesAreRandomAccessAndReproducible) {
  const ShapesDataset a(32, 7), b(32, 7), other(32, 8);
  for (int64_t i : {0, 1, 2, 1000, 5}) {
    const ShapeSample x = a.get(i), y = b.get(i);
    EXPECT_TRUE(at::equal(x.image, y.image)) << i;
    EXPECT_EQ(x.caption, y.caption) << i;
  }
  int differ = 0;
  for (int64_t i = 0; i < 20; ++i) differ += a.get(i).caption != other.get(i).caption;
  EXPECT_GT(differ, 10);  // another seed, other samples
  EXPECT_NE(a.get(0).caption, a.get(1).caption);
  const ShapeSample s = a.get(3);
  EXPECT_EQ(s.image.sizes(), (at::IntArrayRef{3, 32, 32}));
  EXPECT_EQ(s.image.scalar_type(), at::kByte);
}

TEST(Shapes, CaptionsMatchThePixels) {
  const ShapesDataset data(48, 1);
  const double kArea[] = {M_PI, 4.0, 2.0, 2.0};  // circle, square, triangle, diamond (x r^2)
  for (int64_t i = 0; i < 200; ++i) {
    const ShapeSample s = data.get(i);
    SCOPED_TRACE(s.caption);
    // The caption's words, in order.
    const std::string size_word = s.radius < 0.2 * 48 ? "small" : "large";
    EXPECT_EQ(s.caption.rfind("a " + size_word + " " + s.color + " " + s.shape + " on a " +
                                  s.background + " background, ",
                              0),
              0u);
    EXPECT_NE(s.color, s.background);
    // Inside at the centre (a triangle's centroid sits below its box centre).
    const double cy = s.shape == "triangle" ? s.center_y + s.radius / 3 : s.center_y;
    EXPECT_EQ(pixel(s.image, static_cast<int64_t>(s.center_x), static_cast<int64_t>(cy)),
              ShapesDataset::rgb(s.color));
    // The far corner from the centre is background.
    const int64_t fx = s.center_x < 24 ? 47 : 0, fy = s.center_y < 24 ? 47 : 0;
    EXPECT_EQ(pixel(s.image, fx, fy), ShapesDataset::rgb(s.background));
    // The shape's pixel count is its area (within the boundary's pixels).
    const auto c = ShapesDataset::rgb(s.color);
    const at::Tensor mask = s.image[0].eq(c[0]) & s.image[1].eq(c[1]) & s.image[2].eq(c[2]);
    const double count = mask.sum().item<double>();
    size_t k = 0;
    while (ShapesDataset::shapes()[k] != s.shape) ++k;
    const double area = kArea[k] * s.radius * s.radius;
    EXPECT_NEAR(count, area, 4 * 2 * M_PI * s.radius);  // the outline's pixels at most
    // The position words name the centre's thirds.
    const std::string across = s.center_x < 16 ? "left" : s.center_x < 32 ? "" : "right";
    const std::string down = s.center_y < 16 ? "top" : s.center_y < 32 ? "" : "bottom";
    std::string where;
    if (down.empty() && across.empty()) where = "in the center";
    else if (down.empty()) where = "on the " + across;
    else if (across.empty()) where = "at the " + down;
    else where = "at the " + down + " " + across;
    EXPECT_EQ(s.caption.substr(s.caption.size() - where.size()), where);
  }
}

TEST(Shapes, EveryShapeColourAndPositionAppears) {
  const ShapesDataset data(32, 3);
  std::set<std::string> shapes, colors, backgrounds, sizes;
  std::map<std::string, int> where;
  for (int64_t i = 0; i < 400; ++i) {
    const ShapeSample s = data.get(i);
    shapes.insert(s.shape);
    colors.insert(s.color);
    backgrounds.insert(s.background);
    sizes.insert(s.caption.substr(2, 5));
    ++where[s.caption.substr(s.caption.find(", ") + 2)];
  }
  EXPECT_EQ(shapes.size(), ShapesDataset::shapes().size());
  EXPECT_EQ(colors.size(), ShapesDataset::colors().size());
  EXPECT_EQ(backgrounds.size(), ShapesDataset::colors().size());
  EXPECT_EQ(sizes, (std::set<std::string>{"small", "large"}));
  EXPECT_EQ(where.size(), 9u);  // the nine regions
}

TEST(Shapes, RefusesTinyImagesAndNegativeIndices) {
  EXPECT_THROW(ShapesDataset(4, 0), c10::Error);
  EXPECT_THROW(ShapesDataset(16, 0).get(-1), c10::Error);
  EXPECT_THROW(ShapesDataset::rgb("mauve"), c10::Error);
}

}  // namespace test_shapes
}  // namespace titan
