// Per-request records of a benchmark run and the summary computed from them, in the layout
// `vllm bench serve` users know (TTFT, TPOT, ITL, E2E: mean / median / p90 / p99; request and
// token throughput; goodput under a TTFT and a TPOT SLO), plus the prefix-cache hit ratio.
//
// Definitions (all latencies in milliseconds in the report):
//   TTFT  send -> first chunk carrying a token.
//   ITL   gaps between consecutive chunks carrying tokens (a chunk with k tokens contributes one
//         gap then k - 1 zero gaps, as vLLM counts speculative bursts).
//   TPOT  (E2E - TTFT) / (completion_tokens - 1), per request with >= 2 tokens.
//   E2E   send -> last chunk.
//   goodput  successful requests with TTFT <= slo_ttft_ms and TPOT <= slo_tpot_ms (a request with
//         one token passes the TPOT SLO), divided by the run's duration.
//   duration  first send -> last completion, excluding warm-up requests.
//   decode throughput  tokens after each completed request's first chunk, over the time in which
//         at least one completed request was between its first and its last chunk (the union of
//         those intervals, "decode busy"): the decode tier's tokens/s while it has work, which,
//         unlike 1 / TPOT (one stream's speed), does not rise when fewer requests decode at once
//         because the others wait for prefill.
//   TTFT breakdown  over the completed disaggregated requests (those whose usage carries a
//         prefill node's timing, Timing.prefill_compute_us / kv_transfer_us > 0): prefill compute,
//         KV transfer, KV transfer exposed after the prefill compute ended (not hidden by it; its
//         ratio to the transfer is the "exposed fraction"), decode queue.
//
// Thread-safety: pure functions.
#ifndef DEEPINFER_TOOLS_BENCH_REPORT_H_
#define DEEPINFER_TOOLS_BENCH_REPORT_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "nlohmann/json.hpp"

namespace deepinfer::bench {

struct RequestRecord {
  uint64_t session = 0;
  int turn = 0;
  bool warmup = false;
  double send_s = 0.0;                // seconds since the run started
  std::vector<double> chunk_times_s;  // arrival of each chunk carrying tokens
  std::vector<int> chunk_tokens;      // tokens in that chunk
  double end_s = 0.0;                 // last chunk or error
  bool ok = false;
  std::string error;          // "CODE: message" when !ok
  std::string finish_reason;  // "stop", "length", ...
  int64_t prompt_tokens = 0;
  int64_t cached_prompt_tokens = 0;
  int64_t completion_tokens = 0;
  // Speculative decoding (0 when off): drafts verified and accepted for this request.
  int64_t draft_tokens = 0;
  int64_t accepted_draft_tokens = 0;
  // Disaggregated prefill (0 when colocated), from the usage's Timing, microseconds.
  int64_t prefill_compute_us = 0;
  int64_t kv_transfer_us = 0;
  int64_t kv_transfer_exposed_us = 0;
  int64_t decode_queue_us = 0;
};

struct Distribution {
  double mean = 0, median = 0, p90 = 0, p99 = 0, max = 0;
  int64_t count = 0;
};

// Percentiles by linear interpolation between closest ranks (numpy's default).
Distribution Summarize(std::vector<double> values);

struct Summary {
  int64_t completed = 0;
  int64_t failed = 0;
  double duration_s = 0;
  int64_t input_tokens = 0;
  int64_t cached_input_tokens = 0;
  int64_t output_tokens = 0;
  double request_throughput = 0;       // completed / s
  double output_token_throughput = 0;  // tokens / s
  double total_token_throughput = 0;   // (input + output) / s
  double goodput = 0;                  // requests / s meeting both SLOs
  double decode_busy_s = 0;            // union of [first chunk, last chunk] of completed requests
  int64_t decode_tokens = 0;           // completed requests' tokens after their first chunk
  double decode_token_throughput = 0;  // decode_tokens / decode_busy_s
  double slo_ttft_ms = 0, slo_tpot_ms = 0;
  double prefix_cache_hit_ratio = 0;   // cached / input tokens
  // Speculative decoding: accepted / verified drafts, and tokens per decode step
  // (completion / (completion - accepted)), over all completed requests; 0 without drafts.
  int64_t draft_tokens = 0;
  int64_t accepted_draft_tokens = 0;
  double draft_acceptance_rate = 0;
  double mean_accepted_length = 0;
  Distribution ttft_ms, tpot_ms, itl_ms, e2e_ms;
  // TTFT breakdown of the disaggregated requests (count 0 when none).
  int64_t disaggregated = 0;
  Distribution prefill_compute_ms, kv_transfer_ms, kv_transfer_exposed_ms, decode_queue_ms;
  double kv_exposed_fraction = 0;  // sum of exposed / sum of transfer
  std::vector<std::string> errors;  // first few distinct errors
};

Summary Summarize(const std::vector<RequestRecord>& records, double slo_ttft_ms,
                  double slo_tpot_ms);

// The human-readable report (vllm bench serve layout), titled `title`.
std::string FormatSummary(const Summary& s, const std::string& title);
nlohmann::json SummaryJson(const Summary& s);
nlohmann::json RecordJson(const RequestRecord& r);

// Side-by-side table of two summaries with ratios b / a for every figure.
std::string FormatComparison(const Summary& a, const std::string& name_a, const Summary& b,
                             const std::string& name_b);

// Goodput comparison (bench --goodput_targets, tools/bench/goodput.sh): one configuration at one
// arrival rate. A request meets the SLOs when it completed, its TTFT <= slo_ttft_ms and the 90th
// percentile of its own ITL gaps (as in Summary's ITL) <= slo_itl_ms; a request with one chunk
// passes the ITL SLO. goodput = requests meeting both / the run's duration (Summary's); attainment
// = requests meeting both / requests sent (warm-up excluded; failures count as misses).
struct GoodputPoint {
  std::string config;
  double rate = 0;  // offered session arrivals per second
  int64_t requests = 0;
  int64_t met = 0;
  double attainment = 0;
  double goodput = 0;  // req/s within both SLOs
  double request_throughput = 0, output_token_throughput = 0;
  double slo_ttft_ms = 0, slo_itl_ms = 0;
  Distribution ttft_ms, itl_ms;  // every request's TTFT; every ITL gap (Summary's)
};

GoodputPoint EvaluateGoodput(const std::vector<RequestRecord>& records, double slo_ttft_ms,
                             double slo_itl_ms);

// Per configuration, the highest rate among `points` whose attainment is >= `target` (0 when
// none): DistServe's "max rate within SLO". Configurations in their first-seen order.
std::vector<std::pair<std::string, double>> MaxRateWithinSlo(
    const std::vector<GoodputPoint>& points, double target = 0.9);

// The table (one row per rate and configuration, rates ascending) and, per rate, whether the
// configuration named `candidate` serves at least as many of the requests within the SLOs as the
// best other one (attainment; every configuration at a rate was sent the same requests, while
// goodput also divides by each run's own duration), with the ratio of the attainments.
std::string FormatGoodputTable(const std::vector<GoodputPoint>& points,
                               const std::string& candidate);
nlohmann::json GoodputJson(const std::vector<GoodputPoint>& points, const std::string& candidate);

}  // namespace deepinfer::bench

#endif  // DEEPINFER_TOOLS_BENCH_REPORT_H_
