#include "engine/text_stream.h"

#include <algorithm>

namespace deepinfer::engine {

TextStream::TextStream(const tokenizer::Tokenizer& tokenizer, std::vector<std::string> stop,
                       bool skip_special_tokens)
    : detok_(tokenizer, skip_special_tokens), stop_(std::move(stop)) {
  for (const std::string& s : stop_) {
    if (!s.empty()) max_hold_ = std::max(max_hold_, s.size() - 1);
  }
}

std::string TextStream::Release(size_t upto) {
  if (upto <= emitted_) return "";
  std::string out = text_.substr(emitted_, upto - emitted_);
  emitted_ = upto;
  return out;
}

absl::StatusOr<std::string> TextStream::Push(int32_t token) {
  if (stopped_ || finished_) return std::string();
  absl::StatusOr<std::string> piece = detok_.Push(token);
  if (!piece.ok()) return piece.status();
  if (piece->empty()) return std::string();
  // A stop string can only start in the held tail or the new piece.
  const size_t search_from = emitted_ > max_hold_ ? emitted_ - max_hold_ : 0;
  text_ += *piece;
  size_t best = std::string::npos;
  for (const std::string& s : stop_) {
    const size_t at = text_.find(s, search_from);
    if (at != std::string::npos && at < best) {
      best = at;
      matched_stop_ = s;
    }
  }
  if (best != std::string::npos) {
    stopped_ = true;
    text_.resize(best);
    return Release(text_.size());
  }
  // Hold back the longest tail that is a proper prefix of some stop string.
  size_t hold = 0;
  for (const std::string& s : stop_) {
    for (size_t len = std::min(s.size() - 1, text_.size()); len > hold; --len) {
      if (text_.compare(text_.size() - len, len, s, 0, len) == 0) {
        hold = len;
        break;
      }
    }
  }
  return Release(text_.size() - hold);
}

std::string TextStream::Finish() {
  if (stopped_ || finished_) return "";
  finished_ = true;
  absl::StatusOr<std::string> rest = detok_.Flush();
  if (rest.ok()) text_ += *rest;
  return Release(text_.size());
}

}  // namespace deepinfer::engine
