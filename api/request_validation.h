// Validation and conversion of public API requests (deepinfer.v1 ChatRequest / GenerateRequest),
// done once at the router before anything is queued (workers check only their bounds, see
// api/worker_request_check.h): every rule written in the field comments of
// proto/deepinfer/v1/inference.proto is checked here, and a violation is kInvalidArgument whose
// message starts with the field's path, then what was expected and what was found:
//
//   sampling.top_p: expected (0, 1], got 1.5
//   messages[2].role: expected one of system, user, assistant, tool; got "robot"
//   messages[1].content[0].image.url: expected a data:image/png;base64, or
//       data:image/jpeg;base64, URL (the cluster never fetches URLs); got "http://x/y.png"
//
// The request's path at the router: ValidateChatRequest / ValidateGenerateRequest (cheap, before
// templating) → ConvertChatMessages (chat only: messages → the JSON the chat template renders,
// plus the decoded images) → template + tokenize → ToEngineSamplingParams (needs the prompt's
// token count for the context check).
//
// Images are checked structurally, without decoding pixels: a PNG must have its signature, a
// valid IHDR with non-zero size, chunks with correct CRCs up to IEND and at least one IDAT; a
// JPEG must start with SOI, have a frame header (SOFn) with non-zero size before its first scan,
// and end with EOI. Anything else (GIF, WebP, truncated or corrupted files) is refused. Decoding
// the pixels is the vision encoder's job.
//
// Thread-safety: all functions are pure and thread-safe.
#ifndef DEEPINFER_API_REQUEST_VALIDATION_H_
#define DEEPINFER_API_REQUEST_VALIDATION_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "engine/sampler.h"
#include "nlohmann/json.hpp"
#include "proto/deepinfer/v1/inference.pb.h"

namespace deepinfer::api {

// Limits of the model a request is for, and of the router.
struct RequestLimits {
  // Tokens of the model's vocabulary: prompt_token_ids and stop_token_ids must be below it.
  int vocab_size = 0;
  // Prompt + completion tokens a request may use (ModelInfo.max_context_tokens).
  int64_t max_context_tokens = 0;
  // Largest decoded image, bytes (the router's --max_image_bytes).
  size_t max_image_bytes = size_t{20} << 20;
  // Most images in one Chat request (what one vision encoder call takes).
  int max_images = 16;
  // Most bytes of chat text in one request: every text part and name of every message, summed
  // (the router's --max_chat_text_bytes). Checked before anything else about the messages, so an
  // oversized request is refused before it is converted, rendered or tokenized.
  size_t max_chat_text_bytes = size_t{4} << 20;
};

// Sampling defaults of a model, as its generation_config.json gives them; fields the file does
// not set keep these values (which disable the corresponding step).
struct GenerationDefaults {
  float temperature = 1.0f;
  float top_p = 1.0f;
  int top_k = 0;
  float min_p = 0.0f;
  float repetition_penalty = 1.0f;
};

// Reads `temperature`, `top_p`, `top_k`, `min_p` and `repetition_penalty` from a parsed
// generation_config.json object (other keys are ignored, as vLLM does; `do_sample` included). A
// key that is absent or null keeps its default. kInvalidArgument naming the key
// ("generation_config.top_p: expected (0, 1], got 0") when a value has the wrong type or range.
absl::StatusOr<GenerationDefaults> ParseGenerationDefaults(const nlohmann::json& config);

// Checks every field of `sampling` that the client set, against the ranges in inference.proto
// (message paths start with "sampling."). The context check needs the prompt's length and is
// done by ToEngineSamplingParams.
absl::Status ValidateSamplingParams(const v1::SamplingParams& sampling, int vocab_size);

// request_id (empty, or 1..128 printable ASCII bytes), messages (at least one; their text bytes
// summed <= limits.max_chat_text_bytes, checked first and naming the part that crosses the cap;
// role; content parts; UTF-8 text; images as described above, decoded size <= limits.max_image_bytes),
// sampling, cache_salt (<= 256 bytes) and priority (-100..100). `model` is not checked here (an
// unknown model is kInvalidArgument naming `model`, decided by the caller).
absl::Status ValidateChatRequest(const v1::ChatRequest& request, const RequestLimits& limits);

// request_id, prompt_token_ids (at least one; each < limits.vocab_size), sampling, cache_salt,
// priority; and prompt_token_ids.size() + max_tokens against the context (see
// ToEngineSamplingParams).
absl::Status ValidateGenerateRequest(const v1::GenerateRequest& request,
                                     const RequestLimits& limits);

enum class ImageFormat { kPng, kJpeg };

// An image of a chat request, decoded from its data: bytes or data: URL.
struct ChatImage {
  int message_index = 0;  // messages[message_index].content[part_index]
  int part_index = 0;
  ImageFormat format = ImageFormat::kPng;  // from the content (the mime_type hint is ignored)
  uint32_t width = 0;
  uint32_t height = 0;
  std::string bytes;  // the encoded file (PNG or JPEG)
};

// What the chat template renders, and the images it refers to in order of appearance.
struct ChatPrompt {
  // A JSON array with one object per message, as transformers passes them to the template:
  //   {"role": "user", "content": "text", "name": "bob"}
  // `content` is a string (the message's text parts concatenated; "" for an assistant message
  // with no parts) when the message has no image, else a list of parts in order, adjacent text
  // parts merged: {"type": "text", "text": "..."} and {"type": "image"} (the placeholder that
  // multimodal templates test for). `name` is present only when set: keys whose value would be
  // null are left out, since a template sees a null value as None (and may print "None") but an
  // absent one as undefined.
  nlohmann::ordered_json messages;
  // ChatRequest.add_generation_prompt, true when unset.
  bool add_generation_prompt = true;
  std::vector<ChatImage> images;
};

// Validates `request` (exactly as ValidateChatRequest) and converts its messages.
absl::StatusOr<ChatPrompt> ConvertChatMessages(const v1::ChatRequest& request,
                                               const RequestLimits& limits);

// The engine's sampling parameters for a request whose prompt has `prompt_tokens` tokens:
// optional fields the client left unset (temperature, top_p, top_k, min_p) and a
// repetition_penalty of 0 take `defaults`; max_tokens 0 becomes "up to the context"
// (limits.max_context_tokens - prompt_tokens). kInvalidArgument naming the field for any
// out-of-range value, and naming sampling.max_tokens when prompt_tokens + max_tokens exceeds the
// context (or the prompt leaves no room for one token). The result passes
// engine::ValidateSamplingParams.
absl::StatusOr<engine::SamplingParams> ToEngineSamplingParams(const v1::SamplingParams& sampling,
                                                              const GenerationDefaults& defaults,
                                                              const RequestLimits& limits,
                                                              int64_t prompt_tokens);

// The request's sampling with every default resolved, as the router forwards it to workers:
// temperature, top_p, top_k and min_p set (from the client or `defaults`), repetition_penalty the
// effective one; every other field as the client gave it (max_tokens 0 keeps meaning "up to the
// context", which the worker knows as well as the router; it was checked against the context). Errors exactly as ToEngineSamplingParams. A worker converting the
// result with ToEngineSamplingParams gets the same engine parameters whatever its own defaults.
absl::StatusOr<v1::SamplingParams> ResolveSampling(const v1::SamplingParams& sampling,
                                                   const GenerationDefaults& defaults,
                                                   const RequestLimits& limits,
                                                   int64_t prompt_tokens);

// Building blocks, exposed for tests, for other front ends and for the workers' checks. Each
// returns kInvalidArgument with the message format above.

// request_id: empty (the router generates one) or 1..128 printable ASCII bytes.
absl::Status ValidateRequestId(absl::string_view request_id);

// cache_salt: at most 256 bytes.
absl::Status ValidateCacheSalt(absl::string_view cache_salt);

// priority: -100..100.
absl::Status ValidatePriority(int32_t priority);

// prompt_token_ids: at least one, each in [0, vocab_size) (names prompt_token_ids[i]).
absl::Status ValidatePromptTokenIds(absl::Span<const uint32_t> ids, int vocab_size);

// The completion budget of a prompt of `prompt_tokens` tokens in a context of `context` tokens:
// `max_tokens`, or context - prompt_tokens when it is 0. kInvalidArgument naming
// sampling.max_tokens when prompt + max_tokens exceeds the context, or when max_tokens is 0 and
// the prompt leaves no room for one token.
absl::StatusOr<int64_t> ResolveMaxTokens(uint32_t max_tokens, int64_t prompt_tokens,
                                         int64_t context);

// True when `text` is well-formed UTF-8 (no overlong forms, surrogates or values > U+10FFFF).
bool IsValidUtf8(absl::string_view text);

// OK when `text` is well-formed UTF-8; else kInvalidArgument
// "<field>: expected UTF-8 text, got an invalid byte sequence at byte N".
absl::Status ValidateUtf8(absl::string_view field, absl::string_view text);

// Strict standard base64 (RFC 4648 alphabet, '=' padding optional but, if present, correct; no
// whitespace). False on any malformed input.
bool Base64Decode(absl::string_view in, std::string* out);

// The format and size of a PNG or JPEG file, checked structurally as described above.
// kInvalidArgument (message without a field path) when it is neither, or is malformed.
struct ImageHeader {
  ImageFormat format = ImageFormat::kPng;
  uint32_t width = 0;
  uint32_t height = 0;
};
absl::StatusOr<ImageHeader> InspectImage(absl::string_view bytes);

}  // namespace deepinfer::api

#endif  // DEEPINFER_API_REQUEST_VALIDATION_H_
