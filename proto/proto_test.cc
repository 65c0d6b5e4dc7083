// The wire protocol compiles into C++, every message round-trips through its encoding, and the
// stubs and the standard health service work over a real gRPC channel.
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/grpc_server.h"
#include "common/grpc_status.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "google/protobuf/util/message_differencer.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "proto/deepinfer/internal/v1/decode.grpc.pb.h"
#include "proto/deepinfer/internal/v1/encoder.grpc.pb.h"
#include "proto/deepinfer/internal/v1/kv_transfer.pb.h"
#include "proto/deepinfer/internal/v1/prefill.grpc.pb.h"
#include "proto/deepinfer/internal/v1/worker.grpc.pb.h"
#include "proto/deepinfer/v1/inference.grpc.pb.h"
#include "proto/grpc/health/v1/health.grpc.pb.h"

namespace deepinfer {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::FileDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;
using google::protobuf::util::MessageDifferencer;

// Sets every field of `m` to a non-default value derived from the field number (the first
// member of each oneof), recursing into sub-messages up to `depth`.
void FillAllFields(Message* m, int depth) {
  const Descriptor* d = m->GetDescriptor();
  const Reflection* r = m->GetReflection();
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    if (f->real_containing_oneof() != nullptr && f->index_in_oneof() != 0) continue;
    const int n = f->number();
    const int reps = f->is_repeated() ? 2 : 1;
    for (int k = 0; k < reps; ++k) {
      const int v = n * 10 + k + 1;
      switch (f->cpp_type()) {
        case FieldDescriptor::CPPTYPE_INT32:
          f->is_repeated() ? r->AddInt32(m, f, -v) : r->SetInt32(m, f, -v);
          break;
        case FieldDescriptor::CPPTYPE_INT64:
          f->is_repeated() ? r->AddInt64(m, f, -(int64_t{v} << 33))
                           : r->SetInt64(m, f, -(int64_t{v} << 33));
          break;
        case FieldDescriptor::CPPTYPE_UINT32:
          f->is_repeated() ? r->AddUInt32(m, f, v) : r->SetUInt32(m, f, v);
          break;
        case FieldDescriptor::CPPTYPE_UINT64:
          f->is_repeated() ? r->AddUInt64(m, f, static_cast<uint64_t>(v) << 40)
                           : r->SetUInt64(m, f, static_cast<uint64_t>(v) << 40);
          break;
        case FieldDescriptor::CPPTYPE_FLOAT:
          f->is_repeated() ? r->AddFloat(m, f, v * 0.25f) : r->SetFloat(m, f, v * 0.25f);
          break;
        case FieldDescriptor::CPPTYPE_DOUBLE:
          f->is_repeated() ? r->AddDouble(m, f, v * 0.5) : r->SetDouble(m, f, v * 0.5);
          break;
        case FieldDescriptor::CPPTYPE_BOOL:
          f->is_repeated() ? r->AddBool(m, f, true) : r->SetBool(m, f, true);
          break;
        case FieldDescriptor::CPPTYPE_ENUM: {
          const auto* value = f->enum_type()->value(f->enum_type()->value_count() - 1);
          f->is_repeated() ? r->AddEnum(m, f, value) : r->SetEnum(m, f, value);
          break;
        }
        case FieldDescriptor::CPPTYPE_STRING: {
          std::string s = f->type() == FieldDescriptor::TYPE_BYTES
                              ? std::string("\x00\xff\x7f", 3) + std::to_string(v)
                              : absl::StrCat("s", v, "\xc3\xa9");  // UTF-8 "é"
          f->is_repeated() ? r->AddString(m, f, s) : r->SetString(m, f, s);
          break;
        }
        case FieldDescriptor::CPPTYPE_MESSAGE:
          if (depth > 0) {
            FillAllFields(f->is_repeated() ? r->AddMessage(m, f) : r->MutableMessage(m, f),
                          depth - 1);
          }
          break;
      }
    }
  }
}

std::vector<const Descriptor*> AllMessages(const FileDescriptor* file) {
  std::vector<const Descriptor*> out;
  std::vector<const Descriptor*> stack;
  for (int i = 0; i < file->message_type_count(); ++i) stack.push_back(file->message_type(i));
  while (!stack.empty()) {
    const Descriptor* d = stack.back();
    stack.pop_back();
    out.push_back(d);
    for (int i = 0; i < d->nested_type_count(); ++i) stack.push_back(d->nested_type(i));
  }
  return out;
}

class RoundTripTest : public ::testing::TestWithParam<const FileDescriptor*> {};

TEST_P(RoundTripTest, EveryMessageSurvivesEncodeDecode) {
  const std::vector<const Descriptor*> messages = AllMessages(GetParam());
  ASSERT_FALSE(messages.empty());
  for (const Descriptor* d : messages) {
    SCOPED_TRACE(d->full_name());
    const Message* prototype =
        google::protobuf::MessageFactory::generated_factory()->GetPrototype(d);
    ASSERT_NE(prototype, nullptr);
    std::unique_ptr<Message> original(prototype->New());
    FillAllFields(original.get(), /*depth=*/3);
    // Every field (outside the unused oneof members) is present after filling.
    std::vector<const FieldDescriptor*> set;
    original->GetReflection()->ListFields(*original, &set);
    int expected = 0;
    for (int i = 0; i < d->field_count(); ++i) {
      const FieldDescriptor* f = d->field(i);
      if (f->real_containing_oneof() == nullptr || f->index_in_oneof() == 0) ++expected;
    }
    EXPECT_EQ(static_cast<int>(set.size()), expected);

    std::string wire;
    ASSERT_TRUE(original->SerializeToString(&wire));
    if (expected > 0) {
      EXPECT_FALSE(wire.empty());
    }
    std::unique_ptr<Message> parsed(prototype->New());
    ASSERT_TRUE(parsed->ParseFromString(wire));
    EXPECT_TRUE(MessageDifferencer::Equals(*original, *parsed))
        << original->DebugString() << "\nvs\n" << parsed->DebugString();
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllProtoFiles, RoundTripTest,
    ::testing::Values(v1::ChatRequest::descriptor()->file(),
                      internal::v1::KvPeerMetadata::descriptor()->file(),
                      internal::v1::WorkerInfo::descriptor()->file(),
                      internal::v1::PrefillRequest::descriptor()->file(),
                      internal::v1::DecodeRequest::descriptor()->file(),
                      internal::v1::EncodeRequest::descriptor()->file()),
    [](const auto& info) {
      std::string name = info.param->name();
      for (char& c : name) {
        if (!isalnum(static_cast<unsigned char>(c))) c = '_';
      }
      return name;
    });

TEST(ChatRequestTest, TextAndImagePartsAndUnsetOptionals) {
  v1::ChatRequest req;
  req.set_request_id("r-1");
  v1::ChatMessage* msg = req.add_messages();
  msg->set_role("user");
  msg->add_content()->set_text("move the login button to the top right");
  msg->add_content()->mutable_image()->set_data(std::string("\x89PNG\r\n\x1a\n", 8));
  req.mutable_sampling()->set_max_tokens(64);
  req.mutable_sampling()->set_temperature(0.0f);  // explicit greedy, distinct from unset

  std::string wire = req.SerializeAsString();
  v1::ChatRequest back;
  ASSERT_TRUE(back.ParseFromString(wire));
  EXPECT_TRUE(MessageDifferencer::Equals(req, back));
  ASSERT_EQ(back.messages(0).content_size(), 2);
  EXPECT_EQ(back.messages(0).content(0).part_case(), v1::ContentPart::kText);
  EXPECT_EQ(back.messages(0).content(1).image().source_case(), v1::ImagePart::kData);
  // Presence: temperature=0 was sent, top_p was not.
  EXPECT_TRUE(back.sampling().has_temperature());
  EXPECT_EQ(back.sampling().temperature(), 0.0f);
  EXPECT_FALSE(back.sampling().has_top_p());
  EXPECT_FALSE(back.has_add_generation_prompt());
}

// A small Inference service for the channel test: Generate echoes the prompt back one token per
// chunk; it validates like the router does (INVALID_ARGUMENT naming the field).
class EchoInference final : public v1::Inference::Service {
 public:
  grpc::Status Generate(grpc::ServerContext*, const v1::GenerateRequest* req,
                        grpc::ServerWriter<v1::GenerateChunk>* writer) override {
    if (req->prompt_token_ids().empty()) {
      return ToGrpcStatus(
          absl::InvalidArgumentError("prompt_token_ids: expected at least one token, got 0"));
    }
    for (int i = 0; i < req->prompt_token_ids_size(); ++i) {
      v1::GenerateChunk chunk;
      chunk.set_request_id(req->request_id());
      chunk.add_token_ids(req->prompt_token_ids(i));
      if (i + 1 == req->prompt_token_ids_size()) {
        chunk.set_finish_reason(v1::FINISH_REASON_LENGTH);
        chunk.mutable_usage()->set_prompt_tokens(req->prompt_token_ids_size());
        chunk.mutable_usage()->set_completion_tokens(req->prompt_token_ids_size());
      }
      if (!writer->Write(chunk)) return grpc::Status::CANCELLED;
    }
    return grpc::Status::OK;
  }

  grpc::Status ListModels(grpc::ServerContext*, const v1::ListModelsRequest*,
                          v1::ListModelsResponse* resp) override {
    v1::ModelInfo* m = resp->add_models();
    m->set_id("echo");
    m->set_max_context_tokens(4096);
    return grpc::Status::OK;
  }
};

grpc::health::v1::HealthCheckResponse::ServingStatus CheckHealth(
    grpc::health::v1::Health::Stub& stub, const std::string& service, grpc::Status* status) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  grpc::health::v1::HealthCheckRequest req;
  req.set_service(service);
  grpc::health::v1::HealthCheckResponse resp;
  *status = stub.Check(&ctx, req, &resp);
  return resp.status();
}

TEST(GrpcChannelTest, HealthAndStubsOverARealChannel) {
  EchoInference service;
  GrpcServerOptions options;
  options.listen_address = "127.0.0.1:0";
  options.services = {&service};
  options.health_service_names = {v1::Inference::service_full_name()};
  absl::StatusOr<std::unique_ptr<GrpcServer>> server = GrpcServer::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_GT((*server)->port(), 0);

  auto channel = grpc::CreateChannel((*server)->address(), grpc::InsecureChannelCredentials());
  auto health = grpc::health::v1::Health::NewStub(channel);
  grpc::Status status;
  using HS = grpc::health::v1::HealthCheckResponse;

  // Not serving until the owner says so.
  EXPECT_EQ(CheckHealth(*health, "", &status), HS::NOT_SERVING);
  EXPECT_TRUE(status.ok()) << status.error_message();
  (*server)->SetServing(true);
  EXPECT_EQ(CheckHealth(*health, "", &status), HS::SERVING);
  EXPECT_TRUE(status.ok());
  EXPECT_EQ(CheckHealth(*health, "deepinfer.v1.Inference", &status), HS::SERVING);
  EXPECT_TRUE(status.ok());
  CheckHealth(*health, "no.such.Service", &status);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);

  auto inference = v1::Inference::NewStub(channel);
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::GenerateRequest req;
    req.set_request_id("g-1");
    for (uint32_t t : {5u, 6u, 7u}) req.add_prompt_token_ids(t);
    auto reader = inference->Generate(&ctx, req);
    std::vector<uint32_t> tokens;
    v1::GenerateChunk chunk;
    v1::FinishReason finish = v1::FINISH_REASON_UNSPECIFIED;
    while (reader->Read(&chunk)) {
      EXPECT_EQ(chunk.request_id(), "g-1");
      tokens.insert(tokens.end(), chunk.token_ids().begin(), chunk.token_ids().end());
      finish = chunk.finish_reason();
    }
    EXPECT_TRUE(reader->Finish().ok());
    EXPECT_EQ(tokens, (std::vector<uint32_t>{5, 6, 7}));
    EXPECT_EQ(finish, v1::FINISH_REASON_LENGTH);
    EXPECT_EQ(chunk.usage().completion_tokens(), 3u);
  }
  {
    grpc::ClientContext ctx;
    v1::GenerateRequest req;
    auto reader = inference->Generate(&ctx, req);
    v1::GenerateChunk chunk;
    EXPECT_FALSE(reader->Read(&chunk));
    grpc::Status s = reader->Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(s.error_message().find("prompt_token_ids"), std::string::npos);
  }
  {
    grpc::ClientContext ctx;
    v1::ListModelsResponse resp;
    ASSERT_TRUE(inference->ListModels(&ctx, v1::ListModelsRequest(), &resp).ok());
    ASSERT_EQ(resp.models_size(), 1);
    EXPECT_EQ(resp.models(0).id(), "echo");
  }
  {
    // Methods the service does not override answer UNIMPLEMENTED, not a hang.
    grpc::ClientContext ctx;
    v1::AbortResponse resp;
    v1::AbortRequest req;
    req.set_request_id("x");
    EXPECT_EQ(inference->Abort(&ctx, req, &resp).error_code(), grpc::StatusCode::UNIMPLEMENTED);
  }
  (*server)->Shutdown(absl::Seconds(1));
}

TEST(GrpcServerTest, BadListenAddressIsInvalidArgument) {
  GrpcServerOptions options;
  options.listen_address = "nonsense";
  absl::StatusOr<std::unique_ptr<GrpcServer>> server = GrpcServer::Start(options);
  ASSERT_FALSE(server.ok());
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(GrpcServerTest, PortInUseIsUnavailable) {
  EchoInference service_a;
  EchoInference service_b;
  GrpcServerOptions first;
  first.services = {&service_a};
  auto a = GrpcServer::Start(first);
  ASSERT_TRUE(a.ok()) << a.status();
  GrpcServerOptions second;
  second.services = {&service_b};
  second.listen_address = absl::StrCat("127.0.0.1:", (*a)->port());
  auto b = GrpcServer::Start(second);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace deepinfer
