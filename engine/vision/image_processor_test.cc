#include "engine/vision/image_processor.h"

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "engine/vision/image_decode.h"
#include "engine/vision/test_util.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace deepinfer::engine::vision {
namespace {

using testing::FixtureImages;
using testing::ImagePath;
using testing::kFixtureDir;
using testing::ReadFileOrDie;

TEST(ImageProcessorConfigTest, LoadsFixtureProcessorConfig) {
  auto config = LoadImageProcessorConfig(kFixtureDir);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(config->do_resize);
  EXPECT_EQ(config->shortest_edge, 32);
  EXPECT_EQ(config->resample, kResampleBicubic);
  EXPECT_TRUE(config->do_center_crop);
  EXPECT_EQ(config->crop_height, 32);
  EXPECT_EQ(config->crop_width, 32);
  EXPECT_DOUBLE_EQ(config->rescale_factor, 1.0 / 255.0);
  EXPECT_DOUBLE_EQ(config->image_mean[0], 0.48145466);
  EXPECT_DOUBLE_EQ(config->image_std[2], 0.27577711);
  EXPECT_TRUE(config->do_convert_rgb);
}

// The older layout (llava-hf/llava-1.5-7b-hf preprocessor_config.json).
TEST(ImageProcessorConfigTest, ParsesOlderPreprocessorLayout) {
  const auto j = nlohmann::json::parse(R"({
    "crop_size": {"height": 336, "width": 336}, "do_center_crop": true, "do_convert_rgb": true,
    "do_normalize": true, "do_rescale": true, "do_resize": true,
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_processor_type": "CLIPImageProcessor",
    "image_std": [0.26862954, 0.26130258, 0.27577711], "processor_class": "LlavaProcessor",
    "resample": 3, "rescale_factor": 0.00392156862745098, "size": {"shortest_edge": 336}})");
  auto config = ParseImageProcessorConfig(j, "preprocessor_config.json");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->shortest_edge, 336);
  EXPECT_EQ(config->crop_height, 336);
  const auto ints = nlohmann::json::parse(R"({"size": 224, "crop_size": 224,
    "feature_extractor_type": "CLIPFeatureExtractor", "resample": 2})");
  config = ParseImageProcessorConfig(ints, "x");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->shortest_edge, 224);
  EXPECT_EQ(config->crop_width, 224);
  EXPECT_EQ(config->resample, kResampleBilinear);
  config = ParseImageProcessorConfig(
      nlohmann::json::parse(R"({"size": {"height": 20, "width": 30}})"), "x");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->shortest_edge, 0);
  EXPECT_EQ(config->resize_height, 20);
  EXPECT_EQ(config->resize_width, 30);
}

TEST(ImageProcessorConfigTest, UnsupportedSettingsNameTheKey) {
  struct Case {
    const char* json;
    const char* key;
  };
  for (const Case& c : std::vector<Case>{
           {R"({"resample": 1})", "resample"},
           {R"({"image_processor_type": "SiglipImageProcessor"})", "image_processor_type"},
           {R"({"do_pad": true})", "do_pad"},
           {R"({"crop_pct": 0.9})", "crop_pct"},
           {R"({"size": {"longest_edge": 10}})", "size.longest_edge"},
           {R"({"size": {"height": 10}})", "size"},
           {R"({"image_mean": [0.5, 0.5]})", "image_mean"},
           {R"({"image_std": [0.5, 0.0, 0.5]})", "image_std"},
           {R"({"do_resize": "yes"})", "do_resize"},
           {R"({"crop_size": {"height": 0, "width": 3}})", "crop_size.height"},
           {R"({"frobnicate": 1})", "frobnicate"},
       }) {
    auto config = ParseImageProcessorConfig(nlohmann::json::parse(c.json), "cfg.json");
    ASSERT_FALSE(config.ok()) << c.json;
    EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StrContains(config.status().message(), std::string("cfg.json: ") + c.key))
        << config.status();
  }
}

TEST(ImageProcessorConfigTest, MissingFilesAreNotFound) {
  auto config = LoadImageProcessorConfig("engine/testdata/no_such_dir");
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kNotFound);
}

// Every fixture image through decode + preprocess against transformers' CLIPImageProcessorPil.
// PIL's integer resampling is reproduced exactly, so the only freedom left is float rounding in
// rescale/normalise, which is done in the same order and precision: the values must be equal.
TEST(ImageProcessorTest, MatchesTransformersPixelValues) {
  auto config = LoadImageProcessorConfig(kFixtureDir);
  ASSERT_TRUE(config.ok()) << config.status();
  auto ref = testing::OpenReference();
  ASSERT_NE(ref, nullptr);
  for (const auto& image : FixtureImages()) {
    SCOPED_TRACE(image.file);
    auto decoded = DecodeImage(ReadFileOrDie(ImagePath(image)));
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    const std::vector<float> pixels = Preprocess(*decoded, *config);
    const std::vector<float> expected = testing::F32Tensor(*ref, image.prefix + ".pixel_values");
    ASSERT_EQ(pixels.size(), expected.size());
    float max_diff = 0;
    int mismatches = 0;
    for (size_t i = 0; i < expected.size(); ++i) {
      const float d = std::fabs(pixels[i] - expected[i]);
      max_diff = std::max(max_diff, d);
      mismatches += d != 0;
    }
    std::printf("%s: max abs diff %g, %d of %zu values differ\n", image.file.c_str(), max_diff,
                mismatches, expected.size());
    EXPECT_EQ(max_diff, 0.0f);
  }
}

TEST(ImageProcessorTest, OutputSizeAndPaddingWithoutResize) {
  ImageProcessorConfig config;
  config.do_resize = false;
  config.crop_height = 4;
  config.crop_width = 5;
  config.do_normalize = false;
  config.do_rescale = false;
  RgbImage image;
  image.width = 2;
  image.height = 7;
  for (int i = 0; i < 14; ++i) image.pixels.insert(image.pixels.end(), {uint8_t(i + 1), 0, 0});
  const std::vector<float> out = Preprocess(image, config);
  ASSERT_EQ(out.size(), 3u * 4 * 5);
  // Rows: top = (7 - 4) / 2 = 1. Columns: padded by ceil(3 / 2) = 2 on the left.
  for (int y = 0; y < 4; ++y) {
    for (int x = 0; x < 5; ++x) {
      const float expected = (x == 2 || x == 3) ? float((y + 1) * 2 + (x - 2) + 1) : 0.0f;
      EXPECT_EQ(out[y * 5 + x], expected) << y << "," << x;
    }
  }
  EXPECT_EQ(PreprocessedSize(2, 7, config), std::make_pair(4, 5));
  config.do_center_crop = false;
  config.do_resize = true;
  config.shortest_edge = 10;
  EXPECT_EQ(PreprocessedSize(20, 30, config), std::make_pair(15, 10));
  EXPECT_EQ(PreprocessedSize(33, 7, config), std::make_pair(10, 47));  // int(330 / 7)
}

// Pillow 13.0's Image.resize(..., BILINEAR) of a 7x5 RGB ramp (value (i * 37) mod 256 for the
// i-th byte), down to 4x3 and up to 11x9: recorded with the tools/fixtures venv.
TEST(ImageProcessorTest, BilinearResizeMatchesPil) {
  std::vector<uint8_t> pixels(7 * 5 * 3);
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = uint8_t(i * 37 % 256);
  const std::vector<uint8_t> down = {62, 87,  124, 163, 67, 104, 132, 169, 73,  112, 149, 174,
                                     76, 101, 138, 177, 81, 118, 146, 183, 87,  126, 163, 188,
                                     83, 115, 152, 115, 95, 132, 160, 121, 101, 140, 170, 126};
  const std::vector<uint8_t> up = {
      0,   37,  74,  50,  87,  124, 121, 135, 172, 192, 43,  80,  169, 43,  80,  77,  114, 151, 148,
      185, 59,  148, 185, 36,  56,  93,  107, 104, 141, 178, 154, 191, 228, 3,   40,  77,  53,  90,
      127, 124, 138, 175, 195, 46,  83,  172, 46,  83,  80,  117, 154, 151, 188, 62,  151, 188, 39,
      59,  96,  110, 107, 144, 181, 157, 194, 231, 8,   45,  82,  58,  95,  132, 129, 143, 180, 200,
      51,  88,  177, 51,  88,  85,  122, 159, 156, 193, 67,  156, 193, 44,  64,  101, 115, 112, 149,
      186, 162, 199, 236, 13,  50,  87,  63,  100, 137, 134, 148, 185, 205, 56,  93,  182, 56,  93,
      90,  127, 164, 161, 198, 72,  161, 198, 49,  69,  106, 120, 117, 154, 191, 167, 204, 241, 18,
      55,  92,  68,  105, 142, 139, 153, 190, 210, 61,  98,  187, 61,  98,  95,  132, 169, 166, 203,
      77,  166, 203, 54,  74,  111, 125, 122, 159, 196, 172, 209, 246, 23,  60,  97,  73,  110, 147,
      144, 158, 195, 215, 66,  103, 192, 66,  103, 100, 137, 174, 171, 208, 82,  171, 208, 59,  79,
      116, 130, 127, 164, 201, 177, 214, 251, 28,  65,  102, 78,  115, 152, 146, 163, 200, 199, 71,
      108, 179, 71,  108, 105, 142, 179, 176, 195, 87,  176, 192, 64,  84,  118, 135, 132, 169, 190,
      182, 219, 228, 33,  70,  107, 83,  120, 157, 139, 168, 205, 101, 76,  113, 93,  76,  113, 110,
      147, 184, 181, 109, 92,  181, 94,  69,  89,  111, 140, 137, 174, 118, 187, 224, 90,  36,  73,
      110, 86,  123, 160, 134, 171, 208, 42,  79,  116, 42,  79,  116, 113, 150, 187, 184, 58,  95,
      184, 35,  72,  92,  106, 143, 140, 177, 74,  190, 227, 8};
  EXPECT_EQ(ResizeRgb(pixels, 7, 5, 4, 3, kResampleBilinear), down);
  EXPECT_EQ(ResizeRgb(pixels, 7, 5, 11, 9, kResampleBilinear), up);
}

TEST(ImageProcessorTest, ResizeKeepsConstantImagesConstant) {
  for (int resample : {kResampleBilinear, kResampleBicubic}) {
    std::vector<uint8_t> pixels(13 * 9 * 3);
    for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = (i % 3) * 100 + 7;
    for (auto [w, h] : {std::pair{5, 4}, std::pair{40, 31}, std::pair{13, 20}}) {
      const std::vector<uint8_t> out = ResizeRgb(pixels, 13, 9, w, h, resample);
      ASSERT_EQ(out.size(), size_t(w) * h * 3);
      for (size_t i = 0; i < out.size(); ++i) ASSERT_EQ(out[i], (i % 3) * 100 + 7) << i;
    }
  }
}

}  // namespace
}  // namespace deepinfer::engine::vision
