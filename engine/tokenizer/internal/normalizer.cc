#include "engine/tokenizer/internal/normalizer.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/tokenizer/internal/nfc.h"
#include "engine/tokenizer/internal/regex.h"
#include "engine/tokenizer/internal/utf8.h"

namespace deepinfer::tokenizer::internal {
namespace {

class NfcNormalizer : public Normalizer {
 public:
  absl::Status Normalize(std::string* text) const override {
    if (!IsNfcQuick(*text)) *text = ToNfc(*text);
    return absl::OkStatus();
  }
};

class SequenceNormalizer : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> steps)
      : steps_(std::move(steps)) {}
  absl::Status Normalize(std::string* text) const override {
    for (const auto& step : steps_) DI_RETURN_IF_ERROR(step->Normalize(text));
    return absl::OkStatus();
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> steps_;
};

// Prepends a string to non-empty text.
class PrependNormalizer : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
  absl::Status Normalize(std::string* text) const override {
    if (!text->empty()) text->insert(0, prefix_);
    return absl::OkStatus();
  }

 private:
  std::string prefix_;
};

class ReplaceNormalizer : public Normalizer {
 public:
  ReplaceNormalizer(std::unique_ptr<Regex> regex, std::string content)
      : regex_(std::move(regex)), content_(std::move(content)) {}
  absl::Status Normalize(std::string* text) const override {
    std::vector<std::pair<size_t, size_t>> matches;
    DI_RETURN_IF_ERROR(regex_->FindAll(*text, &matches));
    if (matches.empty()) return absl::OkStatus();
    std::string out;
    out.reserve(text->size());
    size_t last = 0;
    for (const auto& [b, e] : matches) {
      out.append(*text, last, b - last);
      out.append(content_);
      last = e;
    }
    out.append(*text, last, std::string::npos);
    *text = std::move(out);
    return absl::OkStatus();
  }

 private:
  std::unique_ptr<Regex> regex_;
  std::string content_;
};

// Strips Unicode whitespace on the left and/or right.
class StripNormalizer : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  absl::Status Normalize(std::string* text) const override {
    size_t begin = 0, end = text->size();
    if (left_) {
      while (begin < end) {
        size_t pos = begin;
        if (!IsUnicodeWhitespace(NextCodePoint(*text, pos))) break;
        begin = pos;
      }
    }
    if (right_) {
      while (end > begin) {
        size_t start = end - 1;
        while (start > begin && (static_cast<unsigned char>((*text)[start]) & 0xC0) == 0x80) {
          --start;
        }
        size_t pos = start;
        if (!IsUnicodeWhitespace(NextCodePoint(*text, pos))) break;
        end = start;
      }
    }
    *text = text->substr(begin, end - begin);
    return absl::OkStatus();
  }

 private:
  bool left_, right_;
};

// Maps every byte to its GPT-2 byte-level code point.
class ByteLevelNormalizer : public Normalizer {
 public:
  absl::Status Normalize(std::string* text) const override {
    const auto& table = ByteToUnicodeUtf8();
    std::string out;
    out.reserve(text->size() * 2);
    for (unsigned char c : *text) out.append(table[c]);
    *text = std::move(out);
    return absl::OkStatus();
  }
};

}  // namespace

absl::StatusOr<std::unique_ptr<Normalizer>> ParseNormalizer(const Json& j, int depth) {
  if (depth > kMaxNesting) {
    return absl::InvalidArgumentError(
        absl::StrCat("normalizer: expected at most ", kMaxNesting, " nested Sequence levels"));
  }
  DI_ASSIGN_OR_RETURN(const std::string type, ComponentType(j, "normalizer"));
  const std::string where = absl::StrCat("normalizer \"", type, "\"");
  if (type == "NFC") return std::make_unique<NfcNormalizer>();
  if (type == "Sequence") {
    auto it = j.find("normalizers");
    if (it == j.end() || !it->is_array()) {
      return FieldError(where, "normalizers", "an array", it == j.end() ? Json() : *it);
    }
    std::vector<std::unique_ptr<Normalizer>> steps;
    for (const Json& step : *it) {
      DI_ASSIGN_OR_RETURN(auto n, ParseNormalizer(step, depth + 1));
      steps.push_back(std::move(n));
    }
    return std::make_unique<SequenceNormalizer>(std::move(steps));
  }
  if (type == "Prepend") {
    DI_ASSIGN_OR_RETURN(std::string prefix, GetString(j, "prepend", where));
    return std::make_unique<PrependNormalizer>(std::move(prefix));
  }
  if (type == "Replace") {
    DI_ASSIGN_OR_RETURN(PatternSpec pattern, GetPattern(j, "pattern", where));
    DI_ASSIGN_OR_RETURN(std::string content, GetString(j, "content", where));
    DI_ASSIGN_OR_RETURN(auto regex, pattern.is_regex ? Regex::Create(pattern.text)
                                                     : Regex::CreateLiteral(pattern.text));
    return std::make_unique<ReplaceNormalizer>(std::move(regex), std::move(content));
  }
  if (type == "Strip") {
    DI_ASSIGN_OR_RETURN(bool left, GetBool(j, "strip_left", true, where));
    DI_ASSIGN_OR_RETURN(bool right, GetBool(j, "strip_right", true, where));
    return std::make_unique<StripNormalizer>(left, right);
  }
  if (type == "ByteLevel") return std::make_unique<ByteLevelNormalizer>();
  return absl::InvalidArgumentError(absl::StrCat("normalizer type \"", type,
                                                 "\" is not supported (supported: NFC, Sequence, "
                                                 "Prepend, Replace, Strip, ByteLevel)"));
}

}  // namespace deepinfer::tokenizer::internal
