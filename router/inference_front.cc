#include "router/inference_front.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/base/call_once.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "api/request_validation.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/descriptor.pb.h"
#include "google/protobuf/dynamic_message.h"
#include "grpcpp/impl/rpc_service_method.h"
#include "grpcpp/support/method_handler.h"

namespace deepinfer::router {
namespace {

namespace pb = google::protobuf;

constexpr char kLenientSuffix[] = ".lenient";
// gRPC keeps the method names' pointers: they must be static. inference_front_test checks that
// they match the generated service's.
constexpr char kChat[] = "/deepinfer.v1.Inference/Chat";
constexpr char kGenerate[] = "/deepinfer.v1.Inference/Generate";
constexpr char kAbort[] = "/deepinfer.v1.Inference/Abort";
constexpr char kListModels[] = "/deepinfer.v1.Inference/ListModels";

void MakeLenient(pb::DescriptorProto* message, const std::string& package) {
  for (pb::FieldDescriptorProto& field : *message->mutable_field()) {
    if (field.type() == pb::FieldDescriptorProto::TYPE_STRING) {
      field.set_type(pb::FieldDescriptorProto::TYPE_BYTES);
    }
    // Fully qualified references (".deepinfer.v1.X") move to the lenient package.
    if (absl::StartsWith(field.type_name(), absl::StrCat(".", package, "."))) {
      field.set_type_name(absl::StrCat(".", package, kLenientSuffix,
                                       field.type_name().substr(package.size() + 1)));
    }
  }
  for (pb::DescriptorProto& nested : *message->mutable_nested_type()) MakeLenient(&nested, package);
}

// The lenient twins of one .proto file's messages: same fields, `bytes` for `string`, in package
// "<package>.lenient". Built once per file.
class LenientPool {
 public:
  // The lenient twin of `descriptor`; null when it cannot be built (no twin: the caller reports
  // the message as malformed).
  const pb::Message* Prototype(const pb::Descriptor* descriptor) {
    absl::MutexLock lock(&mu_);
    const pb::FileDescriptor* file = descriptor->file();
    auto it = files_.find(file);
    if (it == files_.end()) {
      pb::FileDescriptorProto proto;
      file->CopyTo(&proto);
      const std::string package = proto.package();
      proto.set_name(absl::StrCat(proto.name(), kLenientSuffix));
      proto.set_package(absl::StrCat(package, kLenientSuffix));
      proto.clear_service();
      proto.clear_dependency();  // the public API imports nothing it parses
      for (pb::DescriptorProto& message : *proto.mutable_message_type()) {
        MakeLenient(&message, package);
      }
      it = files_.emplace(file, pool_.BuildFile(proto)).first;
    }
    if (it->second == nullptr) return nullptr;
    const std::string name = absl::StrCat(descriptor->file()->package(), kLenientSuffix,
                                          descriptor->full_name().substr(
                                              descriptor->file()->package().size()));
    const pb::Descriptor* twin = pool_.FindMessageTypeByName(name);
    return twin == nullptr ? nullptr : factory_.GetPrototype(twin);
  }

 private:
  absl::Mutex mu_;
  pb::DescriptorPool pool_;
  pb::DynamicMessageFactory factory_{&pool_};
  absl::flat_hash_map<const pb::FileDescriptor*, const pb::FileDescriptor*> files_
      ABSL_GUARDED_BY(mu_);
};

LenientPool& Lenient() {
  static LenientPool* pool = new LenientPool();
  return *pool;
}

// The first string field of `original`'s type holding invalid UTF-8 in `lenient` (its twin), as
// "messages[1].content[0].text: ...".
absl::Status FindInvalidUtf8(const pb::Message& lenient, const pb::Descriptor& original,
                             const std::string& prefix) {
  const pb::Reflection* reflection = lenient.GetReflection();
  std::vector<const pb::FieldDescriptor*> fields;
  reflection->ListFields(lenient, &fields);
  for (const pb::FieldDescriptor* field : fields) {
    const pb::FieldDescriptor* public_field = original.FindFieldByNumber(field->number());
    if (public_field == nullptr) continue;
    const std::string path = prefix.empty() ? field->name() : absl::StrCat(prefix, ".", field->name());
    if (public_field->type() == pb::FieldDescriptor::TYPE_STRING) {
      if (field->is_repeated()) {
        for (int i = 0; i < reflection->FieldSize(lenient, field); ++i) {
          std::string scratch;
          const std::string& value = reflection->GetRepeatedStringReference(lenient, field, i,
                                                                            &scratch);
          DI_RETURN_IF_ERROR(api::ValidateUtf8(absl::StrCat(path, "[", i, "]"), value));
        }
      } else {
        std::string scratch;
        DI_RETURN_IF_ERROR(
            api::ValidateUtf8(path, reflection->GetStringReference(lenient, field, &scratch)));
      }
    } else if (public_field->type() == pb::FieldDescriptor::TYPE_MESSAGE) {
      const pb::Descriptor& sub = *public_field->message_type();
      if (field->is_repeated()) {
        for (int i = 0; i < reflection->FieldSize(lenient, field); ++i) {
          DI_RETURN_IF_ERROR(FindInvalidUtf8(reflection->GetRepeatedMessage(lenient, field, i),
                                                   sub, absl::StrCat(path, "[", i, "]")));
        }
      } else {
        DI_RETURN_IF_ERROR(
            FindInvalidUtf8(reflection->GetMessage(lenient, field), sub, path));
      }
    }
  }
  return absl::OkStatus();
}

std::string Flatten(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  std::string out;
  if (!buffer.Dump(&slices).ok()) return out;
  out.reserve(buffer.Length());
  for (const grpc::Slice& s : slices) out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

}  // namespace

absl::Status ParsePublicRequest(absl::string_view raw, pb::Message* message) {
  if (message->ParseFromArray(raw.data(), static_cast<int>(raw.size()))) return absl::OkStatus();
  const pb::Message* prototype = Lenient().Prototype(message->GetDescriptor());
  if (prototype != nullptr) {
    std::unique_ptr<pb::Message> lenient(prototype->New());
    if (lenient->ParseFromArray(raw.data(), static_cast<int>(raw.size()))) {
      DI_RETURN_IF_ERROR(FindInvalidUtf8(*lenient, *message->GetDescriptor(), ""));
    }
  }
  return absl::InvalidArgumentError(absl::StrCat("request: malformed protobuf message (",
                                                 message->GetDescriptor()->full_name(), ", ",
                                                 raw.size(), " bytes)"));
}

InferenceFront::InferenceFront(InferenceService* service) : service_(service) {
  using grpc::internal::RpcMethod;
  using grpc::internal::RpcServiceMethod;
  AddMethod(new RpcServiceMethod(
      kChat, RpcMethod::SERVER_STREAMING,
      new grpc::internal::ServerStreamingHandler<InferenceFront, grpc::ByteBuffer, v1::ChatChunk>(
          [](InferenceFront* front, grpc::ServerContext* context, const grpc::ByteBuffer* request,
             grpc::ServerWriter<v1::ChatChunk>* writer) {
            return front->Chat(context, request, writer);
          },
          this)));
  AddMethod(new RpcServiceMethod(
      kGenerate, RpcMethod::SERVER_STREAMING,
      new grpc::internal::ServerStreamingHandler<InferenceFront, grpc::ByteBuffer,
                                                 v1::GenerateChunk>(
          [](InferenceFront* front, grpc::ServerContext* context, const grpc::ByteBuffer* request,
             grpc::ServerWriter<v1::GenerateChunk>* writer) {
            return front->Generate(context, request, writer);
          },
          this)));
  AddMethod(new RpcServiceMethod(
      kAbort, RpcMethod::NORMAL_RPC,
      new grpc::internal::RpcMethodHandler<InferenceFront, grpc::ByteBuffer, v1::AbortResponse,
                                           grpc::ByteBuffer, grpc::protobuf::MessageLite>(
          [](InferenceFront* front, grpc::ServerContext* context, const grpc::ByteBuffer* request,
             v1::AbortResponse* response) { return front->Abort(context, request, response); },
          this)));
  AddMethod(new RpcServiceMethod(
      kListModels, RpcMethod::NORMAL_RPC,
      new grpc::internal::RpcMethodHandler<InferenceFront, v1::ListModelsRequest,
                                           v1::ListModelsResponse, grpc::protobuf::MessageLite,
                                           grpc::protobuf::MessageLite>(
          [](InferenceFront* front, grpc::ServerContext* context,
             const v1::ListModelsRequest* request, v1::ListModelsResponse* response) {
            return front->ListModels(context, request, response);
          },
          this)));
}

grpc::Status InferenceFront::Chat(grpc::ServerContext* context, const grpc::ByteBuffer* request,
                                  grpc::ServerWriter<v1::ChatChunk>* writer) {
  v1::ChatRequest parsed;
  if (absl::Status s = ParsePublicRequest(Flatten(*request), &parsed); !s.ok()) {
    return ToGrpcStatus(s);
  }
  return service_->Chat(context, &parsed, writer);
}

grpc::Status InferenceFront::Generate(grpc::ServerContext* context,
                                      const grpc::ByteBuffer* request,
                                      grpc::ServerWriter<v1::GenerateChunk>* writer) {
  v1::GenerateRequest parsed;
  if (absl::Status s = ParsePublicRequest(Flatten(*request), &parsed); !s.ok()) {
    return ToGrpcStatus(s);
  }
  return service_->Generate(context, &parsed, writer);
}

grpc::Status InferenceFront::Abort(grpc::ServerContext* context, const grpc::ByteBuffer* request,
                                   v1::AbortResponse* response) {
  v1::AbortRequest parsed;
  if (absl::Status s = ParsePublicRequest(Flatten(*request), &parsed); !s.ok()) {
    return ToGrpcStatus(s);
  }
  return service_->Abort(context, &parsed, response);
}

grpc::Status InferenceFront::ListModels(grpc::ServerContext* context,
                                        const v1::ListModelsRequest* request,
                                        v1::ListModelsResponse* response) {
  return service_->ListModels(context, request, response);
}

}  // namespace deepinfer::router
