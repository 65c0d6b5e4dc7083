#include "tools/bench/report.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace deepinfer::bench {

Distribution Summarize(std::vector<double> v) {
  Distribution d;
  d.count = static_cast<int64_t>(v.size());
  if (v.empty()) return d;
  std::sort(v.begin(), v.end());
  double sum = 0;
  for (double x : v) sum += x;
  d.mean = sum / v.size();
  auto pct = [&](double p) {
    const double rank = p / 100.0 * (v.size() - 1);
    const size_t lo = static_cast<size_t>(std::floor(rank));
    const size_t hi = std::min(lo + 1, v.size() - 1);
    return v[lo] + (v[hi] - v[lo]) * (rank - lo);
  };
  d.median = pct(50);
  d.p90 = pct(90);
  d.p99 = pct(99);
  d.max = v.back();
  return d;
}

Summary Summarize(const std::vector<RequestRecord>& records, double slo_ttft_ms,
                  double slo_tpot_ms) {
  Summary s;
  s.slo_ttft_ms = slo_ttft_ms;
  s.slo_tpot_ms = slo_tpot_ms;
  std::vector<double> ttft, tpot, itl, e2e;
  std::vector<double> compute, transfer, exposed, decode_queue;
  double transfer_sum = 0, exposed_sum = 0;
  double first = 0, last = 0;
  bool any = false;
  int64_t good = 0;
  std::set<std::string> errors;
  std::vector<std::pair<double, double>> decoding;  // [first chunk, last chunk] per request
  for (const RequestRecord& r : records) {
    if (r.warmup) continue;
    if (!any || r.send_s < first) first = r.send_s;
    if (!any || r.end_s > last) last = r.end_s;
    any = true;
    if (!r.ok) {
      ++s.failed;
      if (errors.size() < 5) errors.insert(r.error);
      continue;
    }
    ++s.completed;
    s.input_tokens += r.prompt_tokens;
    s.cached_input_tokens += r.cached_prompt_tokens;
    s.output_tokens += r.completion_tokens;
    s.draft_tokens += r.draft_tokens;
    s.accepted_draft_tokens += r.accepted_draft_tokens;
    if (r.prefill_compute_us > 0 || r.kv_transfer_us > 0) {
      ++s.disaggregated;
      compute.push_back(r.prefill_compute_us / 1e3);
      transfer.push_back(r.kv_transfer_us / 1e3);
      exposed.push_back(r.kv_transfer_exposed_us / 1e3);
      decode_queue.push_back(r.decode_queue_us / 1e3);
      transfer_sum += r.kv_transfer_us;
      exposed_sum += r.kv_transfer_exposed_us;
    }
    const double e = (r.end_s - r.send_s) * 1e3;
    e2e.push_back(e);
    if (r.chunk_times_s.empty()) continue;
    const double t = (r.chunk_times_s[0] - r.send_s) * 1e3;
    ttft.push_back(t);
    decoding.emplace_back(r.chunk_times_s.front(), r.chunk_times_s.back());
    s.decode_tokens += r.completion_tokens - r.chunk_tokens.front();
    for (size_t i = 0; i < r.chunk_times_s.size(); ++i) {
      if (i > 0) itl.push_back((r.chunk_times_s[i] - r.chunk_times_s[i - 1]) * 1e3);
      for (int k = 1; k < r.chunk_tokens[i]; ++k) itl.push_back(0.0);
    }
    double per_token = 0;
    if (r.completion_tokens >= 2) {
      per_token = (e - t) / static_cast<double>(r.completion_tokens - 1);
      tpot.push_back(per_token);
    }
    if (t <= slo_ttft_ms && per_token <= slo_tpot_ms) ++good;
  }
  s.duration_s = any ? std::max(last - first, 1e-9) : 0;
  if (s.duration_s > 0) {
    s.request_throughput = s.completed / s.duration_s;
    s.output_token_throughput = s.output_tokens / s.duration_s;
    s.total_token_throughput = (s.input_tokens + s.output_tokens) / s.duration_s;
    s.goodput = good / s.duration_s;
  }
  std::sort(decoding.begin(), decoding.end());
  double covered_to = -1e300;
  for (const auto& [begin, end] : decoding) {
    const double from = std::max(begin, covered_to);
    if (end > from) s.decode_busy_s += end - from;
    covered_to = std::max(covered_to, end);
  }
  if (s.decode_busy_s > 0) s.decode_token_throughput = s.decode_tokens / s.decode_busy_s;
  s.prefix_cache_hit_ratio =
      s.input_tokens > 0 ? static_cast<double>(s.cached_input_tokens) / s.input_tokens : 0;
  if (s.draft_tokens > 0) {
    s.draft_acceptance_rate = static_cast<double>(s.accepted_draft_tokens) / s.draft_tokens;
  }
  if (s.output_tokens > s.accepted_draft_tokens) {
    s.mean_accepted_length =
        static_cast<double>(s.output_tokens) / (s.output_tokens - s.accepted_draft_tokens);
  }
  s.ttft_ms = Summarize(std::move(ttft));
  s.tpot_ms = Summarize(std::move(tpot));
  s.itl_ms = Summarize(std::move(itl));
  s.e2e_ms = Summarize(std::move(e2e));
  s.prefill_compute_ms = Summarize(std::move(compute));
  s.kv_transfer_ms = Summarize(std::move(transfer));
  s.kv_transfer_exposed_ms = Summarize(std::move(exposed));
  s.decode_queue_ms = Summarize(std::move(decode_queue));
  s.kv_exposed_fraction = transfer_sum > 0 ? exposed_sum / transfer_sum : 0;
  s.errors.assign(errors.begin(), errors.end());
  return s;
}

namespace {

void Line(std::string* out, const std::string& name, const std::string& value) {
  absl::StrAppendFormat(out, "%-40s%10s\n", name, value);
}
std::string F(double v) { return absl::StrFormat("%.2f", v); }

void Dist(std::string* out, const std::string& title, const std::string& name,
          const Distribution& d) {
  absl::StrAppendFormat(out, "%s\n", std::string(15, '-') + title + std::string(15, '-'));
  Line(out, "Mean " + name + " (ms):", F(d.mean));
  Line(out, "Median " + name + " (ms):", F(d.median));
  Line(out, "P90 " + name + " (ms):", F(d.p90));
  Line(out, "P99 " + name + " (ms):", F(d.p99));
}

}  // namespace

std::string FormatSummary(const Summary& s, const std::string& title) {
  std::string out;
  absl::StrAppendFormat(&out, "%s\n", std::string(16, '=') + " " + title + " " +
                                          std::string(16, '='));
  Line(&out, "Successful requests:", absl::StrCat(s.completed));
  Line(&out, "Failed requests:", absl::StrCat(s.failed));
  Line(&out, "Benchmark duration (s):", F(s.duration_s));
  Line(&out, "Total input tokens:", absl::StrCat(s.input_tokens));
  Line(&out, "Total cached input tokens:", absl::StrCat(s.cached_input_tokens));
  Line(&out, "Total generated tokens:", absl::StrCat(s.output_tokens));
  Line(&out, "Request throughput (req/s):", F(s.request_throughput));
  Line(&out, "Request goodput (req/s):", F(s.goodput));
  Line(&out, "Output token throughput (tok/s):", F(s.output_token_throughput));
  Line(&out, "Total token throughput (tok/s):", F(s.total_token_throughput));
  Line(&out, "Decode busy time (s):", F(s.decode_busy_s));
  Line(&out, "Decode token throughput (tok/s):", F(s.decode_token_throughput));
  Line(&out, "Prefix cache hit ratio:", F(s.prefix_cache_hit_ratio));
  if (s.draft_tokens > 0) {
    Line(&out, "Draft tokens verified / accepted:",
         absl::StrCat(s.draft_tokens, " / ", s.accepted_draft_tokens));
    Line(&out, "Draft acceptance rate:", F(s.draft_acceptance_rate));
    Line(&out, "Tokens per decode step:", F(s.mean_accepted_length));
  }
  Line(&out, "SLO TTFT / TPOT (ms):", absl::StrCat(F(s.slo_ttft_ms), " / ", F(s.slo_tpot_ms)));
  Dist(&out, "Time to First Token", "TTFT", s.ttft_ms);
  Dist(&out, "Time per Output Token (excl. 1st token)", "TPOT", s.tpot_ms);
  Dist(&out, "Inter-token Latency", "ITL", s.itl_ms);
  Dist(&out, "End-to-end Latency", "E2EL", s.e2e_ms);
  if (s.disaggregated > 0) {
    absl::StrAppendFormat(&out, "%s\n", std::string(15, '-') + "TTFT breakdown (" +
                                             absl::StrCat(s.disaggregated) +
                                             " disaggregated requests)" + std::string(15, '-'));
    Line(&out, "Mean / P90 prefill compute (ms):",
         absl::StrCat(F(s.prefill_compute_ms.mean), " / ", F(s.prefill_compute_ms.p90)));
    Line(&out, "Mean / P90 KV transfer (ms):",
         absl::StrCat(F(s.kv_transfer_ms.mean), " / ", F(s.kv_transfer_ms.p90)));
    Line(&out, "Mean / P90 KV transfer exposed (ms):",
         absl::StrCat(F(s.kv_transfer_exposed_ms.mean), " / ", F(s.kv_transfer_exposed_ms.p90)));
    Line(&out, "KV transfer exposed fraction:", F(s.kv_exposed_fraction));
    Line(&out, "Mean / P90 decode queue (ms):",
         absl::StrCat(F(s.decode_queue_ms.mean), " / ", F(s.decode_queue_ms.p90)));
  }
  for (const std::string& e : s.errors) absl::StrAppend(&out, "error: ", e, "\n");
  absl::StrAppend(&out, std::string(50, '='), "\n");
  return out;
}

namespace {
nlohmann::json DistJson(const Distribution& d) {
  return {{"mean", d.mean}, {"median", d.median}, {"p90", d.p90},
          {"p99", d.p99},   {"max", d.max},       {"count", d.count}};
}
}  // namespace

nlohmann::json SummaryJson(const Summary& s) {
  return {{"completed", s.completed},
          {"failed", s.failed},
          {"duration_s", s.duration_s},
          {"input_tokens", s.input_tokens},
          {"cached_input_tokens", s.cached_input_tokens},
          {"output_tokens", s.output_tokens},
          {"request_throughput", s.request_throughput},
          {"output_token_throughput", s.output_token_throughput},
          {"total_token_throughput", s.total_token_throughput},
          {"goodput", s.goodput},
          {"decode_busy_s", s.decode_busy_s},
          {"decode_tokens", s.decode_tokens},
          {"decode_token_throughput", s.decode_token_throughput},
          {"slo_ttft_ms", s.slo_ttft_ms},
          {"slo_tpot_ms", s.slo_tpot_ms},
          {"prefix_cache_hit_ratio", s.prefix_cache_hit_ratio},
          {"draft_tokens", s.draft_tokens},
          {"accepted_draft_tokens", s.accepted_draft_tokens},
          {"draft_acceptance_rate", s.draft_acceptance_rate},
          {"mean_accepted_length", s.mean_accepted_length},
          {"ttft_ms", DistJson(s.ttft_ms)},
          {"tpot_ms", DistJson(s.tpot_ms)},
          {"itl_ms", DistJson(s.itl_ms)},
          {"e2e_ms", DistJson(s.e2e_ms)},
          {"disaggregated", s.disaggregated},
          {"prefill_compute_ms", DistJson(s.prefill_compute_ms)},
          {"kv_transfer_ms", DistJson(s.kv_transfer_ms)},
          {"kv_transfer_exposed_ms", DistJson(s.kv_transfer_exposed_ms)},
          {"kv_exposed_fraction", s.kv_exposed_fraction},
          {"decode_queue_ms", DistJson(s.decode_queue_ms)},
          {"errors", s.errors}};
}

nlohmann::json RecordJson(const RequestRecord& r) {
  return {{"session", r.session},
          {"turn", r.turn},
          {"warmup", r.warmup},
          {"send_s", r.send_s},
          {"chunk_times_s", r.chunk_times_s},
          {"chunk_tokens", r.chunk_tokens},
          {"end_s", r.end_s},
          {"ok", r.ok},
          {"error", r.error},
          {"finish_reason", r.finish_reason},
          {"prompt_tokens", r.prompt_tokens},
          {"cached_prompt_tokens", r.cached_prompt_tokens},
          {"completion_tokens", r.completion_tokens},
          {"draft_tokens", r.draft_tokens},
          {"accepted_draft_tokens", r.accepted_draft_tokens},
          {"prefill_compute_us", r.prefill_compute_us},
          {"kv_transfer_us", r.kv_transfer_us},
          {"kv_transfer_exposed_us", r.kv_transfer_exposed_us},
          {"decode_queue_us", r.decode_queue_us}};
}

std::string FormatComparison(const Summary& a, const std::string& name_a, const Summary& b,
                             const std::string& name_b) {
  std::string out;
  absl::StrAppendFormat(&out, "%-32s%14s%14s%10s\n", "metric", name_a, name_b, "b/a");
  auto row = [&](const std::string& name, double x, double y) {
    absl::StrAppendFormat(&out, "%-32s%14.2f%14.2f%10s\n", name, x, y,
                          x != 0 ? absl::StrFormat("%.3f", y / x) : std::string("-"));
  };
  row("completed", a.completed, b.completed);
  row("failed", a.failed, b.failed);
  row("request throughput (req/s)", a.request_throughput, b.request_throughput);
  row("goodput (req/s)", a.goodput, b.goodput);
  row("output tok/s", a.output_token_throughput, b.output_token_throughput);
  row("decode tok/s (busy)", a.decode_token_throughput, b.decode_token_throughput);
  row("prefix cache hit ratio", a.prefix_cache_hit_ratio, b.prefix_cache_hit_ratio);
  row("tokens per decode step", a.mean_accepted_length, b.mean_accepted_length);
  row("TTFT mean (ms)", a.ttft_ms.mean, b.ttft_ms.mean);
  row("TTFT p90 (ms)", a.ttft_ms.p90, b.ttft_ms.p90);
  row("TTFT p99 (ms)", a.ttft_ms.p99, b.ttft_ms.p99);
  row("TPOT p90 (ms)", a.tpot_ms.p90, b.tpot_ms.p90);
  row("ITL mean (ms)", a.itl_ms.mean, b.itl_ms.mean);
  row("ITL p90 (ms)", a.itl_ms.p90, b.itl_ms.p90);
  row("ITL p99 (ms)", a.itl_ms.p99, b.itl_ms.p99);
  row("E2E p90 (ms)", a.e2e_ms.p90, b.e2e_ms.p90);
  if (a.disaggregated > 0 || b.disaggregated > 0) {
    row("prefill compute mean (ms)", a.prefill_compute_ms.mean, b.prefill_compute_ms.mean);
    row("KV transfer mean (ms)", a.kv_transfer_ms.mean, b.kv_transfer_ms.mean);
    row("KV exposed mean (ms)", a.kv_transfer_exposed_ms.mean, b.kv_transfer_exposed_ms.mean);
    row("KV exposed p90 (ms)", a.kv_transfer_exposed_ms.p90, b.kv_transfer_exposed_ms.p90);
    row("decode queue mean (ms)", a.decode_queue_ms.mean, b.decode_queue_ms.mean);
  }
  return out;
}

GoodputPoint EvaluateGoodput(const std::vector<RequestRecord>& records, double slo_ttft_ms,
                             double slo_itl_ms) {
  GoodputPoint p;
  p.slo_ttft_ms = slo_ttft_ms;
  p.slo_itl_ms = slo_itl_ms;
  const Summary s = Summarize(records, slo_ttft_ms, /*slo_tpot_ms=*/1e300);
  p.ttft_ms = s.ttft_ms;
  p.itl_ms = s.itl_ms;
  p.request_throughput = s.request_throughput;
  p.output_token_throughput = s.output_token_throughput;
  for (const RequestRecord& r : records) {
    if (r.warmup) continue;
    ++p.requests;
    if (!r.ok || r.chunk_times_s.empty()) continue;
    if ((r.chunk_times_s.front() - r.send_s) * 1e3 > slo_ttft_ms) continue;
    std::vector<double> gaps;
    for (size_t i = 0; i < r.chunk_times_s.size(); ++i) {
      if (i > 0) gaps.push_back((r.chunk_times_s[i] - r.chunk_times_s[i - 1]) * 1e3);
      for (int k = 1; k < r.chunk_tokens[i]; ++k) gaps.push_back(0.0);
    }
    if (!gaps.empty() && Summarize(std::move(gaps)).p90 > slo_itl_ms) continue;
    ++p.met;
  }
  if (p.requests > 0) p.attainment = static_cast<double>(p.met) / p.requests;
  if (s.duration_s > 0) p.goodput = p.met / s.duration_s;
  return p;
}

std::vector<std::pair<std::string, double>> MaxRateWithinSlo(
    const std::vector<GoodputPoint>& points, double target) {
  std::vector<std::pair<std::string, double>> out;
  for (const GoodputPoint& p : points) {
    auto it = std::find_if(out.begin(), out.end(), [&](const auto& e) { return e.first == p.config; });
    if (it == out.end()) it = out.insert(out.end(), {p.config, 0.0});
    if (p.attainment >= target) it->second = std::max(it->second, p.rate);
  }
  return out;
}

namespace {

// Rates ascending, each with its points in their given order.
std::vector<std::pair<double, std::vector<const GoodputPoint*>>> ByRate(
    const std::vector<GoodputPoint>& points) {
  std::vector<std::pair<double, std::vector<const GoodputPoint*>>> out;
  for (const GoodputPoint& p : points) {
    auto it = std::find_if(out.begin(), out.end(), [&](const auto& e) { return e.first == p.rate; });
    if (it == out.end()) it = out.insert(out.end(), {p.rate, {}});
    it->second.push_back(&p);
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  return out;
}

// The candidate's SLO attainment against the best other configuration's at one rate (the same
// requests were offered to each, so this compares requests served within the SLOs without the
// noise of each run's own duration, goodput's denominator); nullopt when either is missing.
struct Verdict {
  bool holds = false;
  double ratio = 0;  // candidate / best other; 0 when the best other is 0
  std::string best_other;
};
std::optional<Verdict> Judge(const std::vector<const GoodputPoint*>& at_rate,
                             const std::string& candidate) {
  const GoodputPoint* c = nullptr;
  const GoodputPoint* best = nullptr;
  for (const GoodputPoint* p : at_rate) {
    if (p->config == candidate) {
      c = p;
    } else if (best == nullptr || p->attainment > best->attainment) {
      best = p;
    }
  }
  if (c == nullptr || best == nullptr) return std::nullopt;
  Verdict v;
  v.holds = c->attainment >= best->attainment;
  v.ratio = best->attainment > 0 ? c->attainment / best->attainment : 0;
  v.best_other = best->config;
  return v;
}

}  // namespace

std::string FormatGoodputTable(const std::vector<GoodputPoint>& points,
                               const std::string& candidate) {
  std::string out;
  if (points.empty()) return out;
  absl::StrAppendFormat(&out, "SLOs: TTFT <= %.0f ms and per-request ITL p90 <= %.0f ms\n",
                        points[0].slo_ttft_ms, points[0].slo_itl_ms);
  absl::StrAppendFormat(&out, "%6s  %-15s %5s %5s %7s %9s %9s %9s %8s %8s %7s %9s\n", "rate",
                        "config", "reqs", "met", "attain", "goodput", "TTFT p50", "TTFT p90",
                        "ITL p50", "ITL p90", "req/s", "out tok/s");
  const auto by_rate = ByRate(points);
  for (const auto& [rate, at_rate] : by_rate) {
    for (const GoodputPoint* p : at_rate) {
      absl::StrAppendFormat(&out, "%6.2f  %-15s %5d %5d %7.2f %9.3f %9.1f %9.1f %8.1f %8.1f %7.3f %9.1f\n",
                            rate, p->config, p->requests, p->met, p->attainment, p->goodput,
                            p->ttft_ms.median, p->ttft_ms.p90, p->itl_ms.median, p->itl_ms.p90,
                            p->request_throughput, p->output_token_throughput);
    }
  }
  absl::StrAppend(&out, "max rate with attainment >= 0.90:");
  for (const auto& [config, rate] : MaxRateWithinSlo(points)) {
    absl::StrAppendFormat(&out, "  %s %.2f", config, rate);
  }
  absl::StrAppend(&out, "\n");
  for (const auto& [rate, at_rate] : by_rate) {
    const std::optional<Verdict> v = Judge(at_rate, candidate);
    if (!v.has_value()) continue;
    absl::StrAppendFormat(&out, "rate %.2f: %s requests within SLO %s the best other's (%s), ratio %.3f\n", rate,
                          candidate, v->holds ? ">=" : "<", v->best_other, v->ratio);
  }
  return out;
}

nlohmann::json GoodputJson(const std::vector<GoodputPoint>& points, const std::string& candidate) {
  nlohmann::json j = nlohmann::json::object();
  nlohmann::json rows = nlohmann::json::array();
  for (const GoodputPoint& p : points) {
    rows.push_back({{"config", p.config},
                    {"rate", p.rate},
                    {"requests", p.requests},
                    {"met", p.met},
                    {"attainment", p.attainment},
                    {"goodput", p.goodput},
                    {"request_throughput", p.request_throughput},
                    {"output_token_throughput", p.output_token_throughput},
                    {"slo_ttft_ms", p.slo_ttft_ms},
                    {"slo_itl_ms", p.slo_itl_ms},
                    {"ttft_ms", DistJson(p.ttft_ms)},
                    {"itl_ms", DistJson(p.itl_ms)}});
  }
  j["points"] = rows;
  nlohmann::json max_rate = nlohmann::json::object();
  for (const auto& [config, rate] : MaxRateWithinSlo(points)) max_rate[config] = rate;
  j["max_rate_within_slo"] = max_rate;
  nlohmann::json verdicts = nlohmann::json::array();
  bool all = true, any = false;
  for (const auto& [rate, at_rate] : ByRate(points)) {
    const std::optional<Verdict> v = Judge(at_rate, candidate);
    if (!v.has_value()) continue;
    any = true;
    all &= v->holds;
    verdicts.push_back({{"rate", rate},
                        {"holds", v->holds},
                        {"ratio", v->ratio},
                        {"best_other", v->best_other}});
  }
  j["candidate"] = candidate;
  j["candidate_verdicts"] = verdicts;
  j["candidate_at_least_best_other_at_every_rate"] = any && all;
  return j;
}

}  // namespace deepinfer::bench
