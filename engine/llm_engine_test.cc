// The serving engine against the single-sequence reference path (GenerateOne) on a committed
// fixture checkpoint: greedy outputs must be identical whatever the batching, with the prefix
// cache on or off, chunked prefill on or off, overlap on or off, and under preemption; and under
// random load with aborts no KV block may leak.
#include "engine/llm_engine.h"

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <fstream>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "engine/chat_template/chat_template.h"
#include "engine/kv_copy_test_util.h"
#include "engine/output_collector.h"
#include "engine/tokenizer/tokenizer.h"
#include "gtest/gtest.h"

namespace deepinfer::engine {
namespace {

constexpr char kModelDir[] = "engine/testdata/models/llama";

using Collector = OutputCollector;

class LlmEngineTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto model = Model::Load(kModelDir, ModelOptions{2});
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = model->release();
    // Prompts sharing long prefixes (an agent resending its context), plus unrelated ones.
    std::mt19937 rng(5);
    const int vocab = model_->config().vocab_size;
    std::vector<int32_t> context(37);
    for (int32_t& t : context) t = rng() % vocab;
    for (int i = 0; i < 10; ++i) {
      std::vector<int32_t> p;
      if (i < 6) p.assign(context.begin(), context.begin() + 20 + 3 * i);
      const int extra = 1 + rng() % 9;
      for (int j = 0; j < extra; ++j) p.push_back(rng() % vocab);
      prompts_.push_back(p);
    }
    for (const auto& p : prompts_) {
      SamplingParams sp = Greedy(12);
      auto r = GenerateOne(*model_, p, sp, GenerateOptions());
      ASSERT_TRUE(r.ok()) << r.status();
      std::vector<int32_t> out;
      for (const StepOutput& s : r->steps) out.push_back(s.token);
      expected_.push_back(out);
    }
  }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
  }

  static SamplingParams Greedy(int max_tokens) {
    SamplingParams sp;
    sp.temperature = 0;
    sp.max_tokens = max_tokens;
    sp.ignore_eos = true;
    return sp;
  }

  // Runs every prompt twice (the second round reuses the first round's cached prefixes) and
  // checks each output against the reference.
  void RunAndCompare(const EngineOptions& options, bool expect_preemption = false) {
    auto engine = LlmEngine::Create(model_, options);
    ASSERT_TRUE(engine.ok()) << engine.status();
    ASSERT_TRUE((*engine)->Start().ok());
    for (int round = 0; round < 2; ++round) {
      Collector c;
      for (size_t i = 0; i < prompts_.size(); ++i) {
        EngineRequest req;
        req.request_id = "r" + std::to_string(i);
        req.prompt = prompts_[i];
        req.sampling = Greedy(12);
        ASSERT_TRUE((*engine)->Submit(req, c.Callback()).ok());
      }
      ASSERT_TRUE(c.WaitFor(prompts_.size(), std::chrono::seconds(120)));
      auto results = c.results();
      for (size_t i = 0; i < prompts_.size(); ++i) {
        const auto& r = results["r" + std::to_string(i)];
        EXPECT_EQ(r.final_outputs, 1);
        EXPECT_TRUE(r.status.ok()) << r.status;
        EXPECT_EQ(r.finish, FinishReason::kLength);
        EXPECT_EQ(r.tokens, expected_[i]) << "prompt " << i << " round " << round;
        EXPECT_EQ(r.usage.completion_tokens, 12);
        EXPECT_EQ(r.usage.prompt_tokens, static_cast<int64_t>(prompts_[i].size()));
        if (!options.enable_prefix_cache) {
          EXPECT_EQ(r.usage.cached_prompt_tokens, 0);
        }
      }
    }
    const EngineStats stats = (*engine)->GetStats();
    if (options.enable_prefix_cache) {
      EXPECT_GT(stats.blocks.prefix_hit_tokens, 0);
    }
    if (expect_preemption) {
      EXPECT_GT(stats.preemptions, 0);
    }
    (*engine)->Stop();
    const EngineStats after = (*engine)->GetStats();
    EXPECT_EQ(after.blocks.used_blocks, 0);
  }

  static Model* model_;
  static std::vector<std::vector<int32_t>> prompts_;
  static std::vector<std::vector<int32_t>> expected_;
};

Model* LlmEngineTest::model_ = nullptr;
std::vector<std::vector<int32_t>> LlmEngineTest::prompts_;
std::vector<std::vector<int32_t>> LlmEngineTest::expected_;

TEST_F(LlmEngineTest, IdenticalAcrossCacheChunkingAndOverlapSettings) {
  for (bool cache : {true, false}) {
    for (bool chunked : {true, false}) {
      for (bool overlap : {true, false}) {
        SCOPED_TRACE(::testing::Message() << "cache " << cache << " chunked " << chunked
                                          << " overlap " << overlap);
        EngineOptions o;
        o.num_blocks = 256;
        o.block_size = 4;
        o.max_batch_tokens = 16;  // small budget: prompts are chunked and mixed with decodes
        o.enable_prefix_cache = cache;
        o.chunked_prefill = chunked;
        o.overlap = overlap;
        RunAndCompare(o);
      }
    }
  }
}

TEST_F(LlmEngineTest, IdenticalUnderPreemption) {
  for (bool overlap : {true, false}) {
    EngineOptions o;
    o.num_blocks = 24;  // 96 tokens for 10 requests of up to ~60: forces preemption
    o.block_size = 4;
    o.max_batch_tokens = 32;
    o.overlap = overlap;
    RunAndCompare(o, /*expect_preemption=*/true);
  }
}

TEST_F(LlmEngineTest, PrefixCacheServesTheSecondTurn) {
  EngineOptions o;
  o.num_blocks = 128;
  o.block_size = 4;
  auto engine = LlmEngine::Create(model_, o).value();
  ASSERT_TRUE(engine->Start().ok());
  Collector c;
  EngineRequest req;
  req.request_id = "turn1";
  req.prompt = prompts_[5];
  req.sampling = Greedy(4);
  ASSERT_TRUE(engine->Submit(req, c.Callback()).ok());
  ASSERT_TRUE(c.WaitFor(1, std::chrono::seconds(60)));
  req.request_id = "turn2";
  ASSERT_TRUE(engine->Submit(req, c.Callback()).ok());
  ASSERT_TRUE(c.WaitFor(2, std::chrono::seconds(60)));
  auto results = c.results();
  EXPECT_EQ(results["turn1"].usage.cached_prompt_tokens, 0);
  // Every full block except the one holding the last prompt token.
  EXPECT_EQ(results["turn2"].usage.cached_prompt_tokens, (prompts_[5].size() - 1) / 4 * 4);
  EXPECT_EQ(results["turn1"].tokens, results["turn2"].tokens);
  // Turn 1 published its full blocks; the chain links each to its parent.
  const std::vector<KvEvent> events = engine->DrainKvEvents();
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events[0].kind, KvEvent::Kind::kStored);
  EXPECT_EQ(events[0].parent_hash, 0u);
  if (events.size() > 1) {
    EXPECT_EQ(events[1].parent_hash, events[0].block_hash);
  }
  EXPECT_TRUE(engine->DrainKvEvents().empty());
  // A different salt shares nothing.
  req.request_id = "other-tenant";
  req.cache_salt = "tenant-b";
  ASSERT_TRUE(engine->Submit(req, c.Callback()).ok());
  ASSERT_TRUE(c.WaitFor(3, std::chrono::seconds(60)));
  EXPECT_EQ(c.results()["other-tenant"].usage.cached_prompt_tokens, 0);
}

TEST_F(LlmEngineTest, StatsCountThePendingPrefillBacklog) {
  EngineOptions o;
  o.num_blocks = 600;
  o.block_size = 4;
  o.max_batch_tokens = 8;  // a 1500-token prompt takes ~190 steps to prefill
  auto engine = LlmEngine::Create(model_, o).value();
  ASSERT_TRUE(engine->Start().ok());
  // A reservation (for a remote prefill that never comes) holds 500 of the 600 blocks, so the
  // 1500-token prompt (375 blocks) waits with all its tokens pending until the test frees them:
  // the backlog cannot be computed before this thread looks, however late it looks (it was, in
  // ~190 fast steps, when the prompt was admitted at once and this thread stalled).
  EngineRequest hog;
  hog.request_id = "hog";
  hog.prompt.assign(500 * o.block_size, 5);
  hog.sampling = Greedy(1);
  ASSERT_TRUE(engine->ReserveForRemotePrefill(hog, [](const EngineOutput&) {}).ok());
  Collector c;
  EngineRequest req;
  req.request_id = "long";
  for (int i = 0; i < 1500; ++i) req.prompt.push_back(i % 700);
  req.sampling = Greedy(2);
  ASSERT_TRUE(engine->Submit(req, c.Callback()).ok());
  int64_t seen = 0;
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (seen == 0 && std::chrono::steady_clock::now() < give_up) {
    seen = engine->GetStats().pending_prefill_tokens;
    if (seen == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(seen, 1500);
  ASSERT_TRUE(engine->FailRemotePrefill("hog", absl::CancelledError("test done with it")).ok());
  ASSERT_TRUE(c.WaitFor(1, std::chrono::seconds(60)));
  EXPECT_TRUE(c.results()["long"].status.ok()) << c.results()["long"].status;
  int64_t after = -1;
  const auto drained_by = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (after != 0 && std::chrono::steady_clock::now() < drained_by) {
    after = engine->GetStats().pending_prefill_tokens;
    if (after != 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(after, 0);
  engine->Stop();
}

TEST_F(LlmEngineTest, RejectsBadRequestsWithNamedFields) {
  EngineOptions o;
  o.num_blocks = 8;
  o.block_size = 4;
  o.max_waiting = 2;
  auto engine = LlmEngine::Create(model_, o).value();
  Collector c;
  EngineRequest req;
  req.request_id = "x";
  req.prompt = {1, 2, 3};
  req.sampling = Greedy(4);
  EXPECT_EQ(engine->Submit(req, c.Callback()).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(engine->Start().ok());
  EngineRequest bad = req;
  bad.prompt = {};
  EXPECT_NE(engine->Submit(bad, c.Callback()).message().find("prompt_token_ids"), absl::string_view::npos);
  bad = req;
  bad.prompt = {model_->config().vocab_size};
  EXPECT_NE(engine->Submit(bad, c.Callback()).message().find("prompt_token_ids[0]"), absl::string_view::npos);
  bad = req;
  bad.sampling.top_p = 2;
  EXPECT_NE(engine->Submit(bad, c.Callback()).message().find("sampling.top_p"), absl::string_view::npos);
  bad = req;
  bad.sampling.max_tokens = 40;  // 43 tokens > 32 in the cache
  EXPECT_EQ(engine->Submit(bad, c.Callback()).code(), absl::StatusCode::kResourceExhausted);
  bad = req;
  bad.request_id = "";
  EXPECT_NE(engine->Submit(bad, c.Callback()).message().find("request_id"), absl::string_view::npos);
  EXPECT_FALSE(engine->Abort("never-submitted"));
}

TEST_F(LlmEngineTest, FullQueueIsResourceExhaustedAndAcceptedRequestsFinish) {
  EngineOptions o;
  o.num_blocks = 64;
  o.block_size = 4;
  o.max_running = 1;
  o.max_waiting = 2;
  auto engine = LlmEngine::Create(model_, o).value();
  ASSERT_TRUE(engine->Start().ok());
  // A reservation (for a remote prefill that never comes) holds 60 of the 64 blocks, too few
  // left for any prompt here: nothing is admitted, so the queue cannot drain while it fills,
  // however long this thread stalls between submissions. (A running request generating 200
  // tokens could finish first, and a fourth submission was accepted.)
  EngineRequest hog;
  hog.request_id = "hog";
  hog.prompt.assign(60 * o.block_size, 5);
  hog.sampling = Greedy(1);
  ASSERT_TRUE(engine->ReserveForRemotePrefill(hog, [](const EngineOutput&) {}).ok());
  Collector c;
  int accepted = 0, rejected = 0;
  for (int i = 0; i < 30 && rejected == 0; ++i) {
    EngineRequest req;
    req.request_id = "f" + std::to_string(i);
    req.prompt = prompts_[0];
    req.sampling = Greedy(200);
    absl::Status s = engine->Submit(req, c.Callback());
    if (s.ok()) {
      ++accepted;
    } else {
      EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
      ++rejected;
    }
  }
  // Two queued: the third submission is refused.
  EXPECT_EQ(rejected, 1);
  EXPECT_EQ(accepted, 2);
  ASSERT_TRUE(engine->FailRemotePrefill("hog", absl::CancelledError("test done with it")).ok());
  ASSERT_TRUE(c.WaitFor(accepted, std::chrono::seconds(120)));
  auto results = c.results();
  EXPECT_EQ(static_cast<int>(results.size()), accepted);
  for (const auto& [id, r] : results) {
    EXPECT_TRUE(r.status.ok()) << id;
    EXPECT_EQ(r.tokens.size(), 200u) << id;
    // Greedy and the same prompt: every accepted request generates the same tokens.
    EXPECT_EQ(r.tokens, results.begin()->second.tokens) << id;
  }
}

TEST_F(LlmEngineTest, RandomLoadWithAbortsLeaksNoBlocks) {
  EngineOptions o;
  o.num_blocks = 64;
  o.block_size = 4;
  o.max_batch_tokens = 48;
  o.max_running = 16;
  auto engine = LlmEngine::Create(model_, o).value();
  ASSERT_TRUE(engine->Start().ok());
  Collector c;
  std::mt19937 rng(99);
  const int vocab = model_->config().vocab_size;
  const int n = 300;
  int submitted = 0;
  for (int i = 0; i < n; ++i) {
    EngineRequest req;
    req.request_id = "q" + std::to_string(i);
    const std::vector<int32_t>& base = prompts_[rng() % prompts_.size()];
    req.prompt.assign(base.begin(), base.begin() + 1 + rng() % base.size());
    const int extra = rng() % 6;
    for (int j = 0; j < extra; ++j) req.prompt.push_back(rng() % vocab);
    req.sampling = Greedy(1 + rng() % 8);
    req.priority = rng() % 3;
    absl::Status s = engine->Submit(req, c.Callback());
    ASSERT_TRUE(s.ok()) << s;
    ++submitted;
    if (rng() % 4 == 0) {
      if (rng() % 2 == 0) std::this_thread::sleep_for(std::chrono::microseconds(rng() % 3000));
      engine->Abort("q" + std::to_string(rng() % (i + 1)));
    }
    if (i == n / 2) {
      // The random aborts land only while their target is live, which this thread, stalled, can
      // miss every time. This request is aborted from its own first output (on the scheduler
      // thread), so the abort is handled within the next two steps: it always lands, mid-load.
      EngineRequest live;
      live.request_id = "live";
      live.prompt = prompts_[0];
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
      ++submitted;
    }
  }
  ASSERT_TRUE(c.WaitFor(submitted, std::chrono::seconds(240)));
  auto results = c.results();
  int aborted = 0;
  for (const auto& [id, r] : results) {
    EXPECT_EQ(r.final_outputs, 1) << id;
    if (r.finish == FinishReason::kAborted) ++aborted;
  }
  EXPECT_EQ(static_cast<int>(results.size()), submitted);
  EXPECT_EQ(results["live"].finish, FinishReason::kAborted);
  EXPECT_LT(results["live"].tokens.size(), 64u);
  // Let the scheduler release blocks of the last finished steps.
  EngineStats s;
  for (int i = 0; i < 200; ++i) {
    s = engine->GetStats();
    if (s.blocks.used_blocks == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(s.blocks.used_blocks, 0);
  EXPECT_EQ(s.blocks.free_blocks + s.blocks.cached_blocks, 64);
  EXPECT_EQ(s.running, 0);
  EXPECT_EQ(s.waiting, 0);
  EXPECT_GT(aborted, 0);
}

// Mistral fixture: every layer has a sliding window of 8 tokens. Long generations give back the
// blocks behind the window and still produce exactly the reference tokens.
TEST(SlidingWindowEngineTest, ReleasesBlocksBehindTheWindowWithoutChangingOutputs) {
  auto model = Model::Load("engine/testdata/models/mistral", ModelOptions{2}).value();
  ASSERT_TRUE(model->all_layers_sliding());
  ASSERT_EQ(model->config().sliding_window, 8);
  std::mt19937 rng(3);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 4; ++i) {
    std::vector<int32_t> p(20 + 5 * i);
    for (int32_t& t : p) t = rng() % model->config().vocab_size;
    prompts.push_back(p);
  }
  SamplingParams sp;
  sp.temperature = 0;
  sp.max_tokens = 40;
  sp.ignore_eos = true;
  for (bool overlap : {true, false}) {
    EngineOptions o;
    o.num_blocks = 64;
    o.block_size = 4;
    o.max_batch_tokens = 12;
    o.overlap = overlap;
    auto engine = LlmEngine::Create(model.get(), o).value();
    ASSERT_TRUE(engine->Start().ok());
    Collector c;
    for (size_t i = 0; i < prompts.size(); ++i) {
      EngineRequest req;
      req.request_id = "w" + std::to_string(i);
      req.prompt = prompts[i];
      req.sampling = sp;
      ASSERT_TRUE(engine->Submit(req, c.Callback()).ok());
    }
    ASSERT_TRUE(c.WaitFor(prompts.size(), std::chrono::seconds(120)));
    auto results = c.results();
    for (size_t i = 0; i < prompts.size(); ++i) {
      auto ref = GenerateOne(*model, prompts[i], sp, GenerateOptions()).value();
      std::vector<int32_t> want;
      for (const StepOutput& s : ref.steps) want.push_back(s.token);
      EXPECT_EQ(results["w" + std::to_string(i)].tokens, want) << i << " overlap " << overlap;
    }
    // 4 sequences of up to 75 tokens would need 4 x 19 = 76 blocks without release; there are
    // only 64, so finishing at all (without preemption) shows blocks were given back.
    const EngineStats s = engine->GetStats();
    EXPECT_GT(s.window_released_blocks, 0);
    EXPECT_EQ(s.preemptions, 0);
  }
}

// Disaggregated serving with two engines in one process: the prefill engine computes and holds
// the prompt's KV, the "transfer" copies the blocks into the decode engine's reservation (only
// blocks the decode engine does not already have cached), and the decode engine continues.
// Outputs must equal the single-engine reference; no block may stay reserved.
// Disaggregation with the prompt's KV copied between the two engines' host caches (standing in
// for kv_transfer). With `mirrored`, each engine runs on a backend with KV pools of its own
// (HostMirrorBackend): the prefill engine must download the prompt's blocks into its host cache
// before reporting them, the decode engine upload the copied ones before decoding, or the
// outputs change (the host caches would hold zeros, the backends' pools stale blocks).
class RemotePrefillTest : public LlmEngineTest, public ::testing::WithParamInterface<bool> {};

TEST_P(RemotePrefillTest, RemotePrefillIntoAReservationGivesTheReferenceOutput) {
  const bool mirrored = GetParam();
  EngineOptions o;
  o.num_blocks = 128;
  o.block_size = 4;
  std::unique_ptr<HostMirrorBackend> prefill_backend, decode_backend;
  EngineOptions po = o, dopt = o;
  if (mirrored) {
    prefill_backend = HostMirrorBackend::Create(model_, o.num_blocks, o.block_size).value();
    decode_backend = HostMirrorBackend::Create(model_, o.num_blocks, o.block_size).value();
    po.backend = prefill_backend.get();
    dopt.backend = decode_backend.get();
  }
  auto prefill = LlmEngine::Create(model_, po).value();
  auto decode = LlmEngine::Create(model_, dopt).value();
  ASSERT_TRUE(prefill->Start().ok());
  ASSERT_TRUE(decode->Start().ok());
  KvCache* src = prefill->kv_cache();
  KvCache* dst = decode->kv_cache();
  int64_t decode_cached = 0;
  for (int round = 0; round < 2; ++round) {
    for (size_t i = 0; i < 4; ++i) {
      const std::string id = "d" + std::to_string(round) + "_" + std::to_string(i);
      EngineRequest req;
      req.request_id = id;
      req.prompt = prompts_[i];
      req.sampling = Greedy(12);
      std::promise<absl::StatusOr<PrefillResult>> done;
      ASSERT_TRUE(prefill->SubmitPrefill(req, [&](absl::StatusOr<PrefillResult> r) {
        done.set_value(std::move(r));
      }).ok());
      absl::StatusOr<PrefillResult> pre = done.get_future().get();
      ASSERT_TRUE(pre.ok()) << pre.status();
      Collector c;
      absl::StatusOr<KvReservation> res = decode->ReserveForRemotePrefill(req, c.Callback());
      ASSERT_TRUE(res.ok()) << res.status();
      ASSERT_EQ(res->block_ids.size(), pre->block_ids.size());
      decode_cached += res->cached_tokens;
      CopyPrefilledBlocks(*src, *pre, *dst, *res);
      ASSERT_TRUE(prefill->ReleasePrefilled(id).ok());
      StepOutput first{pre->first_token, pre->first_logprob, {}};
      ASSERT_TRUE(decode->CompleteRemotePrefill(id, first).ok());
      ASSERT_TRUE(c.WaitFor(1, std::chrono::seconds(60)));
      auto r = c.results()[id];
      EXPECT_TRUE(r.status.ok()) << r.status;
      EXPECT_EQ(r.tokens, expected_[i]) << id;
    }
  }
  EXPECT_GT(decode_cached, 0);  // round 2 reused the decode engine's own prefix cache
  EXPECT_EQ(prefill->ReleasePrefilled("d0_0").code(), absl::StatusCode::kNotFound);
  for (LlmEngine* e : {prefill.get(), decode.get()}) {
    EngineStats s;
    for (int i = 0; i < 200; ++i) {
      s = e->GetStats();
      if (s.blocks.used_blocks == 0) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    EXPECT_EQ(s.blocks.used_blocks, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(HostOrBackendKv, RemotePrefillTest, ::testing::Bool());

// Layer-wise streaming (EngineRequest::on_layer_kv): the prefill engine computes in chunks that
// end mid-block; each hook call copies the layer's newly completed blocks (and nothing else) into
// the decode engine's reservation, as the prefill node posts them. The decode output must equal
// the reference: a reported block held its final KV for that layer. Hooks come per chunk in
// layer order, kv_end grows, and the last chunk reports the whole prompt for every layer. With a
// backend (its own KV pools) no hook is called.
TEST_F(LlmEngineTest, LayerHookReportsEachLayersFinalKvChunkByChunk) {
  for (bool mirrored : {false, true}) {
    SCOPED_TRACE(mirrored ? "backend" : "host");
    EngineOptions o;
    o.num_blocks = 128;
    o.block_size = 4;
    o.max_batch_tokens = 6;
    std::unique_ptr<HostMirrorBackend> backend;
    EngineOptions po = o;
    if (mirrored) {
      backend = HostMirrorBackend::Create(model_, o.num_blocks, o.block_size).value();
      po.backend = backend.get();
    }
    auto prefill = LlmEngine::Create(model_, po).value();
    auto decode = LlmEngine::Create(model_, o).value();
    ASSERT_TRUE(prefill->Start().ok());
    ASSERT_TRUE(decode->Start().ok());
    const KvCache* src = prefill->kv_cache();
    KvCache* dst = decode->kv_cache();
    const int layers = model_->config().num_layers;
    const size_t block_bytes = src->block_bytes();
    for (int round = 0; round < 2; ++round) {
      for (size_t i = 0; i < 4; ++i) {
        const std::string id = "s" + std::to_string(round) + "_" + std::to_string(i);
        const int64_t prompt_len = static_cast<int64_t>(prompts_[i].size());
        EngineRequest req;
        req.request_id = id;
        req.prompt = prompts_[i];
        req.sampling = Greedy(12);
        Collector c;
        absl::StatusOr<KvReservation> res = decode->ReserveForRemotePrefill(req, c.Callback());
        ASSERT_TRUE(res.ok()) << res.status();
        const size_t nblocks = res->block_ids.size();
        // Executor thread only (then read after `done`).
        std::vector<size_t> sent(layers, res->cached_tokens / o.block_size);
        std::vector<int64_t> last_end(layers, 0);
        std::vector<int> order;  // layers in call order
        std::vector<std::vector<int32_t>> tables(layers);
        req.on_layer_kv = [&](const LayerKvReady& ready) {
          order.push_back(ready.layer);
          EXPECT_GE(ready.kv_end, last_end[ready.layer]);
          last_end[ready.layer] = ready.kv_end;
          const size_t complete = ready.kv_end >= prompt_len
                                      ? nblocks
                                      : static_cast<size_t>(ready.kv_end / o.block_size);
          ASSERT_GE(ready.block_table.size(), complete);
          tables[ready.layer].assign(ready.block_table.begin(),
                                     ready.block_table.begin() + complete);
          const int l = ready.layer;
          for (size_t b = sent[l]; b < complete; ++b) {
            std::memcpy(static_cast<char*>(dst->k_layer(l)) + res->block_ids[b] * block_bytes,
                        static_cast<char*>(src->k_layer(l)) + ready.block_table[b] * block_bytes,
                        block_bytes);
            std::memcpy(static_cast<char*>(dst->v_layer(l)) + res->block_ids[b] * block_bytes,
                        static_cast<char*>(src->v_layer(l)) + ready.block_table[b] * block_bytes,
                        block_bytes);
          }
          sent[l] = std::max(sent[l], complete);
        };
        std::promise<absl::StatusOr<PrefillResult>> done;
        ASSERT_TRUE(prefill->SubmitPrefill(req, [&](absl::StatusOr<PrefillResult> r) {
          done.set_value(std::move(r));
        }).ok());
        absl::StatusOr<PrefillResult> pre = done.get_future().get();
        ASSERT_TRUE(pre.ok()) << pre.status();
        if (mirrored) {
          EXPECT_TRUE(order.empty());
          CopyPrefilledBlocks(*src, *pre, *dst, *res);
        } else {
          ASSERT_FALSE(order.empty());
          ASSERT_EQ(order.size() % layers, 0u);
          // Round 2 finds the prompt in the prefix cache: one chunk.
          if (round == 0) {
            EXPECT_GT(order.size(), static_cast<size_t>(layers)) << "one chunk";
          }
          for (size_t k = 0; k < order.size(); ++k) EXPECT_EQ(order[k], static_cast<int>(k % layers));
          for (int l = 0; l < layers; ++l) {
            EXPECT_EQ(last_end[l], prompt_len);
            EXPECT_EQ(sent[l], nblocks);
            EXPECT_EQ(tables[l], pre->block_ids);
          }
        }
        ASSERT_TRUE(prefill->ReleasePrefilled(id).ok());
        StepOutput first{pre->first_token, pre->first_logprob, {}};
        ASSERT_TRUE(decode->CompleteRemotePrefill(id, first).ok());
        ASSERT_TRUE(c.WaitFor(1, std::chrono::seconds(60)));
        auto r = c.results()[id];
        EXPECT_TRUE(r.status.ok()) << r.status;
        EXPECT_EQ(r.tokens, expected_[i]) << id;
      }
    }
  }
}

// Colocated serving on a backend with its own KV pools gives the reference outputs, with the
// prefix cache, preemption and chunked prefill (no block enters or leaves the node: no copies).
TEST_F(LlmEngineTest, BackendWithItsOwnKvGivesTheReferenceOutput) {
  for (bool small : {false, true}) {
    SCOPED_TRACE(::testing::Message() << (small ? "preempting" : "roomy"));
    EngineOptions o;
    o.num_blocks = small ? 24 : 128;
    o.block_size = 4;
    o.max_batch_tokens = 16;
    auto backend = HostMirrorBackend::Create(model_, o.num_blocks, o.block_size).value();
    o.backend = backend.get();
    RunAndCompare(o, /*expect_preemption=*/small);
  }
}

TEST_F(LlmEngineTest, RefusesABackendOfAnotherKvGeometry) {
  EngineOptions o;
  o.num_blocks = 64;
  o.block_size = 4;
  auto fewer = HostMirrorBackend::Create(model_, 32, 4).value();
  o.backend = fewer.get();
  absl::StatusOr<std::unique_ptr<LlmEngine>> e = LlmEngine::Create(model_, o);
  ASSERT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(e.status().message().find("backend: num_blocks 32 differs from the engine's 64"),
            std::string::npos)
      << e.status();
  auto wider = HostMirrorBackend::Create(model_, 64, 8).value();
  o.backend = wider.get();
  e = LlmEngine::Create(model_, o);
  ASSERT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(e.status().message().find("block_size 8"), std::string::npos) << e.status();
}

TEST_F(LlmEngineTest, FailedOrAbortedRemotePrefillFreesTheReservation) {
  EngineOptions o;
  o.num_blocks = 32;
  o.block_size = 4;
  auto decode = LlmEngine::Create(model_, o).value();
  ASSERT_TRUE(decode->Start().ok());
  Collector c;
  EngineRequest req;
  req.request_id = "fail";
  req.prompt = prompts_[0];
  req.sampling = Greedy(4);
  auto res = decode->ReserveForRemotePrefill(req, c.Callback());
  ASSERT_TRUE(res.ok()) << res.status();
  // The scheduler publishes stats once per loop; the reservation shows up as used blocks.
  int64_t used = 0;
  for (int i = 0; i < 200 && used == 0; ++i) {
    used = decode->GetStats().blocks.used_blocks;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(used, static_cast<int64_t>(res->block_ids.size()));
  ASSERT_TRUE(decode->FailRemotePrefill("fail", absl::UnavailableError("prefill node gone")).ok());
  ASSERT_TRUE(c.WaitFor(1, std::chrono::seconds(10)));
  EXPECT_EQ(c.results()["fail"].status.code(), absl::StatusCode::kUnavailable);

  // Abort while the transfer may be in flight: nothing ends until the caller says the writes
  // are over.
  req.request_id = "abort";
  ASSERT_TRUE(decode->ReserveForRemotePrefill(req, c.Callback()).ok());
  EXPECT_TRUE(decode->Abort("abort"));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(c.results().count("abort"), 0u);
  ASSERT_TRUE(decode->FailRemotePrefill("abort", absl::CancelledError("transfer cancelled")).ok());
  ASSERT_TRUE(c.WaitFor(2, std::chrono::seconds(10)));
  EXPECT_EQ(c.results()["abort"].finish, FinishReason::kAborted);
  EXPECT_EQ(decode->FailRemotePrefill("abort", absl::OkStatus()).code(), absl::StatusCode::kNotFound);
  EngineStats s;
  for (int i = 0; i < 200; ++i) {
    s = decode->GetStats();
    if (s.blocks.used_blocks == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(s.blocks.used_blocks, 0);
  // Reserving more than the cache holds is refused without side effects.
  req.request_id = "huge";
  req.prompt.assign(140, 1);  // 36 blocks > 32
  req.sampling = Greedy(4);
  EXPECT_EQ(decode->ReserveForRemotePrefill(req, c.Callback()).status().code(),
            absl::StatusCode::kResourceExhausted);
}

TEST_F(LlmEngineTest, ChatMessagesTextDeltasStopStringsAndItl) {
  auto tok = tokenizer::Tokenizer::FromDirectory(kModelDir);
  ASSERT_TRUE(tok.ok()) << tok.status();
  std::ifstream in(std::string(kModelDir) + "/chat_template.jinja");
  const std::string source((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto tmpl = ChatTemplate::Create(source);
  ASSERT_TRUE(tmpl.ok()) << tmpl.status();
  EngineOptions o;
  o.num_blocks = 128;
  o.block_size = 4;
  o.tokenizer = tok->get();
  o.chat_template = tmpl->get();
  o.template_context = {{"bos_token", "<|begin_of_text|>"}};
  auto engine = LlmEngine::Create(model_, o).value();
  ASSERT_TRUE(engine->Start().ok());
  Collector c;
  EngineRequest req;
  req.request_id = "chat";
  req.messages = nlohmann::ordered_json::parse(
      R"([{"role":"system","content":"Be brief."},{"role":"user","content":"Move the button."}])");
  req.sampling = Greedy(12);
  ASSERT_TRUE(engine->Submit(req, c.Callback()).ok());
  ASSERT_TRUE(c.WaitFor(1, std::chrono::seconds(60)));
  auto r = c.results()["chat"];
  ASSERT_EQ(r.tokens.size(), 12u);
  // The deltas concatenate to the decoded output.
  EXPECT_EQ(r.text, tok->get()->Decode(r.tokens, /*skip_special_tokens=*/true).value());
  // Same tokens as the reference path on the rendered prompt.
  nlohmann::ordered_json ctx = o.template_context;
  ctx["messages"] = req.messages;
  ctx["add_generation_prompt"] = true;
  const auto ids = tok->get()->Encode(tmpl->get()->Render(ctx).value(), false).value();
  EXPECT_EQ(r.usage.prompt_tokens, static_cast<int64_t>(ids.size()));
  auto ref = GenerateOne(*model_, ids, Greedy(12), GenerateOptions()).value();
  std::vector<int32_t> want;
  for (const StepOutput& s : ref.steps) want.push_back(s.token);
  EXPECT_EQ(r.tokens, want);
  EXPECT_GT(r.usage.mean_itl_us, 0.0);
  EXPECT_GE(r.usage.max_itl_us, static_cast<int64_t>(r.usage.mean_itl_us));

  // A stop string taken from the middle of that output ends the request there.
  const std::string full = r.text;
  ASSERT_GE(full.size(), 6u);
  const std::string stop = full.substr(full.size() / 2, 3);
  req.request_id = "stopped";
  req.sampling.stop = {stop};
  ASSERT_TRUE(engine->Submit(req, c.Callback()).ok());
  ASSERT_TRUE(c.WaitFor(2, std::chrono::seconds(60)));
  auto st = c.results()["stopped"];
  EXPECT_EQ(st.finish, FinishReason::kStopString);
  EXPECT_EQ(st.matched_stop, stop);
  EXPECT_EQ(st.text, full.substr(0, full.find(stop)));
  EXPECT_LT(st.tokens.size(), 12u);

  // Bad messages are named.
  req.request_id = "bad";
  req.messages = nlohmann::ordered_json::array();
  EXPECT_NE(engine->Submit(req, c.Callback()).message().find("messages"), absl::string_view::npos);
}

}  // namespace
}  // namespace deepinfer::engine
