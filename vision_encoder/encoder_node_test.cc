// The vision encoder node over real gRPC (standalone, no router): embeddings equal transformers'
// for the fixture images, a repeated image is a cache hit, bad requests get INVALID_ARGUMENT
// naming the field and the node keeps serving.
#include "vision_encoder/encoder_node.h"

#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/metrics_test_util.h"
#include "common/sha256.h"
#include "engine/safetensors.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/deepinfer/internal/v1/encoder.grpc.pb.h"
#include "proto/deepinfer/internal/v1/worker.grpc.pb.h"

namespace deepinfer::vision_encoder {
namespace {

constexpr char kModel[] = "engine/testdata/vision/llava";

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class EncoderNodeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    EncoderNodeOptions o;
    o.model_path = kModel;
    o.worker_id = "encoder-test";
    o.threads = 1;
    o.cache_bytes = 1 << 20;
    o.metrics_listen = "127.0.0.1:0";
    absl::StatusOr<std::unique_ptr<EncoderNode>> node = EncoderNode::Create(o);
    ASSERT_TRUE(node.ok()) << node.status();
    node_ = *std::move(node);
    ASSERT_TRUE(node_->Start().ok());
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(64 << 20);
    channel_ = grpc::CreateCustomChannel(node_->address(), grpc::InsecureChannelCredentials(),
                                         args);
    stub_ = internal::v1::Encoder::NewStub(channel_);
    auto ref = engine::SafetensorsFile::Open(std::string(kModel) + "/reference.safetensors");
    ASSERT_TRUE(ref.ok()) << ref.status();
    reference_ = *std::move(ref);
  }

  void TearDown() override {
    if (node_ != nullptr) node_->Drain(absl::Seconds(1));
  }

  grpc::Status Encode(const internal::v1::EncodeRequest& request,
                      internal::v1::EncodeResponse* response) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    return stub_->Encode(&context, request, response);
  }

  // Max |got - reference| over the fixture's projected embeddings of `file`.
  double MaxDiff(const internal::v1::EmbeddingHandle& got, const std::string& file) {
    std::string key = file;
    for (char& c : key) c = c == '.' ? '_' : c;
    const engine::TensorView* want = reference_->Find(key + ".embeddings");
    EXPECT_NE(want, nullptr) << key;
    if (want == nullptr) return 1e9;
    EXPECT_EQ(got.data().size(), static_cast<size_t>(want->numel()) * sizeof(float));
    if (got.data().size() != static_cast<size_t>(want->numel()) * sizeof(float)) return 1e9;
    std::vector<float> values(static_cast<size_t>(want->numel()));
    std::memcpy(values.data(), got.data().data(), got.data().size());
    const float* w = static_cast<const float*>(want->data);
    double max_diff = 0;
    for (size_t i = 0; i < values.size(); ++i) {
      max_diff = std::max(max_diff, static_cast<double>(std::fabs(values[i] - w[i])));
    }
    return max_diff;
  }

  std::unique_ptr<EncoderNode> node_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<internal::v1::Encoder::Stub> stub_;
  std::unique_ptr<engine::SafetensorsFile> reference_;
};

TEST_F(EncoderNodeTest, EncodesLikeTransformersAndCachesRepeatedImages) {
  const std::vector<std::string> files = {"rgb_32x32.png", "photo_56x40.jpg", "rgba_33x35.png"};
  internal::v1::EncodeRequest request;
  request.set_request_id("r1");
  request.set_inline_data(true);
  for (const std::string& f : files) {
    const std::string bytes = ReadFile(std::string(kModel) + "/images/" + f);
    ASSERT_FALSE(bytes.empty()) << f;
    internal::v1::ImageInput* in = request.add_images();
    in->set_data(bytes);
    in->set_content_hash(Sha256(bytes));
  }
  internal::v1::EncodeResponse first;
  grpc::Status s = Encode(request, &first);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(first.embeddings_size(), 3);
  EXPECT_EQ(first.cache_hits(), 0u);
  for (int k = 0; k < 3; ++k) {
    const internal::v1::EmbeddingHandle& h = first.embeddings(k);
    EXPECT_EQ(h.num_tokens(), 16u);
    EXPECT_EQ(h.hidden_size(), 64u);
    EXPECT_EQ(h.dtype(), "f32");
    EXPECT_EQ(h.content_hash(), request.images(k).content_hash());
    EXPECT_LT(MaxDiff(h, files[k]), 2e-5) << files[k];
  }

  // The same images again (no hash given this time: the node computes it): all cached, same
  // embeddings.
  request.set_request_id("r2");
  for (auto& in : *request.mutable_images()) in.clear_content_hash();
  internal::v1::EncodeResponse second;
  ASSERT_TRUE(Encode(request, &second).ok());
  EXPECT_EQ(second.cache_hits(), 3u);
  for (int k = 0; k < 3; ++k) {
    EXPECT_EQ(second.embeddings(k).data(), first.embeddings(k).data());
  }

  // Kept for FetchEmbeddings: a handle without data, then fetched.
  request.set_request_id("r3");
  request.set_inline_data(false);
  internal::v1::EncodeResponse held;
  ASSERT_TRUE(Encode(request, &held).ok());
  EXPECT_TRUE(held.embeddings(0).data().empty());
  EXPECT_EQ(held.embeddings(0).encoder_id(), "encoder-test");
  internal::v1::FetchEmbeddingsRequest fetch;
  fetch.set_content_hash(held.embeddings(0).content_hash());
  internal::v1::EmbeddingHandle fetched;
  {
    grpc::ClientContext context;
    ASSERT_TRUE(stub_->FetchEmbeddings(&context, fetch, &fetched).ok());
  }
  EXPECT_EQ(fetched.data(), first.embeddings(0).data());
  fetch.set_content_hash(std::string(32, 'x'));
  {
    grpc::ClientContext context;
    EXPECT_EQ(stub_->FetchEmbeddings(&context, fetch, &fetched).error_code(),
              grpc::StatusCode::NOT_FOUND);
  }

  internal::v1::WorkerStats stats = node_->Stats();
  EXPECT_EQ(stats.images_encoded(), 3u);
  EXPECT_EQ(stats.embedding_cache_hits(), 6u);
  EXPECT_EQ(stats.embedding_cache_misses(), 3u);
  EXPECT_EQ(stats.embedding_cache_entries(), 3u);
  EXPECT_EQ(stats.embedding_cache_bytes(), 3u * 16 * 64 * 4);
  EXPECT_EQ(stats.requests_ok(), 3u);

  // The same figures on /metrics.
  ASSERT_GT(node_->metrics_port(), 0);
  absl::StatusOr<std::string> text = testutil::HttpGet(node_->metrics_port());
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(testutil::SampleValue(*text, "deepinfer_images_encoded_total").value_or(-1), 3);
  EXPECT_EQ(testutil::SampleValue(*text, "deepinfer_embedding_cache_hits_total").value_or(-1), 6);
  EXPECT_EQ(testutil::SampleValue(*text, "deepinfer_embedding_cache_misses_total").value_or(-1),
            3);
  EXPECT_EQ(testutil::SampleValue(*text, "deepinfer_embedding_cache_bytes").value_or(-1),
            3 * 16 * 64 * 4);
  EXPECT_EQ(
      testutil::SampleValue(*text, "deepinfer_requests_total{outcome=\"ok\"}").value_or(-1), 3);
  EXPECT_EQ(testutil::HttpGet(node_->metrics_port(), "/healthz").value_or(""), "ok\n");
}

TEST_F(EncoderNodeTest, BadRequestsNameTheFieldAndTheNodeKeepsServing) {
  const std::string png = ReadFile(std::string(kModel) + "/images/rgb_32x32.png");
  struct Case {
    std::string name;
    std::function<void(internal::v1::EncodeRequest*)> edit;
    std::string prefix;
  };
  const std::vector<Case> cases = {
      {"no id", [](internal::v1::EncodeRequest* r) { r->clear_request_id(); }, "request_id:"},
      {"no images", [](internal::v1::EncodeRequest* r) { r->clear_images(); }, "images: expected"},
      {"empty data",
       [](internal::v1::EncodeRequest* r) { r->mutable_images(0)->clear_data(); },
       "images[0].data: empty image"},
      {"garbage",
       [](internal::v1::EncodeRequest* r) {
         r->mutable_images(0)->set_data("GIF89a garbage bytes");
         r->mutable_images(0)->clear_content_hash();
       },
       "images[0].data: "},
      {"truncated",
       [&](internal::v1::EncodeRequest* r) {
         r->mutable_images(0)->set_data(png.substr(0, png.size() / 2));
         r->mutable_images(0)->clear_content_hash();
       },
       "images[0].data: "},
      {"wrong hash",
       [](internal::v1::EncodeRequest* r) {
         r->mutable_images(0)->set_content_hash(std::string(32, 'a'));
       },
       "images[0].content_hash: not the SHA-256"},
      {"short hash",
       [](internal::v1::EncodeRequest* r) { r->mutable_images(0)->set_content_hash("abc"); },
       "images[0].content_hash: expected 32 bytes"},
      {"17 images",
       [&](internal::v1::EncodeRequest* r) {
         for (int i = 0; i < 16; ++i) *r->add_images() = r->images(0);
       },
       "images: expected 1..16"},
  };
  for (const Case& c : cases) {
    internal::v1::EncodeRequest request;
    request.set_request_id("bad");
    request.set_inline_data(true);
    request.add_images()->set_data(png);
    request.mutable_images(0)->set_content_hash(Sha256(png));
    c.edit(&request);
    internal::v1::EncodeResponse response;
    grpc::Status s = Encode(request, &response);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.name;
    EXPECT_EQ(s.error_message().rfind(c.prefix, 0), 0u) << c.name << ": " << s.error_message();
  }
  // Still serving.
  internal::v1::EncodeRequest ok;
  ok.set_request_id("ok");
  ok.set_inline_data(true);
  ok.add_images()->set_data(png);
  internal::v1::EncodeResponse response;
  ASSERT_TRUE(Encode(ok, &response).ok());
  EXPECT_EQ(response.embeddings_size(), 1);
  EXPECT_GE(node_->Stats().requests_failed(), cases.size());
}

}  // namespace
}  // namespace deepinfer::vision_encoder
