#include "engine/speculative/verifier.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "absl/strings/str_cat.h"
#include "kernels/softmax_cpu.h"

namespace deepinfer::engine::speculative {

SpecRng::SpecRng(uint64_t seed) {
  for (uint64_t& s : s_) {
    seed += 0x9e3779b97f4a7c15ULL;
    uint64_t z = seed;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    s = z ^ (z >> 31);
  }
}

Verifier::Verifier(const SamplingParams& params)
    : Verifier(params, params.has_seed ? params.seed : std::random_device{}()) {}

Verifier::Verifier(const SamplingParams& params, uint64_t seed) : processor_(params), rng_(seed) {}

int32_t Verifier::Draw(const std::vector<double>& weights, double total) {
  const double u = rng_.Uniform() * total;
  double cum = 0.0;
  int32_t last = -1;
  for (size_t i = 0; i < weights.size(); ++i) {
    if (weights[i] <= 0.0) continue;
    last = static_cast<int32_t>(i);
    cum += weights[i];
    if (u < cum) return last;
  }
  return last;  // rounding left u at the very top: the last token with weight
}

SampleResult Verifier::Result(const float* logits, int vocab, int32_t token) const {
  SampleResult result;
  result.token = token;
  const float raw_max = kernels::RowMaxCpu(logits, vocab);
  const double raw_sum = kernels::SumExpCpu(logits, vocab, raw_max);
  const float log_z = raw_max + static_cast<float>(std::log(raw_sum));
  result.logprob = logits[token] - log_z;
  const int n = std::min(processor_.params().logprobs, vocab);
  if (n > 0) {
    std::vector<int32_t> order(vocab);
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + n, order.end(), [&](int32_t a, int32_t b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
    for (int i = 0; i < n; ++i) result.top.push_back({order[i], logits[order[i]] - log_z});
  }
  return result;
}

SampleResult Verifier::Sample(const float* logits, int vocab) {
  int32_t token;
  if (processor_.params().temperature == 0.0f) {
    token = processor_.Greedy(logits, vocab, {});
  } else {
    processor_.Distribution(logits, vocab, {}, &p_);
    token = Draw(p_, 1.0);
  }
  processor_.AddOutputToken(token);
  return Result(logits, vocab, token);
}

absl::Status Verifier::Verify(const float* rows, int vocab, absl::Span<const int32_t> draft,
                              absl::Span<const float> draft_probs, VerifyResult* out) {
  const int k = static_cast<int>(draft.size());
  if (vocab <= 0) return absl::InvalidArgumentError(absl::StrCat("verify: vocab ", vocab, " <= 0"));
  for (int j = 0; j < k; ++j) {
    if (draft[j] < 0 || draft[j] >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat(
          "verify: draft token ", j, ": expected in [0, ", vocab, "), got ", draft[j]));
    }
  }
  if (!draft_probs.empty() && draft_probs.size() != static_cast<size_t>(k) * vocab) {
    return absl::InvalidArgumentError(absl::StrCat("verify: draft_probs: expected 0 or ", k, " x ",
                                                   vocab, " = ", static_cast<int64_t>(k) * vocab,
                                                   " values, got ", draft_probs.size()));
  }
  out->accepted = 0;
  out->tokens.clear();
  const bool greedy = processor_.params().temperature == 0.0f;
  int32_t final_token = -1;
  int j = 0;
  for (; j < k; ++j) {
    const float* row = rows + static_cast<int64_t>(j) * vocab;
    const auto pending = draft.subspan(0, j);
    const int32_t x = draft[j];
    if (greedy) {
      const int32_t target = processor_.Greedy(row, vocab, pending);
      if (target == x) continue;
      final_token = target;
      break;
    }
    processor_.Distribution(row, vocab, pending, &p_);
    const double px = p_[x];
    const double qx = draft_probs.empty() ? 1.0 : draft_probs[static_cast<int64_t>(j) * vocab + x];
    if (qx > 0.0 && px > 0.0 && (px >= qx || rng_.Uniform() * qx < px)) continue;
    // Rejected: draw from normalize(max(0, p_t - p_d)).
    double total = 0.0;
    if (draft_probs.empty()) {
      p_[x] = 0.0;
      for (double v : p_) total += v;
    } else {
      const float* q = draft_probs.data() + static_cast<int64_t>(j) * vocab;
      for (int i = 0; i < vocab; ++i) total += p_[i] = std::max(0.0, p_[i] - q[i]);
    }
    if (!(total > 0.0)) {
      // p_t <= p_d everywhere, so p_t == p_d up to rounding: the residual is p_t itself.
      processor_.Distribution(row, vocab, pending, &p_);
      total = 1.0;
    }
    final_token = Draw(p_, total);
    break;
  }
  out->accepted = j;
  const float* last_row = rows + static_cast<int64_t>(j) * vocab;
  if (j == k) {  // all accepted: bonus token from row k
    if (greedy) {
      final_token = processor_.Greedy(last_row, vocab, draft);
    } else {
      processor_.Distribution(last_row, vocab, draft, &p_);
      final_token = Draw(p_, 1.0);
    }
  }
  out->tokens.reserve(j + 1);
  for (int i = 0; i <= j; ++i) {
    const int32_t token = i < j ? draft[i] : final_token;
    out->tokens.push_back(Result(rows + static_cast<int64_t>(i) * vocab, vocab, token));
    processor_.AddOutputToken(token);
  }
  return absl::OkStatus();
}

}  // namespace deepinfer::engine::speculative
