#include "engine/safetensors.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "gtest/gtest.h"

namespace deepinfer::engine {
namespace {

namespace fs = std::filesystem;

std::string MakeFile(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + header + data;
}

std::string TempDir() {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string dir = std::string(base ? base : "/tmp") + "/st_" +
                    ::testing::UnitTest::GetInstance()->current_test_info()->name();
  fs::create_directories(dir);
  return dir;
}

void Write(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

TEST(ParseSafetensorsTest, ParsesDtypesShapesAndOffsets) {
  const std::string header =
      R"({"__metadata__":{"format":"pt"},)"
      R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("b":{"dtype":"BF16","shape":[1,3],"data_offsets":[8,14]},)"
      R"("empty":{"dtype":"F16","shape":[0,4],"data_offsets":[14,14]}})";
  std::string data(14, '\0');
  const float one = 1.0f, two = 2.0f;
  std::memcpy(&data[0], &one, 4);
  std::memcpy(&data[4], &two, 4);
  const std::string file = MakeFile(header, data);
  auto tensors = ParseSafetensors(file, "x.safetensors");
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  ASSERT_EQ(tensors->size(), 3u);
  for (const TensorView& t : *tensors) {
    if (t.name == "a") {
      EXPECT_EQ(t.dtype, StDType::kF32);
      EXPECT_EQ(static_cast<const float*>(t.data)[1], 2.0f);
      EXPECT_EQ(t.numel(), 2);
    } else if (t.name == "b") {
      EXPECT_EQ(t.dtype, StDType::kBF16);
      EXPECT_EQ(t.ShapeString(), "[1, 3]");
      EXPECT_EQ(t.nbytes, 6u);
    } else {
      EXPECT_EQ(t.name, "empty");
      EXPECT_EQ(t.numel(), 0);
    }
  }
}

struct BadCase {
  const char* label;
  std::string bytes;
  const char* expect;  // substring of the message
};

TEST(ParseSafetensorsTest, MalformedInputsGiveClearErrors) {
  const std::string ok_entry = R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  std::string huge_len(8, '\xff');
  const BadCase cases[] = {
      {"too short", "abc", "at least 8 bytes"},
      {"header beyond file", huge_len + "{}", "exceeds the file"},
      {"not json", MakeFile("{not json", ""), "not valid JSON"},
      {"not object", MakeFile("[1,2]", ""), "must be an object"},
      {"unknown dtype",
       MakeFile(R"({"a":{"dtype":"Q4","shape":[2],"data_offsets":[0,2]}})", std::string(2, 0)),
       "unknown dtype \"Q4\""},
      {"missing shape", MakeFile(R"({"a":{"dtype":"F32","data_offsets":[0,8]}})", std::string(8, 0)),
       "shape"},
      {"negative dim",
       MakeFile(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", std::string(8, 0)),
       "non-negative"},
      {"size mismatch",
       MakeFile(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", std::string(8, 0)),
       "needs 12 bytes"},
      {"out of bounds", MakeFile("{" + ok_entry + "}", std::string(4, 0)), "out of bounds"},
      {"reversed offsets",
       MakeFile(R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", std::string(8, 0)),
       "out of bounds"},
      {"overlap",
       MakeFile("{" + ok_entry + R"(,"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                std::string(8, 0)),
       "overlap"},
      {"bad offsets type",
       MakeFile(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":"0-8"}})", std::string(8, 0)),
       "data_offsets"},
  };
  for (const BadCase& c : cases) {
    auto r = ParseSafetensors(c.bytes, "bad.safetensors");
    ASSERT_FALSE(r.ok()) << c.label;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << c.label;
    EXPECT_NE(r.status().message().find("bad.safetensors"), absl::string_view::npos) << c.label;
    EXPECT_NE(r.status().message().find(c.expect), absl::string_view::npos)
        << c.label << ": " << r.status();
  }
}

TEST(CheckpointTest, SingleFileAndShapeChecks) {
  const std::string dir = TempDir();
  Write(dir + "/model.safetensors",
        MakeFile(R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}})", std::string(16, 0)));
  auto ckpt = Checkpoint::Open(dir);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ((*ckpt)->tensor_count(), 1u);
  EXPECT_TRUE((*ckpt)->Get("w", {2, 2}).ok());
  auto wrong = (*ckpt)->Get("w", {4});
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.status().message().find("has shape [2, 2], expected [4]"), absl::string_view::npos);
  auto missing = (*ckpt)->Get("nope", {1});
  EXPECT_NE(missing.status().message().find("missing tensor \"nope\""), absl::string_view::npos);
}

TEST(CheckpointTest, ShardedWithIndex) {
  const std::string dir = TempDir();
  Write(dir + "/model-00001-of-00002.safetensors",
        MakeFile(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", std::string(4, 0)));
  Write(dir + "/model-00002-of-00002.safetensors",
        MakeFile(R"({"b":{"dtype":"F16","shape":[2],"data_offsets":[0,4]}})", std::string(4, 0)));
  Write(dir + "/model.safetensors.index.json",
        R"({"metadata":{},"weight_map":{"a":"model-00001-of-00002.safetensors",)"
        R"("b":"model-00002-of-00002.safetensors"}})");
  auto ckpt = Checkpoint::Open(dir);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_NE((*ckpt)->Find("a"), nullptr);
  EXPECT_EQ((*ckpt)->Find("b")->dtype, StDType::kF16);
}

TEST(CheckpointTest, IndexNamingATensorItsShardLacks) {
  const std::string dir = TempDir();
  Write(dir + "/s1.safetensors",
        MakeFile(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", std::string(4, 0)));
  Write(dir + "/model.safetensors.index.json", R"({"weight_map":{"a":"s1.safetensors","z":"s1.safetensors"}})");
  auto ckpt = Checkpoint::Open(dir);
  ASSERT_FALSE(ckpt.ok());
  EXPECT_NE(ckpt.status().message().find("\"z\""), absl::string_view::npos) << ckpt.status();
}

TEST(CheckpointTest, DuplicateTensorAcrossShardsAndMissingDir) {
  const std::string dir = TempDir();
  const std::string f = MakeFile(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", std::string(4, 0));
  Write(dir + "/x.safetensors", f);
  Write(dir + "/y.safetensors", f);
  auto ckpt = Checkpoint::Open(dir);
  ASSERT_FALSE(ckpt.ok());
  EXPECT_NE(ckpt.status().message().find("appears in both"), absl::string_view::npos);
  EXPECT_EQ(Checkpoint::Open(dir + "/nonexistent").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace deepinfer::engine
