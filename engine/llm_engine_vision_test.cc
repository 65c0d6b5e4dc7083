// The engine serving a LLaVA-style checkpoint's language model with image embeddings in the
// prompt (engine/testdata/vision/llava; transformers' projected embeddings stand in for the
// vision tower): greedy outputs and first-token logprobs match transformers whatever the
// batching and chunking, the prefix cache keys blocks by image content, bad image fields are
// rejected by name, the disaggregated path carries images, and no KV block leaks.
#include <chrono>
#include <cmath>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "engine/block_hash.h"
#include "engine/kv_copy_test_util.h"
#include "engine/llava_fixture_test_util.h"
#include "engine/llm_engine.h"
#include "engine/output_collector.h"
#include "gtest/gtest.h"

namespace deepinfer::engine {
namespace {

using testing::LlavaImage;
using testing::LlavaPrompt;

class LlmEngineVisionTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto model = Model::Load(testing::kLlavaDir, ModelOptions{2});
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = model->release();
    auto prompts = testing::LoadLlavaPrompts();
    ASSERT_TRUE(prompts.ok()) << prompts.status();
    prompts_ = new std::vector<LlavaPrompt>(std::move(*prompts));
  }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
    delete prompts_;
    prompts_ = nullptr;
  }

  static const LlavaPrompt& Prompt(int i) { return (*prompts_)[i]; }

  static ImageEmbeddings ToEngine(const LlavaImage& image, bool with_data = true) {
    ImageEmbeddings e;
    e.content_hash = image.content_hash;
    e.position = image.position;
    e.num_tokens = image.num_tokens;
    if (with_data) e.data = std::make_shared<const std::vector<float>>(image.embeddings);
    return e;
  }

  static EngineRequest Request(const std::string& id, const LlavaPrompt& prompt,
                               bool with_data = true) {
    EngineRequest r;
    r.request_id = id;
    r.prompt = prompt.ids;
    for (const LlavaImage& image : prompt.images) r.images.push_back(ToEngine(image, with_data));
    r.sampling.temperature = 0;
    r.sampling.max_tokens = static_cast<int>(prompt.greedy.size());
    r.sampling.logprobs = 5;
    r.sampling.return_logprobs = true;
    return r;
  }

  // log_softmax of the reference logits at the prompt's last position.
  static std::vector<float> ReferenceLastLogprobs(const LlavaPrompt& prompt) {
    const int vocab = model_->config().vocab_size;
    const float* row = prompt.logits.data() + (prompt.ids.size() - 1) * vocab;
    double mx = row[0];
    for (int v = 1; v < vocab; ++v) mx = std::max<double>(mx, row[v]);
    double sum = 0;
    for (int v = 0; v < vocab; ++v) sum += std::exp(row[v] - mx);
    std::vector<float> out(vocab);
    for (int v = 0; v < vocab; ++v) out[v] = static_cast<float>(row[v] - mx - std::log(sum));
    return out;
  }

  static void ExpectNoBlocksHeld(LlmEngine& engine) {
    EngineStats s;
    for (int i = 0; i < 400; ++i) {
      s = engine.GetStats();
      if (s.blocks.used_blocks == 0) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    EXPECT_EQ(s.blocks.used_blocks, 0);
    EXPECT_EQ(s.blocks.free_blocks + s.blocks.cached_blocks, s.blocks.num_blocks);
  }

  static Model* model_;
  static std::vector<LlavaPrompt>* prompts_;
};

Model* LlmEngineVisionTest::model_ = nullptr;
std::vector<LlavaPrompt>* LlmEngineVisionTest::prompts_ = nullptr;

TEST_F(LlmEngineVisionTest, GreedyOutputsMatchTransformersWhateverTheChunking) {
  struct Case {
    int max_batch_tokens;
    int block_size;
    bool overlap;
    bool prefix_cache;
  };
  // 7-token steps split both prompts' image runs across chunks (and blocks of 4).
  for (const Case& k : {Case{512, 16, true, true}, Case{7, 4, true, true}, Case{7, 4, false, false},
                        Case{13, 8, true, true}}) {
    EngineOptions o;
    o.num_blocks = 128;
    o.block_size = k.block_size;
    o.max_batch_tokens = k.max_batch_tokens;
    o.overlap = k.overlap;
    o.enable_prefix_cache = k.prefix_cache;
    auto engine = LlmEngine::Create(model_, o).value();
    ASSERT_TRUE(engine->Start().ok());
    OutputCollector c;
    for (int round = 0; round < 2; ++round) {  // round 1 may hit the prefix cache
      for (int p = 0; p < 2; ++p) {
        ASSERT_TRUE(engine->Submit(Request(absl::StrCat("r", round, "_", p), Prompt(p)),
                                   c.Callback())
                        .ok());
      }
      ASSERT_TRUE(c.WaitFor(2 * (round + 1), std::chrono::seconds(60)));
    }
    auto results = c.results();
    for (int round = 0; round < 2; ++round) {
      for (int p = 0; p < 2; ++p) {
        const std::string where =
            absl::StrCat("prompt ", p, " round ", round, " budget ", k.max_batch_tokens);
        const OutputCollector::Result& r = results[absl::StrCat("r", round, "_", p)];
        ASSERT_TRUE(r.status.ok()) << r.status << " " << where;
        EXPECT_EQ(r.tokens, Prompt(p).greedy) << where;
        // The first token's logprob and top-5 come from the prompt's last logits.
        const std::vector<float> ref = ReferenceLastLogprobs(Prompt(p));
        ASSERT_FALSE(r.logprobs.empty());
        EXPECT_NEAR(r.logprobs[0], ref[Prompt(p).greedy[0]], 1e-4f) << where;
        ASSERT_GE(r.top.size(), 5u);
        for (int j = 1; j < 5; ++j) EXPECT_GE(ref[r.top[j - 1]], ref[r.top[j]]) << where;
        EXPECT_EQ(r.top[0], Prompt(p).greedy[0]) << where;
        if (round == 1 && k.prefix_cache) {
          const LlavaImage& last = Prompt(p).images.back();
          EXPECT_GE(r.usage.cached_prompt_tokens, last.position + last.num_tokens) << where;
        }
      }
    }
    engine->Stop();
    ExpectNoBlocksHeld(*engine);
  }
}

// Preemption by recompute re-feeds the image rows: outputs do not change.
TEST_F(LlmEngineVisionTest, PreemptedSequencesRecomputeTheirImages) {
  EngineOptions o;
  // Two 71-token prompts in blocks of 4 are admitted with 18 blocks each; growing to 79 tokens
  // needs 20 each, so one is preempted and later recomputed.
  o.num_blocks = 37;
  o.block_size = 4;
  o.max_batch_tokens = 64;
  o.enable_prefix_cache = false;
  auto engine = LlmEngine::Create(model_, o).value();
  ASSERT_TRUE(engine->Start().ok());
  OutputCollector c;
  // They must be admitted together (one at a time, nothing is preempted): the scheduler thread
  // waits in a one-token request's output until all three are queued, however late this thread.
  std::promise<void> queued;
  std::shared_future<void> all_queued = queued.get_future().share();
  EngineRequest gate;
  gate.request_id = "gate";
  gate.prompt = {Prompt(0).ids[0]};
  gate.sampling.temperature = 0;
  gate.sampling.max_tokens = 1;
  ASSERT_TRUE(engine->Submit(gate, [all_queued](const EngineOutput&) { all_queued.wait(); }).ok());
  const int which[3] = {0, 0, 1};
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(engine->Submit(Request(absl::StrCat("p", i), Prompt(which[i])), c.Callback()).ok());
  }
  queued.set_value();
  ASSERT_TRUE(c.WaitFor(3, std::chrono::seconds(60)));
  auto results = c.results();
  for (int i = 0; i < 3; ++i) {
    const auto& r = results[absl::StrCat("p", i)];
    ASSERT_TRUE(r.status.ok()) << r.status;
    EXPECT_EQ(r.tokens, Prompt(which[i]).greedy) << i;
  }
  EXPECT_GT(engine->GetStats().preemptions, 0);
  ExpectNoBlocksHeld(*engine);
}

TEST_F(LlmEngineVisionTest, PrefixCacheHitsOnlyForTheSameImage) {
  EngineOptions o;
  o.num_blocks = 128;
  o.block_size = 8;
  auto engine = LlmEngine::Create(model_, o).value();
  ASSERT_TRUE(engine->Start().ok());
  const LlavaPrompt& cat = Prompt(0);
  const LlavaImage& image = cat.images[0];  // positions [33, 49)
  ASSERT_EQ(image.position, 33);
  // The same tokens with another image (other embeddings, other content hash).
  LlavaPrompt dog = cat;
  dog.images[0].embeddings = Prompt(1).images[0].embeddings;
  dog.images[0].content_hash = Prompt(1).images[0].content_hash;
  dog.greedy.clear();

  auto run = [&](LlmEngine& e, const std::string& id, const LlavaPrompt& p) {
    OutputCollector c;
    EngineRequest req = Request(id, p);
    req.sampling.max_tokens = 8;
    EXPECT_TRUE(e.Submit(req, c.Callback()).ok());
    EXPECT_TRUE(c.WaitFor(1, std::chrono::seconds(60)));
    auto r = c.results()[id];
    EXPECT_TRUE(r.status.ok()) << r.status;
    return r;
  };
  const auto first = run(*engine, "a", cat);
  EXPECT_EQ(first.usage.cached_prompt_tokens, 0);
  // The blocks it stored (its KV events) are the image-aware chain the router computes.
  std::vector<ImageSpan> spans = {{image.content_hash, image.position, image.num_tokens}};
  const std::vector<uint64_t> want =
      PromptBlockHashes(RootBlockHash(o.hash_seed, ""), cat.ids, spans, o.block_size);
  std::vector<uint64_t> stored;
  for (int i = 0; i < 400 && stored.size() < want.size(); ++i) {
    for (const KvEvent& e : engine->DrainKvEvents()) {
      if (e.kind == KvEvent::Kind::kStored) stored.push_back(e.block_hash);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_GE(stored.size(), want.size());
  EXPECT_EQ(std::vector<uint64_t>(stored.begin(), stored.begin() + want.size()), want);
  EXPECT_NE(want[4], PromptBlockHashes(RootBlockHash(o.hash_seed, ""), cat.ids, {}, 8)[4]);
  const auto again = run(*engine, "b", cat);
  EXPECT_EQ(again.tokens, cat.greedy);
  // Every full block of the 71-token prompt (64 tokens), the image's included.
  EXPECT_GE(again.usage.cached_prompt_tokens, image.position + image.num_tokens);
  const auto other = run(*engine, "c", dog);
  // Only the blocks before the image's first block ([32, 40)) are shared.
  EXPECT_EQ(other.usage.cached_prompt_tokens, 32);
  // And its output is that of an engine that never saw the first image.
  EngineOptions fresh_options = o;
  fresh_options.enable_prefix_cache = false;
  auto fresh = LlmEngine::Create(model_, fresh_options).value();
  ASSERT_TRUE(fresh->Start().ok());
  const auto alone = run(*fresh, "d", dog);
  EXPECT_EQ(other.tokens, alone.tokens);
  EXPECT_NE(other.tokens, cat.greedy);
  // The second image's blocks are now cached under its own content.
  const auto dog_again = run(*engine, "e", dog);
  EXPECT_GE(dog_again.usage.cached_prompt_tokens, image.position + image.num_tokens);
  EXPECT_EQ(dog_again.tokens, alone.tokens);
  ExpectNoBlocksHeld(*engine);
  ExpectNoBlocksHeld(*fresh);
}

void ExpectInvalid(const absl::Status& s, const std::string& prefix) {
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(s.message().substr(0, prefix.size()), prefix) << s;
}

TEST_F(LlmEngineVisionTest, BadImagesAreRejectedByField) {
  EngineOptions o;
  o.num_blocks = 64;
  auto engine = LlmEngine::Create(model_, o).value();
  ASSERT_TRUE(engine->Start().ok());
  auto submit = [&](const EngineRequest& r) { return engine->Submit(r, [](const EngineOutput&) {}); };
  const LlavaPrompt& one = Prompt(0);  // image at [33, 49) of 71 tokens
  const LlavaPrompt& two = Prompt(1);  // two images

  EngineRequest r = Request("x", one);
  r.images.clear();
  ExpectInvalid(submit(r), "prompt_token_ids[33]: image placeholder token without an image");
  r = Request("x", two);
  r.images.pop_back();
  ExpectInvalid(submit(r), absl::StrCat("prompt_token_ids[", two.images[1].position,
                                        "]: image placeholder token without an image"));
  r = Request("x", two);
  std::swap(r.images[0], r.images[1]);
  ExpectInvalid(submit(r), "images[1].position: ");
  r = Request("x", two);
  r.images[1].position = r.images[0].position + 4;  // overlaps images[0]
  ExpectInvalid(submit(r), "images[1].position: ");
  r = Request("x", one);
  r.images[0].position = static_cast<int64_t>(one.ids.size()) - 4;  // runs past the prompt
  ExpectInvalid(submit(r), "images[0].position: ");
  r.images[0].position = -1;
  ExpectInvalid(submit(r), "images[0].position: ");
  r = Request("x", one);
  r.images[0].position = 32;  // covers the newline before the run
  ExpectInvalid(submit(r), "prompt_token_ids[32]: expected the image placeholder token 768");
  r = Request("x", one);
  r.images[0].num_tokens = 0;
  ExpectInvalid(submit(r), "images[0].num_tokens: ");
  r = Request("x", one);
  r.images[0].num_tokens = 15;  // leaves the run's last placeholder uncovered
  r.images[0].data = std::make_shared<const std::vector<float>>(15 * 64, 0.0f);
  ExpectInvalid(submit(r), "prompt_token_ids[48]: image placeholder token without an image");
  r = Request("x", one);
  r.images[0].data = std::make_shared<const std::vector<float>>(16 * 64 - 1, 0.0f);
  ExpectInvalid(submit(r), "images[0].data: expected num_tokens x hidden_size = 16 x 64");
  r.images[0].data = nullptr;
  ExpectInvalid(submit(r), "images[0].data: ");
  EXPECT_EQ(engine->SubmitPrefill(r, [](absl::StatusOr<PrefillResult>) {}).code(),
            absl::StatusCode::kInvalidArgument);
  r = Request("x", one);
  r.images[0].content_hash.pop_back();
  ExpectInvalid(submit(r), "images[0].content_hash: expected 32 bytes");
  // A text-only model takes no images.
  auto llama = Model::Load("engine/testdata/models/llama", ModelOptions{1});
  ASSERT_TRUE(llama.ok()) << llama.status();
  auto text_engine = LlmEngine::Create(llama->get(), o).value();
  ASSERT_TRUE(text_engine->Start().ok());
  EngineRequest t;
  t.request_id = "t";
  t.prompt = {1, 2, 3};
  t.images.push_back(ToEngine(one.images[0]));
  t.images[0].position = 0;
  t.images[0].num_tokens = 1;
  ExpectInvalid(text_engine->Submit(t, [](const EngineOutput&) {}), "images: this model takes no");
  // Nothing was admitted, nothing is held.
  ExpectNoBlocksHeld(*engine);
  EXPECT_EQ(engine->GetStats().finished, 0);
}

TEST_F(LlmEngineVisionTest, AbortedImageRequestsFreeTheirBlocks) {
  EngineOptions o;
  o.num_blocks = 128;
  o.block_size = 4;
  o.max_batch_tokens = 8;  // many steps per prompt: the aborts land mid-prefill
  auto engine = LlmEngine::Create(model_, o).value();
  ASSERT_TRUE(engine->Start().ok());
  OutputCollector c;
  LlmEngine* e = engine.get();
  for (int i = 0; i < 4; ++i) {
    const std::string id = absl::StrCat("a", i);
    EngineRequest r = Request(id, Prompt(i % 2));
    OutputCallback callback = c.Callback();
    if (i % 2 == 0) {
      // This thread aborts them right away, mostly mid-prefill. Should it stall past their
      // prefill (a loaded machine), each aborts itself at its first output (on the scheduler
      // thread), and it cannot finish first: no eos, the whole context as budget.
      r.sampling.ignore_eos = true;
      r.sampling.max_tokens = 512 - static_cast<int>(r.prompt.size());
      callback = [collect = std::move(callback), e, id,
                  sent = std::make_shared<bool>(false)](const EngineOutput& out) {
        if (!out.finished && !*sent) {
          *sent = true;
          e->Abort(id);
        }
        collect(out);
      };
    }
    ASSERT_TRUE(engine->Submit(r, callback).ok());
  }
  for (int i = 0; i < 4; i += 2) engine->Abort(absl::StrCat("a", i));
  ASSERT_TRUE(c.WaitFor(4, std::chrono::seconds(60)));
  auto results = c.results();
  EXPECT_EQ(results["a0"].status.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(results["a2"].status.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(results["a1"].tokens, Prompt(1).greedy);
  EXPECT_EQ(results["a3"].tokens, Prompt(1).greedy);
  ExpectNoBlocksHeld(*engine);
}

// Disaggregated: the prefill engine computes the prompt with the image data; the decode engine
// reserves by image hash only (no data) and continues from the copied blocks. Round 2 reuses the
// decode engine's own cached image blocks.
TEST_F(LlmEngineVisionTest, RemotePrefillCarriesImages) {
  EngineOptions o;
  o.num_blocks = 128;
  o.block_size = 4;
  o.max_batch_tokens = 24;
  auto prefill = LlmEngine::Create(model_, o).value();
  auto decode = LlmEngine::Create(model_, o).value();
  ASSERT_TRUE(prefill->Start().ok());
  ASSERT_TRUE(decode->Start().ok());
  for (int round = 0; round < 2; ++round) {
    for (int p = 0; p < 2; ++p) {
      const std::string id = absl::StrCat("d", round, "_", p);
      std::promise<absl::StatusOr<PrefillResult>> done;
      ASSERT_TRUE(prefill
                      ->SubmitPrefill(Request(id, Prompt(p)),
                                      [&](absl::StatusOr<PrefillResult> r) {
                                        done.set_value(std::move(r));
                                      })
                      .ok());
      absl::StatusOr<PrefillResult> pre = done.get_future().get();
      ASSERT_TRUE(pre.ok()) << pre.status();
      OutputCollector c;
      absl::StatusOr<KvReservation> res =
          decode->ReserveForRemotePrefill(Request(id, Prompt(p), /*with_data=*/false), c.Callback());
      ASSERT_TRUE(res.ok()) << res.status();
      const int64_t image_end = Prompt(p).images.back().position + Prompt(p).images.back().num_tokens;
      if (round == 1) {
        EXPECT_GE(res->cached_tokens, image_end) << id;
        EXPECT_GE(pre->cached_tokens, image_end) << id;
      }
      CopyPrefilledBlocks(*prefill->kv_cache(), *pre, *decode->kv_cache(), *res);
      ASSERT_TRUE(prefill->ReleasePrefilled(id).ok());
      ASSERT_TRUE(decode->CompleteRemotePrefill(id, {pre->first_token, pre->first_logprob, {}}).ok());
      ASSERT_TRUE(c.WaitFor(1, std::chrono::seconds(60)));
      auto r = c.results()[id];
      ASSERT_TRUE(r.status.ok()) << r.status;
      EXPECT_EQ(r.tokens, Prompt(p).greedy) << id;
    }
  }
  ExpectNoBlocksHeld(*prefill);
  ExpectNoBlocksHeld(*decode);
}

// A decode-side sequence reserved without image data cannot be recomputed: preempting it ends it
// with kResourceExhausted (and frees its blocks) instead of feeding placeholder embeddings.
TEST_F(LlmEngineVisionTest, PreemptingARemotePrefillWithoutImageDataEndsIt) {
  EngineOptions po;
  po.num_blocks = 128;
  po.block_size = 4;
  EngineOptions d = po;
  d.num_blocks = 37;  // two 71-token prompts fit (18 blocks each), not their growth
  d.enable_prefix_cache = false;
  auto prefill = LlmEngine::Create(model_, po).value();
  auto decode = LlmEngine::Create(model_, d).value();
  ASSERT_TRUE(prefill->Start().ok());
  ASSERT_TRUE(decode->Start().ok());
  OutputCollector c;
  std::vector<std::pair<std::string, PrefillResult>> done;
  for (const std::string id : {"x", "y"}) {
    std::promise<absl::StatusOr<PrefillResult>> p;
    ASSERT_TRUE(prefill
                    ->SubmitPrefill(Request(id, Prompt(0)),
                                    [&](absl::StatusOr<PrefillResult> r) {
                                      p.set_value(std::move(r));
                                    })
                    .ok());
    absl::StatusOr<PrefillResult> pre = p.get_future().get();
    ASSERT_TRUE(pre.ok()) << pre.status();
    absl::StatusOr<KvReservation> res =
        decode->ReserveForRemotePrefill(Request(id, Prompt(0), /*with_data=*/false), c.Callback());
    ASSERT_TRUE(res.ok()) << res.status();
    CopyPrefilledBlocks(*prefill->kv_cache(), *pre, *decode->kv_cache(), *res);
    ASSERT_TRUE(prefill->ReleasePrefilled(id).ok());
    done.emplace_back(id, *pre);
  }
  for (const auto& [id, pre] : done) {
    ASSERT_TRUE(decode->CompleteRemotePrefill(id, {pre.first_token, pre.first_logprob, {}}).ok());
  }
  ASSERT_TRUE(c.WaitFor(2, std::chrono::seconds(60)));
  auto results = c.results();
  int ended = 0;
  for (const std::string id : {"x", "y"}) {
    const auto& r = results[id];
    if (r.status.ok()) {
      EXPECT_EQ(r.tokens, Prompt(0).greedy) << id;
    } else {
      EXPECT_EQ(r.status.code(), absl::StatusCode::kResourceExhausted) << r.status;
      ++ended;
    }
  }
  EXPECT_EQ(ended, 1);
  ExpectNoBlocksHeld(*prefill);
  ExpectNoBlocksHeld(*decode);
}

}  // namespace
}  // namespace deepinfer::engine
