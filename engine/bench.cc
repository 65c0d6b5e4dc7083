// Forward-pass throughput benchmark (not a test): prefill and decode tokens/s of a checkpoint on
// the CPU backend, through Model::Forward with a paged KV cache (the path LlmEngine runs).
//
// For every (batch, prompt) pair: prefill = `batch` sequences of `prompt` tokens in one Forward
// call (tokens/s = batch * prompt / time); decode = --decode_tokens steps of one token for each
// of the `batch` sequences, continuing after the prompt (tokens/s = batch * steps / time). A
// prompt of 0 measures decode from an empty context (llama-bench's tg). Each figure is the median
// of --reps repetitions after one warm-up pass. --step_tokens T > 1 runs each decode step with T
// tokens per sequence (logits for all of them), the shape of a speculative verification of T - 1
// drafts: decode tok/s then counts every token the steps ran, and the step time against T = 1 is
// what verifying costs. --after_tokens N > 0 runs an unmeasured step of N tokens per sequence
// (at the same positions, overwritten by the measured step) before each measured one: what a step
// costs right after a longer one, as an adaptive speculative node mixes draft lengths.
//
// --bandwidth also measures the machine's read bandwidth (all threads streaming a buffer much
// larger than the caches) and reports decode at batch 1 against the memory-bandwidth bound:
// bytes one step must read (every layer weight and the LM head, plus the KV it attends to; not
// the embedding table) / bandwidth.
//
//   bazel run -c opt //engine:bench -- --model /tmp/llama57m --batch 1,8,32 --prompt 0,512
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "engine/kv_cache.h"
#include "engine/model.h"
#include "kernels/cpu_features.h"
#include "kernels/thread_pool.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, model, "", "Model directory (Hugging Face layout).");
ABSL_FLAG(int, threads, 0, "Forward-pass threads (0: all cores).");
ABSL_FLAG(std::string, batch, "1", "Comma-separated batch sizes (sequences).");
ABSL_FLAG(std::string, prompt, "512", "Comma-separated prompt lengths (0: decode only).");
ABSL_FLAG(int, decode_tokens, 128, "Decode steps per measurement (0: skip decode).");
ABSL_FLAG(int, reps, 3, "Repetitions per figure; the median is reported.");
ABSL_FLAG(std::string, step_tokens, "1",
          "Comma-separated tokens per sequence in each decode step: 1 is plain decode, T > 1 the "
          "shape of a speculative verification of T - 1 drafts (logits for every token).");
ABSL_FLAG(int, after_tokens, 0,
          "> 0: before each measured decode step, an unmeasured step of this many tokens per "
          "sequence (what a step costs right after one of another shape).");
ABSL_FLAG(int, block_size, 16, "KV block size.");
ABSL_FLAG(bool, bandwidth, false, "Measure read bandwidth and the batch-1 decode bound.");
ABSL_FLAG(bool, json, false, "Print one JSON object instead of a table.");
ABSL_FLAG(std::string, logits_tokens, "",
          "Comma-separated token ids: print the logits after the last one as JSON and exit "
          "(to check another implementation's numerics on the same weights).");

namespace deepinfer::engine {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::vector<int> ParseList(const std::string& s, const char* flag) {
  std::vector<int> out;
  for (absl::string_view part : absl::StrSplit(s, ',', absl::SkipEmpty())) {
    int v = 0;
    if (!absl::SimpleAtoi(part, &v) || v < 0) {
      std::fprintf(stderr, "--%s: expected non-negative integers, got \"%s\"\n", flag, s.c_str());
      std::exit(2);
    }
    out.push_back(v);
  }
  return out;
}

// Read bandwidth in bytes/s: every thread sums its slice of a 1 GiB buffer; best of 5 passes.
double MeasureReadBandwidth(int threads) {
  const size_t words = (size_t{1} << 30) / sizeof(uint64_t);
  std::vector<uint64_t> buf(words);
  for (size_t i = 0; i < words; ++i) buf[i] = i;
  auto pool = kernels::ThreadPool::Create(threads);
  std::vector<uint64_t> sums(pool->num_threads() * 64);
  double best = 0;
  for (int pass = 0; pass < 5; ++pass) {
    const auto t0 = Clock::now();
    pool->ParallelFor(pool->num_threads(), 1, [&](int64_t b, int64_t e) {
      for (int64_t part = b; part < e; ++part) {
        const size_t begin = words / pool->num_threads() * part;
        const size_t end =
            part + 1 == pool->num_threads() ? words : begin + words / pool->num_threads();
        uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
        for (size_t i = begin; i + 4 <= end; i += 4) {
          s0 += buf[i];
          s1 += buf[i + 1];
          s2 += buf[i + 2];
          s3 += buf[i + 3];
        }
        sums[part * 64] = s0 + s1 + s2 + s3;
      }
    });
    const double s = Seconds(t0, Clock::now());
    best = std::max(best, static_cast<double>(words * sizeof(uint64_t)) / s);
  }
  uint64_t check = 0;
  for (uint64_t s : sums) check += s;
  if (check == 42) std::fprintf(stderr, " ");  // keeps the sums alive
  return best;
}

// Bytes one decode step at batch 1 reads at context `context`: every layer weight and the LM
// head in the checkpoint's precision, and the K/V rows it attends to. Dense models only.
double DecodeStepBytes(const Model& model, int64_t context) {
  const ModelConfig& c = model.config();
  const double e = kernels::DTypeSize(model.activation_dtype());
  const double h = c.hidden_size, q = static_cast<double>(c.num_heads) * c.head_dim,
               kv = static_cast<double>(c.num_kv_heads) * c.head_dim;
  const double layer = h * q * 2 + h * kv * 2 + 3.0 * h * c.intermediate_size;
  const double weights = (layer * c.num_layers + h * c.vocab_size) * e;
  const double kv_bytes = 2.0 * kv * e * c.num_layers * static_cast<double>(context);
  return weights + kv_bytes;
}

struct Row {
  int batch = 0;
  int prompt = 0;
  int step_tokens = 1;
  double prefill_tps = 0;  // 0 when prompt == 0
  double decode_tps = 0;   // 0 when decode_tokens == 0
  double decode_step_ms = 0;
};

int Run() {
  const std::string dir = absl::GetFlag(FLAGS_model);
  if (dir.empty()) {
    std::fprintf(stderr, "--model is required\n");
    return 2;
  }
  ModelOptions options;
  options.num_threads = absl::GetFlag(FLAGS_threads);
  auto model_or = Model::Load(dir, options);
  if (!model_or.ok()) {
    std::fprintf(stderr, "%s\n", model_or.status().ToString().c_str());
    return 1;
  }
  Model& model = **model_or;
  const ModelConfig& c = model.config();
  if (!absl::GetFlag(FLAGS_logits_tokens).empty()) {
    const std::vector<int> ids = ParseList(absl::GetFlag(FLAGS_logits_tokens), "logits_tokens");
    const int block = absl::GetFlag(FLAGS_block_size);
    const int blocks = static_cast<int>((ids.size() + block - 1) / block);
    auto cache = KvCache::Create(model.MakeKvCacheConfig(std::max(1, blocks), block));
    if (!cache.ok()) {
      std::fprintf(stderr, "%s\n", cache.status().ToString().c_str());
      return 1;
    }
    std::vector<int32_t> tokens(ids.begin(), ids.end()), table(std::max(1, blocks));
    for (int i = 0; i < blocks; ++i) table[i] = i;
    SequenceInput in;
    in.tokens = tokens.data();
    in.num_tokens = static_cast<int64_t>(tokens.size());
    in.block_table = table.data();
    in.num_blocks = static_cast<int64_t>(table.size());
    std::vector<float> logits;
    const absl::Status st = model.Forward({in}, cache->get(), &logits);
    if (!st.ok()) {
      std::fprintf(stderr, "%s\n", st.ToString().c_str());
      return 1;
    }
    std::printf("%s\n", nlohmann::json{{"logits", logits}}.dump().c_str());
    return 0;
  }
  const std::vector<int> batches = ParseList(absl::GetFlag(FLAGS_batch), "batch");
  const std::vector<int> prompts = ParseList(absl::GetFlag(FLAGS_prompt), "prompt");
  const std::vector<int> step_tokens = ParseList(absl::GetFlag(FLAGS_step_tokens), "step_tokens");
  const int steps = absl::GetFlag(FLAGS_decode_tokens);
  const int after = std::max(0, absl::GetFlag(FLAGS_after_tokens));
  const int reps = std::max(1, absl::GetFlag(FLAGS_reps));
  const int block = absl::GetFlag(FLAGS_block_size);
  const int threads = options.num_threads > 0
                          ? options.num_threads
                          : static_cast<int>(std::thread::hardware_concurrency());
  std::mt19937 rng(1);
  std::uniform_int_distribution<int32_t> token(0, c.vocab_size - 1);

  std::vector<Row> rows;
  for (int b : batches) {
    for (int prompt : prompts) {
      for (int per_step : step_tokens) {
        if (b <= 0 || per_step <= 0) continue;
        const int64_t per_seq =
            (prompt + static_cast<int64_t>(steps) * per_step + after + 1 + block - 1) / block;
        auto cache_or =
            KvCache::Create(model.MakeKvCacheConfig(static_cast<int>(per_seq * b), block));
        if (!cache_or.ok()) {
          std::fprintf(stderr, "%s\n", cache_or.status().ToString().c_str());
          return 1;
        }
        KvCache* cache = cache_or->get();
        std::vector<std::vector<int32_t>> tables(b);
        std::vector<std::vector<int32_t>> prompts_tok(b);
        for (int s = 0; s < b; ++s) {
          for (int64_t i = 0; i < per_seq; ++i)
            tables[s].push_back(static_cast<int32_t>(s * per_seq + i));
          for (int i = 0; i < prompt; ++i) prompts_tok[s].push_back(token(rng));
        }
        std::vector<float> logits;
        std::vector<double> prefill_s, decode_s;
        // Rep 0 is the warm-up.
        for (int rep = 0; rep <= reps; ++rep) {
          if (prompt > 0) {
            std::vector<SequenceInput> batch(b);
            for (int s = 0; s < b; ++s) {
              batch[s].tokens = prompts_tok[s].data();
              batch[s].num_tokens = prompt;
              batch[s].block_table = tables[s].data();
              batch[s].num_blocks = per_seq;
            }
            const auto t0 = Clock::now();
            const absl::Status st = model.Forward(batch, cache, &logits);
            const auto t1 = Clock::now();
            if (!st.ok()) {
              std::fprintf(stderr, "%s\n", st.ToString().c_str());
              return 1;
            }
            if (rep > 0) prefill_s.push_back(Seconds(t0, t1));
          }
          if (steps > 0) {
            // Per sequence: the greedy next token, then per_step - 1 random "drafts".
            std::vector<int32_t> next(static_cast<size_t>(b) * per_step);
            for (int32_t& t : next) t = token(rng);
            std::vector<int32_t> before(static_cast<size_t>(b) * after);
            for (int32_t& t : before) t = token(rng);
            // One step of `n` tokens per sequence (sequence s's at tokens + s * n) at `position`.
            auto run_step = [&](const std::vector<int32_t>& tokens, int n, int64_t position) {
              std::vector<SequenceInput> batch(b);
              for (int s = 0; s < b; ++s) {
                batch[s].tokens = tokens.data() + static_cast<int64_t>(s) * n;
                batch[s].num_tokens = n;
                batch[s].start_position = position;
                batch[s].block_table = tables[s].data();
                batch[s].num_blocks = per_seq;
                batch[s].all_logits = n > 1;
              }
              const absl::Status st = model.Forward(batch, cache, &logits);
              if (!st.ok()) std::fprintf(stderr, "%s\n", st.ToString().c_str());
              return st.ok();
            };
            double measured_s = 0.0;
            for (int step = 0; step < steps; ++step) {
              const int64_t position = prompt + static_cast<int64_t>(step) * per_step;
              if (after > 0 && !run_step(before, after, position)) return 1;
              const auto t0 = Clock::now();
              if (!run_step(next, per_step, position)) return 1;
              // Greedy next token after each sequence's last, as a generation loop would pick it.
              for (int s = 0; s < b; ++s) {
                const int64_t row = (static_cast<int64_t>(s) + 1) * per_step - 1;
                const float* l = logits.data() + row * c.vocab_size;
                next[static_cast<size_t>(s) * per_step] =
                    static_cast<int32_t>(std::max_element(l, l + c.vocab_size) - l);
              }
              measured_s += Seconds(t0, Clock::now());
            }
            if (rep > 0) decode_s.push_back(measured_s);
          }
        }
        Row r;
        r.batch = b;
        r.prompt = prompt;
        r.step_tokens = per_step;
        if (!prefill_s.empty()) r.prefill_tps = static_cast<double>(b) * prompt / Median(prefill_s);
        if (!decode_s.empty()) {
          const double t = Median(decode_s);
          r.decode_tps = static_cast<double>(b) * steps * per_step / t;
          r.decode_step_ms = t / steps * 1e3;
        }
        rows.push_back(r);
      }
    }
  }

  double bandwidth = 0;
  if (absl::GetFlag(FLAGS_bandwidth)) bandwidth = MeasureReadBandwidth(threads);

  nlohmann::json out;
  out["model"] = dir;
  out["threads"] = threads;
  out["isa"] = kernels::CpuIsaName(kernels::BestCpuIsa());
  out["decode_tokens"] = steps;
  out["reps"] = reps;
  out["after_tokens"] = after;
  for (const Row& r : rows) {
    nlohmann::json j;
    j["batch"] = r.batch;
    j["prompt"] = r.prompt;
    j["step_tokens"] = r.step_tokens;
    j["prefill_tokens_per_s"] = r.prefill_tps;
    j["decode_tokens_per_s"] = r.decode_tps;
    j["decode_step_ms"] = r.decode_step_ms;
    if (bandwidth > 0 && r.batch == 1 && r.step_tokens == 1 && r.decode_tps > 0) {
      // Average context over the decode steps.
      const double bytes = DecodeStepBytes(model, r.prompt + steps / 2);
      j["decode_step_bytes"] = bytes;
      j["decode_bound_tokens_per_s"] = bandwidth / bytes;
      j["decode_fraction_of_bound"] = r.decode_tps / (bandwidth / bytes);
    }
    out["rows"].push_back(j);
  }
  if (bandwidth > 0) out["read_bandwidth_gb_per_s"] = bandwidth / 1e9;

  if (absl::GetFlag(FLAGS_json)) {
    std::printf("%s\n", out.dump().c_str());
    return 0;
  }
  std::printf("model %s  threads %d  isa %s  decode steps %d  reps %d (medians)\n", dir.c_str(),
              threads, kernels::CpuIsaName(kernels::BestCpuIsa()), steps, reps);
  if (after > 0) std::printf("each measured step after an unmeasured one of %d tokens\n", after);
  std::printf("%6s %7s %6s %14s %14s %10s %12s\n", "batch", "prompt", "step", "prefill tok/s",
              "decode tok/s", "step ms", "of bw bound");
  for (const nlohmann::json& j : out["rows"]) {
    std::printf("%6d %7d %6d %14.1f %14.1f %10.3f", j["batch"].get<int>(), j["prompt"].get<int>(),
                j["step_tokens"].get<int>(), j["prefill_tokens_per_s"].get<double>(),
                j["decode_tokens_per_s"].get<double>(), j["decode_step_ms"].get<double>());
    if (j.contains("decode_fraction_of_bound")) {
      std::printf(" %11.0f%%", 100 * j["decode_fraction_of_bound"].get<double>());
    }
    std::printf("\n");
  }
  if (bandwidth > 0) std::printf("read bandwidth %.1f GB/s\n", bandwidth / 1e9);
  return 0;
}

}  // namespace
}  // namespace deepinfer::engine

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return deepinfer::engine::Run();
}
