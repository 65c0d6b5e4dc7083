#include "tools/bench/report.h"

#include "gtest/gtest.h"

namespace deepinfer::bench {
namespace {

TEST(ReportTest, PercentilesInterpolateLikeNumpy) {
  Distribution d = Summarize(std::vector<double>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10});
  EXPECT_DOUBLE_EQ(d.mean, 5.5);
  EXPECT_DOUBLE_EQ(d.median, 5.5);
  EXPECT_NEAR(d.p90, 9.1, 1e-12);
  EXPECT_NEAR(d.p99, 9.91, 1e-12);
  EXPECT_DOUBLE_EQ(d.max, 10);
  EXPECT_EQ(Summarize(std::vector<double>{}).count, 0);
}

RequestRecord Rec(double send, std::vector<double> chunks, std::vector<int> tokens, bool ok = true) {
  RequestRecord r;
  r.send_s = send;
  r.chunk_times_s = chunks;
  r.chunk_tokens = tokens;
  r.end_s = chunks.empty() ? send : chunks.back();
  r.ok = ok;
  r.finish_reason = ok ? "length" : "";
  int n = 0;
  for (int t : tokens) n += t;
  r.completion_tokens = n;
  r.prompt_tokens = 100;
  r.cached_prompt_tokens = 50;
  return r;
}

TEST(ReportTest, LatenciesThroughputAndGoodput) {
  std::vector<RequestRecord> recs;
  // TTFT 100 ms, then 4 tokens at 10 ms gaps: TPOT 10 ms.
  recs.push_back(Rec(0.0, {0.1, 0.11, 0.12, 0.13, 0.14}, {1, 1, 1, 1, 1}));
  // TTFT 500 ms (misses a 200 ms TTFT SLO), one 2-token chunk: ITL gaps 0.05 then 0.
  recs.push_back(Rec(0.5, {1.0, 1.05}, {1, 2}));
  RequestRecord warm = Rec(0.0, {5.0}, {1});
  warm.warmup = true;  // ignored entirely
  recs.push_back(warm);
  RequestRecord bad = Rec(1.0, {}, {}, /*ok=*/false);
  bad.end_s = 2.0;
  bad.error = "14: unavailable";
  recs.push_back(bad);
  Summary s = Summarize(recs, /*slo_ttft_ms=*/200, /*slo_tpot_ms=*/50);
  EXPECT_EQ(s.completed, 2);
  EXPECT_EQ(s.failed, 1);
  EXPECT_DOUBLE_EQ(s.duration_s, 2.0);  // first send 0 -> last end 2.0
  EXPECT_EQ(s.output_tokens, 8);
  EXPECT_DOUBLE_EQ(s.request_throughput, 1.0);
  EXPECT_DOUBLE_EQ(s.goodput, 0.5);  // only the first meets TTFT <= 200 ms
  EXPECT_DOUBLE_EQ(s.prefix_cache_hit_ratio, 0.5);
  EXPECT_NEAR(s.ttft_ms.mean, 300, 1e-9);
  // TPOT: (140 - 100) / 4 = 10 and (550 - 500) / 2 = 25.
  EXPECT_NEAR(s.tpot_ms.median, 17.5, 1e-9);
  // ITL values: 10,10,10,10 (first) and 50, 0 (second).
  EXPECT_EQ(s.itl_ms.count, 6);
  EXPECT_NEAR(s.itl_ms.max, 50, 1e-9);
  // Decoding: [0.1, 0.14] and [1.0, 1.05] do not overlap: 0.09 s for 4 + 2 tokens.
  EXPECT_EQ(s.decode_tokens, 6);
  EXPECT_NEAR(s.decode_busy_s, 0.09, 1e-12);
  EXPECT_NEAR(s.decode_token_throughput, 6 / 0.09, 1e-9);
  EXPECT_EQ(s.draft_tokens, 0);
  EXPECT_DOUBLE_EQ(s.mean_accepted_length, 1.0);  // no drafts: one token per step
  ASSERT_EQ(s.errors.size(), 1u);
  EXPECT_NE(FormatSummary(s, "t").find("Request goodput (req/s):"), std::string::npos);
  EXPECT_NE(FormatComparison(s, "a", s, "b").find("1.000"), std::string::npos);
  EXPECT_EQ(SummaryJson(s)["completed"], 2);
}

TEST(ReportTest, DecodeThroughputCountsOverlappingStreamsOnce) {
  // Three streams: [1, 3] and [2, 4] overlap (3 s together), [6, 7] apart; a gap of 2 s with
  // nothing decoding (the others waiting for prefill, say) does not count. Tokens after the first
  // chunk: 10 + 20 + 5 (the first chunk of the second carries 2, both leave out).
  std::vector<RequestRecord> recs;
  recs.push_back(Rec(0.0, {1.0, 2.0, 3.0}, {1, 5, 5}));
  recs.push_back(Rec(0.0, {2.0, 4.0}, {2, 20}));
  recs.push_back(Rec(5.0, {6.0, 7.0}, {1, 5}));
  recs.push_back(Rec(0.0, {2.5, 3.5}, {1, 9}, /*ok=*/false));  // failed: not counted
  Summary s = Summarize(recs, 1000, 1000);
  EXPECT_EQ(s.decode_tokens, 35);
  EXPECT_NEAR(s.decode_busy_s, 4.0, 1e-12);
  EXPECT_NEAR(s.decode_token_throughput, 35 / 4.0, 1e-12);
  // Nested interval: [1.5, 2.5] inside [1, 3] adds no time.
  recs.push_back(Rec(1.0, {1.5, 2.5}, {1, 4}));
  s = Summarize(recs, 1000, 1000);
  EXPECT_EQ(s.decode_tokens, 39);
  EXPECT_NEAR(s.decode_busy_s, 4.0, 1e-12);
}

TEST(ReportTest, SpeculativeDecodingFigures) {
  RequestRecord r = Rec(0.0, {0.1, 0.2}, {4, 4});  // 8 tokens in 2 chunks
  r.draft_tokens = 10;
  r.accepted_draft_tokens = 6;  // 8 tokens in 2 decode steps
  Summary s = Summarize({r}, 1000, 1000);
  EXPECT_DOUBLE_EQ(s.draft_acceptance_rate, 0.6);
  EXPECT_DOUBLE_EQ(s.mean_accepted_length, 4.0);
  EXPECT_NE(FormatSummary(s, "t").find("Tokens per decode step:"), std::string::npos);
}

TEST(ReportTest, TtftBreakdownOfDisaggregatedRequests) {
  RequestRecord colocated = Rec(0.0, {0.1, 0.2}, {1, 1});
  RequestRecord a = Rec(0.0, {0.3, 0.4}, {1, 1});
  a.prefill_compute_us = 200000;
  a.kv_transfer_us = 40000;
  a.kv_transfer_exposed_us = 2000;
  a.decode_queue_us = 5000;
  RequestRecord b = a;
  b.prefill_compute_us = 100000;
  b.kv_transfer_us = 20000;
  b.kv_transfer_exposed_us = 4000;
  b.decode_queue_us = 7000;
  Summary s = Summarize({colocated, a, b}, 1000, 1000);
  EXPECT_EQ(s.disaggregated, 2);
  EXPECT_DOUBLE_EQ(s.prefill_compute_ms.mean, 150.0);
  EXPECT_DOUBLE_EQ(s.kv_transfer_ms.mean, 30.0);
  EXPECT_DOUBLE_EQ(s.kv_transfer_exposed_ms.max, 4.0);
  EXPECT_DOUBLE_EQ(s.decode_queue_ms.mean, 6.0);
  EXPECT_DOUBLE_EQ(s.kv_exposed_fraction, 6.0 / 60.0);
  EXPECT_NE(FormatSummary(s, "t").find("KV transfer exposed fraction:"), std::string::npos);
  EXPECT_EQ(SummaryJson(s)["kv_transfer_exposed_ms"]["count"], 2);
  EXPECT_EQ(RecordJson(a)["kv_transfer_exposed_us"], 2000);
  // Colocated only: no breakdown section.
  Summary c = Summarize({colocated}, 1000, 1000);
  EXPECT_EQ(c.disaggregated, 0);
  EXPECT_EQ(FormatSummary(c, "t").find("TTFT breakdown"), std::string::npos);
}

}  // namespace
}  // namespace deepinfer::bench
