// Image decoding (components/data/image.h): PNG and JPEG files written by Pillow decode to the
// bytes Pillow decodes from them (a fixture folder written by tests/e2e/image_reference.py, run
// by test_images.sh); corrupt, truncated and CMYK files are refused naming the file (and the byte
// offset reached); formats are told by their signatures. The transforms (image_transforms.h):
// Pillow's bicubic resize and TorchTitan's FLUX preprocessing, bit for bit.
#include "titan/common/check.h"
#include "titan/common/file_io.h"
#include "titan/components/data/image.h"
#include "titan/components/data/image_dataset.h"
#include "titan/components/data/image_transforms.h"

#include "../test_util.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
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
  EXPECT_TRUE(test::contains(m, "cmyk.jpg: unsupported JPEG image: a CMYK JPEG")) << m;
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

at::Tensor decode_fixture(const std::string& name) {
  const std::string path = std::string(fixture()) + "/" + name;
  return decode_image(read_regular_file(path, "image"), path);
}

// Pillow's bicubic resize, shrinking (with its antialiasing), enlarging, one axis at a time and
// down to one pixel: the same bytes.
TEST(ImageTransforms, ResizeMatchesPillow) {
  if (fixture() == nullptr) GTEST_SKIP() << "run by tests/e2e/test_images.sh";
  if (!image_codecs_built()) GTEST_SKIP() << "built without libpng / libjpeg-turbo";
  std::ifstream list(std::string(fixture()) + "/resize.txt");
  std::string source, target;
  int64_t width = 0, height = 0, cases = 0;
  while (list >> source >> width >> height >> target) {
    SCOPED_TRACE(target);
    const at::Tensor got =
        resize_bicubic(decode_fixture(source), width, height).permute({1, 2, 0}).contiguous();
    const std::string want = read_regular_file(std::string(fixture()) + "/" + target, "pixels");
    ASSERT_EQ(static_cast<size_t>(got.numel()), want.size());
    EXPECT_EQ(std::memcmp(got.data_ptr<uint8_t>(), want.data(), want.size()), 0);
    ++cases;
  }
  EXPECT_EQ(cases, 11);
  std::printf("bicubic resize vs Pillow: %lld sizes, every byte equal\n",
              static_cast<long long>(cases));
}

// TorchTitan's FLUX preprocessing (resize the shorter side, crop a square at an offset along the
// longer, scale to [-1, 1]): the same float32 values.
TEST(ImageTransforms, FluxPreprocessMatchesTorchTitan) {
  if (fixture() == nullptr) GTEST_SKIP() << "run by tests/e2e/test_images.sh";
  if (!image_codecs_built()) GTEST_SKIP() << "built without libpng / libjpeg-turbo";
  std::ifstream list(std::string(fixture()) + "/flux.txt");
  std::string source, target;
  int64_t size = 0, offset = 0, cases = 0;
  while (list >> source >> size >> offset >> target) {
    SCOPED_TRACE(target);
    const std::optional<at::Tensor> got = flux_preprocess(decode_fixture(source), size, offset);
    ASSERT_TRUE(got.has_value());
    ASSERT_EQ(got->sizes(), (at::IntArrayRef{3, size, size}));
    const std::string want = read_regular_file(std::string(fixture()) + "/" + target, "values");
    ASSERT_EQ(static_cast<size_t>(got->numel()) * sizeof(float), want.size());
    EXPECT_EQ(std::memcmp(got->data_ptr<float>(), want.data(), want.size()), 0);
    ++cases;
  }
  EXPECT_EQ(cases, 4);
  std::printf("FLUX preprocessing vs TorchTitan's: %lld crops, every value equal\n",
              static_cast<long long>(cases));
}

TEST(ImageTransforms, FluxSkipsSmallImagesAndBoundsTheOffset) {
  const at::Tensor image = at::randint(0, 256, {3, 40, 70}, at::kByte);
  EXPECT_FALSE(flux_preprocess(image, 48, 0).has_value());  // 40 < 48: skipped
  EXPECT_EQ(flux_crop_choices(70, 40, 48), 0);
  EXPECT_EQ(flux_crop_choices(70, 40, 32), 56 - 32 + 1);  // ceil(32 / 40 * 70) = 56
  EXPECT_EQ(flux_crop_choices(40, 40, 40), 1);
  const std::optional<at::Tensor> out = flux_preprocess(image, 32, 24);
  ASSERT_TRUE(out.has_value());
  EXPECT_GE(out->min().item<float>(), -1.0f);
  EXPECT_LE(out->max().item<float>(), 1.0f);
  EXPECT_THROW(flux_preprocess(image, 32, 25), c10::Error);
  // The same size: no resampling at all.
  EXPECT_TRUE(at::equal(resize_bicubic(image, 70, 40), image));
}

// A folder of images with a captions sidecar: rows decode with their captions; a missing and a
// truncated image stop a read naming the row and the file, or are skipped (and counted) when
// allowed.
TEST(ImageDataset, ReadsAFolderWithACaptionsSidecar) {
  if (fixture() == nullptr) GTEST_SKIP() << "run by tests/e2e/test_images.sh";
  if (!image_codecs_built()) GTEST_SKIP() << "built without libpng / libjpeg-turbo";
  const std::string dir = std::string(fixture()) + "/dataset";
  const ImageCaptionSource source(dir);
  ASSERT_EQ(source.size(), 5);
  const ImageCaption first = source.get(0);
  EXPECT_EQ(first.caption, "first");
  EXPECT_TRUE(at::equal(first.image, decode_fixture("png_rgb.png")));
  EXPECT_TRUE(at::equal(source.get(1).image, decode_fixture("jpeg_420.jpg")));  // sub/b.jpg
  const auto refusal = [&](int64_t row) -> std::string {
    try {
      source.get(row);
    } catch (const DataError& e) {
      return e.what();
    }
    return "(no error)";
  };
  EXPECT_TRUE(test::contains(refusal(2), "captions.jsonl:3: image file ")) << refusal(2);
  EXPECT_TRUE(test::contains(refusal(2), "missing.png does not exist")) << refusal(2);
  EXPECT_TRUE(test::contains(refusal(3), "captions.jsonl:4 (")) << refusal(3);
  EXPECT_TRUE(test::contains(refusal(3), "bad.png): corrupt PNG image")) << refusal(3);
  EXPECT_THROW(source.next_readable(2, /*skip_unreadable=*/false), DataError);
  int64_t skipped = 0;
  const auto [row, sample] = source.next_readable(2, /*skip_unreadable=*/true, &skipped);
  EXPECT_EQ(row, 4);
  EXPECT_EQ(sample.caption, "fifth");
  EXPECT_EQ(skipped, 2);
}

// Parquet rows with the image's bytes: Hugging Face's Image feature (a struct of bytes and path)
// and a plain binary column.
TEST(ImageDataset, ReadsImageBytesFromParquet) {
  if (fixture() == nullptr) GTEST_SKIP() << "run by tests/e2e/test_images.sh";
  if (!image_codecs_built()) GTEST_SKIP() << "built without libpng / libjpeg-turbo";
  for (const char* file : {"hf.parquet", "raw.parquet"}) {
    SCOPED_TRACE(file);
    const ImageCaptionSource source(std::string(fixture()) + "/" + file);
    ASSERT_EQ(source.size(), 2);
    EXPECT_TRUE(at::equal(source.get(0).image, decode_fixture("jpeg_444.jpg")));
    EXPECT_EQ(source.get(1).caption, "a palette png");
    EXPECT_TRUE(at::equal(source.get(1).image, decode_fixture("png_palette.png")));
  }
  ImageDatasetOptions other;
  other.caption_field = "text";
  const ImageCaptionSource wrong(std::string(fixture()) + "/raw.parquet", other);
  try {
    wrong.get(0);
    FAIL() << "expected DataError";
  } catch (const DataError& e) {
    EXPECT_TRUE(test::contains(e.what(), "raw.parquet row 0: no \"text\" field")) << e.what();
  }
}

TEST(ImageDataset, ShapesAreTheBuiltInSet) {
  ImageDatasetOptions options;
  options.shapes_size = 24;
  options.shapes_count = 50;
  const ImageCaptionSource source("shapes", options);
  EXPECT_EQ(source.size(), 50);
  const ImageCaption s = source.get(7);
  EXPECT_EQ(s.image.sizes(), (at::IntArrayRef{3, 24, 24}));
  EXPECT_EQ(s.caption, ShapesDataset(24, 0).get(7).caption);
  EXPECT_EQ(s.origin, "shapes sample 7");
}

TEST(Image, PngEncodingRoundTrips) {
  if (!image_codecs_built()) GTEST_SKIP() << "built without the image codecs";
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  const at::Tensor rgb = at::randint(0, 256, {3, 7, 11}, gen, at::kByte);
  const std::string png = encode_png(rgb);
  EXPECT_EQ(sniff_image_format(png), ImageFormat::kPng);
  EXPECT_TRUE(at::equal(decode_image(png, "memory"), rgb));
  EXPECT_THROW(encode_png(at::zeros({4, 2, 2}, at::kByte)), c10::Error);
}

}  // namespace test_image
}  // namespace titan
