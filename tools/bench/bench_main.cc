// deepinfer benchmark client: drives a router's public gRPC API with a reproducible workload and
// prints TTFT / TPOT / ITL / E2E, throughput and goodput (see tools/bench/report.h), or compares
// two routers on the same workload (--target_b), alternating runs so machine noise hits both, or
// runs a goodput comparison of several clusters over several arrival rates (--goodput_targets,
// tools/bench/goodput.sh).
//
//   bazel run //tools/bench -- --target=127.0.0.1:50051 --workload=coding --rate=2 --sessions=40
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "tools/bench/report.h"
#include "tools/bench/runner.h"
#include "tools/bench/workload.h"

ABSL_FLAG(std::string, target, "127.0.0.1:50051", "Router host:port (side A).");
ABSL_FLAG(std::string, target_b, "",
          "Comparison mode: a second router host:port (side B); runs alternate A, B, A, B...");
ABSL_FLAG(std::string, label_a, "A", "Name of side A in reports.");
ABSL_FLAG(std::string, label_b, "B", "Name of side B in reports.");
ABSL_FLAG(int, repeats, 1,
          "Comparison mode: runs per side (alternating); repeat k uses workload seed --seed + k.");
ABSL_FLAG(std::string, model, "", "Model id; empty = the router's only model.");
ABSL_FLAG(std::string, workload, "chat", "chat | coding | summarize | mixed (see workload.h).");
ABSL_FLAG(int, sessions, 50, "Sessions (conversations) in the workload, warm-up included.");
ABSL_FLAG(uint64_t, seed, 1, "Workload and arrival seed.");
ABSL_FLAG(std::string, mode, "open", "open (arrivals at --rate) | closed (--concurrency).");
ABSL_FLAG(double, rate, 1.0, "Open loop: session arrivals per second.");
ABSL_FLAG(double, burstiness, 1.0, "Open loop: gamma shape of inter-arrival gaps (1 = Poisson).");
ABSL_FLAG(int, concurrency, 4, "Closed loop: sessions in flight; also warm-up parallelism.");
ABSL_FLAG(int, max_in_flight, 256, "Open loop: cap on sessions in flight.");
ABSL_FLAG(int, warmup_sessions, 2, "Sessions run first and left out of the figures.");
ABSL_FLAG(absl::Duration, duration, absl::InfiniteDuration(),
          "Stop starting sessions after this long (default: run the whole workload).");
ABSL_FLAG(absl::Duration, request_timeout, absl::Minutes(5), "Deadline of each request.");
ABSL_FLAG(double, slo_ttft_ms, 1000, "Goodput SLO: TTFT at most this (ms).");
ABSL_FLAG(double, slo_tpot_ms, 100, "Goodput SLO: TPOT at most this (ms).");
ABSL_FLAG(int, chat_input_words, 120, "chat: median input words.");
ABSL_FLAG(int, chat_output_tokens, 100, "chat: median output tokens.");
ABSL_FLAG(int, coding_context_words, 600, "coding: shared context words per session.");
ABSL_FLAG(int, coding_turns, 4, "coding: turns per session.");
ABSL_FLAG(int, coding_answer_tokens, 64, "coding: answer tokens per turn.");
ABSL_FLAG(double, coding_think_time_s, 0.0, "coding: pause between turns (s).");
ABSL_FLAG(double, mixed_coding_fraction, 0.25, "mixed: share of sessions that are coding ones.");
ABSL_FLAG(int, summarize_document_words, 1200, "summarize: document words.");
ABSL_FLAG(int, summarize_output_tokens, 32, "summarize: summary tokens.");
ABSL_FLAG(int, max_input_words, 1500, "Clamp on generated input lengths (words).");
ABSL_FLAG(int, max_output_tokens, 512, "Clamp on output lengths (tokens).");
ABSL_FLAG(bool, json, false, "Print the summary (and comparison) as JSON instead of tables.");
ABSL_FLAG(std::vector<std::string>, goodput_targets, {},
          "Goodput mode: NAME=HOST:PORT of each configuration's router, comma-separated; at each "
          "--goodput_rates rate every configuration gets the same workload (seed --seed + the "
          "rate's index: fresh prompts per rate), in an order rotated per rate.");
ABSL_FLAG(std::string, goodput_rates, "0.5,1,2",
          "Goodput mode: open-loop session arrival rates (per second), comma-separated.");
ABSL_FLAG(double, slo_itl_ms, 100,
          "Goodput mode: a request meets the ITL SLO when the p90 of its own ITL gaps is at "
          "most this (ms); the TTFT SLO is --slo_ttft_ms.");
ABSL_FLAG(std::string, goodput_candidate, "conditional",
          "Goodput mode: the configuration judged against the best other at every rate.");
ABSL_FLAG(std::string, goodput_json, "", "Goodput mode: write the table as JSON here.");
ABSL_FLAG(std::string, records_out, "",
          "Write every request record as JSON lines here (for tools/bench/plot.py).");

namespace deepinfer::bench {
namespace {

// --goodput_targets: every configuration at every rate, the same workload per rate.
int GoodputMain(WorkloadOptions w, RunnerOptions r) {
  std::vector<std::pair<std::string, std::string>> configs;
  for (const std::string& t : absl::GetFlag(FLAGS_goodput_targets)) {
    const std::vector<std::string> kv = absl::StrSplit(t, absl::MaxSplits('=', 1));
    if (kv.size() != 2 || kv[0].empty() || kv[1].empty()) {
      std::fprintf(stderr, "error: --goodput_targets: expected NAME=HOST:PORT, got \"%s\"\n",
                   t.c_str());
      return 2;
    }
    configs.emplace_back(kv[0], kv[1]);
  }
  std::vector<double> rates;
  for (absl::string_view s :
       absl::StrSplit(absl::GetFlag(FLAGS_goodput_rates), ',', absl::SkipEmpty())) {
    double rate = 0;
    if (!absl::SimpleAtod(s, &rate) || !(rate > 0) || !std::isfinite(rate)) {
      std::fprintf(stderr, "error: --goodput_rates: expected positive numbers, got \"%s\"\n",
                   std::string(s).c_str());
      return 2;
    }
    rates.push_back(rate);
  }
  if (rates.empty()) {
    std::fprintf(stderr, "error: --goodput_rates: expected at least one rate\n");
    return 2;
  }
  const double slo_ttft = absl::GetFlag(FLAGS_slo_ttft_ms);
  const double slo_itl = absl::GetFlag(FLAGS_slo_itl_ms);
  const std::string candidate = absl::GetFlag(FLAGS_goodput_candidate);
  std::ofstream records_out;
  if (!absl::GetFlag(FLAGS_records_out).empty()) {
    records_out.open(absl::GetFlag(FLAGS_records_out));
    if (!records_out) {
      std::fprintf(stderr, "error: --records_out: cannot write %s\n",
                   absl::GetFlag(FLAGS_records_out).c_str());
      return 2;
    }
  }
  r.mode = "open";
  std::vector<GoodputPoint> points;
  for (size_t i = 0; i < rates.size(); ++i) {
    // Fresh prompts per rate: the clusters keep their prefix caches from one rate to the next.
    w.seed = absl::GetFlag(FLAGS_seed) + i;
    r.seed = w.seed;
    r.rate = rates[i];
    auto sessions = GenerateWorkload(w);
    if (!sessions.ok()) {
      std::fprintf(stderr, "error: %s\n", sessions.status().ToString().c_str());
      return 2;
    }
    for (size_t k = 0; k < configs.size(); ++k) {
      const auto& [name, target] = configs[(i + k) % configs.size()];
      r.target = target;
      RunStats stats;
      std::fprintf(stderr, "rate %.2f: %s (%s) ...\n", rates[i], name.c_str(), target.c_str());
      auto records = RunWorkload(*sessions, r, &stats);
      if (!records.ok()) {
        std::fprintf(stderr, "error: %s: %s\n", name.c_str(), records.status().ToString().c_str());
        return 1;
      }
      if (stats.arrivals_delayed > 0) {
        std::fprintf(stderr, "warning: %s: %lld arrivals waited for --max_in_flight\n",
                     name.c_str(), static_cast<long long>(stats.arrivals_delayed));
      }
      if (records_out.is_open()) {
        for (const RequestRecord& rec : *records) {
          nlohmann::json j = RecordJson(rec);
          j["side"] = name;
          j["rate"] = rates[i];
          records_out << j.dump() << "\n";
        }
      }
      GoodputPoint p = EvaluateGoodput(*records, slo_ttft, slo_itl);
      p.config = name;
      p.rate = rates[i];
      points.push_back(std::move(p));
    }
  }
  // Rows in the configurations' given order at each rate, whatever order they ran in.
  std::stable_sort(points.begin(), points.end(), [&](const GoodputPoint& a, const GoodputPoint& b) {
    auto index = [&](const std::string& c) {
      return std::find_if(configs.begin(), configs.end(),
                          [&](const auto& e) { return e.first == c; }) -
             configs.begin();
    };
    return a.rate != b.rate ? a.rate < b.rate : index(a.config) < index(b.config);
  });
  if (!absl::GetFlag(FLAGS_goodput_json).empty()) {
    std::ofstream out(absl::GetFlag(FLAGS_goodput_json));
    out << GoodputJson(points, candidate).dump(2) << "\n";
    if (!out) {
      std::fprintf(stderr, "error: --goodput_json: cannot write %s\n",
                   absl::GetFlag(FLAGS_goodput_json).c_str());
      return 2;
    }
  }
  std::printf("%s", FormatGoodputTable(points, candidate).c_str());
  for (const GoodputPoint& p : points) {
    if (p.requests == 0) return 1;
  }
  return 0;
}

int Main() {
  WorkloadOptions w;
  w.kind = absl::GetFlag(FLAGS_workload);
  w.seed = absl::GetFlag(FLAGS_seed);
  w.sessions = absl::GetFlag(FLAGS_sessions);
  w.chat_input_words = absl::GetFlag(FLAGS_chat_input_words);
  w.chat_output_tokens = absl::GetFlag(FLAGS_chat_output_tokens);
  w.coding_context_words = absl::GetFlag(FLAGS_coding_context_words);
  w.coding_turns = absl::GetFlag(FLAGS_coding_turns);
  w.coding_answer_tokens = absl::GetFlag(FLAGS_coding_answer_tokens);
  w.coding_think_time_s = absl::GetFlag(FLAGS_coding_think_time_s);
  w.mixed_coding_fraction = absl::GetFlag(FLAGS_mixed_coding_fraction);
  w.summarize_document_words = absl::GetFlag(FLAGS_summarize_document_words);
  w.summarize_output_tokens = absl::GetFlag(FLAGS_summarize_output_tokens);
  w.max_input_words = absl::GetFlag(FLAGS_max_input_words);
  w.max_output_tokens = absl::GetFlag(FLAGS_max_output_tokens);
  auto sessions = GenerateWorkload(w);
  if (!sessions.ok()) {
    std::fprintf(stderr, "error: %s\n", sessions.status().ToString().c_str());
    return 2;
  }
  RunnerOptions r;
  r.model = absl::GetFlag(FLAGS_model);
  r.mode = absl::GetFlag(FLAGS_mode);
  r.rate = absl::GetFlag(FLAGS_rate);
  r.burstiness = absl::GetFlag(FLAGS_burstiness);
  r.concurrency = absl::GetFlag(FLAGS_concurrency);
  r.max_in_flight = absl::GetFlag(FLAGS_max_in_flight);
  r.warmup_sessions = absl::GetFlag(FLAGS_warmup_sessions);
  r.duration = absl::GetFlag(FLAGS_duration);
  r.request_timeout = absl::GetFlag(FLAGS_request_timeout);
  r.seed = absl::GetFlag(FLAGS_seed);
  const double slo_ttft = absl::GetFlag(FLAGS_slo_ttft_ms);
  const double slo_tpot = absl::GetFlag(FLAGS_slo_tpot_ms);

  if (!absl::GetFlag(FLAGS_goodput_targets).empty()) return GoodputMain(w, r);

  std::vector<std::pair<std::string, std::string>> sides = {
      {absl::GetFlag(FLAGS_label_a), absl::GetFlag(FLAGS_target)}};
  const bool compare = !absl::GetFlag(FLAGS_target_b).empty();
  if (compare) sides.push_back({absl::GetFlag(FLAGS_label_b), absl::GetFlag(FLAGS_target_b)});
  const int repeats = compare ? std::max(1, absl::GetFlag(FLAGS_repeats)) : 1;

  std::vector<std::vector<RequestRecord>> all(sides.size());
  std::ofstream records_out;
  if (!absl::GetFlag(FLAGS_records_out).empty()) {
    records_out.open(absl::GetFlag(FLAGS_records_out));
    if (!records_out) {
      std::fprintf(stderr, "error: --records_out: cannot write %s\n",
                   absl::GetFlag(FLAGS_records_out).c_str());
      return 2;
    }
  }
  for (int rep = 0; rep < repeats; ++rep) {
    // Each repeat sends a fresh workload (seed + repeat), the same to every side: resending the
    // previous repeat's prompts would measure the prefix caches it left behind.
    if (rep > 0) {
      w.seed = absl::GetFlag(FLAGS_seed) + static_cast<uint64_t>(rep);
      sessions = GenerateWorkload(w);
      if (!sessions.ok()) return 2;
    }
    for (size_t s = 0; s < sides.size(); ++s) {
      r.target = sides[s].second;
      RunStats stats;
      std::fprintf(stderr, "run %d/%d: %s (%s) ...\n", rep + 1, repeats, sides[s].first.c_str(),
                   r.target.c_str());
      auto records = RunWorkload(*sessions, r, &stats);
      if (!records.ok()) {
        std::fprintf(stderr, "error: %s\n", records.status().ToString().c_str());
        return 1;
      }
      if (stats.arrivals_delayed > 0) {
        std::fprintf(stderr, "warning: %lld arrivals waited for --max_in_flight\n",
                     static_cast<long long>(stats.arrivals_delayed));
      }
      for (RequestRecord& rec : *records) {
        if (records_out.is_open()) {
          nlohmann::json j = RecordJson(rec);
          j["side"] = sides[s].first;
          j["repeat"] = rep;
          records_out << j.dump() << "\n";
        }
        all[s].push_back(std::move(rec));
      }
    }
  }
  std::vector<Summary> summaries;
  for (const auto& recs : all) summaries.push_back(Summarize(recs, slo_ttft, slo_tpot));
  if (absl::GetFlag(FLAGS_json)) {
    nlohmann::json out = nlohmann::json::object();
    for (size_t s = 0; s < sides.size(); ++s) out[sides[s].first] = SummaryJson(summaries[s]);
    std::printf("%s\n", out.dump(2).c_str());
  } else {
    for (size_t s = 0; s < sides.size(); ++s) {
      std::printf("%s", FormatSummary(summaries[s], absl::StrCat("Serving Benchmark Result: ",
                                                                 sides[s].first))
                            .c_str());
    }
    if (compare) {
      std::printf("%s", FormatComparison(summaries[0], sides[0].first, summaries[1],
                                         sides[1].first)
                            .c_str());
    }
  }
  for (const Summary& s : summaries) {
    if (s.completed == 0) return 1;
  }
  return 0;
}

}  // namespace
}  // namespace deepinfer::bench

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Benchmark a deepinfer router: TTFT, ITL, throughput, goodput; --target_b compares two.");
  absl::ParseCommandLine(argc, argv);
  return deepinfer::bench::Main();
}
