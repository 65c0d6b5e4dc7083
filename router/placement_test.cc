#include "router/placement.h"

#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "spdlog/sinks/ostream_sink.h"
#include "spdlog/spdlog.h"

namespace deepinfer::router {
namespace {

using internal::v1::WORKER_ROLE_DECODE;
using internal::v1::WORKER_ROLE_ENCODER;
using internal::v1::WORKER_ROLE_PREFILL;
using internal::v1::WORKER_ROLE_UNSPECIFIED;

CandidateWorker Prefill(std::string id, int64_t queue_depth, int64_t queued_tokens,
                        int64_t cached_blocks) {
  CandidateWorker w;
  w.worker_id = std::move(id);
  w.role = WORKER_ROLE_PREFILL;
  w.queue_depth = queue_depth;
  w.queued_input_tokens = queued_tokens;
  w.cached_prefix_blocks = cached_blocks;
  return w;
}

CandidateWorker Decode(std::string id, bool can_prefill, int64_t running, int64_t free_blocks,
                       int64_t total_blocks, int64_t cached_blocks, int64_t queued_tokens = 0) {
  CandidateWorker w;
  w.worker_id = std::move(id);
  w.role = WORKER_ROLE_DECODE;
  w.can_prefill = can_prefill;
  w.running_sequences = running;
  w.free_kv_blocks = free_blocks;
  w.total_kv_blocks = total_blocks;
  w.cached_prefix_blocks = cached_blocks;
  w.queued_input_tokens = queued_tokens;
  return w;
}

// 320-token prompt in 16-token blocks (20 blocks), 21 blocks to reserve on the decode side.
PlacementRequest Request() {
  PlacementRequest r;
  r.request_id = "r1";
  r.prompt_tokens = 320;
  r.block_size = 16;
  r.blocks_needed = 21;
  return r;
}

PlacementOptions Weights(int64_t threshold) {
  PlacementOptions o;
  o.w_uncached_tokens = 1.0;
  o.w_queued_tokens = 0.5;
  o.w_kv_used = 1000.0;
  o.w_running_sequences = 10.0;
  o.local_prefill_threshold_tokens = threshold;
  o.rng_seed = 7;
  return o;
}

TEST(UncachedPromptTokensTest, CountsWholeCachedBlocksAndKeepsTheLastToken) {
  EXPECT_EQ(UncachedPromptTokens(100, 0, 16), 100);
  EXPECT_EQ(UncachedPromptTokens(100, 3, 16), 52);
  EXPECT_EQ(UncachedPromptTokens(100, 10, 16), 4);  // only 6 full blocks exist
  EXPECT_EQ(UncachedPromptTokens(96, 6, 16), 16);   // fully cached: the last block recomputes
  EXPECT_EQ(UncachedPromptTokens(97, 6, 16), 1);
  EXPECT_EQ(UncachedPromptTokens(1, 5, 16), 1);
}

struct Row {
  std::string name;
  std::string policy;
  PlacementOptions options;
  std::vector<CandidateWorker> candidates;
  std::string decode;
  std::string prefill;  // empty: local
  PlacementOutcome outcome;
  int64_t uncached;
  // worker_id -> expected cost (decode workers: decode + prefill part).
  std::map<std::string, double> costs;
  std::map<std::string, bool> eligible;
};

// Hand-computed costs (Weights(): w_uncached 1, w_queued 0.5, w_kv_used 1000, w_running 10):
//   p1: 320 uncached + 0.5 * 100 queued = 370
//   p2: 320 - 15 * 16 = 80 uncached + 0.5 * 400 = 280          (best prefill)
//   d1: 1000 * (1000 - 500 + 21) / 1000 + 10 * 4 = 561, + route 280 = 841
//   d2 (free 600, running 0, 20 queued tokens):
//       decode 1000 * (1000 - 600 + 21) / 1000 = 421
//       18 cached blocks -> 32 uncached; local prefill 32 + 0.5 * 20 = 42
std::vector<Row> Rows() {
  const auto p1 = Prefill("p1", 1, 100, 0);
  const auto p2 = Prefill("p2", 3, 400, 15);
  const auto d1 = Decode("d1", false, 4, 500, 1000, 0);
  std::vector<Row> rows;
  rows.push_back({"remote_to_cached_prefill_worker",
                  "cache_aware",
                  Weights(64),
                  {p1, p2, d1, Decode("d2", false, 0, 600, 1000, 18, 20)},
                  "d2",
                  "p2",
                  PlacementOutcome::kRemotePrefill,
                  80,
                  {{"p1", 370}, {"p2", 280}, {"d1", 841}, {"d2", 421 + 280}},
                  {{"d1", true}, {"d2", true}}});
  rows.push_back({"local_prefill_below_threshold",
                  "cache_aware",
                  Weights(64),
                  {p1, p2, d1, Decode("d2", true, 0, 600, 1000, 18, 20)},
                  "d2",
                  "",
                  PlacementOutcome::kLocalPrefillBelowThreshold,
                  32,
                  {{"p1", 370}, {"p2", 280}, {"d1", 841}, {"d2", 421 + 42}},
                  {{"d1", true}, {"d2", true}}});
  // 16 cached blocks -> 64 uncached: not below a threshold of 64.
  rows.push_back({"threshold_is_strict",
                  "cache_aware",
                  Weights(64),
                  {p1, p2, d1, Decode("d2", true, 0, 600, 1000, 16, 20)},
                  "d2",
                  "p2",
                  PlacementOutcome::kRemotePrefill,
                  80,
                  {{"p1", 370}, {"p2", 280}, {"d1", 841}, {"d2", 421 + 280}},
                  {}});
  rows.push_back({"threshold_zero_disables_local_prefill",
                  "cache_aware",
                  Weights(0),
                  {p1, p2, d1, Decode("d2", true, 0, 600, 1000, 18, 20)},
                  "d2",
                  "p2",
                  PlacementOutcome::kRemotePrefill,
                  80,
                  {{"d2", 421 + 280}},
                  {}});
  // A decode worker that holds the prefix wins over a less loaded one that does not:
  // d3: 1000 * (1000 - 900 + 21) / 1000 = 121, + route 280 = 401 < d2 local: 421 + 42 = 463.
  rows.push_back(
      {"emptier_decode_worker_beats_local_prefix",
       "cache_aware",
       Weights(64),
       {p1, p2, Decode("d3", false, 0, 900, 1000, 0), Decode("d2", true, 0, 600, 1000, 18, 20)},
       "d3",
       "p2",
       PlacementOutcome::kRemotePrefill,
       80,
       {{"d3", 401}, {"d2", 463}},
       {}});
  // No prefill worker: d1 cannot prefill, so only d2 is eligible, prefilling all 320 tokens.
  rows.push_back({"no_prefill_worker_prefills_locally_above_threshold",
                  "cache_aware",
                  Weights(64),
                  {d1, Decode("d2", true, 0, 600, 1000, 0, 20)},
                  "d2",
                  "",
                  PlacementOutcome::kLocalPrefillNoPrefillWorker,
                  320,
                  {{"d2", 421 + 320 + 10}},
                  {{"d1", false}, {"d2", true}}});
  rows.push_back({"too_few_free_blocks_is_ineligible",
                  "cache_aware",
                  Weights(64),
                  {p1, p2, d1, Decode("d2", true, 0, 20, 1000, 18, 20)},
                  "d1",
                  "p2",
                  PlacementOutcome::kRemotePrefill,
                  80,
                  {{"d1", 841}},
                  {{"d1", true}, {"d2", false}}});
  // Least loaded: prefill by queued tokens (p1 100 < p2 400), decode by running sequences
  // (d2 0 < d1 4); the cache is ignored, so the whole 320-token prompt counts as uncached.
  rows.push_back({"least_loaded_ignores_cache",
                  "least_loaded",
                  Weights(64),
                  {p1, p2, d1, Decode("d2", true, 0, 600, 1000, 18, 20)},
                  "d2",
                  "p1",
                  PlacementOutcome::kRemotePrefill,
                  320,
                  {{"p1", 100}, {"p2", 400}, {"d1", 4}, {"d2", 0}},
                  {}});
  rows.push_back({"least_loaded_local_below_threshold",
                  "least_loaded",
                  Weights(512),
                  {p1, p2, d1, Decode("d2", true, 0, 600, 1000, 0, 20)},
                  "d2",
                  "",
                  PlacementOutcome::kLocalPrefillBelowThreshold,
                  320,
                  {{"d2", 0}},
                  {}});
  return rows;
}

TEST(PlacementTest, HandComputedDecisions) {
  for (const Row& row : Rows()) {
    SCOPED_TRACE(row.name);
    auto policy = CreatePlacementPolicy(row.policy, row.options);
    ASSERT_TRUE(policy.ok()) << policy.status();
    absl::StatusOr<PlacementDecision> d = (*policy)->Decide(Request(), row.candidates);
    ASSERT_TRUE(d.ok()) << d.status();
    EXPECT_EQ(d->decode_worker, row.decode);
    EXPECT_EQ(d->prefill_worker, row.prefill);
    EXPECT_EQ(d->outcome, row.outcome) << PlacementOutcomeName(d->outcome);
    EXPECT_EQ(d->uncached_tokens, row.uncached);
    EXPECT_FALSE(d->tie_broken);
    EXPECT_FALSE(d->reason.empty());
    ASSERT_EQ(d->costs.size(), row.candidates.size());
    for (size_t i = 0; i < row.candidates.size(); ++i) {
      const CandidateCost& c = d->costs[i];
      EXPECT_EQ(c.worker_id, row.candidates[i].worker_id);
      EXPECT_EQ(c.role, row.candidates[i].role);
      if (auto it = row.costs.find(c.worker_id); it != row.costs.end()) {
        EXPECT_NEAR(c.cost, it->second, 1e-9) << c.worker_id;
      }
      if (auto it = row.eligible.find(c.worker_id); it != row.eligible.end()) {
        EXPECT_EQ(c.eligible, it->second) << c.worker_id;
      }
    }
  }
}

TEST(PlacementTest, ReportsTheDecodeAndPrefillParts) {
  auto policy = CacheAwarePolicy::Create(Weights(64));
  ASSERT_TRUE(policy.ok());
  std::vector<CandidateWorker> c = {Prefill("p2", 3, 400, 15),
                                    Decode("d2", true, 0, 600, 1000, 18, 20)};
  auto d = (*policy)->Decide(Request(), c);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_NEAR(d->costs[1].decode_cost, 421, 1e-9);
  EXPECT_NEAR(d->costs[1].prefill_cost, 42, 1e-9);
  EXPECT_TRUE(d->costs[1].local_prefill);
  EXPECT_EQ(d->costs[1].uncached_tokens, 32);
  EXPECT_EQ(d->costs[0].uncached_tokens, 80);
  EXPECT_TRUE(absl::StrContains(d->reason, "32 uncached tokens < threshold 64")) << d->reason;
}

TEST(PlacementTest, EncodersAreIgnored) {
  auto policy = CacheAwarePolicy::Create(Weights(64));
  ASSERT_TRUE(policy.ok());
  CandidateWorker encoder;
  encoder.worker_id = "e1";
  encoder.role = WORKER_ROLE_ENCODER;
  std::vector<CandidateWorker> c = {encoder, Prefill("p1", 0, 0, 0),
                                    Decode("d1", false, 0, 100, 100, 0)};
  auto d = (*policy)->Decide(Request(), c);
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_EQ(d->costs.size(), 2u);
  EXPECT_EQ(d->costs[0].worker_id, "p1");
  EXPECT_EQ(d->costs[1].worker_id, "d1");
}

TEST(PlacementTest, Errors) {
  auto policy = CacheAwarePolicy::Create(Weights(64));
  ASSERT_TRUE(policy.ok());
  struct Case {
    std::string name;
    std::vector<CandidateWorker> candidates;
    absl::StatusCode code;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"no_decode_worker",
       {Prefill("p1", 0, 0, 0)},
       absl::StatusCode::kUnavailable,
       "no decode worker among 1 candidates"},
      {"no_room",
       {Prefill("p1", 0, 0, 0), Decode("d1", true, 0, 20, 100, 0),
        Decode("d2", false, 0, 5, 100, 0)},
       absl::StatusCode::kResourceExhausted,
       "no decode worker has 21 free KV blocks (most free: 20 on \"d1\")"},
      {"no_prefill_route",
       {Decode("d1", false, 0, 100, 100, 0), Decode("d2", true, 0, 5, 100, 0)},
       absl::StatusCode::kUnavailable,
       "no prefill worker"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    auto d = (*policy)->Decide(Request(), c.candidates);
    ASSERT_FALSE(d.ok());
    EXPECT_EQ(d.status().code(), c.code);
    EXPECT_TRUE(absl::StrContains(d.status().message(), c.message)) << d.status();
  }
  const PlacementCounters counters = (*policy)->counters();
  EXPECT_EQ(counters.no_decode_worker, 1);
  EXPECT_EQ(counters.no_kv_room, 1);
  EXPECT_EQ(counters.no_prefill_route, 1);
  EXPECT_EQ(counters.remote_prefill, 0);
}

TEST(PlacementTest, InvalidInputsNameTheField) {
  auto policy = CacheAwarePolicy::Create(Weights(64));
  ASSERT_TRUE(policy.ok());
  const std::vector<CandidateWorker> ok = {Prefill("p1", 0, 0, 0),
                                           Decode("d1", false, 0, 100, 100, 0)};
  struct Case {
    PlacementRequest request;
    std::vector<CandidateWorker> candidates;
    std::string message;
  };
  std::vector<Case> cases;
  {
    PlacementRequest r = Request();
    r.prompt_tokens = 0;
    cases.push_back({r, ok, "request.prompt_tokens: expected >= 1; got 0"});
    r = Request();
    r.block_size = 0;
    cases.push_back({r, ok, "request.block_size: expected >= 1; got 0"});
    r = Request();
    r.blocks_needed = -1;
    cases.push_back({r, ok, "request.blocks_needed: expected >= 0; got -1"});
  }
  {
    auto c = ok;
    c[1].worker_id = "p1";
    cases.push_back({Request(), c,
                     "candidates[1].worker_id: expected unique; got \"p1\" again (also "
                     "candidates[0])"});
    c = ok;
    c[0].worker_id.clear();
    cases.push_back({Request(), c, "candidates[0].worker_id: expected non-empty"});
    c = ok;
    c[1].role = WORKER_ROLE_UNSPECIFIED;
    cases.push_back({Request(), c, "candidates[1].role: expected PREFILL, DECODE or ENCODER"});
    c = ok;
    c[0].queued_input_tokens = -5;
    cases.push_back({Request(), c, "candidates[0].queued_input_tokens: expected >= 0; got -5"});
    c = ok;
    c[1].free_kv_blocks = 101;
    cases.push_back(
        {Request(), c, "candidates[1].free_kv_blocks: expected <= total_kv_blocks (100); got 101"});
  }
  for (const Case& c : cases) {
    SCOPED_TRACE(c.message);
    auto d = (*policy)->Decide(c.request, c.candidates);
    ASSERT_FALSE(d.ok());
    EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StrContains(d.status().message(), c.message)) << d.status();
  }
  EXPECT_EQ((*policy)->counters().invalid_request, static_cast<int64_t>(cases.size()));
}

// Three identical decode workers and two identical prefill workers: every decision is a tie.
std::vector<CandidateWorker> AllTied() {
  return {Prefill("p1", 2, 100, 0), Prefill("p2", 2, 100, 0), Decode("d1", false, 3, 50, 100, 0),
          Decode("d2", false, 3, 50, 100, 0), Decode("d3", false, 3, 50, 100, 0)};
}

TEST(PlacementTest, TiesAreSpreadAndReproducibleFromTheSeed) {
  for (const char* name : {"cache_aware", "least_loaded"}) {
    SCOPED_TRACE(name);
    auto a = CreatePlacementPolicy(name, Weights(0));
    auto b = CreatePlacementPolicy(name, Weights(0));
    PlacementOptions other_seed = Weights(0);
    other_seed.rng_seed = 8;
    auto c = CreatePlacementPolicy(name, other_seed);
    ASSERT_TRUE(a.ok() && b.ok() && c.ok());
    std::map<std::string, int> decode_count, prefill_count;
    std::string seq_a, seq_b, seq_c;
    const int kDecisions = 300;
    for (int i = 0; i < kDecisions; ++i) {
      auto da = (*a)->Decide(Request(), AllTied());
      auto db = (*b)->Decide(Request(), AllTied());
      auto dc = (*c)->Decide(Request(), AllTied());
      ASSERT_TRUE(da.ok() && db.ok() && dc.ok());
      EXPECT_TRUE(da->tie_broken);
      EXPECT_TRUE(absl::StrContains(da->reason, "power-of-two among 3 tied")) << da->reason;
      ++decode_count[da->decode_worker];
      ++prefill_count[da->prefill_worker];
      seq_a += da->decode_worker + da->prefill_worker;
      seq_b += db->decode_worker + db->prefill_worker;
      seq_c += dc->decode_worker + dc->prefill_worker;
    }
    EXPECT_EQ(seq_a, seq_b);  // same seed, same choices
    EXPECT_NE(seq_a, seq_c);  // another seed, other choices
    // Uniform over the tied: each of 3 expects 100 of 300, each of 2 expects 150.
    for (const char* id : {"d1", "d2", "d3"}) EXPECT_GT(decode_count[id], 60) << id;
    for (const char* id : {"p1", "p2"}) EXPECT_GT(prefill_count[id], 100) << id;
    EXPECT_EQ((*a)->counters().tie_breaks, kDecisions);
    EXPECT_EQ((*a)->counters().remote_prefill, kDecisions);
  }
}

TEST(PlacementTest, TiedCostsGoToTheLowerSecondaryLoad) {
  // Prefill: equal cost (queued tokens weigh 0), the shorter queue wins every time since both
  // tied candidates are always drawn. Decode: equal cost (running weighs 0; equal KV used
  // after placement), the fewer running sequences win.
  PlacementOptions o = Weights(0);
  o.w_queued_tokens = 0;
  o.w_running_sequences = 0;
  std::vector<CandidateWorker> c = {Prefill("p1", 5, 100, 0), Prefill("p2", 1, 900, 0),
                                    Decode("d1", false, 9, 50, 100, 0),
                                    Decode("d2", false, 2, 50, 100, 0)};
  for (uint64_t seed = 0; seed < 20; ++seed) {
    o.rng_seed = seed;
    auto policy = CacheAwarePolicy::Create(o);
    ASSERT_TRUE(policy.ok());
    auto d = (*policy)->Decide(Request(), c);
    ASSERT_TRUE(d.ok()) << d.status();
    EXPECT_TRUE(d->tie_broken);
    EXPECT_EQ(d->prefill_worker, "p2");
    EXPECT_EQ(d->decode_worker, "d2");
  }
  // Least loaded: equal running sequences, the one with more free KV blocks wins.
  std::vector<CandidateWorker> ll = {Prefill("p1", 0, 0, 0), Decode("d1", false, 2, 40, 100, 0),
                                     Decode("d2", false, 2, 90, 100, 0)};
  for (uint64_t seed = 0; seed < 20; ++seed) {
    o.rng_seed = seed;
    auto policy = LeastLoadedPolicy::Create(o);
    ASSERT_TRUE(policy.ok());
    auto d = (*policy)->Decide(Request(), ll);
    ASSERT_TRUE(d.ok()) << d.status();
    EXPECT_EQ(d->decode_worker, "d2");
  }
}

TEST(PlacementTest, CountsDecisionsPerOutcome) {
  auto policy = CacheAwarePolicy::Create(Weights(64));
  ASSERT_TRUE(policy.ok());
  const auto p2 = Prefill("p2", 3, 400, 15);
  ASSERT_TRUE((*policy)->Decide(Request(), {p2, Decode("d2", true, 0, 600, 1000, 18)}).ok());
  ASSERT_TRUE((*policy)->Decide(Request(), {p2, Decode("d2", true, 0, 600, 1000, 18)}).ok());
  ASSERT_TRUE((*policy)->Decide(Request(), {p2, Decode("d2", true, 0, 600, 1000, 0)}).ok());
  ASSERT_TRUE((*policy)->Decide(Request(), {Decode("d2", true, 0, 600, 1000, 0)}).ok());
  const PlacementCounters c = (*policy)->counters();
  EXPECT_EQ(c.local_prefill_below_threshold, 2);
  EXPECT_EQ(c.remote_prefill, 1);
  EXPECT_EQ(c.local_prefill_no_prefill_worker, 1);
  EXPECT_EQ(c.tie_breaks, 0);
}

// The measured transfer cost: a decode worker that can prefill keeps a prompt whose predicted
// exposed transfer exceeds the allowed fraction of its predicted compute, at or above the token
// threshold; a longer prompt (compute grows, exposed transfer does not) goes to the prefill
// worker; without a measurement (nullopt) or with the rule off, the threshold alone decides.
TEST(PlacementTest, MeasuredTransferCostKeepsShortPromptsLocal) {
  PlacementOptions o = Weights(64);
  o.max_exposed_transfer_fraction = 0.1;
  auto policy = CacheAwarePolicy::Create(o);
  ASSERT_TRUE(policy.ok()) << policy.status();
  TransferCostModel model({.decay = 1.0, .min_samples = 2});
  model.Observe(100, 100 * 50.0, 2000);  // 50 us per token of compute, 2 ms exposed
  model.Observe(1000, 1000 * 50.0, 2000);
  PlacementRequest r = Request();  // 320 tokens: 16 ms compute, 2 ms exposed > 10%
  r.transfer_cost = [&](int64_t tokens) { return model.Predict(tokens); };
  const std::vector<CandidateWorker> c = {Prefill("p1", 0, 0, 0),
                                          Decode("d1", true, 0, 600, 1000, 0)};
  auto d = (*policy)->Decide(r, c);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->outcome, PlacementOutcome::kLocalPrefillTransferCost)
      << PlacementOutcomeName(d->outcome);
  EXPECT_EQ(d->prefill_worker, "");
  EXPECT_TRUE(absl::StrContains(d->reason, "predicted exposed transfer 2000us > 0.1")) << d->reason;

  PlacementRequest longer = r;  // 960 tokens: 48 ms compute, 2 ms exposed < 10%
  longer.prompt_tokens = 960;
  longer.blocks_needed = 61;
  d = (*policy)->Decide(longer, c);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->outcome, PlacementOutcome::kRemotePrefill) << PlacementOutcomeName(d->outcome);

  PlacementRequest unmeasured = r;
  unmeasured.transfer_cost = [](int64_t) { return std::optional<TransferCostEstimate>(); };
  d = (*policy)->Decide(unmeasured, c);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->outcome, PlacementOutcome::kRemotePrefill);

  auto off = CacheAwarePolicy::Create(Weights(64));
  ASSERT_TRUE(off.ok());
  d = (*off)->Decide(r, c);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->outcome, PlacementOutcome::kRemotePrefill);
  EXPECT_EQ((*policy)->counters().local_prefill_transfer_cost, 1);

  o.max_exposed_transfer_fraction = -1;
  EXPECT_EQ(CacheAwarePolicy::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
}

// Load-aware local prefill, measured: 50 us per token of compute plus 1 ms per prefill, 2 ms of
// exposed transfer. A 320-token prompt (threshold 64, so not a fast-path case), C(320) = 17 ms:
//   remote = C(prefill queue + 320) + 2 ms,
//   local  = C(decode queue + 320) + running sequences * 17 ms.
TEST(PlacementTest, LoadAwareLocalPrefillComparesPredictedReadyTimes) {
  PlacementOptions o = Weights(64);
  o.load_aware_local_prefill = true;
  auto policy = CacheAwarePolicy::Create(o);
  ASSERT_TRUE(policy.ok()) << policy.status();
  TransferCostModel model({.decay = 1.0, .min_samples = 2});
  model.Observe(100, 1000 + 100 * 50.0, 2000);
  model.Observe(1000, 1000 + 1000 * 50.0, 2000);
  PlacementRequest r = Request();
  r.transfer_cost = [&](int64_t tokens) { return model.Predict(tokens); };

  // Prefill queue 2000 tokens: remote = 1 ms + 2320 * 50 us + 2 ms = 119 ms; decode queue 500,
  // 3 running: local = 1 ms + 820 * 50 us + 3 * 17 ms = 93 ms. Local.
  auto d = (*policy)->Decide(r, {Prefill("p1", 2, 2000, 0), Decode("d1", true, 3, 600, 1000, 0,
                                                                    /*queued_tokens=*/500)});
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->outcome, PlacementOutcome::kLocalPrefillLoad) << PlacementOutcomeName(d->outcome);
  EXPECT_EQ(d->prefill_worker, "");
  EXPECT_EQ(d->uncached_tokens, 320);
  EXPECT_TRUE(absl::StrContains(d->reason, "predicted 93000us with the decodes' stall) than on p1 (119000us"))
      << d->reason;

  // Idle prefill worker: remote = 1 ms + 16 ms + 2 ms = 19 ms against local 93 ms. Remote.
  d = (*policy)->Decide(r, {Prefill("p1", 0, 0, 0), Decode("d1", true, 3, 600, 1000, 0, 500)});
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->outcome, PlacementOutcome::kRemotePrefill) << PlacementOutcomeName(d->outcome);
  EXPECT_EQ(d->prefill_worker, "p1");

  // The stall of 6 running decodes outweighs the prefill queue: local = 42 + 6 * 17 = 144 ms.
  d = (*policy)->Decide(r, {Prefill("p1", 2, 2000, 0), Decode("d1", true, 6, 600, 1000, 0, 500)});
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->outcome, PlacementOutcome::kRemotePrefill);

  // The exposed transfer decides between equal queues and nothing decoding: both 320 queued,
  // remote pays 2 ms more.
  d = (*policy)->Decide(r, {Prefill("p1", 1, 320, 0), Decode("d1", true, 0, 600, 1000, 0, 320)});
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->outcome, PlacementOutcome::kLocalPrefillLoad);

  // The prefill worker the comparison uses is the least-loaded one.
  d = (*policy)->Decide(r, {Prefill("p1", 2, 2000, 0), Prefill("p2", 0, 100, 0),
                            Decode("d1", true, 3, 600, 1000, 0, 500)});
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->outcome, PlacementOutcome::kRemotePrefill);
  EXPECT_EQ(d->prefill_worker, "p2");

  // A decode worker that cannot prefill is never chosen to.
  d = (*policy)->Decide(r, {Prefill("p1", 2, 2000, 0), Decode("d1", false, 3, 600, 1000, 0)});
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->outcome, PlacementOutcome::kRemotePrefill);
  EXPECT_EQ((*policy)->counters().local_prefill_load, 2);
  EXPECT_EQ((*policy)->counters().remote_prefill, 4);

  // Off (the default): the busy prefill worker still gets the prompt.
  auto off = CacheAwarePolicy::Create(Weights(64));
  ASSERT_TRUE(off.ok());
  d = (*off)->Decide(r, {Prefill("p1", 2, 2000, 0), Decode("d1", true, 3, 600, 1000, 0, 500)});
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->outcome, PlacementOutcome::kRemotePrefill);
}

// Before the transfer cost model predicts, the load-aware rule compares tokens: queued plus
// uncached, plus running sequences times uncached on the decode side (ties stay remote); prompts
// below the threshold take the fast path as before.
TEST(PlacementTest, LoadAwareLocalPrefillComparesTokensUntilMeasured) {
  PlacementOptions o = Weights(64);
  o.load_aware_local_prefill = true;
  auto policy = LeastLoadedPolicy::Create(o);
  ASSERT_TRUE(policy.ok()) << policy.status();
  const PlacementRequest r = Request();  // no transfer_cost
  auto d = (*policy)->Decide(r, {Prefill("p1", 1, 400, 0), Decode("d1", true, 0, 600, 1000, 0,
                                                                   /*queued_tokens=*/399)});
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->outcome, PlacementOutcome::kLocalPrefillLoad);
  EXPECT_TRUE(absl::StrContains(d->reason, "predicted 719 tokens with the decodes' stall) than on p1 (720 tokens"))
      << d->reason;
  d = (*policy)->Decide(r, {Prefill("p1", 1, 400, 0), Decode("d1", true, 0, 600, 1000, 0, 400)});
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->outcome, PlacementOutcome::kRemotePrefill);
  // One running sequence: 0 queued + 320 + 320 = 640 against 720 remote. Local.
  d = (*policy)->Decide(r, {Prefill("p1", 1, 400, 0), Decode("d1", true, 1, 600, 1000, 0, 0)});
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->outcome, PlacementOutcome::kLocalPrefillLoad);

  PlacementRequest short_prompt = r;
  short_prompt.prompt_tokens = 40;
  short_prompt.blocks_needed = 3;
  d = (*policy)->Decide(short_prompt,
                        {Prefill("p1", 0, 0, 0), Decode("d1", true, 0, 600, 1000, 0, 5000)});
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->outcome, PlacementOutcome::kLocalPrefillBelowThreshold);
}

// SLO-aware local prefill, with the load-aware test's measured costs (C(n) = 1 ms + 50 us * n,
// E = 2 ms), a 320-token prompt, TTFT SLO 100 ms and ITL SLO 25 ms:
//   remote_ttft = C(prefill queue + 320) + 2 ms, local_ttft = C(decode queue + 320),
//   local when (remote_ttft > 100 ms or local_ttft < remote_ttft)
//              and local_ttft / 100 ms + running / decode rate / 25 ms <= 1.
TEST(PlacementTest, SloAwareLocalPrefillKeepsBothSlos) {
  PlacementOptions o = Weights(64);
  o.slo_ttft_us = 100000;
  o.slo_itl_us = 25000;
  auto policy = CacheAwarePolicy::Create(o);
  ASSERT_TRUE(policy.ok()) << policy.status();
  TransferCostModel model({.decay = 1.0, .min_samples = 2});
  model.Observe(100, 1000 + 100 * 50.0, 2000);
  model.Observe(1000, 1000 + 1000 * 50.0, 2000);
  PlacementRequest r = Request();
  r.transfer_cost = [&](int64_t tokens) { return model.Predict(tokens); };
  auto decode = [](int64_t running, int64_t queued_tokens, double decode_rate) {
    CandidateWorker w = Decode("d1", true, running, 600, 1000, 0, queued_tokens);
    w.decode_tokens_per_second = decode_rate;
    return w;
  };

  // Prefill queue 2000: remote_ttft = 119 ms misses the SLO. Decode queue 500: local_ttft = 42 ms;
  // 3 running at 300 tokens/s: gap 10 ms. Budget 0.42 + 0.4 = 0.82. Local.
  auto d = (*policy)->Decide(r, {Prefill("p1", 2, 2000, 0), decode(3, 500, 300)});
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->outcome, PlacementOutcome::kLocalPrefillSlo) << PlacementOutcomeName(d->outcome);
  EXPECT_EQ(d->prefill_worker, "");
  EXPECT_EQ(d->uncached_tokens, 320);
  EXPECT_TRUE(absl::StrContains(d->reason, "predicted TTFT 42000us here vs 119000us via p1"))
      << d->reason;
  EXPECT_TRUE(absl::StrContains(d->reason, "gap 10000us")) << d->reason;

  // The same at 200 tokens/s: gap 15 ms, budget 0.42 + 0.6 = 1.02: the running decodes would miss
  // their ITL. Remote (the load-aware rule would have said local: 42 + 3 * 17 = 93 < 119 ms).
  d = (*policy)->Decide(r, {Prefill("p1", 2, 2000, 0), decode(3, 500, 200)});
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->outcome, PlacementOutcome::kRemotePrefill) << PlacementOutcomeName(d->outcome);
  EXPECT_EQ(d->prefill_worker, "p1");
  PlacementOptions both = o;
  both.load_aware_local_prefill = true;
  auto with_load = CacheAwarePolicy::Create(both);
  ASSERT_TRUE(with_load.ok());
  d = (*with_load)->Decide(r, {Prefill("p1", 2, 2000, 0), decode(3, 500, 200)});
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->outcome, PlacementOutcome::kRemotePrefill) << PlacementOutcomeName(d->outcome);

  // Idle prefill worker: remote_ttft = 19 ms meets the SLO and beats local 42 ms. Remote.
  d = (*policy)->Decide(r, {Prefill("p1", 0, 0, 0), decode(3, 500, 300)});
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->outcome, PlacementOutcome::kRemotePrefill);

  // Both within the SLO, local sooner (33 ms against 35 ms), nothing running: local.
  d = (*policy)->Decide(r, {Prefill("p1", 1, 320, 0), decode(0, 320, 0)});
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->outcome, PlacementOutcome::kLocalPrefillSlo);

  // Both miss the TTFT SLO (local: decode queue 1700, 102 ms): remote.
  d = (*policy)->Decide(r, {Prefill("p1", 2, 2000, 0), decode(0, 1700, 0)});
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->outcome, PlacementOutcome::kRemotePrefill);

  // Sequences running but no decode rate reported yet: their stall is unknown. Remote.
  d = (*policy)->Decide(r, {Prefill("p1", 2, 2000, 0), decode(3, 500, 0)});
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->outcome, PlacementOutcome::kRemotePrefill);

  // Not measured yet: remote.
  PlacementRequest unmeasured = r;
  unmeasured.transfer_cost = [](int64_t) { return std::optional<TransferCostEstimate>(); };
  d = (*policy)->Decide(unmeasured, {Prefill("p1", 2, 2000, 0), decode(3, 500, 300)});
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->outcome, PlacementOutcome::kRemotePrefill);
  EXPECT_EQ((*policy)->counters().local_prefill_slo, 2);
  EXPECT_EQ((*policy)->counters().remote_prefill, 5);

  // Off (the default): remote.
  auto off = CacheAwarePolicy::Create(Weights(64));
  ASSERT_TRUE(off.ok());
  d = (*off)->Decide(r, {Prefill("p1", 2, 2000, 0), decode(3, 500, 300)});
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->outcome, PlacementOutcome::kRemotePrefill);
}

TEST(PlacementTest, SloAwareOptionsAndRatesAreValidated) {
  PlacementOptions o = Weights(64);
  o.slo_ttft_us = 100000;
  EXPECT_EQ(CacheAwarePolicy::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.slo_itl_us = -1;
  EXPECT_EQ(CacheAwarePolicy::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.slo_itl_us = 25000;
  auto policy = CacheAwarePolicy::Create(o);
  ASSERT_TRUE(policy.ok()) << policy.status();
  CandidateWorker bad = Decode("d1", true, 0, 600, 1000, 0);
  bad.decode_tokens_per_second = -1;
  auto d = (*policy)->Decide(Request(), {Prefill("p1", 0, 0, 0), bad});
  EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(d.status().message(), "candidates[1].decode_tokens_per_second"))
      << d.status();
}

TEST(PlacementTest, ConcurrentDecisionsAreAllCounted) {
  auto policy = CreatePlacementPolicy("cache_aware", Weights(0));
  ASSERT_TRUE(policy.ok());
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 250; ++i) EXPECT_TRUE((*policy)->Decide(Request(), AllTied()).ok());
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ((*policy)->counters().remote_prefill, 1000);
  EXPECT_EQ((*policy)->counters().tie_breaks, 1000);
}

TEST(PlacementTest, FactoryRejectsUnknownNamesAndBadOptions) {
  auto unknown = CreatePlacementPolicy("round_robin", PlacementOptions());
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(unknown.status().message(),
            "--placement_policy: expected least_loaded or cache_aware; got \"round_robin\"");
  auto renamed = CreatePlacementPolicy("", PlacementOptions(), "router_policy");
  ASSERT_FALSE(renamed.ok());
  EXPECT_TRUE(absl::StrContains(renamed.status().message(), "--router_policy:"));

  PlacementOptions o;
  o.w_kv_used = -1;
  auto bad = CreatePlacementPolicy("cache_aware", o);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(), "w_kv_used: expected a finite weight >= 0; got -1");
  o = PlacementOptions();
  o.local_prefill_threshold_tokens = -2;
  auto bad_threshold = CreatePlacementPolicy("least_loaded", o);
  ASSERT_FALSE(bad_threshold.ok());
  EXPECT_EQ(bad_threshold.status().message(),
            "local_prefill_threshold_tokens: expected >= 0; got -2");

  auto ll = CreatePlacementPolicy("least_loaded", PlacementOptions());
  auto ca = CreatePlacementPolicy("cache_aware", PlacementOptions());
  ASSERT_TRUE(ll.ok() && ca.ok());
  EXPECT_EQ((*ll)->name(), "least_loaded");
  EXPECT_EQ((*ca)->name(), "cache_aware");
}

TEST(PlacementTest, LogsEachDecisionWithItsInputsAtDebug) {
  std::ostringstream out;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_st>(out);
  auto logger = std::make_shared<spdlog::logger>("placement_test", sink);
  logger->set_level(spdlog::level::debug);
  auto previous = spdlog::default_logger();
  spdlog::set_default_logger(logger);
  auto policy = CacheAwarePolicy::Create(Weights(64));
  ASSERT_TRUE(policy.ok());
  auto d = (*policy)->Decide(Request(),
                             {Prefill("p2", 3, 400, 15), Decode("d2", true, 0, 600, 1000, 18, 20)});
  auto e = (*policy)->Decide(Request(), {Prefill("p2", 3, 400, 15)});
  spdlog::set_default_logger(previous);
  ASSERT_TRUE(d.ok());
  ASSERT_FALSE(e.ok());
  const std::string log = out.str();
  EXPECT_TRUE(absl::StrContains(log,
                                "[req=r1] placement cache_aware: prompt_tokens=320 "
                                "blocks_needed=21 block_size=16"))
      << log;
  EXPECT_TRUE(absl::StrContains(log,
                                "{p2 prefill queue=3 queued_tokens=400 running=0 "
                                "kv_free=0/0 cached_blocks=15 uncached=80 cost=280}"))
      << log;
  EXPECT_TRUE(absl::StrContains(log,
                                "{d2 decode can_prefill queue=0 queued_tokens=20 running=0 "
                                "kv_free=600/1000 cached_blocks=18 uncached=32 cost=463 "
                                "(decode 421 + prefill 42 local)}"))
      << log;
  EXPECT_TRUE(absl::StrContains(log, d->reason)) << log;
  EXPECT_TRUE(absl::StrContains(log, "no decode worker among 1 candidates")) << log;
}

}  // namespace
}  // namespace deepinfer::router
