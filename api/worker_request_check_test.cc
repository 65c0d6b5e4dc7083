#include "api/worker_request_check.h"

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace deepinfer::api {
namespace {

using internal::v1::DecodeRequest;
using internal::v1::PrefillRequest;

constexpr RequestLimits kLimits{/*vocab_size=*/768, /*max_context_tokens=*/64};

template <typename Request>
Request Valid() {
  Request r;
  r.set_request_id("req-1");
  for (uint32_t t : {1u, 2u, 3u, 767u}) r.add_prompt_token_ids(t);
  r.mutable_sampling()->set_max_tokens(8);
  return r;
}

struct Case {
  std::string field;  // the message must start with field + ":"
  std::function<void(v1::SamplingParams*)> sampling;
};

// Each bound that protects a worker, set one past its limit on an otherwise valid request.
const std::vector<Case>& SamplingCases() {
  static const std::vector<Case> cases = {
      {"sampling.max_tokens", [](v1::SamplingParams* s) { s->set_max_tokens(61); }},
      {"sampling.top_k", [](v1::SamplingParams* s) { s->set_top_k(-2); }},
      {"sampling.logprobs", [](v1::SamplingParams* s) { s->set_logprobs(21); }},
      {"sampling.stop", [](v1::SamplingParams* s) {
         for (int i = 0; i < 17; ++i) s->add_stop("x");
       }},
      {"sampling.stop[1]", [](v1::SamplingParams* s) {
         s->add_stop("ok");
         s->add_stop(std::string(257, 'y'));
       }},
      {"sampling.stop[0]", [](v1::SamplingParams* s) { s->add_stop(""); }},
      {"sampling.stop_token_ids[1]", [](v1::SamplingParams* s) {
         s->add_stop_token_ids(5);
         s->add_stop_token_ids(768);
       }},
      {"sampling.temperature", [](v1::SamplingParams* s) { s->set_temperature(-0.5f); }},
      {"sampling.top_p", [](v1::SamplingParams* s) { s->set_top_p(1.5f); }},
      {"sampling.repetition_penalty",
       [](v1::SamplingParams* s) { s->set_repetition_penalty(3.0f); }},
  };
  return cases;
}

void ExpectNamed(const absl::Status& status, const std::string& field) {
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << field << ": " << status;
  EXPECT_EQ(std::string(status.message()).rfind(field + ":", 0), 0u) << field << ": " << status;
}

template <typename Request>
void ExpectCommonBounds() {
  EXPECT_TRUE(CheckWorkerRequest(Valid<Request>(), kLimits).ok());
  for (const Case& c : SamplingCases()) {
    Request r = Valid<Request>();
    c.sampling(r.mutable_sampling());
    ExpectNamed(CheckWorkerRequest(r, kLimits), c.field);
  }
  {
    Request r = Valid<Request>();
    r.clear_request_id();
    ExpectNamed(CheckWorkerRequest(r, kLimits), "request_id");
  }
  {
    Request r = Valid<Request>();
    r.set_request_id(std::string(129, 'a'));
    ExpectNamed(CheckWorkerRequest(r, kLimits), "request_id");
  }
  {
    Request r = Valid<Request>();
    r.set_request_id("a\nb");
    ExpectNamed(CheckWorkerRequest(r, kLimits), "request_id");
  }
  {
    Request r = Valid<Request>();
    r.set_cache_salt(std::string(257, 's'));
    ExpectNamed(CheckWorkerRequest(r, kLimits), "cache_salt");
  }
  {
    Request r = Valid<Request>();
    r.clear_prompt_token_ids();
    ExpectNamed(CheckWorkerRequest(r, kLimits), "prompt_token_ids");
  }
  {
    Request r = Valid<Request>();
    r.set_prompt_token_ids(2, 768);
    const absl::Status status = CheckWorkerRequest(r, kLimits);
    ExpectNamed(status, "prompt_token_ids[2]");
    EXPECT_EQ(status.message(), "prompt_token_ids[2]: expected a token id in [0, 768), got 768");
  }
  {
    // max_tokens 0 means "up to the context": a prompt that fills it leaves no room.
    Request r = Valid<Request>();
    r.mutable_sampling()->set_max_tokens(0);
    EXPECT_TRUE(CheckWorkerRequest(r, kLimits).ok());
    for (int i = 4; i < 64; ++i) r.add_prompt_token_ids(1);
    ExpectNamed(CheckWorkerRequest(r, kLimits), "sampling.max_tokens");
  }
  {
    // Exactly at the context is allowed.
    Request r = Valid<Request>();
    r.mutable_sampling()->set_max_tokens(60);
    EXPECT_TRUE(CheckWorkerRequest(r, kLimits).ok());
  }
}

TEST(WorkerRequestCheckTest, DecodeRequestBoundsNameTheField) {
  ExpectCommonBounds<DecodeRequest>();
  DecodeRequest r = Valid<DecodeRequest>();
  r.set_priority(101);
  ExpectNamed(CheckWorkerRequest(r, kLimits), "priority");
  r.set_priority(-100);
  EXPECT_TRUE(CheckWorkerRequest(r, kLimits).ok());
}

TEST(WorkerRequestCheckTest, PrefillRequestBoundsNameTheField) {
  ExpectCommonBounds<PrefillRequest>();
}

TEST(WorkerRequestCheckTest, UnsetSamplingFieldsAreNotRequired) {
  // The router forwards the client's parameters; unset optional fields are the worker's defaults
  // to fill, not errors.
  DecodeRequest r = Valid<DecodeRequest>();
  r.mutable_sampling()->Clear();
  EXPECT_TRUE(CheckWorkerRequest(r, kLimits).ok());
}

}  // namespace
}  // namespace deepinfer::api
