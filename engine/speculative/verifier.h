// Verification of speculative drafts against the target model's logits.
//
// A verify step feeds the target the sequence's last accepted token followed by k draft tokens
// d_1..d_k and gets k + 1 logit rows: row j is the target's next-token logits after d_1..d_j.
// Verifier turns those rows into the tokens the request emits this step:
//
// - Greedy (temperature 0): d_j is accepted while it equals the arg-max of row j - 1 (after
//   penalties, lowest id on ties, exactly as Sampler); at the first mismatch the arg-max is
//   emitted instead; when all k are accepted the arg-max of row k is a bonus token. The output is
//   identical to non-speculative greedy decoding.
// - Sampling: p_t is row j - 1 after the request's processing (penalties, temperature, top-k,
//   top-p, min-p; TargetProcessor below), p_d the draft's distribution for d_j (a point mass at
//   d_j when the drafter gave none). d_j is accepted with probability min(1, p_t(d_j)/p_d(d_j))
//   and rejected outright when p_d(d_j) = 0; on rejection a token is drawn from
//   normalize(max(0, p_t - p_d)) and the step ends; when all k are accepted a bonus token is
//   drawn from p_t of row k. Each emitted token then has exactly the target's distribution,
//   provided the decision to verify d_j did not depend on d_j itself (see budget.h).
//
// Emitted tokens are recorded in the request's history (for penalties) by Verify itself; the
// caller keeps the first `accepted + 1` tokens' KV and rolls back the rest.
//
// Thread-safety: one Verifier per request, used from one thread at a time.
#ifndef DEEPINFER_ENGINE_SPECULATIVE_VERIFIER_H_
#define DEEPINFER_ENGINE_SPECULATIVE_VERIFIER_H_

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "engine/sampler.h"

namespace deepinfer::engine::speculative {

// xoshiro256** seeded through splitmix64: fast, small state, the same stream on every platform.
class SpecRng {
 public:
  explicit SpecRng(uint64_t seed);
  uint64_t Next() {
    const uint64_t result = Rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = Rotl(s_[3], 45);
    return result;
  }
  // Uniform in [0, 1) with 53 random bits.
  double Uniform() { return static_cast<double>(Next() >> 11) * (1.0 / 9007199254740992.0); }

 private:
  static uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

// The target distribution p_t: the serving sampler's own processing (engine/sampler.h).
using TargetProcessor = ::deepinfer::engine::LogitsProcessor;

struct VerifyResult {
  int accepted = 0;  // draft tokens accepted, 0..k
  // accepted + 1 tokens: the accepted drafts, then the correction (or, when accepted == k, the
  // bonus token). logprob and top alternatives are of each row's raw distribution, as Sampler.
  std::vector<SampleResult> tokens;
};

class Verifier {
 public:
  // `params` must be valid. The RNG is seeded from params.seed when has_seed, else from
  // std::random_device. (Speculative and plain decoding consume randomness differently, so a seed
  // reproduces runs of the same mode only.)
  explicit Verifier(const SamplingParams& params);
  Verifier(const SamplingParams& params, uint64_t seed);

  void AddPromptTokens(const int32_t* tokens, int64_t n) { processor_.AddPromptTokens(tokens, n); }

  // A step without drafts: samples one token from `logits` (the same distribution as Sampler)
  // and records it.
  SampleResult Sample(const float* logits, int vocab);

  // `rows` holds (draft.size() + 1) * vocab logits; `draft_probs` is empty (point masses) or
  // draft.size() * vocab probabilities, row j the normalised distribution d_j was drawn from
  // (after the same processing as the target, for best acceptance). Records the emitted tokens.
  // kInvalidArgument for vocab <= 0, a draft token outside [0, vocab) or a draft_probs of another
  // size; nothing is recorded then.
  absl::Status Verify(const float* rows, int vocab, absl::Span<const int32_t> draft,
                      absl::Span<const float> draft_probs, VerifyResult* out);

  TargetProcessor& processor() { return processor_; }

 private:
  int32_t Draw(const std::vector<double>& weights, double total);
  SampleResult Result(const float* logits, int vocab, int32_t token) const;

  TargetProcessor processor_;
  SpecRng rng_;
  std::vector<double> p_;  // workspace: target distribution of the current row
};

}  // namespace deepinfer::engine::speculative

#endif  // DEEPINFER_ENGINE_SPECULATIVE_VERIFIER_H_
