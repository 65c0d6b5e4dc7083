#include "engine/tokenizer/internal/added_vocabulary.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/tokenizer/internal/utf8.h"

namespace deepinfer::tokenizer::internal {
namespace {

// Start of the run of whitespace that ends `s` (s.size() if none): tokenizers' `\s*$`.
size_t TrailingWhitespaceStart(absl::string_view s) {
  size_t end = s.size();
  while (end > 0) {
    size_t start = end - 1;
    while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
    size_t pos = start;
    if (!IsUnicodeWhitespace(NextCodePoint(s, pos))) break;
    end = start;
  }
  return end;
}

// Length of the run of whitespace that starts `s`: tokenizers' `^\s*`.
size_t LeadingWhitespaceLength(absl::string_view s) {
  size_t pos = 0;
  while (pos < s.size()) {
    size_t next = pos;
    if (!IsUnicodeWhitespace(NextCodePoint(s, next))) break;
    pos = next;
  }
  return pos;
}

}  // namespace

absl::StatusOr<std::vector<AddedToken>> ParseAddedTokens(const Json& j) {
  std::vector<AddedToken> tokens;
  if (j.is_null()) return tokens;
  if (!j.is_array()) {
    return absl::InvalidArgumentError(
        absl::StrCat("added_tokens: expected an array, found ", JsonTypeName(j)));
  }
  for (size_t i = 0; i < j.size(); ++i) {
    const Json& t = j[i];
    const std::string where = absl::StrCat("added_tokens[", i, "]");
    if (!t.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": expected an object, found ", JsonTypeName(t)));
    }
    AddedToken token;
    DI_ASSIGN_OR_RETURN(token.content, GetString(t, "content", where));
    DI_ASSIGN_OR_RETURN(token.single_word, GetBool(t, "single_word", false, where));
    DI_ASSIGN_OR_RETURN(token.lstrip, GetBool(t, "lstrip", false, where));
    DI_ASSIGN_OR_RETURN(token.rstrip, GetBool(t, "rstrip", false, where));
    DI_ASSIGN_OR_RETURN(token.special, GetBool(t, "special", false, where));
    DI_ASSIGN_OR_RETURN(token.normalized, GetBool(t, "normalized", !token.special, where));
    tokens.push_back(std::move(token));
  }
  return tokens;
}

void AddedVocabulary::Trie::Insert(absl::string_view pattern, int32_t id) {
  if (pattern.empty()) return;
  first_byte[static_cast<unsigned char>(pattern[0])] = true;
  int32_t node = 0;
  for (char ch : pattern) {
    const unsigned char c = static_cast<unsigned char>(ch);
    auto& children = nodes[node].children;
    auto it = std::lower_bound(children.begin(), children.end(), c,
                               [](const auto& p, unsigned char b) { return p.first < b; });
    if (it != children.end() && it->first == c) {
      node = it->second;
      continue;
    }
    const int32_t child = static_cast<int32_t>(nodes.size());
    children.insert(it, {c, child});
    nodes.emplace_back();
    node = child;
  }
  // Like a map built from (pattern, id) pairs, the first token with a given pattern wins.
  if (nodes[node].value < 0) nodes[node].value = id;
}

size_t AddedVocabulary::Trie::LongestAt(absl::string_view text, size_t pos, int32_t* id) const {
  size_t best = absl::string_view::npos;
  int32_t node = 0;
  for (size_t i = pos; i < text.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    const auto& children = nodes[node].children;
    auto it = std::lower_bound(children.begin(), children.end(), c,
                               [](const auto& p, unsigned char b) { return p.first < b; });
    if (it == children.end() || it->first != c) break;
    node = it->second;
    if (nodes[node].value >= 0) {
      best = i + 1;
      *id = nodes[node].value;
    }
  }
  return best;
}

absl::StatusOr<std::unique_ptr<AddedVocabulary>> AddedVocabulary::Create(
    const std::vector<AddedToken>& tokens, const BpeModel& model, const Normalizer* normalizer) {
  std::unique_ptr<AddedVocabulary> v(new AddedVocabulary());
  DI_ASSIGN_OR_RETURN(v->ends_with_word_, Regex::Create(R"(\w$)"));
  DI_ASSIGN_OR_RETURN(v->starts_with_word_, Regex::Create(R"(^\w)"));
  int64_t next_id = static_cast<int64_t>(model.vocab_size());
  for (const AddedToken& token : tokens) {
    if (token.content.empty()) continue;
    DI_RETURN_IF_ERROR(ValidateUtf8(token.content));
    auto existing = v->by_content_.find(token.content);
    if (existing != v->by_content_.end()) {
      const AddedToken& old = v->by_id_[existing->second];
      if (old.single_word == token.single_word && old.lstrip == token.lstrip &&
          old.rstrip == token.rstrip && old.normalized == token.normalized &&
          old.special == token.special) {
        continue;
      }
    }
    int32_t id;
    if (existing != v->by_content_.end()) {
      id = existing->second;
    } else if (auto model_id = model.TokenToId(token.content)) {
      id = *model_id;
    } else {
      if (next_id > INT32_MAX) {
        return absl::InvalidArgumentError("added_tokens: ids past 2^31 are not supported");
      }
      id = static_cast<int32_t>(next_id++);
    }
    if (token.normalized && normalizer != nullptr) {
      std::string normalized = token.content;
      DI_RETURN_IF_ERROR(normalizer->Normalize(&normalized));
      if (normalized != token.content) v->normalized_forms_[id] = std::move(normalized);
    }
    v->by_content_[token.content] = id;
    if (token.special) v->special_contents_.insert(token.content);
    v->by_id_[id] = token;
  }
  // Build the matchers in id order so that ties between equal patterns resolve the same way
  // on every load.
  std::vector<int32_t> ids = v->Ids();
  for (int32_t id : ids) {
    const AddedToken& token = v->by_id_[id];
    if (token.normalized) {
      auto it = v->normalized_forms_.find(id);
      v->normalized_trie_.Insert(it == v->normalized_forms_.end() ? token.content : it->second, id);
    } else {
      v->raw_trie_.Insert(token.content, id);
    }
  }
  return v;
}

std::vector<int32_t> AddedVocabulary::Ids() const {
  std::vector<int32_t> ids;
  ids.reserve(by_id_.size());
  for (const auto& [id, token] : by_id_) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  return ids;
}

absl::Status AddedVocabulary::Split(absl::string_view text, bool normalized_set,
                                    std::vector<Segment>* out) const {
  if (text.empty()) return absl::OkStatus();
  const Trie& trie = normalized_set ? normalized_trie_ : raw_trie_;
  if (trie.empty()) {
    out->push_back(Segment{0, text.size(), -1});
    return absl::OkStatus();
  }
  size_t start_offset = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    if (!trie.first_byte[static_cast<unsigned char>(text[pos])]) {
      ++pos;
      continue;
    }
    int32_t id = -1;
    const size_t match_end = trie.LongestAt(text, pos, &id);
    if (match_end == absl::string_view::npos) {
      ++pos;
      continue;
    }
    size_t start = pos;
    size_t stop = match_end;
    pos = match_end;  // matches never overlap, even when one is discarded below
    const AddedToken& token = by_id_.at(id);
    if (token.single_word) {
      bool start_space = true, stop_space = true;
      if (start != 0) {
        DI_ASSIGN_OR_RETURN(bool word_before, ends_with_word_->Search(text.substr(0, start)));
        start_space = !word_before;
      }
      if (stop != text.size()) {
        DI_ASSIGN_OR_RETURN(bool word_after, starts_with_word_->Search(text.substr(stop)));
        stop_space = !word_after;
      }
      if (!start_space || !stop_space) continue;
    }
    if (token.lstrip) {
      start = std::max(TrailingWhitespaceStart(text.substr(0, start)), start_offset);
    }
    if (token.rstrip) {
      stop += LeadingWhitespaceLength(text.substr(stop));
      pos = stop;
    }
    if (start_offset < start) out->push_back(Segment{start_offset, start, -1});
    out->push_back(Segment{start, stop, id});
    start_offset = stop;
  }
  if (start_offset != text.size()) out->push_back(Segment{start_offset, text.size(), -1});
  return absl::OkStatus();
}

std::optional<int32_t> AddedVocabulary::TokenToId(absl::string_view content) const {
  auto it = by_content_.find(content);
  if (it == by_content_.end()) return std::nullopt;
  return it->second;
}

const AddedToken* AddedVocabulary::FindById(int32_t id) const {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &it->second;
}

const std::string* AddedVocabulary::DecodeForm(int32_t id) const {
  auto n = normalized_forms_.find(id);
  if (n != normalized_forms_.end()) return &n->second;
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &it->second.content;
}

}  // namespace deepinfer::tokenizer::internal
