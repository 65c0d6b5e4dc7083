// Images through the cluster, as real processes on loopback: router + vision encoder node +
// prefill node + decode node (and a colocated variant) serving the tiny LLaVA-style fixture
// (engine/testdata/vision/llava):
//   * an image+text Chat returns the greedy tokens transformers generates for the same prompt
//     and images (reference.json; engine/llm_engine_vision_test.cc shows the single-process
//     engine produces the same), with the prompt expanded exactly as LlavaProcessor does;
//   * the same image again is an embedding-cache hit on the encoder (usage.cached_images) and a
//     prefix-cache hit covering the image on the workers (usage.cached_prompt_tokens);
//   * the same text with another image does not reuse the first image's KV, and its answer (first
//     token's logprob included) is transformers' for that image;
//   * malformed, truncated and unsupported images get INVALID_ARGUMENT naming the part, and the
//     cluster keeps serving; no KV block stays in use afterwards.
#include <cmath>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "deploy/local/local_cluster.h"
#include "engine/safetensors.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "proto/deepinfer/v1/inference.grpc.pb.h"
#include "tests/cluster_test_util.h"

namespace deepinfer {
namespace {

constexpr char kVisionModel[] = "engine/testdata/vision/llava";

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct ChatResult {
  grpc::Status status;
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;  // of each sampled token
  v1::Usage usage;
};

// log_softmax of the last row of reference tensor prompt<p>.logits at `token`: the first
// generated token's logprob as transformers computes it.
double ReferenceFirstLogprob(const engine::SafetensorsFile& ref, int p, int token) {
  const engine::TensorView* logits = ref.Find(absl::StrCat("prompt", p, ".logits"));
  if (logits == nullptr) return 0;
  const int64_t vocab = logits->shape[1];
  const float* row = static_cast<const float*>(logits->data) + (logits->shape[0] - 1) * vocab;
  double max = row[0];
  for (int64_t i = 1; i < vocab; ++i) max = std::max(max, static_cast<double>(row[i]));
  double sum = 0;
  for (int64_t i = 0; i < vocab; ++i) sum += std::exp(row[i] - max);
  return row[token] - max - std::log(sum);
}

// The fixture's prompt `index` as a Chat request (images attached as bytes, or as a data URL).
v1::ChatRequest FixtureChat(const nlohmann::json& prompt, bool as_data_url,
                            const std::string& replace_first_image = "") {
  v1::ChatRequest req;
  int image = 0;
  for (const auto& message : prompt["messages"]) {
    v1::ChatMessage* m = req.add_messages();
    m->set_role(message["role"].get<std::string>());
    for (const auto& part : message["content"]) {
      if (part["type"] == "text") {
        m->add_content()->set_text(part["text"].get<std::string>());
        continue;
      }
      std::string file = prompt["images"][image].get<std::string>();
      if (image == 0 && !replace_first_image.empty()) file = replace_first_image;
      ++image;
      const std::string bytes = ReadFile(std::string(kVisionModel) + "/images/" + file);
      v1::ImagePart* part_image = m->add_content()->mutable_image();
      if (as_data_url) {
        const bool png = file.size() > 4 && file.substr(file.size() - 4) == ".png";
        part_image->set_url(absl::StrCat("data:image/", png ? "png" : "jpeg", ";base64,",
                                         absl::Base64Escape(bytes)));
      } else {
        part_image->set_data(bytes);
      }
    }
  }
  req.mutable_sampling()->set_temperature(0);
  req.mutable_sampling()->set_max_tokens(static_cast<int>(prompt["greedy"].size()));
  req.mutable_sampling()->set_ignore_eos(true);
  req.mutable_sampling()->set_return_logprobs(true);
  return req;
}

ChatResult RunChat(v1::Inference::Stub& stub, const v1::ChatRequest& req) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  auto reader = stub.Chat(&ctx, req);
  ChatResult out;
  v1::ChatChunk chunk;
  while (reader->Read(&chunk)) {
    for (uint32_t t : chunk.token_ids()) out.tokens.push_back(static_cast<int32_t>(t));
    for (const v1::TokenLogprob& l : chunk.logprobs()) out.logprobs.push_back(l.logprob());
    if (chunk.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) out.usage = chunk.usage();
  }
  out.status = reader->Finish();
  return out;
}

class ClusterVisionTest : public ::testing::TestWithParam<bool /*colocated*/> {
 protected:
  void SetUp() override {
    std::ifstream in(std::string(kVisionModel) + "/reference.json");
    reference_ = nlohmann::json::parse(in);
    const bool colocated = GetParam();
    deploy::LocalClusterConfig config = testutil::ClusterConfig(
        colocated ? "vision_colocated" : "vision_disaggregated", colocated ? 0 : 1, 1, colocated);
    config.model_dir = kVisionModel;
    config.num_encoders = 1;
    auto cluster = deploy::LocalCluster::Start(config);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = *std::move(cluster);
    stub_ = v1::Inference::NewStub(
        grpc::CreateChannel(cluster_->router_address(), grpc::InsecureChannelCredentials()));
  }
  void TearDown() override {
    if (cluster_ != nullptr) EXPECT_TRUE(cluster_->Stop(absl::Seconds(20)).ok());
  }

  nlohmann::json reference_;
  std::unique_ptr<deploy::LocalCluster> cluster_;
  std::unique_ptr<v1::Inference::Stub> stub_;
};

TEST_P(ClusterVisionTest, ImageChatMatchesTransformersAndRepeatsHitBothCaches) {
  // ListModels says images are served once the encoder registered.
  {
    grpc::ClientContext ctx;
    v1::ListModelsResponse models;
    ASSERT_TRUE(stub_->ListModels(&ctx, v1::ListModelsRequest(), &models).ok());
    ASSERT_EQ(models.models_size(), 1);
    EXPECT_TRUE(models.models(0).supports_images());
  }
  for (size_t p = 0; p < 2; ++p) {  // prompt 2 (prompt 0 with another image) comes after
    const nlohmann::json& prompt = reference_["prompts"][p];
    const std::vector<int32_t> want = prompt["greedy"].get<std::vector<int32_t>>();
    const size_t images = prompt["images"].size();
    ChatResult first = RunChat(*stub_, FixtureChat(prompt, /*as_data_url=*/p == 1));
    ASSERT_TRUE(first.status.ok()) << first.status.error_message();
    EXPECT_EQ(first.tokens, want) << "prompt " << p;
    EXPECT_EQ(first.usage.prompt_tokens(), prompt["input_ids"].size()) << "prompt " << p;
    EXPECT_EQ(first.usage.images(), images);
    EXPECT_EQ(first.usage.cached_images(), 0u);

    ChatResult again = RunChat(*stub_, FixtureChat(prompt, /*as_data_url=*/false));
    ASSERT_TRUE(again.status.ok()) << again.status.error_message();
    EXPECT_EQ(again.tokens, want) << "prompt " << p;
    EXPECT_EQ(again.usage.cached_images(), images) << "prompt " << p;
    // The prefix cache covers the whole prompt but its last partial block: the image runs
    // included.
    const int64_t prompt_tokens = static_cast<int64_t>(prompt["input_ids"].size());
    EXPECT_GE(again.usage.cached_prompt_tokens(), (prompt_tokens - 1) / 4 * 4 - 4)
        << "prompt " << p;
  }

  // Prompt 2 is prompt 0's text with another image: the KV before the image is reused, the
  // image's is not, and the answer is the other image's. This tiny random model happens to pick
  // the same greedy tokens for both images, so the first token's logprob tells them apart.
  const nlohmann::json& prompt0 = reference_["prompts"][0];
  const nlohmann::json& prompt2 = reference_["prompts"][2];
  int64_t first_image = 0;
  const auto ids = prompt0["input_ids"].get<std::vector<int64_t>>();
  while (ids[first_image] != reference_["image_token_id"].get<int64_t>()) ++first_image;
  ChatResult image0 = RunChat(*stub_, FixtureChat(prompt0, false));
  ChatResult image2 = RunChat(*stub_, FixtureChat(prompt2, false));
  ASSERT_TRUE(image0.status.ok() && image2.status.ok()) << image2.status.error_message();
  EXPECT_EQ(image2.tokens, prompt2["greedy"].get<std::vector<int32_t>>());
  EXPECT_EQ(image2.usage.cached_images(), 0u);
  EXPECT_LE(image2.usage.cached_prompt_tokens(), first_image);
  ASSERT_FALSE(image0.logprobs.empty());
  ASSERT_FALSE(image2.logprobs.empty());
  auto ref = engine::SafetensorsFile::Open(std::string(kVisionModel) + "/reference.safetensors");
  ASSERT_TRUE(ref.ok()) << ref.status();
  const double want0 = ReferenceFirstLogprob(**ref, 0, image0.tokens[0]);
  const double want2 = ReferenceFirstLogprob(**ref, 2, image2.tokens[0]);
  ASSERT_GT(std::fabs(want0 - want2), 1e-2) << "the fixture no longer separates the images";
  EXPECT_NEAR(image0.logprobs[0], want0, 1e-3);
  EXPECT_NEAR(image2.logprobs[0], want2, 1e-3);

  ASSERT_TRUE(testutil::WaitNoBlocksInUse(*cluster_, absl::Seconds(20)).ok());
}

TEST_P(ClusterVisionTest, BadImagesAreInvalidArgumentNamingThePart) {
  const nlohmann::json& prompt0 = reference_["prompts"][0];
  const std::string png = ReadFile(std::string(kVisionModel) + "/images/rgb_32x32.png");
  struct Case {
    std::string name;
    std::function<void(v1::ImagePart*)> set;
  };
  const std::vector<Case> cases = {
      {"truncated png", [&](v1::ImagePart* i) { i->set_data(png.substr(0, png.size() - 20)); }},
      {"garbage", [](v1::ImagePart* i) { i->set_data(std::string(300, '\x42')); }},
      {"gif", [](v1::ImagePart* i) { i->set_data("GIF89a\x01\x00\x01\x00\x00\x00\x00;"); }},
      {"empty", [](v1::ImagePart* i) { i->set_data(""); }},
      {"bad base64", [](v1::ImagePart* i) { i->set_url("data:image/png;base64,!!!notbase64"); }},
      {"http url", [](v1::ImagePart* i) { i->set_url("http://example.com/cat.png"); }},
  };
  for (const Case& c : cases) {
    v1::ChatRequest req = FixtureChat(prompt0, false);
    c.set(req.mutable_messages(0)->mutable_content(0)->mutable_image());
    ChatResult r = RunChat(*stub_, req);
    EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.name;
    EXPECT_EQ(r.status.error_message().rfind("messages[0].content[0].image", 0), 0u)
        << c.name << ": " << r.status.error_message();
  }
  // Still serving, with the right answer.
  ChatResult ok = RunChat(*stub_, FixtureChat(prompt0, false));
  ASSERT_TRUE(ok.status.ok()) << ok.status.error_message();
  EXPECT_EQ(ok.tokens, prompt0["greedy"].get<std::vector<int32_t>>());
  ASSERT_TRUE(testutil::WaitNoBlocksInUse(*cluster_, absl::Seconds(20)).ok());
}

INSTANTIATE_TEST_SUITE_P(Modes, ClusterVisionTest, ::testing::Values(false, true),
                         [](const auto& info) {
                           return info.param ? "Colocated" : "Disaggregated";
                         });

}  // namespace
}  // namespace deepinfer
