// Added tokens of tokenizer.json ("added_tokens"): special and user tokens matched in the input
// before pre-tokenization, as tokenizers' AddedVocabulary does: leftmost-longest matching, first
// of the tokens with normalized=false on the raw text, then of those with normalized=true on the
// normalized text; single_word / lstrip / rstrip options honoured.
//
// Thread-safety: immutable after Create(); all methods may be called concurrently.
#ifndef DEEPINFER_ENGINE_TOKENIZER_INTERNAL_ADDED_VOCABULARY_H_
#define DEEPINFER_ENGINE_TOKENIZER_INTERNAL_ADDED_VOCABULARY_H_

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/tokenizer/internal/bpe_model.h"
#include "engine/tokenizer/internal/json_util.h"
#include "engine/tokenizer/internal/normalizer.h"
#include "engine/tokenizer/internal/regex.h"

namespace deepinfer::tokenizer::internal {

struct AddedToken {
  std::string content;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = true;
  bool special = false;
};

// Parses the "added_tokens" array (ids are reassigned the way tokenizers does on load).
absl::StatusOr<std::vector<AddedToken>> ParseAddedTokens(const Json& j);

class AddedVocabulary {
 public:
  // A piece of the input: either plain text [begin, end) or an added token `id`.
  struct Segment {
    size_t begin;
    size_t end;
    int32_t id;  // -1 for plain text
  };

  // Assigns ids as tokenizers' add_tokens does (the model's id for content already in the
  // model vocab, otherwise the next id from the model's vocab size) and builds the matchers.
  // `normalizer` may be null; it is used to normalize tokens with normalized=true.
  static absl::StatusOr<std::unique_ptr<AddedVocabulary>> Create(
      const std::vector<AddedToken>& tokens, const BpeModel& model, const Normalizer* normalizer);

  // Splits `text` (valid UTF-8) on matches of the non-normalized (normalized_set=false) or
  // normalized (true) tokens. Appends the segments covering `text` to `out`; empty text gives
  // no segment.
  absl::Status Split(absl::string_view text, bool normalized_set, std::vector<Segment>* out) const;

  std::optional<int32_t> TokenToId(absl::string_view content) const;
  // The added token with this id, or null.
  const AddedToken* FindById(int32_t id) const;
  // The string decoding uses for this id: the normalized form for normalized tokens whose
  // normalization changes them, otherwise the content. Null if `id` is not an added token.
  const std::string* DecodeForm(int32_t id) const;
  bool IsSpecialContent(absl::string_view content) const {
    return special_contents_.contains(content);
  }
  bool empty() const { return by_id_.empty(); }
  // All added token ids.
  std::vector<int32_t> Ids() const;

 private:
  // A byte trie over token patterns, matched leftmost-longest.
  struct Trie {
    struct Node {
      std::vector<std::pair<unsigned char, int32_t>> children;  // sorted by byte
      int32_t value = -1;                                       // token id ending here
    };
    std::vector<Node> nodes{1};
    std::array<bool, 256> first_byte{};
    bool empty() const { return nodes.size() == 1; }
    void Insert(absl::string_view pattern, int32_t id);
    // Longest match starting at `pos`: its end, or npos.
    size_t LongestAt(absl::string_view text, size_t pos, int32_t* id) const;
  };

  AddedVocabulary() = default;

  absl::flat_hash_map<std::string, int32_t> by_content_;
  absl::flat_hash_map<int32_t, AddedToken> by_id_;
  absl::flat_hash_map<int32_t, std::string> normalized_forms_;
  absl::flat_hash_set<std::string> special_contents_;
  Trie raw_trie_;
  Trie normalized_trie_;
  std::unique_ptr<Regex> ends_with_word_;
  std::unique_ptr<Regex> starts_with_word_;
};

}  // namespace deepinfer::tokenizer::internal

#endif  // DEEPINFER_ENGINE_TOKENIZER_INTERNAL_ADDED_VOCABULARY_H_
