// //tools:chat — send one chat request to a deepinfer router and show the answer with timings.
//
//   chat --message "Write a haiku about caches"
//   chat --router 127.0.0.1:50051 --system "Be brief" --message "Hi" --max_tokens 32
//   chat --messages_json '[{"role":"user","content":"Hi"}]' --temperature 0.7 --seed 1
//   chat --message "Hi" --json          # every chunk as a JSON line, then a summary object
//   chat --message "Hi" --follow_up "And then?"   # a second turn after the first answer
//
// Prints the text as it streams (or all at once with --stream=false), then one summary line:
// prompt/cached/completion tokens, finish reason, and client-side TTFT (send -> first chunk with
// tokens), ITL (between chunks with tokens) mean/p50/p90/max, end-to-end time and tokens/s.
// Further lines, when the response carries them: how many prompt tokens the prefix cache served,
// speculative decoding's verified and accepted draft tokens, and where the time went as the
// cluster measured it (usage.timing: queue, prefill including the KV transfer, decode).
// --follow_up sends a second request whose history is the first turn and its answer, and prints
// its answer and summary the same way: its cached prompt tokens show the prefix cache at work.
// A failed call prints "error: CODE: message" on stderr and exits 1; bad flags exit 2.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/grpc_status.h"
#include "google/protobuf/util/json_util.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "nlohmann/json.hpp"
#include "proto/deepinfer/v1/inference.grpc.pb.h"

ABSL_FLAG(std::string, router, "127.0.0.1:50051", "Router address (host:port).");
ABSL_FLAG(std::string, model, "", "Model id; empty selects the cluster's only model.");
ABSL_FLAG(std::string, message, "", "User message text.");
ABSL_FLAG(std::vector<std::string>, image, {},
          "PNG/JPEG files sent as image parts of the user message, before its text "
          "(comma-separated; needs a LLaVA-style model with a vision encoder pool).");
ABSL_FLAG(std::string, system, "", "Optional system message, sent before --message.");
ABSL_FLAG(std::string, messages_json, "",
          "The whole conversation as a JSON array of {\"role\", \"content\"} objects (instead "
          "of --system/--message).");
ABSL_FLAG(int, max_tokens, 64, "Most tokens to generate (>= 1).");
ABSL_FLAG(double, temperature, 0.0, "Sampling temperature; 0 = greedy.");
ABSL_FLAG(double, top_p, 0.0, "Nucleus sampling mass (0, 1]; 0 = the model's default.");
ABSL_FLAG(int64_t, seed, -1, "Sampling seed (>= 0); -1 = unset.");
ABSL_FLAG(bool, stream, true, "Print text as it arrives (else all at once at the end).");
ABSL_FLAG(absl::Duration, timeout, absl::Seconds(60), "Deadline of the whole call.");
ABSL_FLAG(bool, json, false, "Print every chunk as a JSON line, then a JSON summary.");
ABSL_FLAG(std::string, request_id, "", "Request id (empty: the router picks one).");
ABSL_FLAG(std::string, follow_up, "",
          "A second user message, sent after the first answer with the conversation so far "
          "(empty: one turn).");

namespace deepinfer::tools {
namespace {

using ::deepinfer::v1::ChatChunk;
using ::deepinfer::v1::ChatRequest;

absl::StatusOr<ChatRequest> BuildRequest() {
  ChatRequest request;
  request.set_model(absl::GetFlag(FLAGS_model));
  request.set_request_id(absl::GetFlag(FLAGS_request_id));
  const std::string messages_json = absl::GetFlag(FLAGS_messages_json);
  if (!messages_json.empty()) {
    if (!absl::GetFlag(FLAGS_message).empty() || !absl::GetFlag(FLAGS_system).empty()) {
      return absl::InvalidArgumentError(
          "--messages_json: give either --messages_json or --system/--message, not both");
    }
    nlohmann::json messages = nlohmann::json::parse(messages_json, nullptr, false);
    if (messages.is_discarded() || !messages.is_array() || messages.empty()) {
      return absl::InvalidArgumentError(
          "--messages_json: expected a non-empty JSON array of {\"role\", \"content\"}");
    }
    for (size_t i = 0; i < messages.size(); ++i) {
      const nlohmann::json& m = messages[i];
      if (!m.is_object() || !m.contains("role") || !m["role"].is_string() ||
          !m.contains("content") || !m["content"].is_string()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--messages_json[", i, "]: expected {\"role\": string, \"content\": string}"));
      }
      v1::ChatMessage* message = request.add_messages();
      message->set_role(m["role"].get<std::string>());
      message->add_content()->set_text(m["content"].get<std::string>());
    }
  } else {
    if (absl::GetFlag(FLAGS_message).empty()) {
      return absl::InvalidArgumentError("--message: expected the user text (or --messages_json)");
    }
    if (!absl::GetFlag(FLAGS_system).empty()) {
      v1::ChatMessage* system = request.add_messages();
      system->set_role("system");
      system->add_content()->set_text(absl::GetFlag(FLAGS_system));
    }
    v1::ChatMessage* user = request.add_messages();
    user->set_role("user");
    for (const std::string& path : absl::GetFlag(FLAGS_image)) {
      std::ifstream in(path, std::ios::binary);
      std::stringstream bytes;
      bytes << in.rdbuf();
      if (!in || bytes.str().empty()) {
        return absl::InvalidArgumentError(absl::StrCat("--image: cannot read ", path));
      }
      user->add_content()->mutable_image()->set_data(bytes.str());
    }
    user->add_content()->set_text(absl::GetFlag(FLAGS_message));
  }
  v1::SamplingParams* sampling = request.mutable_sampling();
  if (absl::GetFlag(FLAGS_max_tokens) < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_tokens: expected >= 1, got ", absl::GetFlag(FLAGS_max_tokens)));
  }
  sampling->set_max_tokens(absl::GetFlag(FLAGS_max_tokens));
  sampling->set_temperature(static_cast<float>(absl::GetFlag(FLAGS_temperature)));
  if (absl::GetFlag(FLAGS_top_p) != 0.0) {
    sampling->set_top_p(static_cast<float>(absl::GetFlag(FLAGS_top_p)));
  }
  if (absl::GetFlag(FLAGS_seed) >= 0) sampling->set_seed(absl::GetFlag(FLAGS_seed));
  if (absl::GetFlag(FLAGS_timeout) <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--timeout: expected > 0");
  }
  return request;
}

double Ms(absl::Duration d) { return absl::ToDoubleMilliseconds(d); }

// Nearest-rank percentile of a sorted, non-empty vector.
double Percentile(const std::vector<double>& sorted, double p) {
  size_t rank = static_cast<size_t>(std::ceil(p / 100.0 * sorted.size()));
  return sorted[std::clamp<size_t>(rank, 1, sorted.size()) - 1];
}

std::string ChunkJson(const ChatChunk& chunk) {
  std::string out;
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(chunk, &out, options);
  return out;
}

// What one turn's call returned.
struct TurnResult {
  int exit_code = 0;  // 0, or 1 when the call failed.
  std::string text;   // The whole answer.
};

// The lines after the summary: prefix-cache reuse, speculative drafts, and the cluster's own
// timing of the request (usage.timing, microseconds since the router received it).
void PrintUsageDetails(const v1::Usage& usage) {
  if (usage.cached_prompt_tokens() > 0) {
    printf("-- prefix cache: %u of %u prompt tokens reused (their KV was not computed again)\n",
           usage.cached_prompt_tokens(), usage.prompt_tokens());
  }
  if (usage.draft_tokens() > 0) {
    printf("-- speculative decoding: %u draft tokens verified, %u accepted (%.0f%%)\n",
           usage.draft_tokens(), usage.accepted_draft_tokens(),
           100.0 * usage.accepted_draft_tokens() / usage.draft_tokens());
  }
  if (usage.has_timing() && usage.timing().total_us() > 0) {
    const v1::Timing& t = usage.timing();
    const uint64_t first = std::max(t.first_token_us(), t.queued_us() + t.prefill_us());
    printf("-- where the time went (cluster): queue %.1f ms, prefill + KV transfer %.1f ms, "
           "routing and first token %.1f ms, decode %.1f ms, total %.1f ms\n",
           t.queued_us() / 1e3, t.prefill_us() / 1e3,
           (first - t.queued_us() - t.prefill_us()) / 1e3,
           (t.total_us() > first ? t.total_us() - first : 0) / 1e3, t.total_us() / 1e3);
  }
}

TurnResult RunTurn(v1::Inference::Stub& stub, const ChatRequest& request) {
  const bool json = absl::GetFlag(FLAGS_json);
  const bool stream = absl::GetFlag(FLAGS_stream);
  TurnResult result;

  grpc::ClientContext context;
  const absl::Time start = absl::Now();
  context.set_deadline(absl::ToChronoTime(start + absl::GetFlag(FLAGS_timeout)));
  std::unique_ptr<grpc::ClientReader<ChatChunk>> reader = stub.Chat(&context, request);

  ChatChunk chunk, last;
  std::optional<absl::Time> first_token, previous_token;
  std::vector<double> itl_ms;
  uint64_t streamed_tokens = 0;
  while (reader->Read(&chunk)) {
    const absl::Time now = absl::Now();
    if (chunk.token_ids_size() > 0) {
      if (!first_token.has_value()) {
        first_token = now;
      } else {
        itl_ms.push_back(Ms(now - *previous_token));
      }
      previous_token = now;
      streamed_tokens += chunk.token_ids_size();
    }
    if (json) {
      printf("%s\n", ChunkJson(chunk).c_str());
      fflush(stdout);
    } else if (stream) {
      fwrite(chunk.text_delta().data(), 1, chunk.text_delta().size(), stdout);
      fflush(stdout);
    }
    result.text += chunk.text_delta();
    last = chunk;
  }
  const absl::Time end = absl::Now();
  grpc::Status rpc = reader->Finish();
  if (!json && stream) printf("\n");
  if (!rpc.ok()) {
    absl::Status status = FromGrpcStatus(rpc);
    fflush(stdout);
    fprintf(stderr, "error: %s: %s\n", absl::StatusCodeToString(status.code()).c_str(),
            std::string(status.message()).c_str());
    result.exit_code = 1;
    return result;
  }
  if (!json && !stream) printf("%s\n", result.text.c_str());

  const v1::Usage& usage = last.usage();
  const std::string finish(absl::StripPrefix(v1::FinishReason_Name(last.finish_reason()),
                                             "FINISH_REASON_"));
  const uint32_t completion =
      usage.completion_tokens() > 0 ? usage.completion_tokens() : streamed_tokens;
  const double e2e_ms = Ms(end - start);
  const double ttft_ms = first_token.has_value() ? Ms(*first_token - start) : 0.0;
  std::sort(itl_ms.begin(), itl_ms.end());
  double itl_mean = 0, itl_p50 = 0, itl_p90 = 0, itl_max = 0;
  if (!itl_ms.empty()) {
    for (double v : itl_ms) itl_mean += v;
    itl_mean /= itl_ms.size();
    itl_p50 = Percentile(itl_ms, 50);
    itl_p90 = Percentile(itl_ms, 90);
    itl_max = itl_ms.back();
  }
  const double tokens_per_s = e2e_ms > 0 ? completion / (e2e_ms / 1000.0) : 0.0;

  if (json) {
    const v1::Timing& t = usage.timing();
    nlohmann::ordered_json summary = {
        {"request_id", last.request_id()},
        {"prompt_tokens", usage.prompt_tokens()},
        {"cached_prompt_tokens", usage.cached_prompt_tokens()},
        {"images", usage.images()},
        {"cached_images", usage.cached_images()},
        {"completion_tokens", completion},
        {"draft_tokens", usage.draft_tokens()},
        {"accepted_draft_tokens", usage.accepted_draft_tokens()},
        {"finish_reason", finish},
        {"ttft_ms", ttft_ms},
        {"itl_ms", {{"mean", itl_mean}, {"p50", itl_p50}, {"p90", itl_p90}, {"max", itl_max}}},
        {"e2e_ms", e2e_ms},
        {"tokens_per_s", tokens_per_s},
        {"cluster_timing_ms",
         {{"queued", t.queued_us() / 1e3},
          {"prefill", t.prefill_us() / 1e3},
          {"first_token", t.first_token_us() / 1e3},
          {"total", t.total_us() / 1e3}}},
    };
    printf("%s\n", summary.dump().c_str());
  } else {
    printf(
        "%s",
        absl::StrFormat("-- prompt %u tokens (%u cached)%s, completion %u tokens, finish %s | "
                        "TTFT %.1f ms | ITL mean %.1f p50 %.1f p90 %.1f max %.1f ms | E2E %.1f ms "
                        "| %.1f tokens/s\n",
                        usage.prompt_tokens(), usage.cached_prompt_tokens(),
                        usage.images() == 0
                            ? std::string()
                            : absl::StrFormat(", %u images (%u from the encoder cache)",
                                              usage.images(), usage.cached_images()),
                        completion, finish,
                        ttft_ms, itl_mean, itl_p50, itl_p90, itl_max, e2e_ms, tokens_per_s)
            .c_str());
    PrintUsageDetails(usage);
  }
  fflush(stdout);
  return result;
}

int Run() {
  absl::StatusOr<ChatRequest> request = BuildRequest();
  if (!request.ok()) {
    fprintf(stderr, "chat: %s\n", std::string(request.status().message()).c_str());
    return 2;
  }
  auto channel =
      grpc::CreateChannel(absl::GetFlag(FLAGS_router), grpc::InsecureChannelCredentials());
  auto stub = v1::Inference::NewStub(channel);
  TurnResult first = RunTurn(*stub, *request);
  const std::string follow_up = absl::GetFlag(FLAGS_follow_up);
  if (first.exit_code != 0 || follow_up.empty()) return first.exit_code;

  // The second turn: the first one's messages, its answer, then the follow-up.
  ChatRequest second = *request;
  if (!second.request_id().empty()) second.set_request_id(second.request_id() + "-2");
  v1::ChatMessage* answer = second.add_messages();
  answer->set_role("assistant");
  answer->add_content()->set_text(first.text);
  v1::ChatMessage* user = second.add_messages();
  user->set_role("user");
  user->add_content()->set_text(follow_up);
  if (!absl::GetFlag(FLAGS_json)) {
    printf("\nuser> %s\nassistant> ", follow_up.c_str());
    fflush(stdout);
  }
  return RunTurn(*stub, second).exit_code;
}

}  // namespace
}  // namespace deepinfer::tools

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("Sends one chat request: chat --message TEXT [--router host:port]");
  absl::ParseCommandLine(argc, argv);
  return deepinfer::tools::Run();
}
