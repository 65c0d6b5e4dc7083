// The router's OpenAI-compatible HTTP API, served by common/http_server.h on --http_listen:
//
//   POST /v1/chat/completions   -> deepinfer.v1.Inference/Chat
//   POST /v1/completions        -> deepinfer.v1.Inference/Generate (the prompt is tokenized here,
//                                  with the model's tokenizer, special tokens added)
//   GET  /v1/models             -> ListModels
//   GET  /metrics, GET /healthz -> the router's Prometheus text and its health (when configured)
//
// Every request is translated into the public gRPC request and sent to the router's own
// Inference service over a channel to its gRPC listener, so that validation (api/), the chat
// template, placement, relay, retry, metrics and cancellation are exactly those of a gRPC
// client: nothing of InferenceService is duplicated here. The call is asynchronous (gRPC's
// callback API): no thread waits on a stream; the next chunk is read only once the previous one
// was written to the HTTP client, so a slow reader holds back its own stream and nothing else.
// A client that disconnects cancels its gRPC call, which aborts the request on every node.
//
// The mapping (OpenAI JSON <-> deepinfer.v1) is in namespace openai below, pure and tested on its
// own; docs/http-api.md lists every field and error.
//
// Errors are OpenAI-style bodies {"error": {"message", "type", "param", "code"}}:
//   400 a field is malformed, out of range or unsupported (param names it, in the request's own
//       terms: "max_tokens", "messages[0].content[1].image_url", "stop"); malformed JSON; invalid
//       UTF-8 (param names the field that holds it)
//   401 UNAUTHENTICATED: no, malformed or unknown API key (the Authorization header, forwarded
//       to the gRPC call as `authorization` metadata); 403 PERMISSION_DENIED: the key's tenant
//       may not use the model or the priority
//   404 unknown model (code "model_not_found") or path; 405 wrong method on a known path
//   409 the request id is already running; 429 RESOURCE_EXHAUSTED (with Retry-After: the
//       call's `retry-after` trailing metadata, else 1);
//   503 UNAVAILABLE (no worker, draining); 504 DEADLINE_EXCEEDED; 500 anything else.
// An error after a stream's first chunk arrives as a last `data: {"error": {...}}` event.
//
// Thread-safety: OpenAiApi::Handle may be called from any thread, concurrently.
#ifndef DEEPINFER_ROUTER_OPENAI_API_H_
#define DEEPINFER_ROUTER_OPENAI_API_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/http_server.h"
#include "grpcpp/channel.h"
#include "nlohmann/json.hpp"
#include "proto/deepinfer/v1/inference.grpc.pb.h"

namespace deepinfer::router {
namespace openai {

enum class Endpoint { kChat, kCompletion };

// A parsed request body: the gRPC request and what shapes the answer.
struct ParsedRequest {
  Endpoint endpoint = Endpoint::kChat;
  v1::ChatRequest chat;          // kChat
  v1::GenerateRequest generate;  // kCompletion; prompt_token_ids filled by the tokenizer
  std::string model;             // as the client named it ("" when absent)
  bool stream = false;
  bool include_usage = false;    // stream_options.include_usage
  bool logprobs = false;         // return per-token logprobs
};

// Tokenizes a completion prompt (special tokens added).
using Tokenize = std::function<absl::StatusOr<std::vector<int32_t>>(absl::string_view)>;

// Parses a /v1/chat/completions (kChat) or /v1/completions body. kInvalidArgument whose message
// starts with the field's name in the request's terms ("temperature: expected a number; got
// \"hot\""): malformed JSON or invalid UTF-8 (naming the field that holds the bad bytes), wrong
// types, n != 1, unsupported features (tools, response_format other than text, logit_bias,
// echo, suffix, audio...), a completion prompt over `max_prompt_bytes`. Ranges are left to the
// router's validation (api/request_validation.h); `tokenize` is used for kCompletion only.
absl::StatusOr<ParsedRequest> ParseRequest(Endpoint endpoint, absl::string_view body,
                                           size_t max_prompt_bytes, const Tokenize& tokenize);

// An HTTP error as the API returns it.
struct HttpError {
  int status = 500;
  std::string message;
  std::string type;   // "invalid_request_error", "rate_limit_error", "server_error", ...
  std::string param;  // "" -> null
  std::string code;   // "" -> null
  int retry_after_s = 0;  // > 0: a Retry-After header
};

// The HTTP error for a failed call (a gRPC status as absl::Status), in the endpoint's terms:
// INVALID_ARGUMENT -> 400 with the field path of the message translated into the request's own
// field names (sampling.max_tokens -> max_tokens, messages[0].content[1].image ->
// messages[0].content[1].image_url, prompt_token_ids[3] -> prompt), except an unknown model ->
// 404; NOT_FOUND 404; ALREADY_EXISTS 409; RESOURCE_EXHAUSTED 429 + Retry-After: 1;
// UNAUTHENTICATED 401; PERMISSION_DENIED 403;
// FAILED_PRECONDITION 400; UNAVAILABLE 503; DEADLINE_EXCEEDED 504; CANCELLED 499; other 500.
HttpError ErrorFromStatus(const absl::Status& status, Endpoint endpoint);

// {"error": {"message", "type", "param", "code"}} with a trailing newline.
std::string ErrorBody(const HttpError& error);

// The text of one token, for logprobs.
using TokenText = std::function<std::string(uint32_t)>;

// Turns a call's chunks into OpenAI objects: the SSE events of a stream, or the whole response.
class ResponseBuilder {
 public:
  ResponseBuilder(const ParsedRequest& request, std::string model, int64_t created,
                  TokenText token_text);

  // The `data: ...\n\n` events for one chunk of a stream (the first one also announces the
  // assistant role; the last chunk adds the usage event when include_usage, then [DONE]).
  std::string StreamEvents(const v1::GenerateChunk& chunk);
  // Accumulates one chunk of a non-streaming call.
  void Add(const v1::GenerateChunk& chunk);
  // The chat.completion / text_completion object once every chunk was added.
  nlohmann::json Final() const;
  // The error event that ends a stream after its first chunk.
  static std::string StreamErrorEvent(const HttpError& error);

 private:
  nlohmann::json Usage(const v1::Usage& usage) const;
  nlohmann::json Logprobs(const v1::GenerateChunk& chunk, int64_t* text_offset) const;
  std::string Id(const v1::GenerateChunk& chunk) const;

  const Endpoint endpoint_;
  const bool include_usage_;
  const bool logprobs_;
  const std::string model_;
  const int64_t created_;
  const TokenText token_text_;
  bool role_sent_ = false;
  std::string id_;
  std::string text_;
  std::string finish_reason_;
  nlohmann::json logprobs_acc_;
  int64_t text_offset_ = 0;
  std::optional<v1::Usage> usage_;
};

// FinishReason -> "stop" / "length" / "abort" / "error"; "" while unfinished.
std::string FinishReasonName(v1::FinishReason reason);

// The JSON of a gRPC chunk of either kind.
v1::GenerateChunk ToGenerateChunk(v1::ChatChunk& chunk);

// Serializes JSON, replacing invalid UTF-8 (token texts may split characters).
std::string Dump(const nlohmann::json& j);

}  // namespace openai

struct OpenAiApiOptions {
  // The model this router serves: /v1/models lists it, responses name it.
  std::string model_id;
  // Largest completion prompt, bytes (the router's --max_chat_text_bytes).
  size_t max_prompt_bytes = size_t{4} << 20;
  openai::Tokenize tokenize;
  openai::TokenText token_text;
  // GET /v1/models: the router's ListModels answer.
  std::function<v1::ListModelsResponse()> list_models;
  // GET /metrics: Prometheus text; null -> 404.
  std::function<std::string()> metrics;
  // GET /healthz: 200 "ok" when true, else 503; null -> 404.
  std::function<bool()> healthy;
  // Checks the caller of every /v1/ request before its body is parsed (kUnauthenticated ->
  // 401, kPermissionDenied -> 403); null: no check here (the gRPC service still checks the
  // forwarded key).
  std::function<absl::Status(const HttpRequest&)> authorize;
};

class OpenAiApi {
 public:
  // `channel` reaches the router's own Inference service. kInvalidArgument for a missing
  // model_id, tokenize, token_text or list_models.
  static absl::StatusOr<std::unique_ptr<OpenAiApi>> Create(std::shared_ptr<grpc::Channel> channel,
                                                           OpenAiApiOptions options);
  OpenAiApi(const OpenAiApi&) = delete;
  OpenAiApi& operator=(const OpenAiApi&) = delete;

  // The HttpServer handler.
  void Handle(HttpRequest request, std::shared_ptr<HttpResponder> responder);
  // Calls started and not yet finished.
  int in_flight() const { return in_flight_.load(); }
  // Waits until no call is in flight, at most `timeout`; true when idle.
  bool WaitIdle(absl::Duration timeout) const;

 private:
  OpenAiApi(std::shared_ptr<grpc::Channel> channel, OpenAiApiOptions options);
  void Completions(openai::Endpoint endpoint, const HttpRequest& request,
                   std::shared_ptr<HttpResponder> responder);

  const OpenAiApiOptions options_;
  const std::unique_ptr<v1::Inference::Stub> stub_;
  mutable std::atomic<int> in_flight_{0};
};

}  // namespace deepinfer::router

#endif  // DEEPINFER_ROUTER_OPENAI_API_H_
