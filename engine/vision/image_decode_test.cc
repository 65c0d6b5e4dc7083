#include "engine/vision/image_decode.h"

#include <png.h>

#include <cmath>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "engine/vision/test_util.h"
#include "gtest/gtest.h"

namespace deepinfer::engine::vision {
namespace {

using testing::FixtureImages;
using testing::ImagePath;
using testing::ReadFileOrDie;

// Encodes a PNG with libpng. `samples` are big-endian 16-bit or 8-bit values, rows packed.
void AppendToString(png_structp png, png_bytep data, png_size_t length) {
  static_cast<std::string*>(png_get_io_ptr(png))->append(reinterpret_cast<char*>(data), length);
}

std::string EncodePng(int width, int height, int color_type, int bit_depth,
                      const std::vector<uint8_t>& samples) {
  std::string out;
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png_create_info_struct(png);
  if (setjmp(png_jmpbuf(png))) std::abort();
  png_set_write_fn(png, &out, &AppendToString, nullptr);
  png_set_IHDR(png, info, width, height, bit_depth, color_type, PNG_INTERLACE_NONE,
               PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  png_write_info(png, info);
  const size_t rowbytes = samples.size() / height;
  for (int y = 0; y < height; ++y) {
    png_write_row(png, const_cast<png_bytep>(samples.data() + rowbytes * y));
  }
  png_write_end(png, nullptr);
  png_destroy_write_struct(&png, &info);
  return out;
}

TEST(ImageDecodeTest, PngMatchesPilExactly) {
  auto ref = testing::OpenReference();
  ASSERT_NE(ref, nullptr);
  int checked = 0;
  for (const auto& image : FixtureImages()) {
    if (!absl::EndsWith(image.file, ".png")) continue;
    SCOPED_TRACE(image.file);
    auto decoded = DecodeImage(ReadFileOrDie(ImagePath(image)));
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    const std::vector<uint8_t> expected = testing::U8Tensor(*ref, image.prefix + ".rgb");
    ASSERT_EQ(decoded->pixels.size(), size_t(decoded->width) * decoded->height * 3);
    EXPECT_EQ(decoded->pixels, expected);
    EXPECT_EQ(decoded->alpha.empty(), image.mode != "RGBA") << image.mode;
    ++checked;
  }
  EXPECT_EQ(checked, 6);
}

// libjpeg-turbo (Debian) against the libjpeg-turbo bundled with Pillow: both use the accurate
// integer IDCT and fancy upsampling. Measured on the fixture (libjpeg-turbo 2.1.5 vs Pillow
// 13.0): max abs diff 0, mean 0. The bound allows one step for another library version.
TEST(ImageDecodeTest, JpegMatchesPilWithinTolerance) {
  auto ref = testing::OpenReference();
  ASSERT_NE(ref, nullptr);
  int checked = 0;
  for (const auto& image : FixtureImages()) {
    if (!absl::EndsWith(image.file, ".jpg")) continue;
    SCOPED_TRACE(image.file);
    auto decoded = DecodeImage(ReadFileOrDie(ImagePath(image)));
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    const std::vector<uint8_t> expected = testing::U8Tensor(*ref, image.prefix + ".rgb");
    ASSERT_EQ(decoded->pixels.size(), expected.size());
    int max_diff = 0;
    double sum = 0;
    for (size_t i = 0; i < expected.size(); ++i) {
      const int d = std::abs(int(decoded->pixels[i]) - int(expected[i]));
      max_diff = std::max(max_diff, d);
      sum += d;
    }
    const double mean = sum / expected.size();
    std::printf("%s: max abs diff %d, mean abs diff %.4f\n", image.file.c_str(), max_diff, mean);
    EXPECT_LE(max_diff, 1);
    EXPECT_LE(mean, 0.01);
    EXPECT_TRUE(decoded->alpha.empty());
    ++checked;
  }
  EXPECT_EQ(checked, 2);
}

TEST(ImageDecodeTest, Png16BitIsScaledTo8Bits) {
  // 2x1 RGB, 16-bit: samples chosen to check rounding (v * 255 / 65535, rounded).
  const std::vector<uint16_t> values = {0, 65535, 257, 128, 32896, 65407};
  std::vector<uint8_t> be;
  for (uint16_t v : values) {
    be.push_back(v >> 8);
    be.push_back(v & 0xff);
  }
  auto decoded = DecodeImage(EncodePng(2, 1, PNG_COLOR_TYPE_RGB, 16, be));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  ASSERT_EQ(decoded->width, 2);
  ASSERT_EQ(decoded->height, 1);
  std::vector<uint8_t> expected;
  for (uint16_t v : values) expected.push_back(uint8_t(std::lround(v * 255.0 / 65535.0)));
  EXPECT_EQ(decoded->pixels, expected);
  EXPECT_TRUE(decoded->alpha.empty());
}

TEST(ImageDecodeTest, GreyAlphaPngReplicatesGreyAndKeepsAlpha) {
  // 3x2 grey+alpha, 8-bit.
  const std::vector<uint8_t> samples = {0, 255, 10, 0, 200, 128, 255, 1, 77, 77, 128, 255};
  auto decoded = DecodeImage(EncodePng(3, 2, PNG_COLOR_TYPE_GRAY_ALPHA, 8, samples));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  ASSERT_EQ(decoded->width, 3);
  ASSERT_EQ(decoded->height, 2);
  std::vector<uint8_t> rgb;
  std::vector<uint8_t> alpha;
  for (size_t i = 0; i < samples.size(); i += 2) {
    rgb.insert(rgb.end(), {samples[i], samples[i], samples[i]});
    alpha.push_back(samples[i + 1]);
  }
  EXPECT_EQ(decoded->pixels, rgb);
  EXPECT_EQ(decoded->alpha, alpha);
}

TEST(ImageDecodeTest, LowBitDepthGreyPngIsExpanded) {
  // 4x1 grey, 2 bits per sample: 0,1,2,3 -> 0,85,170,255.
  auto decoded = DecodeImage(EncodePng(4, 1, PNG_COLOR_TYPE_GRAY, 2, {0x1B}));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->pixels,
            std::vector<uint8_t>({0, 0, 0, 85, 85, 85, 170, 170, 170, 255, 255, 255}));
}

void ExpectInvalid(absl::string_view bytes, absl::string_view message_part,
                   const ImageLimits& limits = {}) {
  auto decoded = DecodeImage(bytes, limits);
  ASSERT_FALSE(decoded.ok());
  EXPECT_EQ(decoded.status().code(), absl::StatusCode::kInvalidArgument) << decoded.status();
  EXPECT_TRUE(absl::StrContains(decoded.status().message(), message_part)) << decoded.status();
}

TEST(ImageDecodeTest, RefusesEmptyUnknownAndOtherFormats) {
  ExpectInvalid("", "empty image");
  ExpectInvalid("GIF89a\x01\x00\x01\x00", "not a PNG or JPEG image");
  ExpectInvalid("BM\x36\x00\x00\x00\x00\x00", "not a PNG or JPEG image");
  std::mt19937 rng(7);
  std::string random(1000, '\0');
  for (char& c : random) c = static_cast<char>(rng());
  random[0] = 'x';
  ExpectInvalid(random, "not a PNG or JPEG image");
}

TEST(ImageDecodeTest, EveryTruncationIsAnErrorOrAnImage) {
  for (const char* file : {"rgb_48x40.png", "photo_56x40.jpg", "palette_36x36.png"}) {
    SCOPED_TRACE(file);
    const std::string bytes = ReadFileOrDie(std::string(testing::kFixtureDir) + "/images/" + file);
    int errors = 0;
    for (size_t n = 0; n < bytes.size(); ++n) {
      auto decoded = DecodeImage(absl::string_view(bytes.data(), n));
      if (decoded.ok()) {
        EXPECT_EQ(decoded->pixels.size(), size_t(decoded->width) * decoded->height * 3) << n;
      } else {
        ++errors;
        EXPECT_EQ(decoded.status().code(), absl::StatusCode::kInvalidArgument)
            << n << ": " << decoded.status();
      }
    }
    // Only a missing tail after the image data (PNG IEND, JPEG EOI) may still decode.
    EXPECT_GE(errors, int(bytes.size()) - 16);
  }
  ExpectInvalid(
      ReadFileOrDie(std::string(testing::kFixtureDir) + "/images/rgb_48x40.png").substr(0, 200),
      "truncated PNG data");
  ExpectInvalid(
      ReadFileOrDie(std::string(testing::kFixtureDir) + "/images/photo_56x40.jpg").substr(0, 600),
      "JPEG");
}

TEST(ImageDecodeTest, CorruptedBytesNeverCrash) {
  const std::string png =
      ReadFileOrDie(std::string(testing::kFixtureDir) + "/images/rgba_33x35.png");
  const std::string jpg =
      ReadFileOrDie(std::string(testing::kFixtureDir) + "/images/grey_35x30.jpg");
  std::mt19937 rng(11);
  for (const std::string* original : {&png, &jpg}) {
    for (int trial = 0; trial < 300; ++trial) {
      std::string bytes = *original;
      for (int k = 0; k < 4; ++k) bytes[8 + rng() % (bytes.size() - 8)] = char(rng());
      auto decoded = DecodeImage(bytes);
      if (!decoded.ok()) {
        EXPECT_EQ(decoded.status().code(), absl::StatusCode::kInvalidArgument);
      }
    }
  }
}

TEST(ImageDecodeTest, HugeClaimedDimensionsAreRefusedBeforeAllocation) {
  // Only the signature and an IHDR claiming 100000x100000 RGBA (40 GB decoded), no image data:
  // the limit must be reported, not "truncated" and not an allocation failure.
  std::string png = EncodePng(1, 1, PNG_COLOR_TYPE_RGBA, 8, std::vector<uint8_t>(4, 0));
  auto put32 = [&](size_t at, uint32_t v) {
    png[at] = char(v >> 24);
    png[at + 1] = char(v >> 16);
    png[at + 2] = char(v >> 8);
    png[at + 3] = char(v);
  };
  put32(16, 100000);
  put32(20, 100000);
  ExpectInvalid(png, "image of 100000x100000 pixels exceeds the limit of 36000000");
  ExpectInvalid(png.substr(0, 33), "image of 100000x100000 pixels exceeds the limit of 36000000");

  // A real image above a small pixel limit, PNG and JPEG.
  ImageLimits small;
  small.max_pixels = 1000;
  ExpectInvalid(ReadFileOrDie(std::string(testing::kFixtureDir) + "/images/rgb_48x40.png"),
                "image of 48x40 pixels exceeds the limit of 1000", small);
  ExpectInvalid(ReadFileOrDie(std::string(testing::kFixtureDir) + "/images/photo_56x40.jpg"),
                "image of 56x40 pixels exceeds the limit of 1000", small);
}

TEST(ImageDecodeTest, MaxBytes) {
  const std::string png =
      ReadFileOrDie(std::string(testing::kFixtureDir) + "/images/rgb_32x32.png");
  ImageLimits limits;
  limits.max_bytes = int64_t(png.size()) - 1;
  ExpectInvalid(png, "bytes exceeds the limit of", limits);
  limits.max_bytes = int64_t(png.size());
  EXPECT_TRUE(DecodeImage(png, limits).ok());
}

TEST(ImageDecodeTest, SniffsByContent) {
  EXPECT_EQ(SniffImageFormat("\x89PNG\r\n\x1a\n"), ImageFormat::kPng);
  EXPECT_EQ(SniffImageFormat("\xFF\xD8\xFF\xE0"), ImageFormat::kJpeg);
  EXPECT_EQ(SniffImageFormat("\xFF\xD8"), ImageFormat::kUnknown);
  EXPECT_EQ(SniffImageFormat("GIF8"), ImageFormat::kUnknown);
}

}  // namespace
}  // namespace deepinfer::engine::vision
