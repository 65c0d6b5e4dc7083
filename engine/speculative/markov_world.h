// Test-only: a small Markov target/draft pair with known per-position distributions, for
// statistical tests of speculative sampling (verifier_test, adaptive_lossless_test).
#ifndef DEEPINFER_ENGINE_SPECULATIVE_MARKOV_WORLD_H_
#define DEEPINFER_ENGINE_SPECULATIVE_MARKOV_WORLD_H_

#include <algorithm>
#include <cstdio>
#include <vector>

#include "engine/sampler.h"
#include "engine/speculative/chi_square.h"
#include "engine/speculative/verifier.h"
#include "gtest/gtest.h"

namespace deepinfer::engine::speculative {

// A Markov "model" over a small vocabulary: the target's logits at output position `pos` depend
// on the previous token; the draft's distribution likewise (with zeros where the target has
// mass, and mass where the target, after top-k, has none).
struct MarkovWorld {
  static constexpr int kVocab = 5;
  static constexpr int kPositions = 4;  // output positions checked
  static constexpr int kMaxDraft = 4;
  static constexpr int kRows = kPositions + kMaxDraft + 1;

  explicit MarkovWorld(const SamplingParams& params) {
    SpecRng rng(2024);
    TargetProcessor proc(params);
    target_logits.resize(kRows * kVocab * kVocab);
    target.resize(kRows * kVocab * kVocab);
    draft.resize(kRows * kVocab * kVocab);
    for (int pos = 0; pos < kRows; ++pos) {
      for (int prev = 0; prev < kVocab; ++prev) {
        float* l = &target_logits[(pos * kVocab + prev) * kVocab];
        for (int i = 0; i < kVocab; ++i) l[i] = static_cast<float>(rng.Uniform() * 3.0);
        std::vector<double> p;
        proc.Distribution(l, kVocab, {}, &p);
        std::copy(p.begin(), p.end(), &target[(pos * kVocab + prev) * kVocab]);
        float* q = &draft[(pos * kVocab + prev) * kVocab];
        double sum = 0.0;
        for (int i = 0; i < kVocab; ++i) {
          q[i] = i == (pos + prev) % kVocab ? 0.0f : static_cast<float>(0.05 + rng.Uniform());
          sum += q[i];
        }
        for (int i = 0; i < kVocab; ++i) q[i] = static_cast<float>(q[i] / sum);
      }
    }
  }
  const float* TargetLogits(int pos, int prev) const {
    return &target_logits[(pos * kVocab + prev) * kVocab];
  }
  const double* Target(int pos, int prev) const { return &target[(pos * kVocab + prev) * kVocab]; }
  const float* Draft(int pos, int prev) const { return &draft[(pos * kVocab + prev) * kVocab]; }

  // Expected distribution of position 0 (kVocab cells) and of the pair (pos - 1, pos) for
  // pos >= 1 (kVocab^2 cells), starting from token 0.
  std::vector<std::vector<double>> Expected() const {
    std::vector<std::vector<double>> out;
    std::vector<double> marginal(Target(0, 0), Target(0, 0) + kVocab);
    out.push_back(marginal);
    for (int pos = 1; pos < kPositions; ++pos) {
      std::vector<double> pair(kVocab * kVocab), next(kVocab);
      for (int a = 0; a < kVocab; ++a) {
        for (int b = 0; b < kVocab; ++b) {
          pair[a * kVocab + b] = marginal[a] * Target(pos, a)[b];
          next[b] += pair[a * kVocab + b];
        }
      }
      out.push_back(pair);
      marginal = next;
    }
    return out;
  }

  std::vector<float> target_logits;
  std::vector<double> target;
  std::vector<float> draft;
};

// Chi-square of every position's counts against `expected`; expects p > 0.01 and no impossible
// outcome; prints the figures and returns the smallest p-value.
inline double CheckAgainst(const std::vector<std::vector<int64_t>>& counts,
                           const std::vector<std::vector<double>>& expected, const char* label) {
  double min_p = 1.0;
  for (size_t pos = 0; pos < counts.size(); ++pos) {
    const ChiSquare r = ChiSquareTest(counts[pos], expected[pos]);
    std::printf("%s position %zu: chi2 %.2f dof %d p %.4f\n", label, pos, r.statistic, r.dof,
                r.p_value);
    EXPECT_EQ(r.impossible, 0) << label << " position " << pos;
    EXPECT_GT(r.p_value, 0.01) << label << " position " << pos;
    min_p = std::min(min_p, r.p_value);
  }
  return min_p;
}

}  // namespace deepinfer::engine::speculative

#endif  // DEEPINFER_ENGINE_SPECULATIVE_MARKOV_WORLD_H_
