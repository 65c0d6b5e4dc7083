#include "engine/speculative/verifier.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <vector>

#include "engine/sampler.h"
#include "engine/speculative/chi_square.h"
#include "engine/speculative/markov_world.h"
#include "gtest/gtest.h"

namespace deepinfer::engine::speculative {
namespace {

SamplingParams Params(float temperature, uint64_t seed = 11) {
  SamplingParams p;
  p.temperature = temperature;
  p.has_seed = true;
  p.seed = seed;
  return p;
}

std::vector<float> Logits(int vocab, uint64_t seed, float scale = 2.0f) {
  SpecRng rng(seed);
  std::vector<float> l(vocab);
  for (float& x : l) x = static_cast<float>((rng.Uniform() - 0.5) * 2 * scale);
  return l;
}

// --- TargetProcessor against Sampler --------------------------------------------------------

TEST(TargetProcessorTest, MatchesSamplerEmpirically) {
  const int vocab = 8;
  const std::vector<float> logits = Logits(vocab, 5);
  const std::vector<int32_t> prompt = {1, 2, 2};
  const std::vector<int32_t> outputs = {3, 3, 5};
  std::vector<SamplingParams> configs;
  configs.push_back(Params(1.0f));
  configs.push_back(Params(0.6f));
  configs.back().top_k = 3;
  configs.push_back(Params(1.3f));
  configs.back().top_p = 0.7f;
  configs.push_back(Params(1.0f));
  configs.back().min_p = 0.3f;
  configs.push_back(Params(0.8f));
  configs.back().repetition_penalty = 1.4f;
  configs.back().presence_penalty = 0.5f;
  configs.back().frequency_penalty = 0.3f;
  configs.back().top_k = 6;
  configs.back().top_p = 0.95f;
  for (size_t c = 0; c < configs.size(); ++c) {
    Sampler sampler(configs[c]);
    TargetProcessor processor(configs[c]);
    sampler.AddPromptTokens(prompt.data(), prompt.size());
    processor.AddPromptTokens(prompt.data(), prompt.size());
    for (int32_t t : outputs) {
      sampler.AddOutputToken(t);
      processor.AddOutputToken(t);
    }
    std::vector<double> probs;
    processor.Distribution(logits.data(), vocab, {}, &probs);
    double sum = 0.0;
    for (double p : probs) sum += p;
    EXPECT_NEAR(sum, 1.0, 1e-12);
    std::vector<int64_t> counts(vocab);
    const int n = 200000;
    for (int i = 0; i < n; ++i) ++counts[sampler.Sample(logits.data(), vocab).token];
    const ChiSquare r = ChiSquareTest(counts, probs);
    std::printf("processor vs Sampler config %zu: chi2 %.2f dof %d p %.4f\n", c, r.statistic, r.dof,
                r.p_value);
    EXPECT_EQ(r.impossible, 0) << "config " << c;
    EXPECT_GT(r.p_value, 0.01) << "config " << c;
  }
}

TEST(TargetProcessorTest, GreedyIsSamplersArgmaxAndPointMass) {
  SamplingParams p = Params(0.0f);
  p.repetition_penalty = 1.5f;
  Sampler sampler(p);
  TargetProcessor processor(p);
  const std::vector<int32_t> prompt = {4};
  sampler.AddPromptTokens(prompt.data(), 1);
  processor.AddPromptTokens(prompt.data(), 1);
  for (uint64_t seed = 0; seed < 50; ++seed) {
    const std::vector<float> l = Logits(16, seed, 0.5f);
    const int32_t want = sampler.Sample(l.data(), 16).token;
    EXPECT_EQ(processor.Greedy(l.data(), 16, {}), want);
    std::vector<double> probs;
    processor.Distribution(l.data(), 16, {}, &probs);
    EXPECT_EQ(probs[want], 1.0);
  }
}

TEST(TargetProcessorTest, PendingTokensCountLikeRecordedOnes) {
  SamplingParams p = Params(0.9f);
  p.repetition_penalty = 1.2f;
  p.presence_penalty = 0.4f;
  p.frequency_penalty = 0.7f;
  p.top_k = 10;
  const std::vector<float> l = Logits(12, 9);
  TargetProcessor a(p), b(p);
  a.AddOutputToken(3);
  b.AddOutputToken(3);
  const std::vector<int32_t> pending = {3, 7, 7};
  for (int32_t t : pending) b.AddOutputToken(t);
  std::vector<double> pa, pb, again;
  a.Distribution(l.data(), 12, pending, &pa);
  b.Distribution(l.data(), 12, {}, &pb);
  EXPECT_EQ(pa, pb);
  // Pending tokens leave no trace.
  TargetProcessor c(p);
  c.AddOutputToken(3);
  std::vector<double> pc;
  a.Distribution(l.data(), 12, {}, &again);
  c.Distribution(l.data(), 12, {}, &pc);
  EXPECT_EQ(again, pc);
  EXPECT_NE(again, pa);
}

// --- Greedy ---------------------------------------------------------------------------------

// A deterministic "model": logits from a hash of the whole context.
std::vector<float> ModelLogits(const std::vector<int32_t>& context, int vocab) {
  uint64_t h = 1469598103934665603ULL;
  for (int32_t t : context) h = (h ^ static_cast<uint32_t>(t)) * 1099511628211ULL;
  return Logits(vocab, h, 1.0f);
}

TEST(VerifierTest, GreedyIsExactlyPlainGreedyDecoding) {
  const int vocab = 20;
  for (int variant = 0; variant < 2; ++variant) {
    SamplingParams p = Params(0.0f);
    if (variant == 1) {
      p.repetition_penalty = 1.3f;
      p.frequency_penalty = 0.2f;
    }
    const std::vector<int32_t> prompt = {1, 2, 3};
    // Reference: one token at a time through Sampler.
    Sampler sampler(p);
    sampler.AddPromptTokens(prompt.data(), prompt.size());
    std::vector<int32_t> ref = prompt;
    const int n = 60;
    for (int i = 0; i < n; ++i) {
      const int32_t t = sampler.Sample(ModelLogits(ref, vocab).data(), vocab).token;
      sampler.AddOutputToken(t);
      ref.push_back(t);
    }
    // Speculative: drafts are the reference continuation with random corruptions.
    Verifier verifier(p, 77);
    verifier.AddPromptTokens(prompt.data(), prompt.size());
    SpecRng rng(variant);
    std::vector<int32_t> out = prompt;
    int steps = 0, accepted_total = 0;
    while (out.size() < ref.size()) {
      const int k = rng.Next() % 6;
      std::vector<int32_t> draft;
      for (int j = 0; j < k; ++j) {
        const size_t pos = out.size() + j;
        const bool corrupt = rng.Uniform() < 0.2 || pos >= ref.size();
        draft.push_back(corrupt ? static_cast<int32_t>(rng.Next() % vocab) : ref[pos]);
      }
      std::vector<float> rows;
      std::vector<int32_t> ctx = out;
      for (int j = 0; j <= k; ++j) {
        const std::vector<float> l = ModelLogits(ctx, vocab);
        rows.insert(rows.end(), l.begin(), l.end());
        if (j < k) ctx.push_back(draft[j]);
      }
      VerifyResult r;
      ASSERT_TRUE(verifier.Verify(rows.data(), vocab, draft, {}, &r).ok());
      ASSERT_EQ(r.tokens.size(), static_cast<size_t>(r.accepted + 1));
      for (int j = 0; j < r.accepted; ++j) EXPECT_EQ(r.tokens[j].token, draft[j]);
      for (const SampleResult& s : r.tokens) out.push_back(s.token);
      accepted_total += r.accepted;
      ++steps;
    }
    out.resize(ref.size());
    EXPECT_EQ(out, ref) << "variant " << variant;
    EXPECT_LT(steps, n);  // drafts did get accepted
    EXPECT_GT(accepted_total, 0);
  }
}

TEST(VerifierTest, RejectsBadInputAndRecordsNothing) {
  Verifier v(Params(1.0f));
  const std::vector<float> rows(3 * 4, 0.0f);
  VerifyResult r;
  EXPECT_EQ(v.Verify(rows.data(), 0, {}, {}, &r).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(v.Verify(rows.data(), 4, std::vector<int32_t>{1, 4}, {}, &r).code(),
            absl::StatusCode::kInvalidArgument);
  const std::vector<float> probs(5, 0.2f);
  EXPECT_EQ(v.Verify(rows.data(), 4, std::vector<int32_t>{1, 2}, probs, &r).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(v.Verify(rows.data(), 4, {}, {}, &r).ok());  // no drafts: a plain sample
  EXPECT_EQ(r.accepted, 0);
  EXPECT_EQ(r.tokens.size(), 1u);
}

TEST(VerifierTest, LogprobsAreOfTheRawRows) {
  SamplingParams p = Params(0.0f);
  p.logprobs = 2;
  Verifier v(p);
  const std::vector<float> rows = {0.0f, 1.0f, 2.0f, 3.0f, 0.0f, 0.0f};  // 2 rows, vocab 3
  VerifyResult r;
  ASSERT_TRUE(v.Verify(rows.data(), 3, std::vector<int32_t>{2}, {}, &r).ok());
  ASSERT_EQ(r.accepted, 1);
  ASSERT_EQ(r.tokens.size(), 2u);
  const double z0 = std::log(1 + std::exp(1.0) + std::exp(2.0));
  EXPECT_NEAR(r.tokens[0].logprob, 2.0 - z0, 1e-5);
  ASSERT_EQ(r.tokens[0].top.size(), 2u);
  EXPECT_EQ(r.tokens[0].top[0].token, 2);
  EXPECT_EQ(r.tokens[0].top[1].token, 1);
  EXPECT_EQ(r.tokens[1].token, 0);  // bonus: arg-max of row 1 (3, 0, 0)
  EXPECT_NEAR(r.tokens[1].logprob, 3.0 - std::log(std::exp(3.0) + 2), 1e-5);
}

TEST(VerifierTest, DraftEqualToTargetIsAlwaysAcceptedAndZeroDraftProbabilityNever) {
  const int vocab = 4;
  const std::vector<float> logits = {std::log(0.1f), std::log(0.2f), std::log(0.3f),
                                     std::log(0.4f)};
  std::vector<float> rows = logits;
  rows.insert(rows.end(), logits.begin(), logits.end());
  Verifier v(Params(1.0f));
  std::vector<double> p;
  v.processor().Distribution(logits.data(), vocab, {}, &p);
  std::vector<float> same(p.begin(), p.end());
  std::vector<float> zero_on_2 = {0.5f, 0.5f, 0.0f, 0.0f};
  for (int i = 0; i < 1000; ++i) {
    VerifyResult r;
    ASSERT_TRUE(v.Verify(rows.data(), vocab, std::vector<int32_t>{i % 4}, same, &r).ok());
    EXPECT_EQ(r.accepted, 1);
    ASSERT_TRUE(v.Verify(rows.data(), vocab, std::vector<int32_t>{2}, zero_on_2, &r).ok());
    EXPECT_EQ(r.accepted, 0);
    EXPECT_NE(r.tokens[0].token, 0);  // residual max(0, p - q) is 0 on tokens 0 and 1
    EXPECT_NE(r.tokens[0].token, 1);
  }
}

// --- Losslessness ---------------------------------------------------------------------------

// Runs `trials` generations of kPositions tokens; `verify_len(step)` gives the draft length of
// each step. Counts position 0 and the pairs (pos - 1, pos).
template <typename LenFn>
std::vector<std::vector<int64_t>> Simulate(const MarkovWorld& w, Verifier* verifier,
                                           bool with_probs, int64_t trials, LenFn verify_len,
                                           uint64_t seed) {
  constexpr int V = MarkovWorld::kVocab;
  std::vector<std::vector<int64_t>> counts(MarkovWorld::kPositions);
  counts[0].assign(V, 0);
  for (int pos = 1; pos < MarkovWorld::kPositions; ++pos) counts[pos].assign(V * V, 0);
  SpecRng rng(seed);
  std::vector<float> rows, probs;
  std::vector<int32_t> draft;
  int32_t emitted[MarkovWorld::kPositions + MarkovWorld::kMaxDraft + 1];
  VerifyResult r;
  for (int64_t t = 0; t < trials; ++t) {
    int pos = 0;
    int32_t prev = 0;
    while (pos < MarkovWorld::kPositions) {
      const int k = verify_len();
      draft.clear();
      probs.clear();
      rows.assign(w.TargetLogits(pos, prev), w.TargetLogits(pos, prev) + V);
      int32_t dprev = prev;
      for (int j = 0; j < k; ++j) {
        const float* q = w.Draft(pos + j, dprev);
        double u = rng.Uniform(), cum = 0.0;
        int32_t x = V - 1;
        for (int i = 0; i < V; ++i) {
          cum += q[i];
          if (u < cum) {
            x = i;
            break;
          }
        }
        if (q[x] == 0.0f) x = 0;  // rounding at the top; token 0 is never the zero here
        draft.push_back(x);
        if (with_probs) probs.insert(probs.end(), q, q + V);
        rows.insert(rows.end(), w.TargetLogits(pos + j + 1, x), w.TargetLogits(pos + j + 1, x) + V);
        dprev = x;
      }
      if (!verifier->Verify(rows.data(), V, draft, probs, &r).ok()) std::abort();
      for (const SampleResult& s : r.tokens) emitted[pos++] = prev = s.token;
    }
    ++counts[0][emitted[0]];
    for (int p = 1; p < MarkovWorld::kPositions; ++p) ++counts[p][emitted[p - 1] * V + emitted[p]];
  }
  return counts;
}

TEST(VerifierLosslessTest, EveryVerifyLengthWithAndWithoutDraftProbabilities) {
  SamplingParams params = Params(0.9f);
  params.top_k = 4;  // one token of every target row gets probability 0
  const MarkovWorld world(params);
  const auto expected = world.Expected();
  const int64_t trials = 1000000;
  for (int with_probs = 0; with_probs < 2; ++with_probs) {
    for (int len = 1; len <= MarkovWorld::kMaxDraft; ++len) {
      const auto start = std::chrono::steady_clock::now();
      Verifier verifier(params, 1000 + len + 10 * with_probs);
      const auto counts = Simulate(
          world, &verifier, with_probs, trials, [len] { return len; }, 500 + len + 10 * with_probs);
      const double secs =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      char label[96];
      std::snprintf(label, sizeof(label), "len %d %s (%.2f s)", len,
                    with_probs ? "draft probs" : "point masses", secs);
      CheckAgainst(counts, expected, label);
    }
  }
}

}  // namespace
}  // namespace deepinfer::engine::speculative
