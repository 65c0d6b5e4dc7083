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

TEST(ReportTest, GoodputNeedsTtftAndEachRequestsItlP90WithinSlo) {
  std::vector<RequestRecord> recs;
  // Meets both: TTFT 100 ms, ten 10 ms gaps.
  std::vector<double> steady = {0.1};
  for (int i = 1; i <= 10; ++i) steady.push_back(0.1 + 0.01 * i);
  recs.push_back(Rec(0.0, steady, std::vector<int>(steady.size(), 1)));
  // TTFT 300 ms: misses the 200 ms TTFT SLO.
  recs.push_back(Rec(0.0, {0.3, 0.31}, {1, 1}));
  // TTFT 100 ms, but 2 of its 4 gaps are 100 ms stalls (a prefill in the way): ITL p90 > 50 ms.
  recs.push_back(Rec(1.0, {1.1, 1.11, 1.21, 1.31, 1.32}, {1, 1, 1, 1, 1}));
  // One stall among ten gaps: its p90 (interpolated) is 19 ms, within the SLO.
  std::vector<double> one_stall = {1.1};
  for (int i = 1; i <= 10; ++i) one_stall.push_back(one_stall.back() + (i == 5 ? 0.1 : 0.01));
  recs.push_back(Rec(1.0, one_stall, std::vector<int>(one_stall.size(), 1)));
  // One token only: passes the ITL SLO.
  recs.push_back(Rec(1.5, {1.6}, {1}));
  RequestRecord bad = Rec(1.5, {}, {}, /*ok=*/false);
  bad.end_s = 2.0;
  recs.push_back(bad);
  RequestRecord warm = Rec(0.0, {0.1}, {1});
  warm.warmup = true;
  recs.push_back(warm);
  GoodputPoint p = EvaluateGoodput(recs, /*slo_ttft_ms=*/200, /*slo_itl_ms=*/50);
  EXPECT_EQ(p.requests, 6);
  EXPECT_EQ(p.met, 3);
  EXPECT_DOUBLE_EQ(p.attainment, 0.5);
  EXPECT_DOUBLE_EQ(p.goodput, 3 / 2.0);  // duration: first send 0 -> last end 2.0
  EXPECT_EQ(p.ttft_ms.count, 5);
  EXPECT_DOUBLE_EQ(p.slo_itl_ms, 50);
}

TEST(ReportTest, GoodputTableJudgesTheCandidateAgainstTheBestOtherAtEveryRate) {
  auto point = [](std::string config, double rate, double goodput, double attainment) {
    GoodputPoint p;
    p.config = std::move(config);
    p.rate = rate;
    p.goodput = goodput;
    p.attainment = attainment;
    p.slo_ttft_ms = 1000;
    p.slo_itl_ms = 50;
    return p;
  };
  // At rate 1 the candidate's goodput is a hair below colocated's (a longer run) while it serves
  // more of the same requests within the SLOs: attainment decides.
  std::vector<GoodputPoint> points = {
      point("colocated", 2, 1.0, 0.6),      point("disaggregated", 2, 1.5, 0.92),
      point("conditional", 2, 1.4, 0.9),    point("colocated", 1, 0.91, 0.95),
      point("disaggregated", 1, 0.8, 0.9),  point("conditional", 1, 0.9, 0.97)};
  const auto max_rate = MaxRateWithinSlo(points);
  ASSERT_EQ(max_rate.size(), 3u);
  EXPECT_EQ(max_rate[0], std::make_pair(std::string("colocated"), 1.0));
  EXPECT_EQ(max_rate[1], std::make_pair(std::string("disaggregated"), 2.0));
  EXPECT_EQ(max_rate[2], std::make_pair(std::string("conditional"), 2.0));

  const nlohmann::json j = GoodputJson(points, "conditional");
  ASSERT_EQ(j["candidate_verdicts"].size(), 2u);
  EXPECT_EQ(j["candidate_verdicts"][0]["rate"], 1.0);  // rates ascending
  EXPECT_TRUE(j["candidate_verdicts"][0]["holds"]);    // 0.97 >= colocated's 0.95
  EXPECT_EQ(j["candidate_verdicts"][0]["best_other"], "colocated");
  EXPECT_FALSE(j["candidate_verdicts"][1]["holds"]);   // 0.9 < disaggregated's 0.92
  EXPECT_EQ(j["candidate_verdicts"][1]["best_other"], "disaggregated");
  EXPECT_FALSE(j["candidate_at_least_best_other_at_every_rate"]);
  EXPECT_EQ(j["points"].size(), 6u);

  const std::string table = FormatGoodputTable(points, "conditional");
  EXPECT_NE(table.find("TTFT <= 1000 ms"), std::string::npos);
  EXPECT_NE(table.find("rate 2.00: conditional requests within SLO < the best other's "
                       "(disaggregated)"),
            std::string::npos);
  EXPECT_LT(table.find("  1.00  colocated"), table.find("  2.00  colocated"));
}

}  // namespace
}  // namespace deepinfer::bench
