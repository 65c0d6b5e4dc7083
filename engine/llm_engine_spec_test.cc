// Speculative decoding in the serving engine: greedy outputs are token-identical with speculation
// on and off (any k, adaptive or not, under chunking, concurrency and preemption), stop
// conditions truncate an accepted run, seeded sampling is reproducible, aborts leak no KV block,
// and rejected draft positions never reach the prefix cache.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "engine/kv_copy_test_util.h"
#include "engine/llm_engine.h"
#include "engine/output_collector.h"
#include "engine/speculative/budget.h"
#include "engine/tokenizer/tokenizer.h"
#include "gtest/gtest.h"
#include "kernels/cpu_features.h"
#include "kernels/dtype.h"
#include "kernels/linear_cpu.h"
#include "nlohmann/json.hpp"

namespace deepinfer::engine {
namespace {

using Collector = OutputCollector;

SamplingParams Greedy(int max_tokens) {
  SamplingParams sp;
  sp.temperature = 0;
  sp.max_tokens = max_tokens;
  sp.ignore_eos = true;
  return sp;
}

// Prompts with repetition (a short motif repeated, then a tail), so n-gram drafts find matches.
std::vector<std::vector<int32_t>> RepetitivePrompts(int vocab, int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < n; ++i) {
    std::vector<int32_t> motif(2 + rng() % 5);
    for (int32_t& t : motif) t = rng() % vocab;
    std::vector<int32_t> p;
    const int repeats = 2 + rng() % 4;
    for (int r = 0; r < repeats; ++r) p.insert(p.end(), motif.begin(), motif.end());
    const int tail = rng() % 4;
    for (int j = 0; j < tail; ++j) p.push_back(rng() % vocab);
    prompts.push_back(p);
  }
  return prompts;
}

struct RunResult {
  std::map<std::string, Collector::Result> results;
  EngineStats stats;
};

// Submits every request at once, waits for all, stops the engine.
RunResult RunAll(Model* model, const EngineOptions& options,
                 const std::vector<EngineRequest>& reqs) {
  RunResult out;
  auto engine = LlmEngine::Create(model, options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  if (!engine.ok()) return out;
  EXPECT_TRUE((*engine)->Start().ok());
  Collector c;
  for (const EngineRequest& r : reqs) {
    absl::Status s = (*engine)->Submit(r, c.Callback());
    EXPECT_TRUE(s.ok()) << s;
  }
  EXPECT_TRUE(c.WaitFor(static_cast<int>(reqs.size()), std::chrono::seconds(240)));
  out.results = c.results();
  (*engine)->Stop();
  out.stats = (*engine)->GetStats();
  EXPECT_EQ(out.stats.blocks.used_blocks, 0);
  return out;
}

std::vector<EngineRequest> GreedyRequests(const std::vector<std::vector<int32_t>>& prompts,
                                          int max_tokens) {
  std::vector<EngineRequest> reqs;
  for (size_t i = 0; i < prompts.size(); ++i) {
    EngineRequest req;
    req.request_id = "r" + std::to_string(i);
    req.prompt = prompts[i];
    req.sampling = Greedy(max_tokens);
    reqs.push_back(req);
  }
  return reqs;
}

// Every request's tokens in `got` are those of `ref` (a run without speculation).
void ExpectSameTokens(const RunResult& got, const RunResult& ref,
                      const std::vector<EngineRequest>& reqs) {
  for (const EngineRequest& r : reqs) {
    EXPECT_EQ(got.results.at(r.request_id).tokens, ref.results.at(r.request_id).tokens)
        << r.request_id;
  }
}

EngineOptions BaseOptions() {
  EngineOptions o;
  o.num_blocks = 256;
  o.block_size = 4;
  o.max_batch_tokens = 40;  // small: prompts are chunked and mixed with decodes and drafts
  return o;
}

// A cost table of base + slope x tokens seconds per step, for 1 and 8 requests and 1 and 64
// tokens (5 runs each).
speculative::CostTable LinearCostTable(double base, double slope) {
  std::vector<speculative::CostTable::Sample> samples;
  for (int requests : {1, 8}) {
    for (int tokens : {1, 64}) {
      for (int run = 0; run < 5; ++run)
        samples.push_back({tokens, requests, base + slope * tokens});
    }
  }
  return speculative::CostTable::FromSamples(samples).value();
}

EngineOptions WithSpec(EngineOptions o, int k, bool adaptive) {
  o.speculative.enabled = true;
  o.speculative.num_speculative_tokens = k;
  o.speculative.min_n = 1;
  o.speculative.max_n = 3;
  o.speculative.adaptive = adaptive;
  // The plan alone (the tests below check what it decides); WithSelector adds the measured
  // selector above it.
  o.speculative.select_mode = false;
  return o;
}

// Adaptive with the measured mode selector, epochs short enough that a test's few dozen steps
// run every mode (the plan, fixed lengths 1, 2, 4, ... k, none) more than once.
EngineOptions WithSelector(EngineOptions o) {
  o.speculative.select_mode = true;
  o.speculative.select_options.epoch_steps = 2;
  o.speculative.select_options.epoch_seconds = 0.0;
  o.speculative.select_options.warmup_steps = 1;
  o.speculative.select_options.min_gap_epochs = 1;
  o.speculative.select_options.max_gap_epochs = 2;
  return o;
}

class SpecEngineTest : public ::testing::TestWithParam<std::string> {};

TEST_P(SpecEngineTest, GreedyIsTokenIdenticalWithSpeculation) {
  const std::string dir = "engine/testdata/models/" + GetParam();
  auto model = Model::Load(dir, ModelOptions{2}).value();
  const auto prompts = RepetitivePrompts(model->config().vocab_size, 12, 17);
  auto reqs = GreedyRequests(prompts, 24);
  for (size_t i = 1; i < reqs.size(); i += 3) {  // penalties see the drafts as pending history
    reqs[i].sampling.repetition_penalty = 1.3f;
    reqs[i].sampling.presence_penalty = 0.5f;
    reqs[i].sampling.frequency_penalty = 0.2f;
  }
  for (size_t i = 0; i < reqs.size(); i += 2) reqs[i].sampling.logprobs = 3;
  const RunResult ref = RunAll(model.get(), BaseOptions(), reqs);
  int64_t accepted = 0;
  // The selector needs an adaptive plan: a fixed table, as a profile taken while the machine is
  // busy can come out flat (every draft verified, no selector).
  const speculative::CostTable table = LinearCostTable(1e-3, 1e-5);
  for (int k : {1, 2, 4, 8}) {
    for (int mode : {0, 1, 2}) {  // fixed k, the adaptive plan, the plan under the selector
      const bool adaptive = mode >= 1;
      SCOPED_TRACE(::testing::Message() << GetParam() << " k " << k << " mode " << mode);
      EngineOptions o = WithSpec(BaseOptions(), k, adaptive);
      if (mode == 2) {
        o = WithSelector(o);
        o.speculative.cost_table = &table;
      }
      const RunResult got = RunAll(model.get(), o, reqs);
      int64_t usage_drafts = 0, usage_accepted = 0;
      for (const EngineRequest& r : reqs) {
        const auto& g = got.results.at(r.request_id);
        EXPECT_EQ(g.final_outputs, 1);
        EXPECT_TRUE(g.status.ok()) << g.status;
        EXPECT_EQ(g.finish, FinishReason::kLength);
        const auto& want = ref.results.at(r.request_id);
        EXPECT_EQ(g.tokens, want.tokens) << r.request_id;
        // Logprobs and alternatives from verification rows match the plain decode's.
        EXPECT_EQ(g.top, want.top) << r.request_id;
        ASSERT_EQ(g.logprobs.size(), want.logprobs.size());
        for (size_t j = 0; j < g.logprobs.size(); ++j) {
          EXPECT_NEAR(g.logprobs[j], want.logprobs[j], 1e-4) << r.request_id << " token " << j;
        }
        EXPECT_EQ(g.usage.completion_tokens, 24);
        EXPECT_LE(g.usage.accepted_draft_tokens, g.usage.draft_tokens);
        usage_drafts += g.usage.draft_tokens;
        usage_accepted += g.usage.accepted_draft_tokens;
      }
      EXPECT_EQ(usage_drafts, got.stats.spec_verified_tokens);
      EXPECT_EQ(usage_accepted, got.stats.spec_accepted_tokens);
      EXPECT_LE(got.stats.spec_verified_tokens, got.stats.spec_drafted_tokens);
      if (mode == 2) {
        // Every mode ran: the plan, fixed lengths (which ask the drafter every step) and none.
        EXPECT_GT(got.stats.spec_select_plan_steps, 0);
        EXPECT_GT(got.stats.spec_select_fixed_steps, 0);
        EXPECT_GT(got.stats.spec_select_off_steps, 0);
        EXPECT_GE(got.stats.spec_select_epochs, k == 1 ? 3 : 4);
        EXPECT_GT(got.stats.spec_drafted_tokens, 0);
      } else if (adaptive) {
        // Only steps the plan may verify drafts in (and probes) ask the drafter; on a model
        // whose outputs rarely repeat none of them may find an n-gram match.
        EXPECT_GT(got.stats.spec_probe_steps, 0);
      } else {
        EXPECT_GT(got.stats.spec_drafted_tokens, 0);
      }
      accepted += got.stats.spec_accepted_tokens;
    }
  }
  // Alone (the prompt fits one step): 1 prefill step, then each decode step emits one token plus
  // its accepted drafts, so every accepted draft saves exactly one step.
  for (int k : {2, 8}) {
    for (size_t i = 0; i < 4; ++i) {
      const std::vector<EngineRequest> one = {reqs[i]};
      SCOPED_TRACE(::testing::Message() << "alone: k " << k << " request " << i);
      const RunResult plain = RunAll(model.get(), BaseOptions(), one);
      const RunResult got = RunAll(model.get(), WithSpec(BaseOptions(), k, false), one);
      EXPECT_EQ(plain.stats.steps, 24);
      EXPECT_EQ(got.stats.steps, 24 - got.stats.spec_accepted_tokens) << i;
      EXPECT_EQ(got.results.at(reqs[i].request_id).tokens,
                ref.results.at(reqs[i].request_id).tokens);
    }
  }
  EXPECT_GT(accepted, 0);
}

// mistral: every layer slides (window 8), so blocks behind the window are released as well.
INSTANTIATE_TEST_SUITE_P(Models, SpecEngineTest,
                         ::testing::Values("llama", "qwen3", "hybrid", "mistral"));

constexpr char kLlama[] = "engine/testdata/models/llama";

TEST(SpecEngineLlamaTest, IdenticalUnderPreemptionAndWithoutPrefixCache) {
  auto model = Model::Load(kLlama, ModelOptions{2}).value();
  const auto prompts = RepetitivePrompts(model->config().vocab_size, 10, 23);
  const auto reqs = GreedyRequests(prompts, 20);
  EngineOptions base = BaseOptions();
  const RunResult ref = RunAll(model.get(), base, reqs);
  EngineOptions tight = base;
  tight.num_blocks = 24;  // 96 tokens for 10 requests of up to ~45: forces preemption
  EngineOptions nocache = base;
  nocache.enable_prefix_cache = false;
  nocache.chunked_prefill = false;
  for (const EngineOptions& o : {tight, nocache}) {
    const RunResult got = RunAll(model.get(), WithSpec(o, 4, false), reqs);
    for (const EngineRequest& r : reqs) {
      EXPECT_EQ(got.results.at(r.request_id).tokens, ref.results.at(r.request_id).tokens)
          << r.request_id << " blocks " << o.num_blocks;
    }
    if (o.num_blocks == tight.num_blocks) {
      EXPECT_GT(got.stats.preemptions, 0);
    }
  }
}

// Adaptive verification with fixed cost tables: a step whose time explodes with every extra token
// verifies no draft (but the probes' one per sequence); a flat one verifies every draft; a cheap
// slope verifies some. Outputs never change.
TEST(SpecEngineLlamaTest, AdaptiveBudgetFollowsTheCostTable) {
  auto model = Model::Load(kLlama, ModelOptions{2}).value();
  const auto prompts = RepetitivePrompts(model->config().vocab_size, 8, 29);
  const auto reqs = GreedyRequests(prompts, 24);
  const RunResult ref = RunAll(model.get(), BaseOptions(), reqs);
  auto table = [](double slope) {
    std::vector<speculative::CostTable::Sample> samples;
    for (int requests : {1, 8}) {
      for (int tokens : {1, 2, 8, 64}) {
        for (int run = 0; run < 5; ++run) {
          samples.push_back({tokens, requests, 1e-3 + slope * tokens});
        }
      }
    }
    return speculative::CostTable::FromSamples(samples).value();
  };
  const speculative::CostTable steep = table(1.0), flat = table(0.0), cheap = table(1e-5);
  for (const speculative::CostTable* cost : {&steep, &flat, &cheap}) {
    EngineOptions o = WithSpec(BaseOptions(), 4, /*adaptive=*/true);
    o.speculative.cost_table = cost;
    const RunResult got = RunAll(model.get(), o, reqs);
    for (const EngineRequest& r : reqs) {
      EXPECT_EQ(got.results.at(r.request_id).tokens, ref.results.at(r.request_id).tokens);
    }
    EXPECT_GT(got.stats.spec_drafted_tokens, 0);
    if (cost == &steep) {
      // Only probes verify: one draft per sequence and probe.
      EXPECT_TRUE(got.stats.spec_adaptive_active);
      EXPECT_GT(got.stats.spec_probe_steps, 0);
      EXPECT_GT(got.stats.spec_verified_tokens, 0);
      EXPECT_LE(got.stats.spec_verified_tokens, 8 * got.stats.spec_probe_steps);
      o.speculative.probe_interval = 0;  // no probes: nothing is worth verifying
      const RunResult quiet = RunAll(model.get(), o, reqs);
      EXPECT_EQ(quiet.stats.spec_probe_steps, 0);
      EXPECT_EQ(quiet.stats.spec_verified_tokens, 0);
      for (const EngineRequest& r : reqs) {
        EXPECT_EQ(quiet.results.at(r.request_id).tokens, ref.results.at(r.request_id).tokens);
      }
    } else if (cost == &flat) {
      EXPECT_FALSE(got.stats.spec_adaptive_active);
      EXPECT_GT(got.stats.spec_verified_tokens, 0);
    } else {
      EXPECT_TRUE(got.stats.spec_adaptive_active);
      EXPECT_GT(got.stats.spec_verified_tokens, 0);
      EXPECT_GT(got.stats.spec_accepted_tokens, 0);
    }
  }
}

// The start-up cost profile runs its steps at SpecOptions::profile_context cached tokens a
// sequence, less where the KV cache cannot hold its widest row (32 requests, or max_running) at
// k + 1 tokens a request; a given table is not profiled.
TEST(SpecEngineLlamaTest, CostProfileRunsAtTheConfiguredContextWhereTheCacheHoldsIt) {
  auto model = Model::Load(kLlama, ModelOptions{2}).value();
  auto profiled_context = [&](const EngineOptions& o) -> int64_t {
    auto engine = LlmEngine::Create(model.get(), o);
    EXPECT_TRUE(engine.ok()) << engine.status();
    return engine.ok() ? (*engine)->GetStats().spec_cost_context : -1;
  };
  EngineOptions o = WithSpec(BaseOptions(), 4, /*adaptive=*/true);  // 256 blocks of 4 tokens
  o.speculative.profile_context = 20;
  EXPECT_EQ(profiled_context(o), 20);
  o.speculative.profile_context = 512;
  EXPECT_EQ(profiled_context(o), 256 / 32 * 4 - 5);  // 32 requests of 27 + 5 tokens fill 256
  o.max_running = 8;
  EXPECT_EQ(profiled_context(o), 256 / 8 * 4 - 5);
  const speculative::CostTable table = LinearCostTable(1e-3, 1e-5);
  o.speculative.cost_table = &table;
  EXPECT_EQ(profiled_context(o), 0);
  o.speculative.profile_context = 0;
  auto bad = LlmEngine::Create(model.get(), o);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("speculative.profile_context: expected >= 1, got 0"),
            std::string::npos)
      << bad.status();
  o.speculative.profile_context = 512;
  o.speculative.profile_edge_requests = -1;
  bad = LlmEngine::Create(model.get(), o);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(
      bad.status().message().find("speculative.profile_edge_requests: expected >= 0, got -1"),
      std::string::npos)
      << bad.status();
}

TEST(SpecEngineLlamaTest, StopTokensAndStopStringsTruncateTheAcceptedRun) {
  auto model = Model::Load(kLlama, ModelOptions{2}).value();
  auto tok = tokenizer::Tokenizer::FromDirectory(kLlama);
  ASSERT_TRUE(tok.ok()) << tok.status();
  const auto prompts = RepetitivePrompts(model->config().vocab_size, 8, 31);
  EngineOptions base = BaseOptions();
  base.tokenizer = tok->get();
  const auto plain = GreedyRequests(prompts, 24);
  const RunResult first = RunAll(model.get(), base, plain);
  // Stop at a token (and at a string) from the middle of each reference output.
  std::vector<EngineRequest> reqs;
  for (const EngineRequest& r : plain) {
    const auto& out = first.results.at(r.request_id);
    EngineRequest by_token = r;
    by_token.request_id = r.request_id + "/token";
    by_token.sampling.stop_token_ids = {out.tokens[10]};
    reqs.push_back(by_token);
    if (out.text.size() >= 8) {
      EngineRequest by_string = r;
      by_string.request_id = r.request_id + "/string";
      by_string.sampling.stop = {out.text.substr(out.text.size() / 2, 2)};
      reqs.push_back(by_string);
    }
    EngineRequest eos = r;  // the same token as EOS
    eos.request_id = r.request_id + "/eos";
    eos.sampling.ignore_eos = false;
    reqs.push_back(eos);
  }
  EngineOptions with_eos = base;
  with_eos.eos_token_ids = {first.results.at("r0").tokens[6]};
  const RunResult ref = RunAll(model.get(), with_eos, reqs);
  int truncated = 0;
  for (int k : {2, 8}) {
    const RunResult got = RunAll(model.get(), WithSpec(with_eos, k, false), reqs);
    for (const EngineRequest& r : reqs) {
      SCOPED_TRACE(r.request_id);
      const auto& want = ref.results.at(r.request_id);
      const auto& g = got.results.at(r.request_id);
      EXPECT_EQ(g.tokens, want.tokens);
      EXPECT_EQ(g.text, want.text);
      EXPECT_EQ(g.finish, want.finish);
      EXPECT_EQ(g.matched_stop, want.matched_stop);
      EXPECT_EQ(g.usage.completion_tokens, want.usage.completion_tokens);
      if (want.finish != FinishReason::kLength) ++truncated;
    }
  }
  EXPECT_GT(truncated, 0);
}

TEST(SpecEngineLlamaTest, SeededSamplingIsReproducible) {
  auto model = Model::Load(kLlama, ModelOptions{2}).value();
  const auto prompts = RepetitivePrompts(model->config().vocab_size, 6, 41);
  auto reqs = GreedyRequests(prompts, 20);
  for (size_t i = 0; i < reqs.size(); ++i) {
    reqs[i].sampling.temperature = 0.7f;
    reqs[i].sampling.top_k = 20;
    reqs[i].sampling.repetition_penalty = 1.1f;
    reqs[i].sampling.has_seed = true;
    reqs[i].sampling.seed = 1000 + i;
  }
  for (bool adaptive : {false, true}) {
    const RunResult a = RunAll(model.get(), WithSpec(BaseOptions(), 4, adaptive), reqs);
    const RunResult b = RunAll(model.get(), WithSpec(BaseOptions(), 4, adaptive), reqs);
    EXPECT_GT(a.stats.spec_verified_tokens, 0);
    for (const EngineRequest& r : reqs) {
      const auto& x = a.results.at(r.request_id);
      EXPECT_TRUE(x.status.ok()) << x.status;
      EXPECT_EQ(x.tokens.size(), 20u);
      if (!adaptive) {
        EXPECT_EQ(x.tokens, b.results.at(r.request_id).tokens) << r.request_id;
      }
    }
  }
}

TEST(SpecEngineLlamaTest, RandomAbortsLeakNoBlocks) {
  auto model = Model::Load(kLlama, ModelOptions{2}).value();
  const speculative::CostTable cheap = LinearCostTable(1e-3, 1e-5);
  for (bool select : {false, true}) {
    SCOPED_TRACE(::testing::Message() << "selector " << select);
    // Fixed k, or the selector switching modes (drafting or not) every two steps.
    EngineOptions o = WithSpec(BaseOptions(), 4, select);
    if (select) {
      o.speculative.cost_table = &cheap;
      o = WithSelector(o);
    }
    o.num_blocks = 64;
    o.max_running = 16;
    auto engine = LlmEngine::Create(model.get(), o).value();
    ASSERT_TRUE(engine->Start().ok());
    Collector c;
    std::mt19937 rng(99);
    const auto prompts = RepetitivePrompts(model->config().vocab_size, 20, 7);
    const int n = 150;
    for (int i = 0; i < n; ++i) {
      EngineRequest req;
      req.request_id = "q" + std::to_string(i);
      req.prompt = prompts[rng() % prompts.size()];
      req.sampling = Greedy(1 + rng() % 16);
      req.priority = rng() % 3;
      ASSERT_TRUE(engine->Submit(req, c.Callback()).ok());
      if (rng() % 4 == 0) {
        if (rng() % 2 == 0) std::this_thread::sleep_for(std::chrono::microseconds(rng() % 3000));
        engine->Abort("q" + std::to_string(rng() % (i + 1)));
      }
      if (i == n / 2) {
        // The random aborts land only while their target is live, which this thread, stalled,
        // can miss every time. This request is aborted from its own first output (on the
        // scheduler thread), so the abort is handled within the next two steps: it always
        // lands, mid-load.
        EngineRequest live;
        live.request_id = "live";
        live.prompt = prompts[0];
        live.sampling = Greedy(64);
        OutputCallback collect = c.Callback();
        auto abort_sent = std::make_shared<bool>(false);
        LlmEngine* e = engine.get();
        ASSERT_TRUE(engine
                        ->Submit(live,
                                 [collect, abort_sent, e](const EngineOutput& out) {
                                   if (!out.finished && !*abort_sent) {
                                     *abort_sent = true;
                                     EXPECT_TRUE(e->Abort("live"));
                                   }
                                   collect(out);
                                 })
                        .ok());
      }
    }
    ASSERT_TRUE(c.WaitFor(n + 1, std::chrono::seconds(240)));
    auto results = c.results();
    int aborted = 0;
    for (const auto& [id, r] : results) {
      EXPECT_EQ(r.final_outputs, 1) << id;
      if (r.finish == FinishReason::kAborted) ++aborted;
    }
    EXPECT_EQ(results["live"].finish, FinishReason::kAborted);
    EXPECT_LT(results["live"].tokens.size(), 64u);
    EngineStats s;
    for (int i = 0; i < 200; ++i) {
      s = engine->GetStats();
      if (s.blocks.used_blocks == 0) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_EQ(s.blocks.used_blocks, 0);
    EXPECT_EQ(s.blocks.free_blocks + s.blocks.cached_blocks, 64);
    EXPECT_GT(aborted, 0);
    EXPECT_GT(s.spec_verified_tokens, 0);
    if (select) {
      EXPECT_GT(s.spec_select_epochs, 4);
    }
  }
}

// A prompt equal to an earlier request's prompt + output is served from the blocks that request
// published, and continues exactly as the reference: no rejected draft's KV was published.
TEST(SpecEngineLlamaTest, PrefixCacheHoldsOnlyAcceptedTokens) {
  auto model = Model::Load(kLlama, ModelOptions{2}).value();
  const auto prompts = RepetitivePrompts(model->config().vocab_size, 6, 57);
  EngineOptions o = WithSpec(BaseOptions(), 8, false);
  auto engine = LlmEngine::Create(model.get(), o).value();
  ASSERT_TRUE(engine->Start().ok());
  Collector c;
  auto first = GreedyRequests(prompts, 30);
  for (const EngineRequest& r : first) ASSERT_TRUE(engine->Submit(r, c.Callback()).ok());
  ASSERT_TRUE(c.WaitFor(static_cast<int>(first.size()), std::chrono::seconds(120)));
  auto results = c.results();
  std::vector<EngineRequest> second;
  for (const EngineRequest& r : first) {
    EngineRequest next = r;
    next.request_id = r.request_id + "/turn2";
    next.prompt.insert(next.prompt.end(), results[r.request_id].tokens.begin(),
                       results[r.request_id].tokens.end());
    next.sampling = Greedy(12);
    second.push_back(next);
  }
  for (const EngineRequest& r : second) ASSERT_TRUE(engine->Submit(r, c.Callback()).ok());
  ASSERT_TRUE(c.WaitFor(static_cast<int>(first.size() + second.size()), std::chrono::seconds(120)));
  results = c.results();
  const EngineStats stats = engine->GetStats();
  EXPECT_GT(stats.spec_accepted_tokens, 0);
  engine->Stop();
  // Reference: no speculation, no prefix cache.
  EngineOptions plain = BaseOptions();
  plain.enable_prefix_cache = false;
  const RunResult ref = RunAll(model.get(), plain, second);
  for (const EngineRequest& r : second) {
    const auto& g = results[r.request_id];
    // Everything up to the last full block before the final output token was published.
    EXPECT_GE(
        g.usage.cached_prompt_tokens,
        (static_cast<int64_t>(r.prompt.size()) - 1) / o.block_size * o.block_size - o.block_size)
        << r.request_id;
    EXPECT_EQ(g.tokens, ref.results.at(r.request_id).tokens) << r.request_id;
  }
}

// Disaggregated: the prompt's KV comes from a prefill engine (no speculation) into a decode
// engine's reservation; the decode engine speculates from the first token on.
TEST(SpecEngineLlamaTest, DecodeAfterRemotePrefillSpeculatesAndMatchesTheReference) {
  auto model = Model::Load(kLlama, ModelOptions{2}).value();
  const auto prompts = RepetitivePrompts(model->config().vocab_size, 4, 61);
  const auto reqs = GreedyRequests(prompts, 20);
  const RunResult ref = RunAll(model.get(), BaseOptions(), reqs);
  auto prefill = LlmEngine::Create(model.get(), BaseOptions()).value();
  auto decode = LlmEngine::Create(model.get(), WithSpec(BaseOptions(), 4, false)).value();
  ASSERT_TRUE(prefill->Start().ok());
  ASSERT_TRUE(decode->Start().ok());
  KvCache* src = prefill->kv_cache();
  KvCache* dst = decode->kv_cache();
  int64_t drafts = 0;
  for (const EngineRequest& req : reqs) {
    std::promise<absl::StatusOr<PrefillResult>> done;
    ASSERT_TRUE(prefill
                    ->SubmitPrefill(
                        req, [&](absl::StatusOr<PrefillResult> r) { done.set_value(std::move(r)); })
                    .ok());
    absl::StatusOr<PrefillResult> pre = done.get_future().get();
    ASSERT_TRUE(pre.ok()) << pre.status();
    Collector c;
    absl::StatusOr<KvReservation> res = decode->ReserveForRemotePrefill(req, c.Callback());
    ASSERT_TRUE(res.ok()) << res.status();
    CopyPrefilledBlocks(*src, *pre, *dst, *res);
    ASSERT_TRUE(prefill->ReleasePrefilled(req.request_id).ok());
    ASSERT_TRUE(decode->CompleteRemotePrefill(req.request_id, {pre->first_token, 0.0f, {}}).ok());
    ASSERT_TRUE(c.WaitFor(1, std::chrono::seconds(60)));
    const auto r = c.results()[req.request_id];
    EXPECT_TRUE(r.status.ok()) << r.status;
    EXPECT_EQ(r.tokens, ref.results.at(req.request_id).tokens) << req.request_id;
    drafts += r.usage.draft_tokens;
  }
  EXPECT_GT(drafts, 0);
  decode->Stop();
  prefill->Stop();
  EXPECT_EQ(decode->GetStats().blocks.used_blocks, 0);
}

TEST(SpecEngineLlamaTest, RejectsBadSpeculativeOptions) {
  auto model = Model::Load(kLlama, ModelOptions{2}).value();
  EngineOptions o = WithSpec(BaseOptions(), 0, false);
  auto e = LlmEngine::Create(model.get(), o);
  EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(e.status().message().find("speculative.num_speculative_tokens"), std::string::npos);
  o = WithSpec(BaseOptions(), 4, false);
  o.speculative.drafter = "eagle";
  EXPECT_NE(LlmEngine::Create(model.get(), o).status().message().find("speculative.drafter"),
            std::string::npos);
  o = WithSpec(BaseOptions(), 4, false);
  o.speculative.min_n = 0;
  EXPECT_EQ(LlmEngine::Create(model.get(), o).status().code(), absl::StatusCode::kInvalidArgument);
  o = WithSpec(BaseOptions(), 4, false);
  o.speculative.draft_stop_extend = 1.0;
  EXPECT_NE(LlmEngine::Create(model.get(), o).status().message().find(
                "speculative.draft_stop_extend"),
            std::string::npos);
  o = WithSpec(BaseOptions(), 4, false);
  o.speculative.draft_stop_extend_min_decoding = 0;
  EXPECT_NE(LlmEngine::Create(model.get(), o).status().message().find(
                "speculative.draft_stop_extend_min_decoding"),
            std::string::npos);
}

EngineOptions WithDraftModel(EngineOptions o, const std::string& dir, int k, bool adaptive) {
  o = WithSpec(o, k, adaptive);
  o.speculative.drafter = "draft_model";
  o.speculative.draft_model_path = dir;
  o.speculative.draft_num_blocks = 64;
  o.speculative.draft_threads = 1;
  return o;
}

TEST(SpecEngineDraftModelTest, SameWeightsDraftIsAlwaysAcceptedAndOutputsMatch) {
  auto model = Model::Load(kLlama, ModelOptions{2}).value();
  const auto prompts = RepetitivePrompts(model->config().vocab_size, 6, 53);
  const auto reqs = GreedyRequests(prompts, 20);
  const RunResult ref = RunAll(model.get(), BaseOptions(), reqs);
  const RunResult got = RunAll(model.get(), WithDraftModel(BaseOptions(), kLlama, 4, false), reqs);
  ExpectSameTokens(got, ref, reqs);
  EXPECT_GT(got.stats.spec_verified_tokens, 0);
  EXPECT_EQ(got.stats.spec_accepted_tokens, got.stats.spec_verified_tokens);
}

// The draft model's KV cache: by default as many blocks as the target's, so sequences running
// together never evict one another's draft KV; a small explicit cache evicts (and the evicted
// sequence's context is recomputed by the draft model), which costs time but never changes
// outputs. A negative size is refused naming the field.
TEST(SpecEngineDraftModelTest, DraftCacheDefaultsToTheTargetsCapacity) {
  auto model = Model::Load(kLlama, ModelOptions{2}).value();
  const auto prompts = RepetitivePrompts(model->config().vocab_size, 6, 71);
  const auto reqs = GreedyRequests(prompts, 20);
  const RunResult ref = RunAll(model.get(), BaseOptions(), reqs);
  for (int blocks : {0, 8}) {
    EngineOptions o = WithDraftModel(BaseOptions(), kLlama, 4, false);
    o.speculative.draft_num_blocks = blocks;
    const RunResult got = RunAll(model.get(), o, reqs);
    for (const EngineRequest& r : reqs) {
      EXPECT_EQ(got.results.at(r.request_id).tokens, ref.results.at(r.request_id).tokens)
          << r.request_id << " draft blocks " << blocks;
    }
    EXPECT_GT(got.stats.spec_verified_tokens, 0);
    if (blocks == 0) {
      EXPECT_EQ(got.stats.spec_draft_evictions, 0);
      // No request's context extends a finished one's here.
      EXPECT_EQ(got.stats.spec_draft_reused_tokens, 0);
    } else {
      // 8 blocks of 4 tokens hold about one sequence: the six evict one another.
      EXPECT_GT(got.stats.spec_draft_evictions, 0);
    }
  }
  EngineOptions bad = WithDraftModel(BaseOptions(), kLlama, 4, false);
  bad.speculative.draft_num_blocks = -1;
  const auto e = LlmEngine::Create(model.get(), bad);
  EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(e.status().message().find("speculative.draft_num_blocks"), std::string::npos)
      << e.status();
}

TEST(SpecEngineDraftModelTest, OtherDraftKeepsGreedyOutputsAndIsSometimesRejected) {
  auto model = Model::Load(kLlama, ModelOptions{2}).value();
  const auto prompts = RepetitivePrompts(model->config().vocab_size, 6, 59);
  const auto reqs = GreedyRequests(prompts, 16);
  const RunResult ref = RunAll(model.get(), BaseOptions(), reqs);
  // Fixed k, the adaptive plan, the plan under the selector, and the selector with a catch-up
  // window of 5 tokens (the draft model skips the rest of every prompt and of every stretch
  // without drafts).
  for (int mode : {0, 1, 2, 4}) {
    const bool adaptive = mode >= 1;
    // A cost table where drafts are cheap, so the adaptive plan verifies some of them.
    const speculative::CostTable cheap = LinearCostTable(1e-3, 1e-5);
    EngineOptions o =
        WithDraftModel(BaseOptions(), "engine/testdata/models/llama_tied", 3, adaptive);
    o.speculative.cost_table = &cheap;
    if (mode >= 2) {
      o = WithSelector(o);
      // A prompt lagging by more than 2 x 4 + k + 1 = 12 tokens is a whole-prompt catch-up.
      o.speculative.draft_upkeep_tokens = 4;
      if (mode == 4) o.speculative.draft_catch_up_window = 5;
    }
    const RunResult got = RunAll(model.get(), o, reqs);
    for (const EngineRequest& r : reqs) {
      EXPECT_EQ(got.results.at(r.request_id).tokens, ref.results.at(r.request_id).tokens)
          << r.request_id << " mode " << mode;
    }
    if (mode == 4) {
      EXPECT_GT(got.stats.spec_select_plan_steps, 0);
      // Prompts longer than the window are skipped but for their last 5 tokens, and no catch-up
      // is ever longer than that, so none counts as a whole-prompt catch-up (12 tokens).
      EXPECT_GT(got.stats.spec_draft_skipped_tokens, 0);
      EXPECT_EQ(got.stats.spec_prompt_catch_up_steps, 0);
    } else {
      EXPECT_EQ(got.stats.spec_draft_skipped_tokens, 0);
    }
    if (mode == 2) {
      // The draft model's cache survives modes that skip it (no drafting) and catches up.
      EXPECT_GT(got.stats.spec_select_plan_steps, 0);
      EXPECT_GT(got.stats.spec_select_fixed_steps, 0);
      EXPECT_GT(got.stats.spec_select_off_steps, 0);
      // Each new request's prompt (most are longer than 12 tokens) is fed to the draft model in
      // a step the selector leaves out of its measurements.
      EXPECT_GT(got.stats.spec_prompt_catch_up_steps, 0);
      EXPECT_LE(got.stats.spec_prompt_catch_up_steps, 2 * static_cast<int64_t>(reqs.size()));
    } else if (mode < 2) {
      EXPECT_EQ(got.stats.spec_prompt_catch_up_steps, 0);
    }
    EXPECT_GT(got.stats.spec_verified_tokens, 0);
    EXPECT_LT(got.stats.spec_accepted_tokens, got.stats.spec_verified_tokens);
  }
}

// A node that prefills locally runs prompt chunks beside its decodes; such a step's period is
// mostly the prompt's, so the selector leaves it out of its measurements (counted in
// spec_select_prompt_steps). A lone request's prompt never runs beside a decode: none there.
TEST(SpecEngineSelectorTest, StepsThatComputePromptTokensAreLeftOutOfTheSelectorsMeasurements) {
  auto model = Model::Load(kLlama, ModelOptions{2}).value();
  const auto prompts = RepetitivePrompts(model->config().vocab_size, 8, 41);
  const auto reqs = GreedyRequests(prompts, 24);
  const RunResult ref = RunAll(model.get(), BaseOptions(), reqs);
  const speculative::CostTable cheap = LinearCostTable(1e-3, 1e-5);
  EngineOptions o = WithSelector(WithSpec(BaseOptions(), 4, /*adaptive=*/true));
  o.speculative.cost_table = &cheap;
  o.max_running = 3;  // the others are admitted, and prefilled, while these decode
  const RunResult got = RunAll(model.get(), o, reqs);
  ExpectSameTokens(got, ref, reqs);
  const int64_t selected = got.stats.spec_select_plan_steps + got.stats.spec_select_fixed_steps +
                           got.stats.spec_select_off_steps;
  EXPECT_GT(got.stats.spec_select_prompt_steps, 0);
  EXPECT_LT(got.stats.spec_select_prompt_steps, selected);

  const RunResult one = RunAll(model.get(), o, {reqs[0]});
  EXPECT_EQ(one.results.at(reqs[0].request_id).tokens, ref.results.at(reqs[0].request_id).tokens);
  EXPECT_GT(one.stats.spec_select_plan_steps + one.stats.spec_select_fixed_steps +
                one.stats.spec_select_off_steps,
            0);
  EXPECT_EQ(one.stats.spec_select_prompt_steps, 0);
}

// Adaptive draft length: even a draft that is always accepted, if its round costs a second (1000
// target steps), is not worth drafting with, so steps draft nothing but the probes' one token per
// sequence (none without probes); one that costs a microsecond drafts every step. Outputs never
// change, and the measured step times are recorded against their predictions.
TEST(SpecEngineDraftModelTest, AdaptiveDraftLengthFollowsTheDraftCost) {
  auto model = Model::Load(kLlama, ModelOptions{2}).value();
  const auto prompts = RepetitivePrompts(model->config().vocab_size, 6, 67);
  const auto reqs = GreedyRequests(prompts, 16);
  const RunResult ref = RunAll(model.get(), BaseOptions(), reqs);
  const speculative::CostTable target = LinearCostTable(1e-3, 1e-5);
  const speculative::CostTable expensive = LinearCostTable(1.0, 0.0),
                               cheap = LinearCostTable(1e-6, 0.0);
  struct Case {
    const speculative::CostTable* draft;
    int probe_interval;
  };
  for (const Case& c : {Case{&expensive, 0}, Case{&expensive, 4}, Case{&cheap, 4}}) {
    SCOPED_TRACE(::testing::Message()
                 << (c.draft == &cheap ? "cheap" : "expensive") << " probe " << c.probe_interval);
    // The target's own weights as the draft: every draft is accepted.
    EngineOptions o = WithDraftModel(BaseOptions(), kLlama, 3, /*adaptive=*/true);
    o.speculative.cost_table = &target;
    o.speculative.draft_cost_table = c.draft;
    o.speculative.probe_interval = c.probe_interval;
    const RunResult got = RunAll(model.get(), o, reqs);
    ExpectSameTokens(got, ref, reqs);
    const EngineStats& st = got.stats;
    EXPECT_GT(st.spec_timed_steps, 0);
    EXPECT_GT(st.spec_measured_step_seconds, 0.0);
    EXPECT_GT(st.spec_predicted_step_seconds, 0.0);
    EXPECT_GE(st.spec_overhead_seconds, 0.0);
    if (c.draft == &cheap) {
      EXPECT_EQ(st.spec_no_draft_steps, 0);
      EXPECT_GT(st.spec_verified_tokens, 0);
      EXPECT_EQ(st.spec_accepted_tokens, st.spec_verified_tokens);
      EXPECT_GT(st.spec_draft_predicted_seconds, 0.0);
    } else if (c.probe_interval == 0) {
      EXPECT_GT(st.spec_no_draft_steps, 0);
      EXPECT_EQ(st.spec_drafted_tokens, 0);
      EXPECT_EQ(st.spec_draft_predicted_seconds, 0.0);
    } else {
      EXPECT_GT(st.spec_no_draft_steps, 0);
      EXPECT_GT(st.spec_probe_steps, 0);
      EXPECT_GT(st.spec_drafted_tokens, 0);
      EXPECT_LE(st.spec_drafted_tokens, 6 * st.spec_probe_steps);  // one per sequence and probe
      // No plan drafts between probes, so their gap doubles: 4, 8, 16 steps (a fixed gap of 4
      // would probe 4+ times over these ~17 decode steps).
      EXPECT_LE(st.spec_probe_steps, 3);
    }
  }
}

// SpecOptions::select_max_length: the selector measures fixed lengths only up to it, while the
// plan still drafts and verifies up to k. A draft that is always accepted (the target's own
// weights) and costs a microsecond makes the plan verify long drafts; the fixed lengths run 1, 2
// (none longer), or 1, 2, 4, 8 by default. Outputs never change.
TEST(SpecEngineSelectorTest, FixedLengthsStopAtSelectMaxLengthWhileThePlanVerifiesUpToK) {
  auto model = Model::Load(kLlama, ModelOptions{2}).value();
  const auto prompts = RepetitivePrompts(model->config().vocab_size, 4, 29);
  const auto reqs = GreedyRequests(prompts, 200);  // enough steps to tour every mode
  const RunResult ref = RunAll(model.get(), BaseOptions(), reqs);
  const speculative::CostTable target = LinearCostTable(1e-3, 1e-6),
                               cheap = LinearCostTable(1e-6, 0.0);
  for (int select_max_length : {2, 0}) {
    SCOPED_TRACE(::testing::Message() << "select_max_length " << select_max_length);
    EngineOptions o = WithSelector(WithDraftModel(BaseOptions(), kLlama, 8, /*adaptive=*/true));
    o.speculative.cost_table = &target;
    o.speculative.draft_cost_table = &cheap;
    o.speculative.select_max_length = select_max_length;
    o.speculative.draft_num_blocks = 256;
    o.max_running = 2;  // room in the 40-token step for 2 x (1 + 8)
    const RunResult got = RunAll(model.get(), o, reqs);
    ExpectSameTokens(got, ref, reqs);
    const EngineStats& st = got.stats;
    EXPECT_GT(st.spec_select_plan_steps, 0);
    EXPECT_GT(st.spec_select_fixed_steps, 0);
    EXPECT_EQ(st.spec_accepted_tokens, st.spec_verified_tokens);
    EXPECT_EQ(st.spec_select_longest_fixed, select_max_length == 2 ? 2 : 8);
    if (select_max_length == 2) {
      EXPECT_GT(st.spec_longest_verified, 2);  // only the plan drafts that far
    } else {
      EXPECT_EQ(st.spec_longest_verified, 8);  // k = 8's whole drafts
    }
  }
  // The fixed lengths also hold the one whose single sequence fills a pass of the CPU's
  // projections, where that is above 1 and below the longest (3 on AVX-512 BF16, bf16 weights).
  for (const char* dir : {kLlama, "engine/testdata/models/llama_bf16"}) {
    auto m = Model::Load(dir, ModelOptions{2}).value();
    const int fill =
        kernels::LinearRowsPerPass(m->activation_dtype(), kernels::BestCpuIsa()) - 1;
    for (int select_max_length : {0, 2}) {
      SCOPED_TRACE(::testing::Message() << dir << " select_max_length " << select_max_length);
      EngineOptions o = WithSelector(WithDraftModel(BaseOptions(), dir, 8, /*adaptive=*/true));
      o.speculative.cost_table = &target;
      o.speculative.draft_cost_table = &cheap;
      o.speculative.select_max_length = select_max_length;
      auto engine = LlmEngine::Create(m.get(), o);
      ASSERT_TRUE(engine.ok()) << engine.status();
      std::vector<int> want = select_max_length == 2 ? std::vector<int>{1, 2}
                                                     : std::vector<int>{1, 2, 4, 8};
      const int longest = want.back();
      if (fill > 1 && fill < longest && std::find(want.begin(), want.end(), fill) == want.end()) {
        want.insert(std::upper_bound(want.begin(), want.end(), fill), fill);
      }
      EXPECT_EQ((*engine)->GetStats().spec_select_lengths, want);
      if (kernels::BestCpuIsa() == kernels::CpuIsa::kAvx512Bf16 &&
          m->activation_dtype() == kernels::DType::kBF16) {
        const std::vector<int> avx512 =
            select_max_length == 2 ? std::vector<int>{1, 2} : std::vector<int>{1, 2, 3, 4, 8};
        EXPECT_EQ((*engine)->GetStats().spec_select_lengths, avx512);
      }
    }
  }
  EngineOptions bad = WithDraftModel(BaseOptions(), kLlama, 4, /*adaptive=*/true);
  bad.speculative.select_max_length = 5;
  const auto engine = LlmEngine::Create(model.get(), bad);
  EXPECT_EQ(engine.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(engine.status().message().find("speculative.select_max_length"), std::string::npos)
      << engine.status();
}

// Overlap with speculation: an adaptive plan that never drafts (a draft round costing a second,
// no probes) schedules every step while the previous one runs, exactly as without speculation;
// with overlap off nothing is overlapped. Outputs never change.
TEST(SpecEngineDraftModelTest, StepsWithoutDraftsOverlap) {
  auto model = Model::Load(kLlama, ModelOptions{2}).value();
  const auto prompts = RepetitivePrompts(model->config().vocab_size, 6, 71);
  const auto reqs = GreedyRequests(prompts, 16);
  const RunResult ref = RunAll(model.get(), BaseOptions(), reqs);
  EXPECT_GT(ref.stats.overlapped_steps, 0);
  const speculative::CostTable target = LinearCostTable(1e-3, 1e-5),
                               expensive = LinearCostTable(1.0, 0.0);
  for (bool overlap : {true, false}) {
    SCOPED_TRACE(::testing::Message() << "overlap " << overlap);
    EngineOptions o = WithDraftModel(BaseOptions(), kLlama, 3, /*adaptive=*/true);
    o.overlap = overlap;
    o.speculative.cost_table = &target;
    o.speculative.draft_cost_table = &expensive;
    o.speculative.probe_interval = 0;
    const RunResult got = RunAll(model.get(), o, reqs);
    ExpectSameTokens(got, ref, reqs);
    const EngineStats& st = got.stats;
    EXPECT_EQ(st.spec_drafted_tokens, 0);
    EXPECT_EQ(st.spec_synced_steps, 0);
    EXPECT_GT(st.spec_no_draft_steps, 0);
    EXPECT_GT(st.spec_timed_steps, 0);
    if (overlap) {
      // Every step ran on the executor while the next was scheduled.
      EXPECT_EQ(st.overlapped_steps, st.steps);
    } else {
      EXPECT_EQ(st.overlapped_steps, 0);
      EXPECT_EQ(st.spec_overlap_overhead_seconds, 0.0);
    }
  }
}

// Upkeep (SpecOptions::draft_upkeep_tokens): an adaptive plan that never drafts (a draft round
// costing a second, no probes) still keeps the draft model within that many tokens of every
// decoding sequence, without drafting; with 0 the draft model is never run. Outputs never change.
TEST(SpecEngineDraftModelTest, StepsWithoutDraftsKeepTheDraftModelFed) {
  auto model = Model::Load(kLlama, ModelOptions{2}).value();
  const auto prompts = RepetitivePrompts(model->config().vocab_size, 6, 79);
  constexpr int kMaxTokens = 16, kUpkeep = 4;
  const auto reqs = GreedyRequests(prompts, kMaxTokens);
  const RunResult ref = RunAll(model.get(), BaseOptions(), reqs);
  const speculative::CostTable target = LinearCostTable(1e-3, 1e-5),
                               expensive = LinearCostTable(1.0, 0.0);
  for (int upkeep : {0, kUpkeep}) {
    SCOPED_TRACE(::testing::Message() << "upkeep " << upkeep);
    EngineOptions o = WithDraftModel(BaseOptions(), kLlama, 3, /*adaptive=*/true);
    o.speculative.cost_table = &target;
    o.speculative.draft_cost_table = &expensive;
    o.speculative.probe_interval = 0;
    o.speculative.draft_upkeep_tokens = upkeep;
    const RunResult got = RunAll(model.get(), o, reqs);
    ExpectSameTokens(got, ref, reqs);
    const EngineStats& st = got.stats;
    EXPECT_EQ(st.spec_drafted_tokens, 0);
    EXPECT_GT(st.spec_no_draft_steps, 0);
    if (upkeep == 0) {
      EXPECT_EQ(st.spec_draft_upkeep_tokens, 0);
      EXPECT_EQ(st.spec_draft_upkeep_seconds, 0.0);
      continue;
    }
    // The last decode step of a request is scheduled with prompt + kMaxTokens - 1 tokens known,
    // of which all but the last are fed once kUpkeep lag: at least prompt + kMaxTokens - 2 -
    // (kUpkeep - 1) tokens per request came into the draft cache, fed or adopted from a finished
    // request's entry; and no more than the tokens there are (nothing is fed twice: no drafts).
    int64_t least = 0, most = 0;
    for (const auto& p : prompts) {
      least += static_cast<int64_t>(p.size()) + kMaxTokens - 2 - (kUpkeep - 1);
      most += static_cast<int64_t>(p.size()) + kMaxTokens;
    }
    EXPECT_GE(st.spec_draft_upkeep_tokens + st.spec_draft_reused_tokens, least);
    EXPECT_LE(st.spec_draft_upkeep_tokens, most);
    EXPECT_GT(st.spec_draft_upkeep_seconds, 0.0);
  }
}

// Non-adaptive speculation with overlap on: every decode step waits for the step in flight and
// drafts (a draft model with the target's weights proposes min(k, room) tokens each time, all
// accepted), exactly as with overlap off; prefill-only steps still overlap.
TEST(SpecEngineDraftModelTest, NonAdaptiveDraftsEveryStepWithOverlap) {
  auto model = Model::Load(kLlama, ModelOptions{2}).value();
  const auto prompts = RepetitivePrompts(model->config().vocab_size, 6, 73);
  constexpr int kMaxTokens = 16, kK = 3;
  const auto reqs = GreedyRequests(prompts, kMaxTokens);
  const RunResult ref = RunAll(model.get(), BaseOptions(), reqs);
  // Each decode step emits min(k, room) + 1 tokens: the first token comes from the prefill, then
  // ceil((max_tokens - 1) / (k + 1)) decode steps draft all the rest but one token each.
  const int64_t decode_steps = (kMaxTokens - 1 + kK) / (kK + 1);
  for (bool overlap : {true, false}) {
    SCOPED_TRACE(::testing::Message() << "overlap " << overlap);
    EngineOptions o = WithDraftModel(BaseOptions(), kLlama, kK, /*adaptive=*/false);
    o.max_batch_tokens = 512;  // room for every draft
    o.overlap = overlap;
    const RunResult got = RunAll(model.get(), o, reqs);
    for (const EngineRequest& r : reqs) {
      const auto& g = got.results.at(r.request_id);
      EXPECT_EQ(g.tokens, ref.results.at(r.request_id).tokens) << r.request_id;
      EXPECT_EQ(g.usage.draft_tokens, kMaxTokens - 1 - decode_steps) << r.request_id;
      EXPECT_EQ(g.usage.accepted_draft_tokens, g.usage.draft_tokens) << r.request_id;
    }
    const EngineStats& st = got.stats;
    EXPECT_EQ(st.spec_accepted_tokens, st.spec_verified_tokens);
    if (overlap) {
      EXPECT_GT(st.spec_synced_steps, 0);
      EXPECT_GT(st.overlapped_steps, 0);  // the prefills
    } else {
      EXPECT_EQ(st.overlapped_steps, 0);
    }
  }
}

TEST(SpecEngineDraftModelTest, SampledRequestsWithDraftDistributions) {
  auto model = Model::Load(kLlama, ModelOptions{2}).value();
  const auto prompts = RepetitivePrompts(model->config().vocab_size, 4, 61);
  auto reqs = GreedyRequests(prompts, 12);
  for (size_t i = 0; i < reqs.size(); ++i) {
    reqs[i].sampling.temperature = 0.8f;
    reqs[i].sampling.has_seed = true;
    reqs[i].sampling.seed = 7 + i;
  }
  const RunResult got = RunAll(model.get(), WithDraftModel(BaseOptions(), kLlama, 4, false), reqs);
  EXPECT_GT(got.stats.spec_verified_tokens, 0);
  // Same weights and temperature: p_d == p_t up to top-k/p (none here), so nearly every draft is
  // accepted (min(1, p_t / p_d) = 1).
  EXPECT_GT(got.stats.spec_accepted_tokens, got.stats.spec_verified_tokens * 9 / 10);
  for (const EngineRequest& r : reqs) {
    const auto& x = got.results.at(r.request_id);
    EXPECT_TRUE(x.status.ok()) << x.status;
    EXPECT_EQ(x.tokens.size(), 12u);
  }
}

TEST(SpecEngineDraftModelTest, RejectsBadDraftModels) {
  auto model = Model::Load(kLlama, ModelOptions{2}).value();
  auto message = [&](const EngineOptions& o) {
    auto e = LlmEngine::Create(model.get(), o);
    EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
    return std::string(e.status().message());
  };
  EXPECT_EQ(message(WithDraftModel(BaseOptions(), "", 4, false))
                .rfind("speculative.draft_model_path: required", 0),
            0u);
  EXPECT_EQ(message(WithDraftModel(BaseOptions(), "/nonexistent/draft", 4, false))
                .rfind("speculative.draft_model_path: \"/nonexistent/draft\"", 0),
            0u);
  EngineOptions window = WithDraftModel(BaseOptions(), "engine/testdata/models/llama_tied", 4, false);
  window.speculative.draft_catch_up_window = -1;
  EXPECT_EQ(message(window).rfind("speculative.draft_catch_up_window: expected >= 0", 0), 0u);
  const std::filesystem::path dir =
      std::filesystem::path(std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp") /
      "draft_other_vocab";
  std::filesystem::create_directories(dir);
  nlohmann::json config;
  std::ifstream(std::string(kLlama) + "/config.json") >> config;
  config["vocab_size"] = 1024;
  std::ofstream(dir / "config.json") << config.dump();
  const std::string vocab = message(WithDraftModel(BaseOptions(), dir.string(), 4, false));
  EXPECT_EQ(vocab.rfind("speculative.draft_model_path:", 0), 0u) << vocab;
  EXPECT_NE(vocab.find("vocab_size 1024 differs from the target model's 768"), std::string::npos)
      << vocab;
}

}  // namespace
}  // namespace deepinfer::engine
