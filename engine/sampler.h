// Turning logits into the next token: penalties, temperature, top-k, top-p, min-p, a per-request
// seeded RNG, and top-n logprobs.
//
// Order of operations (as Hugging Face's logits processors and vLLM apply them): repetition
// penalty (prompt + output tokens), presence and frequency penalties (output tokens), then
// temperature, top-k, top-p, min-p; sample from what is left. temperature == 0 is greedy: the
// arg-max of the penalised logits (lowest id on ties, like torch.argmax).
//
// Logprobs are of the model's raw distribution (log-softmax of the unprocessed logits), which is
// what OpenAI-style APIs report.
//
// Thread-safety: Sampler holds one request's RNG; use it from one thread at a time.
#ifndef DEEPINFER_ENGINE_SAMPLER_H_
#define DEEPINFER_ENGINE_SAMPLER_H_

#include <cstdint>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace deepinfer::engine {

struct SamplingParams {
  float temperature = 1.0f;        // >= 0; 0 = greedy
  int top_k = 0;                   // 0 or -1 disables; else >= 1
  float top_p = 1.0f;              // (0, 1]
  float min_p = 0.0f;              // [0, 1]
  float repetition_penalty = 1.0f; // (0, 2]
  float presence_penalty = 0.0f;   // [-2, 2]
  float frequency_penalty = 0.0f;  // [-2, 2]
  bool has_seed = false;
  uint64_t seed = 0;
  int max_tokens = 16;             // >= 1
  std::vector<std::string> stop;   // at most 16, each 1..256 bytes
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  int logprobs = 0;                // top-n alternatives, 0..20
  bool return_logprobs = false;
};

// kInvalidArgument naming the field ("sampling.top_p: expected (0, 1], got 1.5").
absl::Status ValidateSamplingParams(const SamplingParams& p, int vocab_size);

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0.0f;
};

struct SampleResult {
  int32_t token = 0;
  float logprob = 0.0f;             // of `token` under the raw distribution
  std::vector<TokenLogprob> top;    // `logprobs` best, descending
};

// The next-token distribution a request samples from: penalties over the request's history,
// then temperature, top-k, top-p and min-p. The Sampler draws from it; speculative verification
// (engine/speculative) uses the very same object, so both see one distribution.
class LogitsProcessor {
 public:
  // `params` must be valid (ValidateSamplingParams).
  explicit LogitsProcessor(const SamplingParams& params);

  void AddPromptTokens(const int32_t* tokens, int64_t n);
  void AddOutputToken(int32_t token);

  // Fills `probs` with `vocab` probabilities summing to 1: the next-token distribution for
  // `logits` after the history plus `pending` (output tokens not yet recorded, e.g. the drafts
  // before this position). Temperature 0 gives a point mass at the arg-max.
  void Distribution(const float* logits, int vocab, absl::Span<const int32_t> pending,
                    std::vector<double>* probs);
  // Arg-max of the penalised logits (the greedy choice), lowest id on ties.
  int32_t Greedy(const float* logits, int vocab, absl::Span<const int32_t> pending);

  const SamplingParams& params() const { return params_; }

 private:
  // Penalised logits into penalised_.
  void Penalise(const float* logits, int vocab, absl::Span<const int32_t> pending);

  SamplingParams params_;
  bool uses_history_ = false;  // any penalty set
  std::unordered_map<int32_t, int> output_counts_;
  std::vector<int32_t> seen_;  // prompt + output, for the repetition penalty
  // Workspace, reused between calls.
  std::vector<uint8_t> seen_mask_;
  std::vector<float> penalised_;
  std::vector<int32_t> order_;
  std::vector<double> sorted_probs_;
};

class Sampler {
 public:
  // `params` must be valid. Without a seed, one is drawn from std::random_device.
  explicit Sampler(const SamplingParams& params);

  // Records tokens that count for the repetition penalty (the prompt) without counting them for
  // presence/frequency.
  void AddPromptTokens(const int32_t* tokens, int64_t n);
  // Records a generated token (call with every token emitted, sampled or not).
  void AddOutputToken(int32_t token);

  // Picks the next token from `logits` (vocab_size values).
  SampleResult Sample(const float* logits, int vocab_size);

  const SamplingParams& params() const { return params_; }

 private:
  double Uniform();

  SamplingParams params_;
  std::mt19937_64 rng_;
  LogitsProcessor processor_;
  std::vector<double> probs_;  // workspace
};

}  // namespace deepinfer::engine

#endif  // DEEPINFER_ENGINE_SAMPLER_H_
