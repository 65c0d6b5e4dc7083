// Fuzzes what the router parses from clients: OpenAI request bodies (router/openai_api.h, both
// endpoints, and the error each failure maps to) and raw gRPC request bytes
// (router/inference_front.h). Any input must give a request or an InvalidArgument, never a crash.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "proto/deepinfer/v1/inference.pb.h"
#include "router/inference_front.h"
#include "router/openai_api.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using deepinfer::router::openai::Endpoint;
  const absl::string_view input(reinterpret_cast<const char*>(data), size);
  auto tokenize = [](absl::string_view text) -> absl::StatusOr<std::vector<int32_t>> {
    return std::vector<int32_t>(text.size() % 64, 1);
  };
  for (Endpoint endpoint : {Endpoint::kChat, Endpoint::kCompletion}) {
    absl::StatusOr<deepinfer::router::openai::ParsedRequest> parsed =
        deepinfer::router::openai::ParseRequest(endpoint, input, 1 << 16, tokenize);
    if (!parsed.ok()) {
      if (parsed.status().code() != absl::StatusCode::kInvalidArgument) std::abort();
      const auto error = deepinfer::router::openai::ErrorFromStatus(parsed.status(), endpoint);
      if (error.status != 400 || deepinfer::router::openai::ErrorBody(error).empty()) std::abort();
    }
  }
  deepinfer::v1::ChatRequest chat;
  const absl::Status s = deepinfer::router::ParsePublicRequest(input, &chat);
  if (!s.ok() && s.code() != absl::StatusCode::kInvalidArgument) std::abort();
  return 0;
}
