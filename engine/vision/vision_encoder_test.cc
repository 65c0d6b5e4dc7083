#include "engine/vision/vision_encoder.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "engine/vision/image_processor.h"
#include "engine/vision/test_util.h"
#include "gtest/gtest.h"

namespace deepinfer::engine::vision {
namespace {

using testing::FixtureImages;
using testing::ImagePath;
using testing::kFixtureDir;
using testing::ReadFileOrDie;

// f32 weights and f32 math; transformers' reference ran in f32 too, so differences are
// summation order only. Measured (printed): max abs diff <= 3e-6 for features and embeddings.
constexpr float kTolerance = 2e-5f;

float MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  float m = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

std::unique_ptr<VisionEncoder> LoadFixture() {
  VisionEncoderOptions options;
  options.num_threads = 2;
  auto encoder = VisionEncoder::Load(kFixtureDir, options);
  EXPECT_TRUE(encoder.ok()) << encoder.status();
  return encoder.ok() ? std::move(*encoder) : nullptr;
}

TEST(VisionEncoderTest, LoadsFixtureShape) {
  auto encoder = LoadFixture();
  ASSERT_NE(encoder, nullptr);
  EXPECT_EQ(encoder->num_image_tokens(), 16);
  EXPECT_EQ(encoder->output_hidden_size(), 64);
  EXPECT_EQ(encoder->image_token_id(), 768);
  EXPECT_EQ(encoder->image_size(), 32);
  EXPECT_EQ(encoder->tower_config().hidden_size, 32);
  EXPECT_EQ(encoder->tower_config().hidden_act, "quick_gelu");
}

TEST(VisionEncoderTest, FeaturesAndEmbeddingsMatchTransformers) {
  auto encoder = LoadFixture();
  ASSERT_NE(encoder, nullptr);
  auto ref = testing::OpenReference();
  ASSERT_NE(ref, nullptr);
  for (const auto& image : FixtureImages()) {
    SCOPED_TRACE(image.file);
    const std::vector<float> pixels = testing::F32Tensor(*ref, image.prefix + ".pixel_values");
    auto features = encoder->Features(pixels);
    ASSERT_TRUE(features.ok()) << features.status();
    const float feature_diff =
        MaxAbsDiff(*features, testing::F32Tensor(*ref, image.prefix + ".features"));
    auto embeddings = encoder->EncodePixels(pixels);
    ASSERT_TRUE(embeddings.ok()) << embeddings.status();
    ASSERT_EQ(embeddings->size(), 16u * 64);
    const float embedding_diff =
        MaxAbsDiff(*embeddings, testing::F32Tensor(*ref, image.prefix + ".embeddings"));
    std::printf("%s: features max abs diff %g, embeddings max abs diff %g\n", image.file.c_str(),
                feature_diff, embedding_diff);
    EXPECT_LE(feature_diff, kTolerance);
    EXPECT_LE(embedding_diff, kTolerance);
  }
}

TEST(VisionEncoderTest, EncodeImageEndToEnd) {
  auto encoder = LoadFixture();
  ASSERT_NE(encoder, nullptr);
  auto ref = testing::OpenReference();
  ASSERT_NE(ref, nullptr);
  for (const auto& image : FixtureImages()) {
    SCOPED_TRACE(image.file);
    auto embeddings = encoder->EncodeImage(ReadFileOrDie(ImagePath(image)));
    ASSERT_TRUE(embeddings.ok()) << embeddings.status();
    const float diff =
        MaxAbsDiff(*embeddings, testing::F32Tensor(*ref, image.prefix + ".embeddings"));
    std::printf("%s: end-to-end embeddings max abs diff %g\n", image.file.c_str(), diff);
    EXPECT_LE(diff, kTolerance);
  }
}

TEST(VisionEncoderTest, ConcurrentEncodesAgree) {
  auto encoder = LoadFixture();
  ASSERT_NE(encoder, nullptr);
  const std::string bytes = ReadFileOrDie(std::string(kFixtureDir) + "/images/rgb_48x40.png");
  auto expected = encoder->EncodeImage(bytes);
  ASSERT_TRUE(expected.ok());
  std::vector<std::thread> threads;
  std::vector<std::vector<float>> results(4);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      auto r = encoder->EncodeImage(bytes);
      if (r.ok()) results[t] = std::move(*r);
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& r : results) EXPECT_EQ(r, *expected);
}

TEST(VisionEncoderTest, BadInputsAreInvalidArgument) {
  auto encoder = LoadFixture();
  ASSERT_NE(encoder, nullptr);
  auto r = encoder->EncodeImage("GIF89a");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(), "not a PNG or JPEG image");
  r = encoder->EncodePixels(std::vector<float>(10));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(r.status().message(), "3x32x32")) << r.status();
}

// A copy of the fixture directory with one file rewritten, for error-path tests.
class BrokenFixture {
 public:
  explicit BrokenFixture(const std::string& name) {
    dir_ = std::string(std::getenv("TEST_TMPDIR")) + "/" + name;
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    for (const char* f : {"config.json", "model.safetensors", "processor_config.json"}) {
      std::filesystem::copy_file(std::string(kFixtureDir) + "/" + f, dir_ + "/" + f);
    }
  }
  void Write(const std::string& file, const std::string& text) {
    std::ofstream(dir_ + "/" + file, std::ios::binary | std::ios::trunc) << text;
  }
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
};

void ExpectLoadError(const std::string& dir, const std::string& part) {
  auto encoder = VisionEncoder::Load(dir);
  ASSERT_FALSE(encoder.ok()) << part;
  EXPECT_TRUE(absl::StrContains(encoder.status().message(), part)) << encoder.status();
}

TEST(VisionEncoderTest, ConfigErrorsNameTheKey) {
  const std::string config = ReadFileOrDie(std::string(kFixtureDir) + "/config.json");
  struct Case {
    std::string from, to, message;
  };
  for (const Case& c : std::vector<Case>{
           {"\"model_type\": \"llava\"", "\"model_type\": \"qwen2\"", "config.json: model_type"},
           {"\"clip_vision_model\"", "\"vit\"", "vision_config.model_type"},
           {"\"vision_feature_layer\": -2", "\"vision_feature_layer\": -9", "vision_feature_layer"},
           {"\"vision_feature_layer\": -2", "\"vision_feature_layer\": [-2, -1]",
            "vision_feature_layer"},
           {"\"vision_feature_select_strategy\": \"default\"",
            "\"vision_feature_select_strategy\": \"cls\"", "vision_feature_select_strategy"},
           {"\"projector_hidden_act\": \"gelu\"", "\"projector_hidden_act\": \"relu\"",
            "projector_hidden_act"},
           {"\"hidden_act\": \"quick_gelu\"", "\"hidden_act\": \"swish\"",
            "vision_config.hidden_act"},
           {"\"patch_size\": 8", "\"patch_size\": 16", "embeddings.patch_embedding.weight"},
       }) {
    BrokenFixture fixture("config_error");
    std::string text = config;
    const size_t at = text.find(c.from);
    ASSERT_NE(at, std::string::npos) << c.from;
    text.replace(at, c.from.size(), c.to);
    fixture.Write("config.json", text);
    ExpectLoadError(fixture.dir(), c.message);
  }
}

std::string OneTensorSafetensors(const std::string& name, int64_t rows, int64_t cols) {
  const std::string header = "{\"" + name + "\": {\"dtype\": \"F32\", \"shape\": [" +
                             std::to_string(rows) + ", " + std::to_string(cols) +
                             "], \"data_offsets\": [0, " + std::to_string(rows * cols * 4) + "]}}";
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = char((header.size() >> (8 * i)) & 0xff);
  return out + header + std::string(rows * cols * 4, '\0');
}

TEST(VisionEncoderTest, MissingTensorsAreNamed) {
  BrokenFixture fixture("missing_tensor");
  fixture.Write("model.safetensors", OneTensorSafetensors("unrelated.weight", 2, 2));
  ExpectLoadError(fixture.dir(), "multi_modal_projector.linear_1.weight");
  fixture.Write("model.safetensors",
                OneTensorSafetensors("multi_modal_projector.linear_1.weight", 64, 32));
  ExpectLoadError(fixture.dir(), "vision_tower.vision_model.embeddings.class_embedding");
}

}  // namespace
}  // namespace deepinfer::engine::vision
