#include "engine/tokenizer/incremental_detokenizer.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/tokenizer/internal/added_vocabulary.h"
#include "engine/tokenizer/internal/decoder.h"

namespace deepinfer::tokenizer {

IncrementalDetokenizer::IncrementalDetokenizer(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tokenizer_(tokenizer),
      skip_special_tokens_(skip_special_tokens),
      stream_(std::make_unique<internal::DecodeStream>(*tokenizer.decoder_)) {}

IncrementalDetokenizer::~IncrementalDetokenizer() = default;

absl::StatusOr<std::string> IncrementalDetokenizer::Push(int32_t id) {
  if (flushed_) {
    return absl::FailedPreconditionError("IncrementalDetokenizer: Push() after Flush()");
  }
  const std::string* token = tokenizer_.DecoderInput(id);
  if (token == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("expected token ids in the vocabulary (below ",
                                                   tokenizer_.vocab_size(), "), found id ", id));
  }
  ++num_tokens_;
  std::string out;
  if (skip_special_tokens_ && tokenizer_.added_->IsSpecialContent(*token)) return out;
  DI_RETURN_IF_ERROR(stream_->PushToken(*token, &out));
  return out;
}

absl::StatusOr<std::string> IncrementalDetokenizer::Flush() {
  if (flushed_) {
    return absl::FailedPreconditionError("IncrementalDetokenizer: Flush() called twice");
  }
  flushed_ = true;
  std::string out;
  DI_RETURN_IF_ERROR(stream_->Finish(&out));
  return out;
}

}  // namespace deepinfer::tokenizer
