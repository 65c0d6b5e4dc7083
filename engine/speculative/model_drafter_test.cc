#include "engine/speculative/model_drafter.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace deepinfer::engine::speculative {
namespace {

constexpr char kLlama[] = "engine/testdata/models/llama";

Model* SharedModel() {
  static Model* model = [] {
    auto m = Model::Load(kLlama, ModelOptions{1});
    EXPECT_TRUE(m.ok()) << m.status();
    return m->release();
  }();
  return model;
}

std::unique_ptr<ModelDrafter> MakeWith(const ModelDrafterOptions& o) {
  auto d = ModelDrafter::Create(SharedModel(), SharedModel()->config().vocab_size, o);
  EXPECT_TRUE(d.ok()) << d.status();
  return d.ok() ? *std::move(d) : nullptr;
}

std::unique_ptr<ModelDrafter> Make(int num_blocks = 64, int block_size = 4) {
  ModelDrafterOptions o;
  o.num_blocks = num_blocks;
  o.block_size = block_size;
  return MakeWith(o);
}

// Greedy continuation the slow way: a fresh cache and a full forward pass per token (of the
// shared test model by default).
std::vector<int32_t> Reference(std::vector<int32_t> ctx, int k, Model* model = nullptr) {
  if (model == nullptr) model = SharedModel();
  const int block_size = 16;
  const int blocks = static_cast<int>((ctx.size() + k) / block_size + 1);
  auto cache = KvCache::Create(model->MakeKvCacheConfig(blocks, block_size));
  EXPECT_TRUE(cache.ok());
  std::vector<int32_t> table(blocks);
  for (int b = 0; b < blocks; ++b) table[b] = b;
  const int vocab = model->config().vocab_size;
  std::vector<int32_t> out;
  std::vector<float> logits;
  for (int i = 0; i < k; ++i) {
    SequenceInput in;
    in.tokens = ctx.data();
    in.num_tokens = static_cast<int64_t>(ctx.size());
    in.block_table = table.data();
    in.num_blocks = blocks;
    EXPECT_TRUE(model->Forward({in}, cache->get(), &logits).ok());
    int32_t best = 0;
    for (int v = 1; v < vocab; ++v) {
      if (logits[v] > logits[best]) best = v;
    }
    out.push_back(best);
    ctx.push_back(best);
  }
  return out;
}

std::vector<int32_t> Context(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> ctx(n);
  for (int32_t& t : ctx) t = static_cast<int32_t>(rng() % 700) + 3;
  return ctx;
}

std::vector<int32_t> Propose(ModelDrafter* d, int64_t seq, const std::vector<int32_t>& ctx, int k) {
  DraftProposal p;
  absl::Status s = d->Propose(seq, ctx, k, &p);
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_TRUE(p.probs.empty());  // greedy drafts are point masses
  EXPECT_EQ(p.confidence.size(), p.tokens.size());
  return p.tokens;
}

TEST(ModelDrafterTest, GreedyDraftsAreTheDraftModelsGreedyContinuation) {
  auto d = Make();
  const std::vector<int32_t> ctx = Context(11, 1);
  EXPECT_EQ(Propose(d.get(), 1, ctx, 5), Reference(ctx, 5));
  EXPECT_EQ(d->cached_length(1), 11 + 5 - 1);  // d_k is never fed
}

TEST(ModelDrafterTest, RejectedDraftsAreTruncatedToTheCommonPrefix) {
  auto d = Make();
  std::vector<int32_t> ctx = Context(9, 2);
  const std::vector<int32_t> first = Propose(d.get(), 7, ctx, 4);
  ASSERT_EQ(first.size(), 4u);
  // The target accepts d_1 and corrects d_2: only the correction is new to the drafter.
  ctx.push_back(first[0]);
  ctx.push_back((first[1] + 1) % 700 + 3);
  int64_t before = d->computed_tokens();
  EXPECT_EQ(Propose(d.get(), 7, ctx, 4), Reference(ctx, 4));
  EXPECT_EQ(d->computed_tokens() - before, 1 + 3);
  EXPECT_EQ(d->cached_length(7), static_cast<int64_t>(ctx.size()) + 3);

  // All drafts accepted plus a bonus token: d_k and the bonus are fed.
  const std::vector<int32_t> second = Reference(ctx, 4);
  ctx.insert(ctx.end(), second.begin(), second.end());
  ctx.push_back(5);
  before = d->computed_tokens();
  EXPECT_EQ(Propose(d.get(), 7, ctx, 3), Reference(ctx, 3));
  EXPECT_EQ(d->computed_tokens() - before, 2 + 2);

  // A context that diverges deep inside (a replaced sequence): keep the 4 shared tokens.
  std::vector<int32_t> other(ctx.begin(), ctx.begin() + 4);
  const std::vector<int32_t> tail = Context(6, 3);
  other.insert(other.end(), tail.begin(), tail.end());
  other[4] = ctx[4] == 100 ? 101 : 100;
  before = d->computed_tokens();
  EXPECT_EQ(Propose(d.get(), 7, other, 2), Reference(other, 2));
  EXPECT_EQ(d->computed_tokens() - before, 6 + 1);

  // The same context again: only its last token is fed again (its logits are needed).
  before = d->computed_tokens();
  EXPECT_EQ(Propose(d.get(), 7, other, 2), Reference(other, 2));
  EXPECT_EQ(d->computed_tokens() - before, 1 + 1);
}

// The demo draft model (a sliding window of 64 in every other layer) over contexts well past its
// window, as an adaptive engine drives it: draft lengths change from step to step (0: the cache
// only fed), each step accepts a prefix of the drafts and appends a correction. Every proposal is
// the greedy continuation computed from scratch.
TEST(ModelDrafterTest, ChangingLengthsPastTheWindowDraftWhatAFreshCacheWould) {
  auto loaded = Model::Load("models/demo-draft", ModelOptions{1});
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  Model* model = loaded->get();
  const int vocab = model->config().vocab_size;
  ModelDrafterOptions o;
  o.num_blocks = 128;
  o.block_size = 16;
  auto made = ModelDrafter::Create(model, vocab, o);
  ASSERT_TRUE(made.ok()) << made.status();
  ModelDrafter& d = **made;
  std::mt19937 rng(3);
  std::vector<int32_t> ctx(90);
  for (int32_t& t : ctx) t = static_cast<int32_t>(rng() % (vocab - 10)) + 5;
  const int lengths[] = {2, 4, 2, 4, 0, 4, 1, 4, 8, 2, 0, 0, 4, 2, 4, 2, 8, 1, 2, 4};
  for (int step = 0; step < 60; ++step) {
    const int k = lengths[step % 20];
    std::vector<DraftRequest> requests(1);
    requests[0].seq_id = 1;
    requests[0].context = ctx;
    requests[0].k = k;
    std::vector<int32_t> accepted;
    if (k == 0) {
      ASSERT_TRUE(d.Feed(requests).ok());
    } else {
      std::vector<DraftProposal> out;
      ASSERT_TRUE(d.ProposeBatch(requests, &out).ok());
      ASSERT_EQ(out[0].tokens, Reference(ctx, k, model)) << "step " << step << " k " << k;
      const int take = static_cast<int>(rng() % (k + 1));
      accepted.assign(out[0].tokens.begin(), out[0].tokens.begin() + take);
    }
    ctx.insert(ctx.end(), accepted.begin(), accepted.end());
    ctx.push_back(static_cast<int32_t>(rng() % (vocab - 10)) + 5);
  }
}

TEST(ModelDrafterTest, BatchEqualsOneAtATime) {
  auto batched = Make();
  auto single = Make();
  std::vector<std::vector<int32_t>> ctx = {Context(5, 4), Context(17, 5), Context(1, 6)};
  const int ks[] = {3, 1, 4};
  for (int turn = 0; turn < 2; ++turn) {
    std::vector<DraftRequest> requests(3);
    for (int i = 0; i < 3; ++i) {
      requests[i].seq_id = 10 + i;
      requests[i].context = ctx[i];
      requests[i].k = ks[i];
    }
    std::vector<DraftProposal> out;
    ASSERT_TRUE(batched->ProposeBatch(requests, &out).ok());
    ASSERT_EQ(out.size(), 3u);
    for (int i = 0; i < 3; ++i) {
      EXPECT_EQ(out[i].tokens, Propose(single.get(), 10 + i, ctx[i], ks[i])) << i;
      EXPECT_EQ(out[i].tokens, Reference(ctx[i], ks[i])) << i;
      // Next turn: accept the first draft and append a correction.
      ctx[i].push_back(out[i].tokens[0]);
      ctx[i].push_back(42);
    }
  }
}

TEST(ModelDrafterTest, KeepDraftingStopsEachRequestBeforeTheDeclinedToken) {
  auto d = Make();
  std::vector<std::vector<int32_t>> ctx = {Context(5, 4), Context(17, 5), Context(1, 6)};
  // Request 0 stops before token 2, request 1 before token 0 (no draft), request 2 never.
  const int stop_at[] = {2, 0, 99};
  std::vector<std::vector<std::pair<int, float>>> asked(3);
  std::vector<DraftRequest> requests(3);
  for (int i = 0; i < 3; ++i) {
    requests[i].seq_id = 20 + i;
    requests[i].context = ctx[i];
    requests[i].k = 4;
    requests[i].keep_drafting = [&asked, i, stop = stop_at[i]](int position, float confidence) {
      asked[i].push_back({position, confidence});
      return position < stop;
    };
  }
  std::vector<DraftProposal> out;
  ASSERT_TRUE(d->ProposeBatch(requests, &out).ok());
  ASSERT_EQ(out.size(), 3u);
  // The tokens kept are the greedy continuation's prefix; the declined token is not returned.
  EXPECT_EQ(out[0].tokens, Reference(ctx[0], 2));
  EXPECT_TRUE(out[1].tokens.empty());
  EXPECT_EQ(out[2].tokens, Reference(ctx[2], 4));
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(out[i].confidence.size(), out[i].tokens.size()) << i;
    // Asked once per position up to and including the declined one, with the confidence the
    // proposal reports for the kept ones.
    const size_t expected_asks = std::min<size_t>(stop_at[i] + 1, 4);
    ASSERT_EQ(asked[i].size(), expected_asks) << i;
    for (size_t j = 0; j < asked[i].size(); ++j) {
      EXPECT_EQ(asked[i][j].first, static_cast<int>(j));
      EXPECT_GT(asked[i][j].second, 0.0f);
      EXPECT_LE(asked[i][j].second, 1.0f);
      if (j < out[i].confidence.size()) {
        EXPECT_EQ(asked[i][j].second, out[i].confidence[j]);
      }
    }
  }
  // The next proposal continues from the cache as usual (a stopped draft left nothing stale).
  for (int i = 0; i < 3; ++i) {
    ctx[i].push_back(7);
    DraftProposal again;
    ASSERT_TRUE(d->Propose(20 + i, ctx[i], 3, &again).ok());
    EXPECT_EQ(again.tokens, Reference(ctx[i], 3)) << i;
  }
}

TEST(ModelDrafterTest, LongCatchUpsAreSpreadOverCalls) {
  ModelDrafterOptions o;
  o.num_blocks = 64;
  o.block_size = 4;
  o.max_catch_up = 4;
  auto made = ModelDrafter::Create(SharedModel(), SharedModel()->config().vocab_size, o);
  ASSERT_TRUE(made.ok()) << made.status();
  ModelDrafter& d = **made;
  const std::vector<int32_t> ctx = Context(10, 3);
  DraftProposal p;
  // 10 uncached tokens, at most 4 per call: 4, 8, then the last 2 and the draft.
  ASSERT_TRUE(d.Propose(1, ctx, 3, &p).ok());
  EXPECT_TRUE(p.tokens.empty());
  EXPECT_EQ(d.cached_length(1), 4);
  EXPECT_EQ(d.computed_tokens(), 4);
  ASSERT_TRUE(d.Propose(1, ctx, 3, &p).ok());
  EXPECT_TRUE(p.tokens.empty());
  EXPECT_EQ(d.cached_length(1), 8);
  ASSERT_TRUE(d.Propose(1, ctx, 3, &p).ok());
  EXPECT_EQ(p.tokens, Reference(ctx, 3));
  EXPECT_EQ(p.confidence.size(), 3u);
  // Steady state: a short extension is drafted at once.
  std::vector<int32_t> next = ctx;
  next.push_back(p.tokens[0]);
  next.push_back(9);
  ASSERT_TRUE(d.Propose(1, next, 2, &p).ok());
  EXPECT_EQ(p.tokens, Reference(next, 2));
}

// The drafts after a skip are the draft model's greedy continuation of what its cache then
// holds: the old context followed directly by the last `catch_up_window` tokens.
std::vector<int32_t> Spliced(const std::vector<int32_t>& head, const std::vector<int32_t>& ctx,
                             size_t from, size_t to) {
  std::vector<int32_t> out = head;
  out.insert(out.end(), ctx.begin() + from, ctx.begin() + to);
  return out;
}

// 64 blocks of 4 tokens and a catch-up window of `window` tokens.
ModelDrafterOptions WindowOptions(int window) {
  ModelDrafterOptions o;
  o.num_blocks = 64;
  o.block_size = 4;
  o.catch_up_window = window;
  return o;
}

// catch_up_window_min_sequences: while fewer sequences decode (set_decoding), a lagging sequence
// is fed whole; from that many on, it skips to the window.
TEST(ModelDrafterTest, CatchUpWindowAppliesFromItsSequenceCount) {
  ModelDrafterOptions o = WindowOptions(4);
  o.catch_up_window_min_sequences = 2;
  const std::unique_ptr<ModelDrafter> made = MakeWith(o);
  ASSERT_NE(made, nullptr);
  ModelDrafter& d = *made;
  d.set_decoding(1);
  std::vector<int32_t> ctx = Context(3, 21);
  DraftProposal p;
  ASSERT_TRUE(d.Propose(1, ctx, 3, &p).ok());
  EXPECT_EQ(d.computed_tokens(), 3 + 2);
  // One sequence decoding: 10 more tokens are all fed (the cache holds the prompt and d_1, d_2,
  // which Lag counts as covered).
  const std::vector<int32_t> more = Context(10, 22);
  ctx.insert(ctx.end(), more.begin(), more.end());
  EXPECT_EQ(d.Lag(1, static_cast<int64_t>(ctx.size())), 13 - 5);
  ASSERT_TRUE(d.Propose(1, ctx, 3, &p).ok());
  EXPECT_EQ(p.tokens, Reference(ctx, 3));
  EXPECT_EQ(d.skipped_tokens(), 0);
  EXPECT_EQ(d.computed_tokens(), 5 + 10 + 2);
  // Two decoding: the next 10 skip to the last 4.
  d.set_decoding(2);
  const std::vector<int32_t> head = ctx;
  const std::vector<int32_t> later = Context(10, 23);
  ctx.insert(ctx.end(), later.begin(), later.end());
  EXPECT_EQ(d.Lag(1, static_cast<int64_t>(ctx.size())), 4);
  ASSERT_TRUE(d.Propose(1, ctx, 3, &p).ok());
  EXPECT_EQ(p.tokens, Reference(Spliced(head, ctx, ctx.size() - 4, ctx.size()), 3));
  EXPECT_EQ(d.skipped_tokens(), 10 - 4);
  EXPECT_EQ(d.computed_tokens(), 17 + 4 + 2);
  // The option's range.
  o.catch_up_window_min_sequences = 0;
  auto bad = ModelDrafter::Create(SharedModel(), SharedModel()->config().vocab_size, o);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("catch_up_window_min_sequences"), std::string::npos);
}

TEST(ModelDrafterTest, CatchUpWindowSkipsToTheRecentText) {
  const std::unique_ptr<ModelDrafter> made = MakeWith(WindowOptions(4));
  ASSERT_NE(made, nullptr);
  ModelDrafter& d = *made;
  // A short prompt is fed whole.
  const std::vector<int32_t> prompt = Context(3, 11);
  DraftProposal p;
  ASSERT_TRUE(d.Propose(1, prompt, 3, &p).ok());
  EXPECT_EQ(p.tokens, Reference(prompt, 3));
  EXPECT_EQ(d.skipped_tokens(), 0);
  EXPECT_EQ(d.computed_tokens(), 3 + 2);
  // 10 tokens later (no drafts meanwhile): the prompt's KV stays and only the last 4 are fed.
  std::vector<int32_t> ctx = prompt;
  const std::vector<int32_t> more = Context(10, 12);
  ctx.insert(ctx.end(), more.begin(), more.end());
  EXPECT_EQ(d.Lag(1, static_cast<int64_t>(ctx.size())), 4);  // at most the window
  ASSERT_TRUE(d.Propose(1, ctx, 3, &p).ok());
  std::vector<int32_t> seen = Spliced(prompt, ctx, ctx.size() - 4, ctx.size());
  EXPECT_EQ(p.tokens, Reference(seen, 3));
  EXPECT_EQ(d.skipped_tokens(), 13 - 4 - 3);
  EXPECT_EQ(d.computed_tokens(), 5 + 4 + 2);
  // Steady drafting goes on past the gap: the first draft accepted and a correction; only the
  // correction is fed (the accepted draft's KV is cached), at the slots after the window.
  ctx.push_back(p.tokens[0]);
  const int32_t correction = (p.tokens[1] + 1) % SharedModel()->config().vocab_size;
  ctx.push_back(correction);
  // Lag counts cached drafts as covered (a rejected one shows only when a call matches the
  // context), as the cache holds d_1 and d_2 here.
  EXPECT_EQ(d.Lag(1, static_cast<int64_t>(ctx.size())), 0);
  ASSERT_TRUE(d.Propose(1, ctx, 2, &p).ok());
  seen.push_back(ctx[ctx.size() - 2]);
  seen.push_back(correction);
  EXPECT_EQ(p.tokens, Reference(seen, 2));
  EXPECT_EQ(d.computed_tokens(), 11 + 1 + 1);
  // Released, the entry keeps its gap: a new sequence whose context continues this one adopts it
  // through the gap and feeds only what is new.
  d.Release(1);
  ASSERT_GT(d.reusable_blocks(), 0);
  std::vector<int32_t> next = ctx;
  next.push_back(5);
  ASSERT_TRUE(d.Propose(2, next, 2, &p).ok());
  // Whole blocks of the released cache (8 of its 10 slots: the prompt, the window and the
  // accepted draft) are adopted; the correction and the new token are fed.
  std::vector<int32_t> adopted(seen.begin(), seen.begin() + 8);
  adopted.push_back(correction);
  adopted.push_back(5);
  EXPECT_EQ(p.tokens, Reference(adopted, 2));
  EXPECT_EQ(d.reused_tokens(), 8);
  EXPECT_EQ(d.computed_tokens(), 13 + 2 + 1);
  // A second long stretch drops everything after the first gap and skips again: the prompt and
  // the latest 4 tokens.
  std::vector<int32_t> later = next;
  const std::vector<int32_t> tail = Context(9, 13);
  later.insert(later.end(), tail.begin(), tail.end());
  const int64_t skipped = d.skipped_tokens();
  ASSERT_TRUE(d.Propose(2, later, 3, &p).ok());
  EXPECT_EQ(p.tokens, Reference(Spliced(prompt, later, later.size() - 4, later.size()), 3));
  // The cache covered `next` (the draft after it was rejected): the rest but 4 is skipped.
  EXPECT_EQ(d.skipped_tokens(), skipped + static_cast<int64_t>(later.size() - 4 - next.size()));
  // A context that disagrees before the gap drops the gap: its new text is fed (the last 4).
  std::vector<int32_t> other = later;
  other[1] = (other[1] + 1) % SharedModel()->config().vocab_size;
  ASSERT_TRUE(d.Propose(2, other, 2, &p).ok());
  EXPECT_EQ(p.tokens, Reference(Spliced({other[0]}, other, other.size() - 4, other.size()), 2));
}

TEST(ModelDrafterTest, FeedKeepsTheCacheOneTokenBehindWithoutDrafting) {
  ModelDrafterOptions o;
  o.num_blocks = 64;
  o.block_size = 4;
  o.max_catch_up = 6;
  auto made = ModelDrafter::Create(SharedModel(), SharedModel()->config().vocab_size, o);
  ASSERT_TRUE(made.ok()) << made.status();
  ModelDrafter& d = **made;
  std::vector<int32_t> ctx = Context(10, 4);
  const std::vector<int32_t> other = Context(3, 5);
  std::vector<DraftRequest> requests(3);
  requests[0].seq_id = 1;
  requests[0].context = ctx;
  requests[1].seq_id = 2;
  requests[1].context = other;
  requests[2].seq_id = 3;  // one token: nothing to feed (the proposal feeds it for its logits)
  const std::vector<int32_t> single = {42};
  requests[2].context = single;
  // At most 6 per call: 6 of seq 1's 9 feedable tokens and both of seq 2's.
  ASSERT_TRUE(d.Feed(requests).ok());
  EXPECT_EQ(d.cached_length(1), 6);
  EXPECT_EQ(d.cached_length(2), 2);
  EXPECT_EQ(d.cached_length(3), 0);
  EXPECT_EQ(d.computed_tokens(), 6 + 2);
  ASSERT_TRUE(d.Feed(requests).ok());
  EXPECT_EQ(d.cached_length(1), 9);  // all but the last token
  EXPECT_EQ(d.computed_tokens(), 6 + 2 + 3);
  ASSERT_TRUE(d.Feed(requests).ok());  // up to date: no forward pass
  EXPECT_EQ(d.computed_tokens(), 6 + 2 + 3);
  // The proposal after feeding feeds only the last token, and drafts what it would have.
  DraftProposal p;
  ASSERT_TRUE(d.Propose(1, ctx, 3, &p).ok());
  EXPECT_EQ(p.tokens, Reference(ctx, 3));
  EXPECT_EQ(d.computed_tokens(), 6 + 2 + 3 + 1 + 2);
  // After rejected drafts, feeding drops them and feeds the accepted continuation.
  ctx.push_back(p.tokens[0]);
  ctx.push_back((p.tokens[1] + 1) % 700 + 3);
  ctx.push_back(17);
  requests.resize(1);
  requests[0].context = ctx;
  const int64_t before = d.computed_tokens();
  ASSERT_TRUE(d.Feed(requests).ok());
  EXPECT_EQ(d.computed_tokens() - before, 1);  // the correction: d_1 was cached, 17 is last
  EXPECT_EQ(d.cached_length(1), static_cast<int64_t>(ctx.size()) - 1);
  ASSERT_TRUE(d.Propose(1, ctx, 2, &p).ok());
  EXPECT_EQ(p.tokens, Reference(ctx, 2));
  // Bad requests are refused by name; the others are still fed.
  std::vector<int32_t> bad = {5, -1, 6};
  std::vector<int32_t> fresh = Context(5, 6);
  std::vector<DraftRequest> mixed(2);
  mixed[0].seq_id = 9;
  mixed[0].context = bad;
  mixed[1].seq_id = 10;
  mixed[1].context = fresh;
  const absl::Status s = d.Feed(mixed);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("context[1]"), std::string::npos) << s;
  EXPECT_EQ(d.cached_length(10), 4);
}

TEST(ModelDrafterTest, SampledDraftsCarryTheirDistribution) {
  auto d = Make();
  std::vector<DraftRequest> requests(1);
  const std::vector<int32_t> ctx = Context(6, 7);
  requests[0].seq_id = 1;
  requests[0].context = ctx;
  requests[0].k = 3;
  requests[0].temperature = 0.8f;
  std::vector<DraftProposal> out;
  ASSERT_TRUE(d->ProposeBatch(requests, &out).ok());
  const DraftProposal& p = out[0];
  const int vocab = SharedModel()->config().vocab_size;
  ASSERT_EQ(p.tokens.size(), 3u);
  ASSERT_EQ(p.probs.size(), 3u * vocab);
  ASSERT_EQ(p.confidence.size(), 3u);
  for (int j = 0; j < 3; ++j) {
    double sum = 0.0;
    float max_p = 0.0f;
    for (int v = 0; v < vocab; ++v) {
      sum += p.probs[j * vocab + v];
      max_p = std::max(max_p, p.probs[j * vocab + v]);
    }
    EXPECT_NEAR(sum, 1.0, 1e-4);
    EXPECT_GT(p.probs[j * vocab + p.tokens[j]], 0.0f);
    EXPECT_NEAR(p.confidence[j], max_p, 1e-5);
  }
}

TEST(ModelDrafterTest, EvictsLeastRecentlyUsedAndNeverLeaks) {
  // 8 blocks of 4 slots; a 10-token context with k = 4 needs 13 slots = 4 blocks.
  auto d = Make(/*num_blocks=*/8, /*block_size=*/4);
  const auto a = Context(10, 8), b = Context(10, 9), c = Context(10, 10);
  Propose(d.get(), 1, a, 4);
  Propose(d.get(), 2, b, 4);
  EXPECT_EQ(d->free_blocks(), 0);
  Propose(d.get(), 2, b, 4);  // b is now the most recently used
  EXPECT_EQ(Propose(d.get(), 3, c, 4), Reference(c, 4));
  EXPECT_EQ(d->evictions(), 1);
  EXPECT_EQ(d->cached_length(1), 0);
  EXPECT_EQ(d->cached_length(2), 13);
  // The evicted sequence is recomputed on its next proposal.
  EXPECT_EQ(Propose(d.get(), 1, a, 4), Reference(a, 4));
  // A proposal that can never fit gets no draft, and nothing breaks.
  EXPECT_TRUE(Propose(d.get(), 4, Context(40, 11), 4).empty());
  // Aborts at any point give every block back (free, or held by a retired entry that any
  // proposal may drop).
  for (int64_t s = 1; s <= 4; ++s) d->Release(s);
  d->Release(99);
  EXPECT_EQ(d->free_blocks() + d->reusable_blocks(), d->num_blocks());
  EXPECT_EQ(d->num_sequences(), 0);
  const int64_t before = d->evictions();
  EXPECT_EQ(Propose(d.get(), 5, Context(25, 12), 4), Reference(Context(25, 12), 4));
  EXPECT_EQ(d->evictions(), before);  // retired entries made room, nothing live was evicted
}

// A finished sequence's KV stays as a retired entry; a new sequence whose context extends it
// (the next turn of a conversation) adopts it and feeds only the new tokens. Less than a block in
// common adopts nothing; an entry is adopted once; retired entries are dropped before any live
// sequence is evicted.
TEST(ModelDrafterTest, NewSequencesReuseARetiredPrefix) {
  auto d = Make(/*num_blocks=*/16, /*block_size=*/4);
  std::vector<int32_t> turn1 = Context(14, 20);
  Propose(d.get(), 1, turn1, 3);  // caches 14 + 2 tokens
  d->Release(1);                  // keeps 16 tokens = 4 whole blocks
  EXPECT_EQ(d->num_sequences(), 0);
  EXPECT_EQ(d->reusable_blocks(), 4);
  // Turn 2: turn 1's context, an answer and a new message.
  std::vector<int32_t> turn2 = turn1;
  for (int32_t t : Context(7, 21)) turn2.push_back(t);
  int64_t before = d->computed_tokens();
  EXPECT_EQ(Propose(d.get(), 2, turn2, 3), Reference(turn2, 3));
  // The 14 shared tokens are reused (the cached drafts past them differ from the answer).
  EXPECT_EQ(d->reused_tokens(), 14);
  EXPECT_EQ(d->computed_tokens() - before, 7 + 2);
  EXPECT_EQ(d->reusable_blocks(), 0);

  // Another sequence with the same first 3 tokens (less than a block): computed from scratch.
  d->Release(2);
  std::vector<int32_t> other = Context(9, 22);
  std::copy(turn1.begin(), turn1.begin() + 3, other.begin());
  before = d->computed_tokens();
  EXPECT_EQ(Propose(d.get(), 3, other, 2), Reference(other, 2));
  EXPECT_EQ(d->computed_tokens() - before, 9 + 1);
  EXPECT_EQ(d->reused_tokens(), 14);
  // The retired entry is still there for the conversation's next turn.
  std::vector<int32_t> turn3 = turn2;
  turn3.push_back(11);
  before = d->computed_tokens();
  EXPECT_EQ(Propose(d.get(), 4, turn3, 2), Reference(turn3, 2));
  // Turn 2 cached 21 + 2 tokens; its entry keeps the 20 of whole blocks.
  EXPECT_EQ(d->reused_tokens(), 14 + 20);
  EXPECT_EQ(d->computed_tokens() - before, 2 + 1);
  // Same for the same context twice: only one sequence gets the entry.
  d->Release(4);
  Propose(d.get(), 5, turn3, 2);
  before = d->computed_tokens();
  Propose(d.get(), 6, turn3, 2);
  EXPECT_EQ(d->computed_tokens() - before, static_cast<int64_t>(turn3.size()) + 1);
  // Nothing leaks.
  for (int64_t s = 1; s <= 6; ++s) d->Release(s);
  EXPECT_EQ(d->free_blocks() + d->reusable_blocks(), d->num_blocks());
  EXPECT_EQ(d->evictions(), 0);
}

TEST(ModelDrafterTest, RejectsBadArguments) {
  auto d = Make();
  DraftProposal p;
  EXPECT_EQ(d->Propose(1, Context(3, 1), -1, &p).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(d->Propose(1, std::vector<int32_t>{1, 900}, 2, &p).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(p.tokens.empty());
  EXPECT_TRUE(d->Propose(1, Context(3, 1), 0, &p).ok());
  EXPECT_TRUE(p.tokens.empty());
  EXPECT_TRUE(d->Propose(1, {}, 3, &p).ok());
  EXPECT_TRUE(p.tokens.empty());
  EXPECT_EQ(d->free_blocks(), d->num_blocks());
}

TEST(ModelDrafterTest, RefusesAnotherVocabulary) {
  auto bad = ModelDrafter::Create(SharedModel(), 1000, {});
  ASSERT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("speculative.draft_model"), std::string::npos);

  // A checkpoint directory whose config has another vocabulary is refused before its weights.
  const std::filesystem::path dir =
      std::filesystem::path(std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp") /
      "draft_vocab";
  std::filesystem::create_directories(dir);
  nlohmann::json config;
  std::ifstream(std::string(kLlama) + "/config.json") >> config;
  config["vocab_size"] = 1024;
  std::ofstream(dir / "config.json") << config.dump();
  auto loaded = ModelDrafter::Load(dir.string(), 768, {});
  ASSERT_EQ(loaded.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(loaded.status().message().find("speculative.draft_model: vocab_size 1024"),
            std::string::npos)
      << loaded.status();

  auto missing = ModelDrafter::Load("/nonexistent/draft", 768, {});
  ASSERT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(missing.status().message().rfind("speculative.draft_model: ", 0), 0u);

  auto good = ModelDrafter::Load(kLlama, 768, {}, ModelOptions{1});
  EXPECT_TRUE(good.ok()) << good.status();
}

// The round-cost profile: one row per batch size, positive and non-decreasing in it; only on an
// empty cache (it writes scratch KV).
TEST(ModelDrafterTest, ProfilesOneDraftRoundPerBatchSize) {
  auto d = Make(/*num_blocks=*/8, /*block_size=*/4);  // fewer blocks than 16 x 9: shared
  auto table = d->ProfileRoundCost({1, 4, 16});
  ASSERT_TRUE(table.ok()) << table.status();
  for (int n = 1; n < 16; ++n) {
    EXPECT_GT(table->StepSeconds(n, n), 0.0);
    EXPECT_LE(table->StepSeconds(n, n), table->StepSeconds(n + 1, n + 1)) << n;
  }
  EXPECT_EQ(d->ProfileRoundCost({1, 2}, /*runs=*/4).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(d->ProfileRoundCost({0}).status().code(), absl::StatusCode::kInvalidArgument);
  // Drafts after profiling are those of a fresh drafter.
  const std::vector<int32_t> ctx = {5, 9, 2, 7, 7, 1};
  DraftProposal p;
  ASSERT_TRUE(d->Propose(1, ctx, 3, &p).ok());
  EXPECT_EQ(p.tokens, Reference(ctx, 3));
  EXPECT_EQ(d->ProfileRoundCost({1}).status().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace deepinfer::engine::speculative
