#include "api/worker_request_check.h"

#include <cstdint>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/status_macros.h"

namespace deepinfer::api {
namespace {

absl::Status CheckFields(absl::string_view request_id, absl::Span<const uint32_t> prompt,
                         const v1::SamplingParams& sampling, absl::string_view cache_salt,
                         int32_t priority, const RequestLimits& limits) {
  // The router fills an empty id in; a worker needs one to key the call and its Abort.
  if (request_id.empty()) {
    return absl::InvalidArgumentError(
        "request_id: expected 1..128 printable ASCII bytes, got \"\"");
  }
  DI_RETURN_IF_ERROR(ValidateRequestId(request_id));
  DI_RETURN_IF_ERROR(ValidateSamplingParams(sampling, limits.vocab_size));
  DI_RETURN_IF_ERROR(ValidateCacheSalt(cache_salt));
  DI_RETURN_IF_ERROR(ValidatePriority(priority));
  DI_RETURN_IF_ERROR(ValidatePromptTokenIds(prompt, limits.vocab_size));
  return ResolveMaxTokens(sampling.max_tokens(), static_cast<int64_t>(prompt.size()),
                          limits.max_context_tokens)
      .status();
}

}  // namespace

absl::Status CheckWorkerRequest(const internal::v1::DecodeRequest& request,
                                const RequestLimits& limits) {
  return CheckFields(request.request_id(), request.prompt_token_ids(), request.sampling(),
                     request.cache_salt(), request.priority(), limits);
}

absl::Status CheckWorkerRequest(const internal::v1::PrefillRequest& request,
                                const RequestLimits& limits) {
  return CheckFields(request.request_id(), request.prompt_token_ids(), request.sampling(),
                     request.cache_salt(), /*priority=*/0, limits);
}

}  // namespace deepinfer::api
