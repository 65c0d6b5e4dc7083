// Serving benchmark (not a test): the multi-turn agent workload on LlmEngine.
//
// 1. TTFT per turn for one session, prefix cache on vs off: turn 1 sends --context tokens; each
//    later turn resends the previous prompt + answer + --turn_tokens new tokens.
// 2. Throughput with 1, 8 and 32 concurrent sessions (--sessions) doing --throughput_turns turns.
// 3. Scheduler time with overlap on vs off, as a fraction of step time.
// 4. Speculative decoding (n-gram drafts, --spec_k) off / on / adaptive on a workload whose
//    prompts repeat a passage (as when a model edits code it was given): output tokens/s and the
//    draft acceptance rate, with --spec_sessions concurrent requests.
//
//   bazel run -c opt //engine:bench_serving -- --model DIR
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "engine/llm_engine.h"

ABSL_FLAG(std::string, model, "", "Model directory.");
ABSL_FLAG(int, threads, 0, "Forward-pass threads (0: all cores).");
ABSL_FLAG(int, context, 2000, "Turn-1 context tokens.");
ABSL_FLAG(int, turn_tokens, 50, "New tokens per turn.");
ABSL_FLAG(int, output_tokens, 16, "Generated tokens per turn.");
ABSL_FLAG(int, turns, 8, "Turns in the TTFT run.");
ABSL_FLAG(std::string, sessions, "1,8,32", "Concurrent sessions for the throughput runs.");
ABSL_FLAG(int, throughput_context, 256, "Turn-1 context tokens in the throughput runs.");
ABSL_FLAG(int, throughput_turns, 2, "Turns per session in the throughput runs.");
ABSL_FLAG(int, block_size, 16, "KV block size.");
ABSL_FLAG(int, max_batch_tokens, 512, "Token budget per step.");
ABSL_FLAG(int, spec_k, 4, "Speculative decoding: draft tokens per step.");
ABSL_FLAG(std::string, spec_sessions, "1,8", "Concurrent requests in the speculative runs.");
ABSL_FLAG(int, spec_output_tokens, 64, "Generated tokens per request in the speculative runs.");

namespace deepinfer::engine {
namespace {

using Clock = std::chrono::steady_clock;

struct Waiter {
  std::mutex mu;
  std::condition_variable cv;
  std::map<std::string, std::pair<std::vector<int32_t>, RequestUsage>> done;
  std::map<std::string, std::vector<int32_t>> partial;
  OutputCallback Callback() {
    return [this](const EngineOutput& o) {
      std::lock_guard<std::mutex> lock(mu);
      auto& toks = partial[o.request_id];
      for (const auto& s : o.new_tokens) toks.push_back(s.token);
      if (o.finished) {
        done[o.request_id] = {toks, o.usage};
        cv.notify_all();
      }
    };
  }
  std::pair<std::vector<int32_t>, RequestUsage> Wait(const std::string& id) {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return done.count(id) != 0; });
    return done[id];
  }
};

std::unique_ptr<LlmEngine> MakeEngine(Model* model, bool cache, bool overlap, int max_tokens,
                                      const SpecOptions& spec = {}) {
  EngineOptions o;
  o.speculative = spec;
  o.block_size = absl::GetFlag(FLAGS_block_size);
  o.num_blocks = (max_tokens + o.block_size - 1) / o.block_size + 64;
  o.max_batch_tokens = absl::GetFlag(FLAGS_max_batch_tokens);
  o.enable_prefix_cache = cache;
  o.overlap = overlap;
  o.max_running = 64;
  auto engine = LlmEngine::Create(model, o);
  if (!engine.ok()) {
    std::fprintf(stderr, "%s\n", engine.status().ToString().c_str());
    std::exit(1);
  }
  (void)(*engine)->Start();
  return std::move(*engine);
}

std::vector<int32_t> RandomTokens(std::mt19937& rng, int n, int vocab) {
  std::vector<int32_t> t(n);
  for (int32_t& x : t) x = 3 + rng() % (vocab - 3);
  return t;
}

SamplingParams Params() {
  SamplingParams sp;
  sp.temperature = 0;
  sp.max_tokens = absl::GetFlag(FLAGS_output_tokens);
  sp.ignore_eos = true;
  return sp;
}

// Runs `sessions` sessions of `turns` turns; returns per-turn mean TTFT (ms) and fills totals.
std::vector<double> RunSessions(LlmEngine* engine, int vocab, int sessions, int turns,
                                int context, double* seconds, int64_t* out_tokens,
                                int64_t* in_tokens) {
  std::mt19937 rng(17);
  Waiter w;
  std::vector<std::vector<int32_t>> prompts(sessions);
  for (auto& p : prompts) p = RandomTokens(rng, context, vocab);
  std::vector<double> ttft(turns, 0.0);
  const auto start = Clock::now();
  *out_tokens = 0;
  *in_tokens = 0;
  for (int t = 0; t < turns; ++t) {
    for (int s = 0; s < sessions; ++s) {
      EngineRequest req;
      req.request_id = "s" + std::to_string(s) + "t" + std::to_string(t);
      req.prompt = prompts[s];
      req.sampling = Params();
      absl::Status st = engine->Submit(req, w.Callback());
      if (!st.ok()) {
        std::fprintf(stderr, "submit: %s\n", st.ToString().c_str());
        std::exit(1);
      }
    }
    for (int s = 0; s < sessions; ++s) {
      auto [tokens, usage] = w.Wait("s" + std::to_string(s) + "t" + std::to_string(t));
      ttft[t] += usage.first_token_us / 1000.0 / sessions;
      *out_tokens += tokens.size();
      *in_tokens += prompts[s].size();
      prompts[s].insert(prompts[s].end(), tokens.begin(), tokens.end());
      const auto extra = RandomTokens(rng, absl::GetFlag(FLAGS_turn_tokens), vocab);
      prompts[s].insert(prompts[s].end(), extra.begin(), extra.end());
    }
  }
  *seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return ttft;
}

int Main() {
  auto model = Model::Load(absl::GetFlag(FLAGS_model), ModelOptions{absl::GetFlag(FLAGS_threads)});
  if (!model.ok()) {
    std::fprintf(stderr, "%s\n", model.status().ToString().c_str());
    return 1;
  }
  const int vocab = (*model)->config().vocab_size;
  const int turns = absl::GetFlag(FLAGS_turns);
  const int context = absl::GetFlag(FLAGS_context);
  const int max_len = context + turns * (absl::GetFlag(FLAGS_turn_tokens) +
                                         absl::GetFlag(FLAGS_output_tokens)) + 64;

  std::printf("== TTFT per turn, 1 session, %d-token context, +%d tokens/turn ==\n", context,
              absl::GetFlag(FLAGS_turn_tokens));
  std::vector<double> ttft_on, ttft_off;
  for (bool cache : {false, true}) {
    auto engine = MakeEngine(model->get(), cache, true, max_len);
    double secs;
    int64_t out, in;
    (cache ? ttft_on : ttft_off) = RunSessions(engine.get(), vocab, 1, turns, context, &secs, &out, &in);
  }
  std::printf("%-6s %14s %14s %8s\n", "turn", "cache off ms", "cache on ms", "on/off");
  double sum_on = 0, sum_off = 0;
  for (int t = 0; t < turns; ++t) {
    std::printf("%-6d %14.1f %14.1f %8.3f\n", t + 1, ttft_off[t], ttft_on[t], ttft_on[t] / ttft_off[t]);
    if (t > 0) {
      sum_on += ttft_on[t];
      sum_off += ttft_off[t];
    }
  }
  std::printf("turns 2..%d mean TTFT ratio (cache on / off): %.3f\n\n", turns, sum_on / sum_off);

  std::printf("== Throughput, %d turns of a %d-token context per session ==\n",
              absl::GetFlag(FLAGS_throughput_turns), absl::GetFlag(FLAGS_throughput_context));
  std::printf("%-9s %12s %12s %12s %10s\n", "sessions", "out tok/s", "in tok/s", "mean TTFT ms",
              "seconds");
  double base = 0;
  for (absl::string_view part : absl::StrSplit(absl::GetFlag(FLAGS_sessions), ',')) {
    int sessions = 0;
    if (!absl::SimpleAtoi(part, &sessions) || sessions <= 0) continue;
    const int ctx = absl::GetFlag(FLAGS_throughput_context);
    const int tturns = absl::GetFlag(FLAGS_throughput_turns);
    const int len = ctx + tturns * (absl::GetFlag(FLAGS_turn_tokens) + absl::GetFlag(FLAGS_output_tokens)) + 64;
    auto engine = MakeEngine(model->get(), true, true, len * sessions);
    double secs;
    int64_t out, in;
    std::vector<double> t = RunSessions(engine.get(), vocab, sessions, tturns, ctx, &secs, &out, &in);
    double mean = 0;
    for (double x : t) mean += x / t.size();
    const double rate = out / secs;
    if (base == 0) base = rate;
    std::printf("%-9d %12.1f %12.1f %12.1f %10.2f   (x%.2f of 1 session)\n", sessions, rate,
                in / secs, mean, secs, rate / base);
  }

  std::printf("\n== Scheduler time vs step time, 8 sessions ==\n");
  for (bool overlap : {false, true}) {
    const int ctx = absl::GetFlag(FLAGS_throughput_context);
    auto engine = MakeEngine(model->get(), true, overlap, (ctx + 256) * 8);
    double secs;
    int64_t out, in;
    RunSessions(engine.get(), vocab, 8, absl::GetFlag(FLAGS_throughput_turns), ctx, &secs, &out, &in);
    const EngineStats s = engine->GetStats();
    const double exposed = overlap ? s.exposed_schedule_seconds : s.schedule_seconds;
    std::printf("overlap %-3s: steps %lld, forward %.3f s, scheduling %.4f s, exposed %.4f s "
                "= %.2f%% of step time\n",
                overlap ? "on" : "off", static_cast<long long>(s.steps), s.forward_seconds,
                s.schedule_seconds, exposed, 100.0 * exposed / (s.forward_seconds + exposed));
  }

  std::printf("\n== Speculative decoding (n-gram, k=%d), prompts repeating a passage ==\n",
              absl::GetFlag(FLAGS_spec_k));
  std::printf("%-9s %-9s %12s %10s %10s %10s\n", "sessions", "mode", "out tok/s", "verified",
              "accepted", "x off");
  for (absl::string_view part : absl::StrSplit(absl::GetFlag(FLAGS_spec_sessions), ',')) {
    int sessions = 0;
    if (!absl::SimpleAtoi(part, &sessions) || sessions <= 0) continue;
    std::mt19937 rng(23);
    std::vector<std::vector<int32_t>> prompts(sessions);
    for (auto& p : prompts) {
      const std::vector<int32_t> passage = RandomTokens(rng, 64, vocab);
      for (int r = 0; r < 3; ++r) p.insert(p.end(), passage.begin(), passage.end());
    }
    const int out_tokens = absl::GetFlag(FLAGS_spec_output_tokens);
    double off_rate = 0;
    for (int mode = 0; mode < 3; ++mode) {
      SpecOptions spec;
      spec.enabled = mode > 0;
      spec.adaptive = mode == 2;
      spec.num_speculative_tokens = absl::GetFlag(FLAGS_spec_k);
      auto engine = MakeEngine(model->get(), false, true, (64 * 3 + out_tokens + 16) * sessions,
                               spec);
      Waiter w;
      const auto start = Clock::now();
      for (int s = 0; s < sessions; ++s) {
        EngineRequest req;
        req.request_id = "spec" + std::to_string(s);
        req.prompt = prompts[s];
        req.sampling = Params();
        req.sampling.max_tokens = out_tokens;
        (void)engine->Submit(req, w.Callback());
      }
      int64_t out = 0;
      for (int s = 0; s < sessions; ++s) out += w.Wait("spec" + std::to_string(s)).first.size();
      const double rate = out / std::chrono::duration<double>(Clock::now() - start).count();
      if (mode == 0) off_rate = rate;
      const EngineStats st = engine->GetStats();
      std::printf("%-9d %-9s %12.1f %10lld %10lld %10.2f\n", sessions,
                  mode == 0 ? "off" : mode == 1 ? "on" : "adaptive", rate,
                  static_cast<long long>(st.spec_verified_tokens),
                  static_cast<long long>(st.spec_accepted_tokens), rate / off_rate);
    }
  }
  return 0;
}

}  // namespace
}  // namespace deepinfer::engine

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  absl::ParseCommandLine(argc, argv);
  return deepinfer::engine::Main();
}
