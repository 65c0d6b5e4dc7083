// Generating one sequence with a private KV cache: the reference path that the standalone tool,
// the tests and (as the oracle) the serving engine's tests use. Prefill runs in chunks, then one
// token per step until max_tokens, an end-of-sequence or stop token, the context limit, or the
// caller's callback says stop (e.g. a stop string matched in the detokenized text).
#ifndef DEEPINFER_ENGINE_GENERATE_H_
#define DEEPINFER_ENGINE_GENERATE_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model.h"
#include "engine/sampler.h"

namespace deepinfer::engine {

enum class FinishReason { kStop, kLength, kStopString, kAborted };

const char* FinishReasonName(FinishReason r);

struct StepOutput {
  int32_t token = 0;
  float logprob = 0.0f;
  std::vector<TokenLogprob> top;
};

struct GenerateOptions {
  int block_size = 16;
  int prefill_chunk = 512;  // prompt tokens per forward pass
  // Token ids that end generation unless sampling.ignore_eos (the model's eos ids).
  std::vector<int32_t> eos_token_ids;
};

struct GenerateResult {
  std::vector<StepOutput> steps;
  FinishReason finish = FinishReason::kLength;
};

// Called after each generated token; return false to stop with kStopString.
using TokenCallback = std::function<bool(const StepOutput&)>;

// kInvalidArgument for an empty prompt, prompt ids out of range, invalid sampling parameters
// (named), or prompt + max_tokens beyond the model's context ("sampling.max_tokens: ...").
absl::StatusOr<GenerateResult> GenerateOne(Model& model, const std::vector<int32_t>& prompt,
                                           const SamplingParams& sampling,
                                           const GenerateOptions& options,
                                           const TokenCallback& on_token = nullptr);

// A forward pass of another backend over KV pools it owns (e.g. engine/cuda's CudaModel), with
// Model::Forward's contract minus the cache argument.
using ForwardFn =
    std::function<absl::Status(const std::vector<SequenceInput>&, std::vector<float>*)>;

// KV blocks (of options.block_size tokens) that GenerateWith needs for this prompt and
// sampling.max_tokens (0 for a non-positive block size).
int GenerateBlocks(const std::vector<int32_t>& prompt, const SamplingParams& sampling,
                   const GenerateOptions& options);

// GenerateOne through `forward`, whose pools hold blocks [0, num_blocks) (one sequence uses
// them in order). Errors as GenerateOne, and kInvalidArgument when num_blocks <
// GenerateBlocks(...).
absl::StatusOr<GenerateResult> GenerateWith(const ModelConfig& config, int num_blocks,
                                            const ForwardFn& forward,
                                            const std::vector<int32_t>& prompt,
                                            const SamplingParams& sampling,
                                            const GenerateOptions& options,
                                            const TokenCallback& on_token = nullptr);

}  // namespace deepinfer::engine

#endif  // DEEPINFER_ENGINE_GENERATE_H_
