// Test helper: collects LlmEngine outputs per request from the engine's callback thread.
//
//   OutputCollector c;
//   engine->Submit(request, c.Callback());
//   ASSERT_TRUE(c.WaitFor(1, std::chrono::seconds(30)));
//   c.results()["id"].tokens ...
//
// Thread-safety: all methods are thread-safe.
#ifndef DEEPINFER_ENGINE_OUTPUT_COLLECTOR_H_
#define DEEPINFER_ENGINE_OUTPUT_COLLECTOR_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/llm_engine.h"

namespace deepinfer::engine {

class OutputCollector {
 public:
  struct Result {
    std::vector<int32_t> tokens;
    std::vector<float> logprobs;
    std::vector<int32_t> top;  // the top alternatives' ids, token after token
    std::string text;
    std::string matched_stop;
    int final_outputs = 0;
    FinishReason finish = FinishReason::kLength;
    absl::Status status;
    RequestUsage usage;
  };

  OutputCallback Callback() {
    return [this](const EngineOutput& out) {
      std::lock_guard<std::mutex> lock(mu_);
      Result& r = results_[out.request_id];
      for (const StepOutput& s : out.new_tokens) {
        r.tokens.push_back(s.token);
        r.logprobs.push_back(s.logprob);
        for (const TokenLogprob& t : s.top) r.top.push_back(t.token);
      }
      r.text += out.text_delta;
      if (!out.matched_stop.empty()) r.matched_stop = out.matched_stop;
      if (out.finished) {
        ++r.final_outputs;
        r.finish = out.finish_reason;
        r.status = out.status;
        r.usage = out.usage;
        ++finished_;
        cv_.notify_all();
      }
    };
  }

  // True once `n` requests have finished, false after `timeout`.
  bool WaitFor(int n, std::chrono::seconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return finished_ >= n; });
  }

  std::map<std::string, Result> results() {
    std::lock_guard<std::mutex> lock(mu_);
    return results_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, Result> results_;
  int finished_ = 0;
};

}  // namespace deepinfer::engine

#endif  // DEEPINFER_ENGINE_OUTPUT_COLLECTOR_H_
