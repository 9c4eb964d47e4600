// Image decoding (components/data/image.h): PNG and JPEG files written by Pillow decode to the
// bytes Pillow decodes from them (a fixture folder written by tests/e2e/image_reference.py, run
// by test_images.sh); corrupt, truncated and CMYK files are refused naming the file (and the byte
// offset reached); formats are told by their signatures.
#include "titan/common/check.h"
#include "titan/common/file_io.h"
#include "titan/components/data/image.h"

#include "../test_util.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

namespace titan {
namespace test_image {

const char* fixture() {
  const char* dir = std::getenv("TITAN_IMAGE_FIXTURE");
  return dir;
}

TEST(Image, MatchesPillow) {
  const char* dir = fixture();
  if (dir == nullptr) GTEST_SKIP() << "run by tests/e2e/test_images.sh";
  if (!image_codecs_built()) GTEST_SKIP() << "built without libpng / libjpeg-turbo";
  std::ifstream manifest(std::string(dir) + "/manifest.txt");
  std::string name;
  int64_t width = 0, height = 0, files = 0, pixels = 0;
  while (manifest >> name >> width >> height) {
    SCOPED_TRACE(name);
    const std::string path = std::string(dir) + "/" + name;
    const at::Tensor image = decode_image(read_regular_file(path, "image"), path);
    ASSERT_EQ(image.sizes(), (at::IntArrayRef{3, height, width}));
    const std::string want = read_regular_file(path + ".rgb", "pixels");
    const at::Tensor hwc = image.permute({1, 2, 0}).contiguous();
    ASSERT_EQ(static_cast<size_t>(hwc.numel()), want.size());
    const auto* got = hwc.data_ptr<uint8_t>();
    int64_t differ = 0;
    for (size_t i = 0; i < want.size(); ++i) differ += got[i] != static_cast<uint8_t>(want[i]);
    EXPECT_EQ(differ, 0) << "bytes differing from Pillow's";
    ++files;
    pixels += width * height;
  }
  EXPECT_GE(files, 11);
  std::printf("images vs Pillow: %lld PNG and JPEG files, %lld pixels, every byte equal\n",
              static_cast<long long>(files), static_cast<long long>(pixels));
}

std::string refusal(const std::string& file) {
  const std::string path = std::string(fixture()) + "/" + file;
  try {
    decode_image(read_regular_file(path, "image"), path);
  } catch (const DataError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Image, CorruptFilesNameTheFileAndOffset) {
  if (fixture() == nullptr) GTEST_SKIP() << "run by tests/e2e/test_images.sh";
  if (!image_codecs_built()) GTEST_SKIP() << "built without libpng / libjpeg-turbo";
  std::string m = refusal("truncated_png_rgb.png");
  EXPECT_TRUE(test::contains(m, "truncated_png_rgb.png: corrupt PNG image: ")) << m;
  EXPECT_TRUE(test::contains(m, "at byte offset")) << m;
  m = refusal("truncated_jpeg_420.jpg");
  EXPECT_TRUE(test::contains(m, "truncated_jpeg_420.jpg: corrupt JPEG image: ")) << m;
  EXPECT_TRUE(test::contains(m, "at byte offset")) << m;
  m = refusal("crc_png_rgb.png");
  EXPECT_TRUE(test::contains(m, "crc_png_rgb.png: corrupt PNG image: ")) << m;
  m = refusal("garbage.png");
  EXPECT_TRUE(test::contains(m, "garbage.png: not a PNG or JPEG image")) << m;
  m = refusal("cmyk.jpg");
  EXPECT_TRUE(test::contains(m, "cmyk.jpg: corrupt JPEG image: a CMYK JPEG")) << m;
  std::printf("refused: %s\n", refusal("truncated_jpeg_420.jpg").c_str());
}

TEST(Image, SniffsFormatsBySignature) {
  EXPECT_EQ(sniff_image_format(std::string("\x89PNG\r\n\x1a\n....", 12)), ImageFormat::kPng);
  EXPECT_EQ(sniff_image_format(std::string("\xFF\xD8\xFF\xE0", 4)), ImageFormat::kJpeg);
  EXPECT_EQ(sniff_image_format("GIF89a"), ImageFormat::kUnknown);
  EXPECT_EQ(sniff_image_format(""), ImageFormat::kUnknown);
  try {
    decode_image("BM not a bitmap we read", "x.bmp");
    FAIL() << "expected DataError";
  } catch (const DataError& e) {
    EXPECT_TRUE(test::contains(e.what(), "x.bmp: not a PNG or JPEG image (23 bytes")) << e.what();
  }
}

}  // namespace test_image
}  // namespace titan
