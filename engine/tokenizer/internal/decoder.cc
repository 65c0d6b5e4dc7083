#include "engine/tokenizer/internal/decoder.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/tokenizer/internal/regex.h"
#include "engine/tokenizer/internal/utf8.h"

namespace deepinfer::tokenizer::internal {
namespace {

// A stage that needs whole tokens: gathers pieces until the token ends, then transforms it.
class WholeTokenStage : public DecoderStage {
 public:
  absl::Status Push(DecodePiece piece, std::vector<DecodePiece>* out) override {
    if (piece.starts_token && piece.ends_token && !collecting_) {
      return OnToken(std::move(piece.text), out);
    }
    collecting_ = true;
    buffer_.append(piece.text);
    if (!piece.ends_token) return absl::OkStatus();
    collecting_ = false;
    return OnToken(std::exchange(buffer_, std::string()), out);
  }
  absl::Status Finish(std::vector<DecodePiece>* out) override {
    if (collecting_) {
      collecting_ = false;
      DI_RETURN_IF_ERROR(OnToken(std::exchange(buffer_, std::string()), out));
    }
    return OnFinish(out);
  }

 protected:
  virtual absl::Status OnToken(std::string token, std::vector<DecodePiece>* out) = 0;
  virtual absl::Status OnFinish(std::vector<DecodePiece>* out) { return absl::OkStatus(); }

 private:
  bool collecting_ = false;
  std::string buffer_;
};

// Emits one token made of many pieces (Fuse, ByteLevel): the first piece starts it, Finish ends it.
class SingleTokenEmitter {
 public:
  void Emit(std::string text, std::vector<DecodePiece>* out) {
    out->push_back(DecodePiece{std::move(text), !started_, false});
    started_ = true;
  }
  void End(std::vector<DecodePiece>* out) {
    out->push_back(DecodePiece{"", !started_, true});
    started_ = true;
  }

 private:
  bool started_ = false;
};

// ---- ByteLevel: byte-level characters back to bytes, then lossy UTF-8 over everything. ----
class ByteLevelStage : public WholeTokenStage {
 protected:
  absl::Status OnToken(std::string token, std::vector<DecodePiece>* out) override {
    std::string bytes;
    bytes.reserve(token.size());
    size_t pos = 0;
    bool all_mapped = true;
    while (pos < token.size()) {
      const int b = UnicodeToByte(NextCodePoint(token, pos));
      if (b < 0) {
        all_mapped = false;
        break;
      }
      bytes.push_back(static_cast<char>(b));
    }
    std::string text;
    utf8_.Append(all_mapped ? absl::string_view(bytes) : absl::string_view(token), &text);
    if (!text.empty()) emitter_.Emit(std::move(text), out);
    return absl::OkStatus();
  }
  absl::Status OnFinish(std::vector<DecodePiece>* out) override {
    std::string text;
    utf8_.Finish(&text);
    if (!text.empty()) emitter_.Emit(std::move(text), out);
    emitter_.End(out);
    return absl::OkStatus();
  }

 private:
  Utf8StreamDecoder utf8_;
  SingleTokenEmitter emitter_;
};

class ByteLevelDecoder : public Decoder {
 public:
  std::unique_ptr<DecoderStage> NewStage() const override {
    return std::make_unique<ByteLevelStage>();
  }
};

// ---- Fuse: all tokens into one. ----
class FuseStage : public DecoderStage {
 public:
  absl::Status Push(DecodePiece piece, std::vector<DecodePiece>* out) override {
    if (!piece.text.empty()) emitter_.Emit(std::move(piece.text), out);
    return absl::OkStatus();
  }
  absl::Status Finish(std::vector<DecodePiece>* out) override {
    emitter_.End(out);
    return absl::OkStatus();
  }

 private:
  SingleTokenEmitter emitter_;
};

class FuseDecoder : public Decoder {
 public:
  std::unique_ptr<DecoderStage> NewStage() const override { return std::make_unique<FuseStage>(); }
};

// ---- ByteFallback: runs of "<0xXX>" tokens become the UTF-8 they spell, or one U+FFFD per
// byte when that is not valid UTF-8. ----
class ByteFallbackStage : public WholeTokenStage {
 protected:
  absl::Status OnToken(std::string token, std::vector<DecodePiece>* out) override {
    int byte = -1;
    if (token.size() == 6 && token.compare(0, 3, "<0x") == 0 && token[5] == '>') {
      byte = ParseHexByte(token[3], token[4]);
    }
    if (byte >= 0) {
      pending_.push_back(static_cast<char>(byte));
      return absl::OkStatus();
    }
    FlushBytes(out);
    out->push_back(DecodePiece{std::move(token), true, true});
    return absl::OkStatus();
  }
  absl::Status OnFinish(std::vector<DecodePiece>* out) override {
    FlushBytes(out);
    return absl::OkStatus();
  }

 private:
  static int HexValue(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }
  static int ParseHexByte(char hi, char lo) {
    const int h = HexValue(hi), l = HexValue(lo);
    return (h < 0 || l < 0) ? -1 : h * 16 + l;
  }
  void FlushBytes(std::vector<DecodePiece>* out) {
    if (pending_.empty()) return;
    if (ValidateUtf8(pending_).ok()) {
      out->push_back(DecodePiece{std::move(pending_), true, true});
    } else {
      for (size_t i = 0; i < pending_.size(); ++i) {
        out->push_back(DecodePiece{kReplacementUtf8, true, true});
      }
    }
    pending_.clear();
  }

  std::string pending_;
};

class ByteFallbackDecoder : public Decoder {
 public:
  std::unique_ptr<DecoderStage> NewStage() const override {
    return std::make_unique<ByteFallbackStage>();
  }
};

// ---- Replace: pattern -> content inside each token. ----
class ReplaceStage : public WholeTokenStage {
 public:
  ReplaceStage(const Regex* regex, const std::string* content) : regex_(regex), content_(content) {}

 protected:
  absl::Status OnToken(std::string token, std::vector<DecodePiece>* out) override {
    DI_RETURN_IF_ERROR(regex_->FindAll(token, &matches_));
    std::string replaced;
    size_t last = 0;
    for (const auto& [b, e] : matches_) {
      replaced.append(token, last, b - last);
      replaced.append(*content_);
      last = e;
    }
    replaced.append(token, last, std::string::npos);
    out->push_back(DecodePiece{std::move(replaced), true, true});
    return absl::OkStatus();
  }

 private:
  const Regex* regex_;
  const std::string* content_;
  std::vector<std::pair<size_t, size_t>> matches_;
};

class ReplaceDecoder : public Decoder {
 public:
  ReplaceDecoder(std::unique_ptr<Regex> regex, std::string content)
      : regex_(std::move(regex)), content_(std::move(content)) {}
  std::unique_ptr<DecoderStage> NewStage() const override {
    return std::make_unique<ReplaceStage>(regex_.get(), &content_);
  }

 private:
  std::unique_ptr<Regex> regex_;
  std::string content_;
};

// ---- Strip: removes up to `start` leading and `stop` trailing `content` chars per token. ----
class StripStage : public DecoderStage {
 public:
  StripStage(char32_t content, size_t start, size_t stop)
      : content_(content), start_(start), stop_(stop) {
    AppendUtf8(content, &content_utf8_);
  }
  absl::Status Push(DecodePiece piece, std::vector<DecodePiece>* out) override {
    if (piece.starts_token) {
      if (in_token_) EndToken(out, /*emit_marker=*/true);
      in_token_ = true;
      leading_stripped_ = 0;
      leading_done_ = false;
      held_ = 0;
    }
    std::string text;
    size_t pos = 0;
    while (pos < piece.text.size()) {
      const size_t begin = pos;
      const char32_t c = NextCodePoint(piece.text, pos);
      if (!leading_done_ && leading_stripped_ < start_ && c == content_) {
        ++leading_stripped_;
        continue;
      }
      leading_done_ = true;
      if (c == content_) {
        ++held_;
        continue;
      }
      for (; held_ > 0; --held_) text.append(content_utf8_);
      text.append(piece.text, begin, pos - begin);
    }
    // Held-back content chars beyond the `stop` that may be removed are final.
    for (; held_ > stop_; --held_) text.append(content_utf8_);
    out->push_back(DecodePiece{std::move(text), piece.starts_token, false});
    if (piece.ends_token) EndToken(out, /*emit_marker=*/false);
    return absl::OkStatus();
  }
  absl::Status Finish(std::vector<DecodePiece>* out) override {
    if (in_token_) EndToken(out, /*emit_marker=*/true);
    return absl::OkStatus();
  }

 private:
  void EndToken(std::vector<DecodePiece>* out, bool emit_marker) {
    // The last `stop_` held chars are removed; the piece just pushed (or a marker) ends it.
    held_ = held_ > stop_ ? held_ - stop_ : 0;
    std::string rest;
    for (; held_ > 0; --held_) rest.append(content_utf8_);
    if (emit_marker || !rest.empty()) {
      out->push_back(DecodePiece{std::move(rest), false, true});
    } else {
      out->back().ends_token = true;
    }
    in_token_ = false;
  }

  char32_t content_;
  std::string content_utf8_;
  size_t start_, stop_;
  bool in_token_ = false;
  size_t leading_stripped_ = 0;
  bool leading_done_ = false;
  size_t held_ = 0;
};

class StripDecoder : public Decoder {
 public:
  StripDecoder(char32_t content, size_t start, size_t stop)
      : content_(content), start_(start), stop_(stop) {}
  std::unique_ptr<DecoderStage> NewStage() const override {
    return std::make_unique<StripStage>(content_, start_, stop_);
  }

 private:
  char32_t content_;
  size_t start_, stop_;
};

// ---- Metaspace: the replacement char becomes a space, except in the first token (where it is
// dropped) unless prepend_scheme is "never". ----
class MetaspaceStage : public DecoderStage {
 public:
  MetaspaceStage(char32_t replacement, bool drop_in_first)
      : replacement_(replacement), drop_in_first_(drop_in_first) {}
  absl::Status Push(DecodePiece piece, std::vector<DecodePiece>* out) override {
    if (piece.starts_token) ++token_index_;
    const bool first = token_index_ == 1;
    std::string text;
    size_t pos = 0;
    while (pos < piece.text.size()) {
      const size_t begin = pos;
      const char32_t c = NextCodePoint(piece.text, pos);
      if (c == replacement_) {
        if (!(first && drop_in_first_)) text.push_back(' ');
      } else {
        text.append(piece.text, begin, pos - begin);
      }
    }
    out->push_back(DecodePiece{std::move(text), piece.starts_token, piece.ends_token});
    return absl::OkStatus();
  }
  absl::Status Finish(std::vector<DecodePiece>*) override { return absl::OkStatus(); }

 private:
  char32_t replacement_;
  bool drop_in_first_;
  size_t token_index_ = 0;
};

class MetaspaceDecoder : public Decoder {
 public:
  MetaspaceDecoder(char32_t replacement, bool drop_in_first)
      : replacement_(replacement), drop_in_first_(drop_in_first) {}
  std::unique_ptr<DecoderStage> NewStage() const override {
    return std::make_unique<MetaspaceStage>(replacement_, drop_in_first_);
  }

 private:
  char32_t replacement_;
  bool drop_in_first_;
};

// ---- Sequence: stages chained. ----
class SequenceStage : public DecoderStage {
 public:
  explicit SequenceStage(std::vector<std::unique_ptr<DecoderStage>> stages)
      : stages_(std::move(stages)) {}
  absl::Status Push(DecodePiece piece, std::vector<DecodePiece>* out) override {
    std::vector<DecodePiece> current;
    current.push_back(std::move(piece));
    return Run(0, std::move(current), out);
  }
  absl::Status Finish(std::vector<DecodePiece>* out) override {
    for (size_t i = 0; i < stages_.size(); ++i) {
      std::vector<DecodePiece> flushed;
      DI_RETURN_IF_ERROR(stages_[i]->Finish(&flushed));
      DI_RETURN_IF_ERROR(Run(i + 1, std::move(flushed), out));
    }
    return absl::OkStatus();
  }

 private:
  // Runs `pieces` through stages [first, end) and appends the result to `out`.
  absl::Status Run(size_t first, std::vector<DecodePiece> pieces, std::vector<DecodePiece>* out) {
    for (size_t i = first; i < stages_.size(); ++i) {
      std::vector<DecodePiece> next;
      for (DecodePiece& p : pieces) DI_RETURN_IF_ERROR(stages_[i]->Push(std::move(p), &next));
      pieces = std::move(next);
    }
    for (DecodePiece& p : pieces) out->push_back(std::move(p));
    return absl::OkStatus();
  }

  std::vector<std::unique_ptr<DecoderStage>> stages_;
};

class SequenceDecoder : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> decoders)
      : decoders_(std::move(decoders)) {}
  std::unique_ptr<DecoderStage> NewStage() const override {
    std::vector<std::unique_ptr<DecoderStage>> stages;
    for (const auto& d : decoders_) stages.push_back(d->NewStage());
    return std::make_unique<SequenceStage>(std::move(stages));
  }

 private:
  std::vector<std::unique_ptr<Decoder>> decoders_;
};

// ---- No decoder: tokens joined with a space. ----
class SpaceJoinStage : public DecoderStage {
 public:
  absl::Status Push(DecodePiece piece, std::vector<DecodePiece>* out) override {
    if (piece.starts_token) {
      if (seen_token_) out->push_back(DecodePiece{" ", true, true});
      seen_token_ = true;
    }
    out->push_back(std::move(piece));
    return absl::OkStatus();
  }
  absl::Status Finish(std::vector<DecodePiece>*) override { return absl::OkStatus(); }

 private:
  bool seen_token_ = false;
};

class SpaceJoinDecoder : public Decoder {
 public:
  std::unique_ptr<DecoderStage> NewStage() const override {
    return std::make_unique<SpaceJoinStage>();
  }
};

absl::StatusOr<char32_t> SingleChar(const Json& j, const char* key, absl::string_view where) {
  DI_ASSIGN_OR_RETURN(std::string s, GetString(j, key, where));
  DI_RETURN_IF_ERROR(ValidateUtf8(s));
  size_t pos = 0;
  if (s.empty() || (NextCodePoint(s, pos), pos != s.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": expected \"", key, "\" to be one character, found \"", s, "\""));
  }
  pos = 0;
  return NextCodePoint(s, pos);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Decoder>> ParseDecoder(const Json& j, int depth) {
  if (depth > kMaxNesting) {
    return absl::InvalidArgumentError(
        absl::StrCat("decoder: expected at most ", kMaxNesting, " nested Sequence levels"));
  }
  DI_ASSIGN_OR_RETURN(const std::string type, ComponentType(j, "decoder"));
  const std::string where = absl::StrCat("decoder \"", type, "\"");
  if (type == "ByteLevel") return std::make_unique<ByteLevelDecoder>();
  if (type == "Fuse") return std::make_unique<FuseDecoder>();
  if (type == "ByteFallback") return std::make_unique<ByteFallbackDecoder>();
  if (type == "Replace") {
    DI_ASSIGN_OR_RETURN(PatternSpec pattern, GetPattern(j, "pattern", where));
    DI_ASSIGN_OR_RETURN(std::string content, GetString(j, "content", where));
    DI_ASSIGN_OR_RETURN(auto regex, pattern.is_regex ? Regex::Create(pattern.text)
                                                     : Regex::CreateLiteral(pattern.text));
    return std::make_unique<ReplaceDecoder>(std::move(regex), std::move(content));
  }
  if (type == "Strip") {
    DI_ASSIGN_OR_RETURN(char32_t content, SingleChar(j, "content", where));
    DI_ASSIGN_OR_RETURN(int64_t start, GetInt(j, "start", 0, 0, 1 << 20, where));
    DI_ASSIGN_OR_RETURN(int64_t stop, GetInt(j, "stop", 0, 0, 1 << 20, where));
    return std::make_unique<StripDecoder>(content, start, stop);
  }
  if (type == "Metaspace") {
    DI_ASSIGN_OR_RETURN(char32_t replacement, SingleChar(j, "replacement", where));
    DI_ASSIGN_OR_RETURN(std::optional<std::string> scheme,
                        GetOptionalString(j, "prepend_scheme", where));
    bool never = scheme.has_value() && *scheme == "never";
    auto aps = j.find("add_prefix_space");
    if (aps != j.end() && aps->is_boolean() && !aps->get<bool>()) never = true;
    return std::make_unique<MetaspaceDecoder>(replacement, !never);
  }
  if (type == "Sequence") {
    auto it = j.find("decoders");
    if (it == j.end() || !it->is_array()) {
      return FieldError(where, "decoders", "an array", it == j.end() ? Json() : *it);
    }
    std::vector<std::unique_ptr<Decoder>> decoders;
    for (const Json& d : *it) {
      DI_ASSIGN_OR_RETURN(auto decoder, ParseDecoder(d, depth + 1));
      decoders.push_back(std::move(decoder));
    }
    return std::make_unique<SequenceDecoder>(std::move(decoders));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("decoder type \"", type,
                   "\" is not supported (supported: ByteLevel, Sequence, Replace, ByteFallback, "
                   "Fuse, Strip, Metaspace)"));
}

std::unique_ptr<Decoder> NewSpaceJoinDecoder() { return std::make_unique<SpaceJoinDecoder>(); }

absl::Status DecodeStream::PushToken(absl::string_view token, std::string* out) {
  scratch_.clear();
  DI_RETURN_IF_ERROR(stage_->Push(DecodePiece{std::string(token), true, true}, &scratch_));
  for (const DecodePiece& p : scratch_) out->append(p.text);
  return absl::OkStatus();
}

absl::Status DecodeStream::Finish(std::string* out) {
  scratch_.clear();
  DI_RETURN_IF_ERROR(stage_->Finish(&scratch_));
  for (const DecodePiece& p : scratch_) out->append(p.text);
  return absl::OkStatus();
}

}  // namespace deepinfer::tokenizer::internal
