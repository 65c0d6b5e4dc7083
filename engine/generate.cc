#include "engine/generate.h"

#include <algorithm>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace deepinfer::engine {

const char* FinishReasonName(FinishReason r) {
  switch (r) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kStopString:
      return "stop_string";
    case FinishReason::kAborted:
      return "aborted";
  }
  return "?";
}

namespace {

absl::Status ValidateGenerate(const ModelConfig& c, const std::vector<int32_t>& prompt,
                              const SamplingParams& sampling, const GenerateOptions& options) {
  if (prompt.empty()) {
    return absl::InvalidArgumentError("prompt: expected at least one token, got 0");
  }
  for (size_t i = 0; i < prompt.size(); ++i) {
    if (prompt[i] < 0 || prompt[i] >= c.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("prompt[", i, "]: expected a token id in [0, ",
                                                     c.vocab_size, "), got ", prompt[i]));
    }
  }
  DI_RETURN_IF_ERROR(ValidateSamplingParams(sampling, c.vocab_size));
  const int64_t context = c.max_position_embeddings;
  if (static_cast<int64_t>(prompt.size()) + sampling.max_tokens > context) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sampling.max_tokens: prompt (", prompt.size(), " tokens) + max_tokens (",
        sampling.max_tokens, ") exceeds the model's context of ", context, " tokens"));
  }
  if (options.block_size <= 0 || options.prefill_chunk <= 0) {
    return absl::InvalidArgumentError("generate: block_size and prefill_chunk must be positive");
  }
  return absl::OkStatus();
}

}  // namespace

int GenerateBlocks(const std::vector<int32_t>& prompt, const SamplingParams& sampling,
                   const GenerateOptions& options) {
  if (options.block_size <= 0) return 0;
  const int64_t max_len = static_cast<int64_t>(prompt.size()) + std::max(sampling.max_tokens, 0);
  return static_cast<int>((max_len + options.block_size - 1) / options.block_size);
}

absl::StatusOr<GenerateResult> GenerateOne(Model& model, const std::vector<int32_t>& prompt,
                                           const SamplingParams& sampling,
                                           const GenerateOptions& options,
                                           const TokenCallback& on_token) {
  // Checked before the cache is sized from max_tokens.
  DI_RETURN_IF_ERROR(ValidateGenerate(model.config(), prompt, sampling, options));
  const int num_blocks = GenerateBlocks(prompt, sampling, options);
  DI_ASSIGN_OR_RETURN(std::unique_ptr<KvCache> cache,
                      KvCache::Create(model.MakeKvCacheConfig(num_blocks, options.block_size)));
  return GenerateWith(
      model.config(), num_blocks,
      [&](const std::vector<SequenceInput>& batch, std::vector<float>* logits) {
        return model.Forward(batch, cache.get(), logits);
      },
      prompt, sampling, options, on_token);
}

absl::StatusOr<GenerateResult> GenerateWith(const ModelConfig& c, int num_blocks,
                                            const ForwardFn& forward,
                                            const std::vector<int32_t>& prompt,
                                            const SamplingParams& sampling,
                                            const GenerateOptions& options,
                                            const TokenCallback& on_token) {
  DI_RETURN_IF_ERROR(ValidateGenerate(c, prompt, sampling, options));
  if (num_blocks < GenerateBlocks(prompt, sampling, options)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "generate: ", num_blocks, " KV blocks of ", options.block_size, " tokens cannot hold ",
        prompt.size(), " prompt + ", sampling.max_tokens, " generated tokens"));
  }
  std::vector<int32_t> table(num_blocks);
  std::iota(table.begin(), table.end(), 0);

  Sampler sampler(sampling);
  sampler.AddPromptTokens(prompt.data(), static_cast<int64_t>(prompt.size()));
  std::vector<float> logits;
  int64_t pos = 0;
  const int64_t n = static_cast<int64_t>(prompt.size());
  while (pos < n) {
    const int64_t chunk = std::min<int64_t>(options.prefill_chunk, n - pos);
    SequenceInput in;
    in.tokens = prompt.data() + pos;
    in.num_tokens = chunk;
    in.start_position = pos;
    in.block_table = table.data();
    in.num_blocks = num_blocks;
    DI_RETURN_IF_ERROR(forward({in}, &logits));
    pos += chunk;
  }
  GenerateResult result;
  while (true) {
    SampleResult s = sampler.Sample(logits.data(), c.vocab_size);
    StepOutput step{s.token, s.logprob, std::move(s.top)};
    sampler.AddOutputToken(step.token);
    result.steps.push_back(step);
    const bool is_eos = !sampling.ignore_eos &&
                        std::find(options.eos_token_ids.begin(), options.eos_token_ids.end(),
                                  step.token) != options.eos_token_ids.end();
    const bool is_stop_id = std::find(sampling.stop_token_ids.begin(),
                                      sampling.stop_token_ids.end(),
                                      step.token) != sampling.stop_token_ids.end();
    if (on_token && !on_token(result.steps.back())) {
      result.finish = FinishReason::kStopString;
      break;
    }
    if (is_eos || is_stop_id) {
      result.finish = FinishReason::kStop;
      break;
    }
    if (static_cast<int>(result.steps.size()) >= sampling.max_tokens) {
      result.finish = FinishReason::kLength;
      break;
    }
    SequenceInput in;
    in.tokens = &result.steps.back().token;
    in.num_tokens = 1;
    in.start_position = pos;
    in.block_table = table.data();
    in.num_blocks = num_blocks;
    DI_RETURN_IF_ERROR(forward({in}, &logits));
    ++pos;
  }
  return result;
}

}  // namespace deepinfer::engine
