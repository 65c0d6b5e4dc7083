#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace deepinfer::engine {
namespace {

absl::Status Field(absl::string_view field, absl::string_view expected, double got) {
  return absl::InvalidArgumentError(
      absl::StrCat("sampling.", field, ": expected ", expected, ", got ", got));
}

}  // namespace

absl::Status ValidateSamplingParams(const SamplingParams& p, int vocab_size) {
  if (!(p.temperature >= 0.0f) || !std::isfinite(p.temperature)) {
    return Field("temperature", ">= 0", p.temperature);
  }
  if (p.top_k < -1) return Field("top_k", "-1, 0 (disabled) or >= 1", p.top_k);
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) return Field("top_p", "(0, 1]", p.top_p);
  if (!(p.min_p >= 0.0f && p.min_p <= 1.0f)) return Field("min_p", "[0, 1]", p.min_p);
  if (!(p.repetition_penalty > 0.0f && p.repetition_penalty <= 2.0f)) {
    return Field("repetition_penalty", "(0, 2]", p.repetition_penalty);
  }
  if (!(p.presence_penalty >= -2.0f && p.presence_penalty <= 2.0f)) {
    return Field("presence_penalty", "[-2, 2]", p.presence_penalty);
  }
  if (!(p.frequency_penalty >= -2.0f && p.frequency_penalty <= 2.0f)) {
    return Field("frequency_penalty", "[-2, 2]", p.frequency_penalty);
  }
  if (p.max_tokens < 1) return Field("max_tokens", ">= 1", p.max_tokens);
  if (p.logprobs < 0 || p.logprobs > 20) return Field("logprobs", "0..20", p.logprobs);
  if (p.stop.size() > 16) return Field("stop", "at most 16 strings", p.stop.size());
  for (size_t i = 0; i < p.stop.size(); ++i) {
    if (p.stop[i].empty() || p.stop[i].size() > 256) {
      return Field(absl::StrCat("stop[", i, "]"), "1..256 bytes", p.stop[i].size());
    }
  }
  for (size_t i = 0; i < p.stop_token_ids.size(); ++i) {
    if (p.stop_token_ids[i] < 0 || p.stop_token_ids[i] >= vocab_size) {
      return Field(absl::StrCat("stop_token_ids[", i, "]"),
                   absl::StrCat("a token id in [0, ", vocab_size, ")"), p.stop_token_ids[i]);
    }
  }
  return absl::OkStatus();
}

Sampler::Sampler(const SamplingParams& params)
    : params_(params), rng_(params.has_seed ? params.seed : std::random_device{}()) {}

void Sampler::AddPromptTokens(const int32_t* tokens, int64_t n) {
  for (int64_t i = 0; i < n; ++i) seen_.push_back(tokens[i]);
}

void Sampler::AddOutputToken(int32_t token) {
  ++output_counts_[token];
  seen_.push_back(token);
}

double Sampler::Uniform() {
  // 53 random bits -> [0, 1); the same on every platform for a given seed.
  return static_cast<double>(rng_() >> 11) * (1.0 / 9007199254740992.0);
}

SampleResult Sampler::Sample(const float* logits, int vocab) {
  SampleResult result;
  // Raw log-softmax for logprobs.
  const float raw_max = *std::max_element(logits, logits + vocab);
  double raw_sum = 0.0;
  for (int i = 0; i < vocab; ++i) raw_sum += std::exp(static_cast<double>(logits[i] - raw_max));
  const float log_z = raw_max + static_cast<float>(std::log(raw_sum));

  std::vector<float> l(logits, logits + vocab);
  if (params_.repetition_penalty != 1.0f) {
    seen_mask_.assign(vocab, 0);
    for (int32_t t : seen_) {
      if (t >= 0 && t < vocab) seen_mask_[t] = 1;
    }
    for (int i = 0; i < vocab; ++i) {
      if (!seen_mask_[i]) continue;
      l[i] = l[i] > 0 ? l[i] / params_.repetition_penalty : l[i] * params_.repetition_penalty;
    }
  }
  if (params_.presence_penalty != 0.0f || params_.frequency_penalty != 0.0f) {
    for (const auto& [token, count] : output_counts_) {
      if (token < 0 || token >= vocab) continue;
      l[token] -= params_.presence_penalty + params_.frequency_penalty * count;
    }
  }

  int32_t chosen = 0;
  if (params_.temperature == 0.0f) {
    chosen = static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
  } else {
    for (float& x : l) x /= params_.temperature;
    std::vector<int32_t> order(vocab);
    std::iota(order.begin(), order.end(), 0);
    int keep = vocab;
    if (params_.top_k > 0 && params_.top_k < vocab) keep = params_.top_k;
    std::partial_sort(order.begin(), order.begin() + keep, order.end(),
                      [&](int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
    order.resize(keep);
    const float mx = l[order[0]];
    std::vector<double> probs(keep);
    double sum = 0.0;
    for (int i = 0; i < keep; ++i) sum += probs[i] = std::exp(static_cast<double>(l[order[i]] - mx));
    for (double& p : probs) p /= sum;
    if (params_.top_p < 1.0f) {
      double cum = 0.0;
      int n = 0;
      while (n < keep) {
        cum += probs[n++];
        if (cum >= params_.top_p) break;
      }
      keep = std::max(1, n);
    }
    if (params_.min_p > 0.0f) {
      const double threshold = params_.min_p * probs[0];
      int n = 1;
      while (n < keep && probs[n] >= threshold) ++n;
      keep = n;
    }
    double total = 0.0;
    for (int i = 0; i < keep; ++i) total += probs[i];
    const double u = Uniform() * total;
    double cum = 0.0;
    chosen = order[keep - 1];
    for (int i = 0; i < keep; ++i) {
      cum += probs[i];
      if (u < cum) {
        chosen = order[i];
        break;
      }
    }
  }
  result.token = chosen;
  result.logprob = logits[chosen] - log_z;
  if (params_.logprobs > 0) {
    const int n = std::min(params_.logprobs, vocab);
    std::vector<int32_t> order(vocab);
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + n, order.end(), [&](int32_t a, int32_t b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
    for (int i = 0; i < n; ++i) result.top.push_back({order[i], logits[order[i]] - log_z});
  }
  return result;
}

}  // namespace deepinfer::engine
