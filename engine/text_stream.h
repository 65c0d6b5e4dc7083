// Generated tokens -> text deltas for one sequence, with stop strings.
//
// Text is released as soon as it is final: never a broken UTF-8 sequence (the incremental
// detokenizer holds incomplete characters back) and never a prefix of a stop string that might
// still complete (that tail is held until it either completes the stop string or cannot). When a
// stop string appears, the text up to it is the final text, the stop string itself is not
// emitted, and stopped() turns true.
//
// Thread-compatible: one sequence, one thread at a time.
#ifndef DEEPINFER_ENGINE_TEXT_STREAM_H_
#define DEEPINFER_ENGINE_TEXT_STREAM_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/tokenizer/incremental_detokenizer.h"
#include "engine/tokenizer/tokenizer.h"

namespace deepinfer::engine {

class TextStream {
 public:
  // `tokenizer` must outlive the stream.
  TextStream(const tokenizer::Tokenizer& tokenizer, std::vector<std::string> stop,
             bool skip_special_tokens = true);

  // Adds a generated token and returns the text that became final (often empty).
  // kInvalidArgument for an id outside the vocabulary. After a stop, returns "" for any token.
  absl::StatusOr<std::string> Push(int32_t token);

  // End of generation: returns the rest (held-back bytes of an incomplete character become
  // U+FFFD, as Hugging Face decode does).
  std::string Finish();

  bool stopped() const { return stopped_; }
  const std::string& matched_stop() const { return matched_stop_; }
  // All final text so far.
  const std::string& text() const { return text_; }

 private:
  std::string Release(size_t upto);

  tokenizer::IncrementalDetokenizer detok_;
  std::vector<std::string> stop_;
  size_t max_hold_ = 0;
  std::string text_;     // everything decoded (final or held)
  size_t emitted_ = 0;   // bytes of text_ released
  bool stopped_ = false;
  bool finished_ = false;
  std::string matched_stop_;
};

}  // namespace deepinfer::engine

#endif  // DEEPINFER_ENGINE_TEXT_STREAM_H_
