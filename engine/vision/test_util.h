// Test helpers for the vision fixture (engine/testdata/vision/llava): file reading and the
// reference tensors written by tools/fixtures/make_vision_fixtures.py.
#ifndef DEEPINFER_ENGINE_VISION_TEST_UTIL_H_
#define DEEPINFER_ENGINE_VISION_TEST_UTIL_H_

#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "engine/safetensors.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace deepinfer::engine::vision::testing {

inline constexpr char kFixtureDir[] = "engine/testdata/vision/llava";

inline std::string ReadFileOrDie(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << path;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct FixtureImage {
  std::string file;    // under images/
  std::string prefix;  // tensor name prefix in reference.safetensors
  std::string mode;    // PIL mode of the source image
};

inline std::vector<FixtureImage> FixtureImages() {
  const auto ref =
      nlohmann::json::parse(ReadFileOrDie(std::string(kFixtureDir) + "/reference.json"));
  std::vector<FixtureImage> images;
  for (const auto& img : ref.at("images")) {
    images.push_back({img.at("file").get<std::string>(), img.at("tensor_prefix").get<std::string>(),
                      img.at("mode").get<std::string>()});
  }
  return images;
}

inline std::string ImagePath(const FixtureImage& image) {
  return std::string(kFixtureDir) + "/images/" + image.file;
}

// Opens reference.safetensors; tensors stay valid while the returned file lives.
inline std::unique_ptr<SafetensorsFile> OpenReference() {
  auto file = SafetensorsFile::Open(std::string(kFixtureDir) + "/reference.safetensors");
  EXPECT_TRUE(file.ok()) << file.status();
  return file.ok() ? std::move(*file) : nullptr;
}

inline std::vector<float> F32Tensor(const SafetensorsFile& file, const std::string& name) {
  const TensorView* t = file.Find(name);
  EXPECT_NE(t, nullptr) << name;
  if (t == nullptr) return {};
  EXPECT_EQ(t->dtype, StDType::kF32) << name;
  std::vector<float> out(t->numel());
  std::memcpy(out.data(), t->data, out.size() * sizeof(float));
  return out;
}

inline std::vector<uint8_t> U8Tensor(const SafetensorsFile& file, const std::string& name) {
  const TensorView* t = file.Find(name);
  EXPECT_NE(t, nullptr) << name;
  if (t == nullptr) return {};
  EXPECT_EQ(t->dtype, StDType::kU8) << name;
  const auto* p = static_cast<const uint8_t*>(t->data);
  return std::vector<uint8_t>(p, p + t->numel());
}

}  // namespace deepinfer::engine::vision::testing

#endif  // DEEPINFER_ENGINE_VISION_TEST_UTIL_H_
