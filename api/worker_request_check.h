// The bounds a worker (prefill or decode node) checks on a request from the router, before it
// touches the engine. The router has already validated the public request in full
// (api/request_validation.h); a worker re-checks only what protects it from a bad or foreign
// caller: the id it keys the call by, token ids it indexes with, sizes it allocates by, and the
// model's context. The router resolves the model's sampling defaults once (ResolveSampling) and
// the internal requests carry the result, so a worker converts it with ToEngineSamplingParams
// and the built-in GenerationDefaults, which then change nothing.
//
// Every violation is kInvalidArgument whose message starts with the field's path, in the format
// of api/request_validation.h ("prompt_token_ids[2]: expected a token id in [0, 768), got 900").
// Only limits.vocab_size and limits.max_context_tokens are read.
//
// Checked, in this order:
//   request_id           required (unlike at the router), 1..128 printable ASCII bytes;
//   sampling.*           the ranges of inference.proto (top_k >= -1, logprobs 0..20, at most 16
//                        stop strings of 1..256 bytes, stop_token_ids below vocab_size, ...);
//   cache_salt           at most 256 bytes;
//   priority             -100..100 (DecodeRequest only);
//   prompt_token_ids     at least one, each below vocab_size;
//   sampling.max_tokens  prompt + max_tokens within max_context_tokens (0 = "up to the context":
//                        the prompt must leave room for one token).
//
// Thread-safety: all functions are pure and thread-safe.
#ifndef DEEPINFER_API_WORKER_REQUEST_CHECK_H_
#define DEEPINFER_API_WORKER_REQUEST_CHECK_H_

#include "absl/status/status.h"
#include "api/request_validation.h"
#include "proto/deepinfer/internal/v1/decode.pb.h"
#include "proto/deepinfer/internal/v1/prefill.pb.h"

namespace deepinfer::api {

absl::Status CheckWorkerRequest(const internal::v1::DecodeRequest& request,
                                const RequestLimits& limits);

// PrefillRequest.destination and .images are the prefill node's own checks (they depend on its
// KV pool and peers).
absl::Status CheckWorkerRequest(const internal::v1::PrefillRequest& request,
                                const RequestLimits& limits);

}  // namespace deepinfer::api

#endif  // DEEPINFER_API_WORKER_REQUEST_CHECK_H_
