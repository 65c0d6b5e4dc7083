#include "router/inference_front.h"

#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "common/grpc_server.h"
#include "engine/model_assets.h"
#include "google/protobuf/descriptor.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/deepinfer/v1/inference.grpc.pb.h"
#include "router/inference_service.h"
#include "router/worker_registry.h"

namespace deepinfer::router {
namespace {

constexpr char kModelDir[] = "engine/testdata/models/llama";

TEST(ParsePublicRequestTest, ParsesValidRequestsAndNamesTheFieldWithInvalidUtf8) {
  v1::ChatRequest request;
  request.set_request_id("r1");
  auto* message = request.add_messages();
  message->set_role("user");
  message->add_content()->set_text("héllo");
  v1::ChatRequest parsed;
  ASSERT_TRUE(ParsePublicRequest(request.SerializeAsString(), &parsed).ok());
  EXPECT_EQ(parsed.messages(0).content(0).text(), "héllo");

  // proto3 string fields holding invalid UTF-8 (the C++ serializer only logs them).
  message->add_content()->set_text("ok");
  message->add_content()->set_text("caf\xc3");
  absl::Status s = ParsePublicRequest(request.SerializeAsString(), &parsed);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "messages[0].content[2].text: expected UTF-8 text, got an invalid byte sequence at "
            "byte 3");

  v1::GenerateRequest generate;
  generate.add_prompt_token_ids(1);
  generate.mutable_sampling()->add_stop("fine");
  generate.mutable_sampling()->add_stop("\xed\xa0\x80");  // a UTF-16 surrogate
  v1::GenerateRequest parsed_generate;
  s = ParsePublicRequest(generate.SerializeAsString(), &parsed_generate);
  EXPECT_TRUE(absl::StartsWith(s.message(), "sampling.stop[1]: expected UTF-8 text")) << s;

  s = ParsePublicRequest("\xff\xff\xff\xff", &parsed);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StartsWith(s.message(), "request: malformed protobuf message")) << s;
}

// The front through gRPC: every method of the generated service is served (by name), and
// invalid UTF-8 is INVALID_ARGUMENT naming the field instead of INTERNAL.
class InferenceFrontTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<engine::ModelAssets>> assets =
        engine::ModelAssets::Load(kModelDir);
    ASSERT_TRUE(assets.ok()) << assets.status();
    assets_ = std::move(*assets);
    absl::StatusOr<std::unique_ptr<WorkerRegistry>> registry =
        WorkerRegistry::Create(WorkerRegistry::Options());
    ASSERT_TRUE(registry.ok()) << registry.status();
    registry_ = std::move(*registry);
    absl::StatusOr<std::unique_ptr<InferenceService>> service = InferenceService::Create(
        registry_.get(), assets_.get(), InferenceServiceOptions{.model_id = "llama"});
    ASSERT_TRUE(service.ok()) << service.status();
    service_ = std::move(*service);
    front_ = std::make_unique<InferenceFront>(service_.get());
    GrpcServerOptions options;
    options.services = {front_.get()};
    absl::StatusOr<std::unique_ptr<GrpcServer>> server = GrpcServer::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    stub_ = v1::Inference::NewStub(
        grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials()));
  }

  grpc::Status Chat(const v1::ChatRequest& request) {
    grpc::ClientContext context;
    auto reader = stub_->Chat(&context, request);
    v1::ChatChunk chunk;
    while (reader->Read(&chunk)) {
    }
    return reader->Finish();
  }

  std::unique_ptr<engine::ModelAssets> assets_;
  std::unique_ptr<WorkerRegistry> registry_;
  std::unique_ptr<InferenceService> service_;
  std::unique_ptr<InferenceFront> front_;
  std::unique_ptr<GrpcServer> server_;
  std::unique_ptr<v1::Inference::Stub> stub_;
};

TEST_F(InferenceFrontTest, ServesEveryMethodAndNamesInvalidUtf8) {
  // The front registers the generated service's method names.
  const google::protobuf::ServiceDescriptor* service =
      v1::ChatRequest::descriptor()->file()->FindServiceByName("Inference");
  ASSERT_NE(service, nullptr);
  EXPECT_EQ(service->full_name(), "deepinfer.v1.Inference");
  EXPECT_EQ(service->method_count(), 4);

  grpc::ClientContext list_context;
  v1::ListModelsResponse models;
  ASSERT_TRUE(stub_->ListModels(&list_context, v1::ListModelsRequest(), &models).ok());
  ASSERT_EQ(models.models_size(), 1);
  EXPECT_EQ(models.models(0).id(), "llama");

  v1::ChatRequest chat;
  auto* message = chat.add_messages();
  message->set_role("user");
  message->add_content()->set_text("hello");
  grpc::Status status = Chat(chat);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();

  message->set_role("us\xff" "er");
  status = Chat(chat);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(status.error_message(),
            "messages[0].role: expected UTF-8 text, got an invalid byte sequence at byte 2");

  v1::GenerateRequest generate;
  generate.set_request_id("id\xc0");
  generate.add_prompt_token_ids(1);
  grpc::ClientContext generate_context;
  auto reader = stub_->Generate(&generate_context, generate);
  v1::GenerateChunk chunk;
  while (reader->Read(&chunk)) {
  }
  status = reader->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StartsWith(status.error_message(), "request_id: expected UTF-8 text"))
      << status.error_message();

  v1::AbortRequest abort;
  abort.set_request_id("\x80");
  v1::AbortResponse aborted;
  grpc::ClientContext abort_context;
  status = stub_->Abort(&abort_context, abort, &aborted);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StartsWith(status.error_message(), "request_id: expected UTF-8 text"));
  abort.set_request_id("not-running");
  grpc::ClientContext abort_context2;
  ASSERT_TRUE(stub_->Abort(&abort_context2, abort, &aborted).ok());
  EXPECT_FALSE(aborted.found());
}

}  // namespace
}  // namespace deepinfer::router
