#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "kernels/softmax_cpu.h"

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

LogitsProcessor::LogitsProcessor(const SamplingParams& params)
    : params_(params),
      uses_history_(params.repetition_penalty != 1.0f || params.presence_penalty != 0.0f ||
                    params.frequency_penalty != 0.0f) {}

void LogitsProcessor::AddPromptTokens(const int32_t* tokens, int64_t n) {
  if (!uses_history_) return;
  seen_.insert(seen_.end(), tokens, tokens + n);
}

void LogitsProcessor::AddOutputToken(int32_t token) {
  if (!uses_history_) return;  // the history only feeds penalties
  ++output_counts_[token];
  seen_.push_back(token);
}

void LogitsProcessor::Penalise(const float* logits, int vocab, absl::Span<const int32_t> pending) {
  penalised_.assign(logits, logits + vocab);
  if (!uses_history_) return;
  std::vector<float>& l = penalised_;
  if (params_.repetition_penalty != 1.0f) {
    seen_mask_.assign(vocab, 0);
    for (int32_t t : seen_) {
      if (t >= 0 && t < vocab) seen_mask_[t] = 1;
    }
    for (int32_t t : pending) {
      if (t >= 0 && t < vocab) seen_mask_[t] = 1;
    }
    for (int i = 0; i < vocab; ++i) {
      if (!seen_mask_[i]) continue;
      l[i] = l[i] > 0 ? l[i] / params_.repetition_penalty : l[i] * params_.repetition_penalty;
    }
  }
  if (params_.presence_penalty != 0.0f || params_.frequency_penalty != 0.0f) {
    for (int32_t t : pending) ++output_counts_[t];
    for (const auto& [token, count] : output_counts_) {
      if (token < 0 || token >= vocab || count == 0) continue;
      l[token] -= params_.presence_penalty + params_.frequency_penalty * count;
    }
    for (int32_t t : pending) {
      auto it = output_counts_.find(t);
      if (--it->second == 0) output_counts_.erase(it);
    }
  }
}

int32_t LogitsProcessor::Greedy(const float* logits, int vocab, absl::Span<const int32_t> pending) {
  // Without penalties the logits are the penalised ones: no copy.
  if (!uses_history_) return static_cast<int32_t>(kernels::ArgMaxCpu(logits, vocab));
  Penalise(logits, vocab, pending);
  return static_cast<int32_t>(kernels::ArgMaxCpu(penalised_.data(), vocab));
}

void LogitsProcessor::Distribution(const float* logits, int vocab,
                                   absl::Span<const int32_t> pending, std::vector<double>* probs) {
  probs->assign(vocab, 0.0);
  if (params_.temperature == 0.0f) {
    (*probs)[Greedy(logits, vocab, pending)] = 1.0;
    return;
  }
  Penalise(logits, vocab, pending);
  std::vector<float>& l = penalised_;
  for (float& x : l) x /= params_.temperature;
  const bool truncates =
      (params_.top_k > 0 && params_.top_k < vocab) || params_.top_p < 1.0f || params_.min_p > 0.0f;
  if (!truncates) {
    // Plain softmax; the order of summation is the only difference from the sorted path.
    const float mx = kernels::RowMaxCpu(l.data(), vocab);
    double sum = 0.0;
    for (int i = 0; i < vocab; ++i) sum += (*probs)[i] = std::exp(static_cast<double>(l[i] - mx));
    for (double& p : *probs) p /= sum;
    return;
  }
  order_.resize(vocab);
  std::iota(order_.begin(), order_.end(), 0);
  int keep = vocab;
  if (params_.top_k > 0 && params_.top_k < vocab) keep = params_.top_k;
  std::partial_sort(order_.begin(), order_.begin() + keep, order_.end(),
                    [&](int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
  const float mx = l[order_[0]];
  sorted_probs_.resize(keep);
  double sum = 0.0;
  for (int i = 0; i < keep; ++i) {
    sum += sorted_probs_[i] = std::exp(static_cast<double>(l[order_[i]] - mx));
  }
  for (int i = 0; i < keep; ++i) sorted_probs_[i] /= sum;
  if (params_.top_p < 1.0f) {
    double cum = 0.0;
    int n = 0;
    while (n < keep) {
      cum += sorted_probs_[n++];
      if (cum >= params_.top_p) break;
    }
    keep = std::max(1, n);
  }
  if (params_.min_p > 0.0f) {
    const double threshold = params_.min_p * sorted_probs_[0];
    int n = 1;
    while (n < keep && sorted_probs_[n] >= threshold) ++n;
    keep = n;
  }
  double total = 0.0;
  for (int i = 0; i < keep; ++i) total += sorted_probs_[i];
  for (int i = 0; i < keep; ++i) (*probs)[order_[i]] = sorted_probs_[i] / total;
}

Sampler::Sampler(const SamplingParams& params)
    : params_(params),
      rng_(params.has_seed ? params.seed : std::random_device{}()),
      processor_(params) {}

void Sampler::AddPromptTokens(const int32_t* tokens, int64_t n) {
  processor_.AddPromptTokens(tokens, n);
}

void Sampler::AddOutputToken(int32_t token) { processor_.AddOutputToken(token); }

double Sampler::Uniform() {
  // 53 random bits -> [0, 1); the same on every platform for a given seed.
  return static_cast<double>(rng_() >> 11) * (1.0 / 9007199254740992.0);
}

SampleResult Sampler::Sample(const float* logits, int vocab) {
  SampleResult result;
  // Raw log-softmax for logprobs.
  const float raw_max = kernels::RowMaxCpu(logits, vocab);
  const double raw_sum = kernels::SumExpCpu(logits, vocab, raw_max);
  const float log_z = raw_max + static_cast<float>(std::log(raw_sum));

  int32_t chosen = 0;
  if (params_.temperature == 0.0f) {
    chosen = processor_.Greedy(logits, vocab, {});
  } else {
    processor_.Distribution(logits, vocab, {}, &probs_);
    const double u = Uniform();
    double cum = 0.0;
    chosen = -1;
    int32_t last_nonzero = 0;
    for (int i = 0; i < vocab; ++i) {
      if (probs_[i] <= 0.0) continue;
      last_nonzero = i;
      cum += probs_[i];
      if (u < cum) {
        chosen = i;
        break;
      }
    }
    if (chosen < 0) chosen = last_nonzero;  // rounding left u just above the total
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
