// The router's deepinfer.v1.Inference gRPC endpoint: InferenceService behind a front that parses
// the requests itself.
//
// Why: a proto3 `string` field holding invalid UTF-8 makes protobuf refuse the whole message
// while gRPC parses it, before any handler runs, and the client gets INTERNAL with an empty
// message; the API promises INVALID_ARGUMENT naming the field. Declaring the fields `bytes`
// would fix that on the wire but change the generated types of every non-C++ client (Python,
// Go, grpcurl's JSON), so the public proto keeps `string` and the router parses instead: each
// method takes the raw request bytes, parses them into the v1 message and, only when that fails,
// parses them again into a copy of the message whose string fields are `bytes` (derived at start
// from the v1 descriptors, so it cannot drift from the proto) to name the first field that is
// not UTF-8:
//
//   messages[1].content[0].text: expected UTF-8 text; got invalid UTF-8 at byte 3
//
// Bytes that are not a protobuf message at all -> INVALID_ARGUMENT "request: malformed ...".
// Everything else (method names, responses, statuses) is InferenceService's.
//
// Thread-safety: as InferenceService; the handlers run on gRPC's threads.
#ifndef DEEPINFER_ROUTER_INFERENCE_FRONT_H_
#define DEEPINFER_ROUTER_INFERENCE_FRONT_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/message.h"
#include "grpcpp/impl/codegen/service_type.h"
#include "grpcpp/server_context.h"
#include "grpcpp/support/byte_buffer.h"
#include "proto/deepinfer/v1/inference.grpc.pb.h"
#include "router/inference_service.h"

namespace deepinfer::router {

// Parses `raw` into `message` (a deepinfer.v1 message). kInvalidArgument naming the first
// string field with invalid UTF-8 (the path as api/request_validation.h writes it), or
// "request: malformed protobuf message" when the bytes do not parse even without UTF-8 checks.
absl::Status ParsePublicRequest(absl::string_view raw, google::protobuf::Message* message);

class InferenceFront final : public grpc::Service {
 public:
  // `service` is not owned and must outlive the front.
  explicit InferenceFront(InferenceService* service);

 private:
  grpc::Status Chat(grpc::ServerContext* context, const grpc::ByteBuffer* request,
                    grpc::ServerWriter<v1::ChatChunk>* writer);
  grpc::Status Generate(grpc::ServerContext* context, const grpc::ByteBuffer* request,
                        grpc::ServerWriter<v1::GenerateChunk>* writer);
  grpc::Status Abort(grpc::ServerContext* context, const grpc::ByteBuffer* request,
                     v1::AbortResponse* response);
  grpc::Status ListModels(grpc::ServerContext* context, const v1::ListModelsRequest* request,
                          v1::ListModelsResponse* response);

  InferenceService* const service_;
};

}  // namespace deepinfer::router

#endif  // DEEPINFER_ROUTER_INFERENCE_FRONT_H_
