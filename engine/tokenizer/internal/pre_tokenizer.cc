#include "engine/tokenizer/internal/pre_tokenizer.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/tokenizer/internal/regex.h"
#include "engine/tokenizer/internal/utf8.h"

namespace deepinfer::tokenizer::internal {
namespace {

constexpr char kGpt2Pattern[] =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

struct Span {
  size_t begin, end;
  bool flag;  // is_match before the behavior, should_remove after it
};

class SplitPreTokenizer : public PreTokenizer {
 public:
  SplitPreTokenizer(std::unique_ptr<Regex> regex, SplitBehavior behavior, bool invert)
      : regex_(std::move(regex)), behavior_(behavior), invert_(invert) {}

  absl::Status PreTokenize(std::vector<PreToken>* pieces) const override {
    std::vector<PreToken> out;
    out.reserve(pieces->size() * 2);
    std::vector<std::pair<size_t, size_t>> matches;
    for (const PreToken& piece : *pieces) {
      DI_RETURN_IF_ERROR(regex_->FindAll(piece.text, &matches));
      SplitPiece(piece, matches, invert_, behavior_, &out);
    }
    *pieces = std::move(out);
    return absl::OkStatus();
  }

 private:
  std::unique_ptr<Regex> regex_;
  SplitBehavior behavior_;
  bool invert_;
};

class ByteLevelPreTokenizer : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, std::unique_ptr<Regex> regex)
      : add_prefix_space_(add_prefix_space), regex_(std::move(regex)) {}

  absl::Status PreTokenize(std::vector<PreToken>* pieces) const override {
    std::vector<PreToken> split;
    split.reserve(pieces->size() * 2);
    std::vector<std::pair<size_t, size_t>> matches;
    for (PreToken& piece : *pieces) {
      if (add_prefix_space_ && (piece.text.empty() || piece.text[0] != ' ')) {
        piece.text.insert(0, 1, ' ');
      }
      if (regex_ != nullptr) {
        DI_RETURN_IF_ERROR(regex_->FindAll(piece.text, &matches));
        SplitPiece(piece, matches, false, SplitBehavior::kIsolated, &split);
      } else if (!piece.text.empty()) {
        split.push_back(std::move(piece));
      }
    }
    const auto& table = ByteToUnicodeUtf8();
    for (PreToken& piece : split) {
      std::string mapped;
      mapped.reserve(piece.text.size() * 2);
      for (unsigned char c : piece.text) mapped.append(table[c]);
      piece.text = std::move(mapped);
    }
    *pieces = std::move(split);
    return absl::OkStatus();
  }

 private:
  bool add_prefix_space_;
  std::unique_ptr<Regex> regex_;  // null when use_regex is false
};

class SequencePreTokenizer : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> steps)
      : steps_(std::move(steps)) {}
  absl::Status PreTokenize(std::vector<PreToken>* pieces) const override {
    for (const auto& step : steps_) DI_RETURN_IF_ERROR(step->PreTokenize(pieces));
    return absl::OkStatus();
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> steps_;
};

enum class PrependScheme { kFirst, kNever, kAlways };

class MetaspacePreTokenizer : public PreTokenizer {
 public:
  MetaspacePreTokenizer(std::string replacement, PrependScheme scheme, bool split)
      : replacement_(std::move(replacement)), scheme_(scheme), split_(split) {}

  absl::Status PreTokenize(std::vector<PreToken>* pieces) const override {
    std::vector<PreToken> out;
    for (PreToken& piece : *pieces) {
      std::string text;
      text.reserve(piece.text.size() + replacement_.size());
      for (char c : piece.text) {
        if (c == ' ') {
          text.append(replacement_);
        } else {
          text.push_back(c);
        }
      }
      const bool starts_with_replacement = text.compare(0, replacement_.size(), replacement_) == 0;
      if (!starts_with_replacement && (scheme_ == PrependScheme::kAlways ||
                                       (scheme_ == PrependScheme::kFirst && piece.at_origin))) {
        text.insert(0, replacement_);
      }
      PreToken replaced{std::move(text), piece.at_origin};
      if (!split_) {
        if (!replaced.text.empty()) out.push_back(std::move(replaced));
        continue;
      }
      // Split on every replacement character, each one merged with what follows it.
      std::vector<std::pair<size_t, size_t>> matches;
      for (size_t pos = replaced.text.find(replacement_); pos != std::string::npos;
           pos = replaced.text.find(replacement_, pos + replacement_.size())) {
        matches.emplace_back(pos, pos + replacement_.size());
      }
      SplitPiece(replaced, matches, false, SplitBehavior::kMergedWithNext, &out);
    }
    *pieces = std::move(out);
    return absl::OkStatus();
  }

 private:
  std::string replacement_;
  PrependScheme scheme_;
  bool split_;
};

// Splits on Unicode whitespace, dropping it.
class WhitespaceSplitPreTokenizer : public PreTokenizer {
 public:
  absl::Status PreTokenize(std::vector<PreToken>* pieces) const override {
    std::vector<PreToken> out;
    std::vector<std::pair<size_t, size_t>> matches;
    for (const PreToken& piece : *pieces) {
      matches.clear();
      size_t pos = 0;
      while (pos < piece.text.size()) {
        const size_t start = pos;
        if (IsUnicodeWhitespace(NextCodePoint(piece.text, pos))) matches.emplace_back(start, pos);
      }
      SplitPiece(piece, matches, false, SplitBehavior::kRemoved, &out);
    }
    *pieces = std::move(out);
    return absl::OkStatus();
  }
};

absl::StatusOr<SplitBehavior> ParseBehavior(const Json& j, absl::string_view where) {
  DI_ASSIGN_OR_RETURN(std::string b, GetString(j, "behavior", where));
  if (b == "Removed") return SplitBehavior::kRemoved;
  if (b == "Isolated") return SplitBehavior::kIsolated;
  if (b == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (b == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (b == "Contiguous") return SplitBehavior::kContiguous;
  return absl::InvalidArgumentError(
      absl::StrCat(where,
                   ": expected behavior Removed, Isolated, MergedWithPrevious, MergedWithNext or "
                   "Contiguous, found \"",
                   b, "\""));
}

}  // namespace

void SplitPiece(const PreToken& piece, const std::vector<std::pair<size_t, size_t>>& matches,
                bool invert, SplitBehavior behavior, std::vector<PreToken>* out) {
  const std::string& s = piece.text;
  if (s.empty()) return;
  // Cover the whole string with (span, is_match), as tokenizers' Pattern::find_matches does.
  std::vector<Span> spans;
  spans.reserve(matches.size() * 2 + 1);
  size_t prev = 0;
  for (const auto& [b, e] : matches) {
    if (prev != b) spans.push_back({prev, b, invert});
    spans.push_back({b, e, !invert});
    prev = e;
  }
  if (prev != s.size()) spans.push_back({prev, s.size(), invert});

  std::vector<Span> result;
  result.reserve(spans.size());
  switch (behavior) {
    case SplitBehavior::kIsolated:
      for (Span sp : spans) result.push_back({sp.begin, sp.end, false});
      break;
    case SplitBehavior::kRemoved:
      result = spans;
      break;
    case SplitBehavior::kContiguous: {
      bool previous_match = false;
      for (const Span& sp : spans) {
        if (sp.flag == previous_match && !result.empty()) {
          result.back().end = sp.end;
        } else {
          result.push_back({sp.begin, sp.end, false});
        }
        previous_match = sp.flag;
      }
      break;
    }
    case SplitBehavior::kMergedWithPrevious: {
      bool previous_match = false;
      for (const Span& sp : spans) {
        if (sp.flag && !previous_match && !result.empty()) {
          result.back().end = sp.end;
        } else {
          result.push_back({sp.begin, sp.end, false});
        }
        previous_match = sp.flag;
      }
      break;
    }
    case SplitBehavior::kMergedWithNext: {
      bool previous_match = false;
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        if (it->flag && !previous_match && !result.empty()) {
          result.back().begin = it->begin;
        } else {
          result.push_back({it->begin, it->end, false});
        }
        previous_match = it->flag;
      }
      std::reverse(result.begin(), result.end());
      break;
    }
  }
  for (const Span& sp : result) {
    if (sp.flag || sp.begin == sp.end) continue;
    out->push_back(
        PreToken{s.substr(sp.begin, sp.end - sp.begin), piece.at_origin && sp.begin == 0});
  }
}

absl::StatusOr<std::unique_ptr<PreTokenizer>> ParsePreTokenizer(const Json& j, int depth) {
  if (depth > kMaxNesting) {
    return absl::InvalidArgumentError(
        absl::StrCat("pre_tokenizer: expected at most ", kMaxNesting, " nested Sequence levels"));
  }
  DI_ASSIGN_OR_RETURN(const std::string type, ComponentType(j, "pre_tokenizer"));
  const std::string where = absl::StrCat("pre_tokenizer \"", type, "\"");
  if (type == "ByteLevel") {
    DI_ASSIGN_OR_RETURN(bool add_prefix_space, GetBool(j, "add_prefix_space", true, where));
    DI_ASSIGN_OR_RETURN(bool use_regex, GetBool(j, "use_regex", true, where));
    std::unique_ptr<Regex> regex;
    if (use_regex) {
      DI_ASSIGN_OR_RETURN(regex, Regex::Create(kGpt2Pattern));
    }
    return std::make_unique<ByteLevelPreTokenizer>(add_prefix_space, std::move(regex));
  }
  if (type == "Split") {
    DI_ASSIGN_OR_RETURN(PatternSpec pattern, GetPattern(j, "pattern", where));
    DI_ASSIGN_OR_RETURN(SplitBehavior behavior, ParseBehavior(j, where));
    DI_ASSIGN_OR_RETURN(bool invert, GetBool(j, "invert", false, where));
    DI_ASSIGN_OR_RETURN(auto regex, pattern.is_regex ? Regex::Create(pattern.text)
                                                     : Regex::CreateLiteral(pattern.text));
    if (!pattern.is_regex && pattern.text.empty()) {
      // tokenizers never matches an empty literal.
      DI_ASSIGN_OR_RETURN(regex, Regex::Create("(*FAIL)"));
    }
    return std::make_unique<SplitPreTokenizer>(std::move(regex), behavior, invert);
  }
  if (type == "Digits") {
    DI_ASSIGN_OR_RETURN(bool individual, GetBool(j, "individual_digits", false, where));
    // Rust's char::is_numeric is the Unicode N category; runs of digits form one piece unless
    // individual_digits (Contiguous over single-char matches == Isolated over runs).
    DI_ASSIGN_OR_RETURN(auto regex, Regex::Create(individual ? R"(\p{N})" : R"(\p{N}+)"));
    return std::make_unique<SplitPreTokenizer>(std::move(regex), SplitBehavior::kIsolated, false);
  }
  if (type == "Sequence") {
    auto it = j.find("pretokenizers");
    if (it == j.end() || !it->is_array()) {
      return FieldError(where, "pretokenizers", "an array", it == j.end() ? Json() : *it);
    }
    std::vector<std::unique_ptr<PreTokenizer>> steps;
    for (const Json& step : *it) {
      DI_ASSIGN_OR_RETURN(auto p, ParsePreTokenizer(step, depth + 1));
      steps.push_back(std::move(p));
    }
    return std::make_unique<SequencePreTokenizer>(std::move(steps));
  }
  if (type == "Metaspace") {
    DI_ASSIGN_OR_RETURN(std::string replacement, GetString(j, "replacement", where));
    size_t pos = 0;
    if (replacement.empty() || (NextCodePoint(replacement, pos), pos != replacement.size())) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": expected \"replacement\" to be one character, found \"", replacement, "\""));
    }
    DI_ASSIGN_OR_RETURN(std::optional<std::string> scheme_name,
                        GetOptionalString(j, "prepend_scheme", where));
    PrependScheme scheme = PrependScheme::kAlways;
    if (scheme_name.has_value()) {
      if (*scheme_name == "first") {
        scheme = PrependScheme::kFirst;
      } else if (*scheme_name == "never") {
        scheme = PrependScheme::kNever;
      } else if (*scheme_name == "always") {
        scheme = PrependScheme::kAlways;
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": expected prepend_scheme first, never or always, found \"",
                         *scheme_name, "\""));
      }
    }
    auto aps = j.find("add_prefix_space");
    if (aps != j.end() && aps->is_boolean() && !aps->get<bool>()) {
      if (scheme != PrependScheme::kNever) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": add_prefix_space false does not match prepend_scheme \"",
                         scheme_name.value_or("always"), "\""));
      }
      scheme = PrependScheme::kNever;
    }
    DI_ASSIGN_OR_RETURN(bool split, GetBool(j, "split", true, where));
    return std::make_unique<MetaspacePreTokenizer>(std::move(replacement), scheme, split);
  }
  if (type == "WhitespaceSplit") return std::make_unique<WhitespaceSplitPreTokenizer>();
  return absl::InvalidArgumentError(
      absl::StrCat("pre_tokenizer type \"", type,
                   "\" is not supported (supported: ByteLevel, Split, Sequence, Digits, "
                   "Metaspace, WhitespaceSplit)"));
}

}  // namespace deepinfer::tokenizer::internal
