#include "tools/bench/runner.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <random>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "grpcpp/grpcpp.h"
#include "proto/deepinfer/v1/inference.grpc.pb.h"

namespace deepinfer::bench {
namespace {

using Clock = std::chrono::steady_clock;

std::string FinishName(v1::FinishReason r) {
  switch (r) {
    case v1::FINISH_REASON_STOP: return "stop";
    case v1::FINISH_REASON_LENGTH: return "length";
    case v1::FINISH_REASON_STOP_STRING: return "stop_string";
    case v1::FINISH_REASON_ABORTED: return "aborted";
    case v1::FINISH_REASON_ERROR: return "error";
    default: return "unspecified";
  }
}

class Runner {
 public:
  Runner(const RunnerOptions& o, std::shared_ptr<grpc::Channel> channel)
      : o_(o), stub_(v1::Inference::NewStub(channel)), start_(Clock::now()) {}

  double Now() const {
    return std::chrono::duration<double>(Clock::now() - start_).count();
  }

  void RunSession(const SessionPlan& plan, bool warmup) {
    std::vector<std::pair<std::string, std::string>> history;  // (instruction, answer)
    for (size_t t = 0; t < plan.turns.size(); ++t) {
      if (t > 0 && plan.think_time_s > 0) absl::SleepFor(absl::Seconds(plan.think_time_s));
      v1::ChatRequest req;
      req.set_model(o_.model);
      auto add = [&](const std::string& role, const std::string& text) {
        v1::ChatMessage* m = req.add_messages();
        m->set_role(role);
        m->add_content()->set_text(text);
      };
      if (!plan.system.empty()) add("system", plan.system);
      for (const auto& [q, a] : history) {
        add("user", q);
        add("assistant", a);
      }
      add("user", plan.turns[t].instruction);
      req.mutable_sampling()->set_temperature(0);
      req.mutable_sampling()->set_max_tokens(plan.turns[t].max_tokens);
      req.mutable_sampling()->set_ignore_eos(true);

      RequestRecord r;
      r.session = plan.id;
      r.turn = static_cast<int>(t);
      r.warmup = warmup;
      std::string answer;
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() +
                       absl::ToChronoMilliseconds(o_.request_timeout));
      r.send_s = Now();
      auto reader = stub_->Chat(&ctx, req);
      v1::ChatChunk chunk;
      while (reader->Read(&chunk)) {
        const double at = Now();
        if (chunk.token_ids_size() > 0) {
          r.chunk_times_s.push_back(at);
          r.chunk_tokens.push_back(chunk.token_ids_size());
        }
        answer += chunk.text_delta();
        if (chunk.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
          r.finish_reason = FinishName(chunk.finish_reason());
          r.prompt_tokens = chunk.usage().prompt_tokens();
          r.cached_prompt_tokens = chunk.usage().cached_prompt_tokens();
          r.completion_tokens = chunk.usage().completion_tokens();
          r.draft_tokens = chunk.usage().draft_tokens();
          r.accepted_draft_tokens = chunk.usage().accepted_draft_tokens();
          const v1::Timing& timing = chunk.usage().timing();
          r.prefill_compute_us = static_cast<int64_t>(timing.prefill_compute_us());
          r.kv_transfer_us = static_cast<int64_t>(timing.kv_transfer_us());
          r.kv_transfer_exposed_us = static_cast<int64_t>(timing.kv_transfer_exposed_us());
          r.decode_queue_us = static_cast<int64_t>(timing.decode_queue_us());
        }
      }
      grpc::Status st = reader->Finish();
      r.end_s = Now();
      r.ok = st.ok() && !r.finish_reason.empty() && r.finish_reason != "error" &&
             r.finish_reason != "aborted";
      if (!st.ok()) {
        r.error = absl::StrCat(st.error_code(), ": ", st.error_message());
      } else if (!r.ok) {
        r.error = absl::StrCat("finish_reason ", r.finish_reason.empty() ? "missing" : r.finish_reason);
      }
      const bool failed = !r.ok;
      {
        std::lock_guard<std::mutex> lock(mu_);
        records_.push_back(std::move(r));
      }
      if (failed) return;  // the rest of the session would resend a broken history
      history.emplace_back(plan.turns[t].instruction, answer);
    }
  }

  std::vector<RequestRecord> TakeRecords() {
    std::lock_guard<std::mutex> lock(mu_);
    return std::move(records_);
  }

 private:
  const RunnerOptions o_;
  std::unique_ptr<v1::Inference::Stub> stub_;
  const Clock::time_point start_;
  std::mutex mu_;
  std::vector<RequestRecord> records_;
};

// Runs sessions [begin, end) closed-loop with `n` threads.
void ClosedLoop(Runner& runner, const std::vector<SessionPlan>& sessions, size_t begin,
                size_t end, int n, bool warmup, absl::Time stop_at) {
  std::atomic<size_t> next{begin};
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&] {
      for (;;) {
        const size_t k = next.fetch_add(1);
        if (k >= end || absl::Now() >= stop_at) return;
        runner.RunSession(sessions[k], warmup);
      }
    });
  }
  for (auto& t : threads) t.join();
}

}  // namespace

absl::StatusOr<std::vector<RequestRecord>> RunWorkload(const std::vector<SessionPlan>& sessions,
                                                       const RunnerOptions& o, RunStats* stats) {
  if (o.mode != "open" && o.mode != "closed") {
    return absl::InvalidArgumentError(
        absl::StrCat("mode: expected open or closed, got \"", o.mode, "\""));
  }
  if (o.mode == "open" && !(o.rate > 0)) {
    return absl::InvalidArgumentError(absl::StrCat("rate: expected > 0, got ", o.rate));
  }
  if (!(o.burstiness > 0)) {
    return absl::InvalidArgumentError(absl::StrCat("burstiness: expected > 0, got ", o.burstiness));
  }
  if (o.concurrency < 1 || o.max_in_flight < 1) {
    return absl::InvalidArgumentError("concurrency / max_in_flight: expected >= 1");
  }
  if (o.warmup_sessions < 0 || static_cast<size_t>(o.warmup_sessions) > sessions.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("warmup_sessions: expected 0..", sessions.size(), ", got ", o.warmup_sessions));
  }
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  auto channel = grpc::CreateCustomChannel(o.target, grpc::InsecureChannelCredentials(), args);
  {
    auto stub = v1::Inference::NewStub(channel);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::ListModelsResponse models;
    grpc::Status st = stub->ListModels(&ctx, v1::ListModelsRequest(), &models);
    if (!st.ok()) {
      return absl::UnavailableError(
          absl::StrCat("router ", o.target, ": ListModels failed: ", st.error_message()));
    }
  }
  Runner runner(o, channel);
  const size_t warm = static_cast<size_t>(o.warmup_sessions);
  if (warm > 0) {
    ClosedLoop(runner, sessions, 0, warm, o.concurrency, /*warmup=*/true,
               absl::InfiniteFuture());
  }
  const absl::Time stop_at =
      o.duration == absl::InfiniteDuration() ? absl::InfiniteFuture() : absl::Now() + o.duration;
  if (o.mode == "closed") {
    ClosedLoop(runner, sessions, warm, sessions.size(), o.concurrency, false, stop_at);
  } else {
    std::mt19937_64 rng(o.seed);
    std::gamma_distribution<double> gap(o.burstiness, 1.0 / (o.rate * o.burstiness));
    std::mutex mu;
    std::condition_variable cv;
    int in_flight = 0;
    std::vector<std::thread> threads;
    auto next_at = std::chrono::steady_clock::now();
    for (size_t k = warm; k < sessions.size(); ++k) {
      next_at += std::chrono::duration_cast<std::chrono::steady_clock::duration>(
          std::chrono::duration<double>(gap(rng)));
      std::this_thread::sleep_until(next_at);
      if (absl::Now() >= stop_at) break;
      {
        std::unique_lock<std::mutex> lock(mu);
        if (in_flight >= o.max_in_flight) {
          if (stats != nullptr) ++stats->arrivals_delayed;
          cv.wait(lock, [&] { return in_flight < o.max_in_flight; });
        }
        ++in_flight;
      }
      threads.emplace_back([&, k] {
        runner.RunSession(sessions[k], false);
        std::lock_guard<std::mutex> lock(mu);
        --in_flight;
        cv.notify_all();
      });
    }
    for (auto& t : threads) t.join();
  }
  return runner.TakeRecords();
}

}  // namespace deepinfer::bench
