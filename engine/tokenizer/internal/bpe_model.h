// The BPE model of Hugging Face tokenizer.json ("model": {"type": "BPE", ...}): vocab, merges
// (either "a b" strings or ["a", "b"] pairs), unk_token, fuse_unk, byte_fallback, ignore_merges,
// continuing_subword_prefix, end_of_word_suffix. Merging follows tokenizers' Word::merge_all:
// a priority queue ordered by (merge rank, position), O(n log n) per word. Results for words
// shorter than 256 bytes are cached.
//
// Thread-safety: Tokenize() and the lookups may be called concurrently (the cache is sharded and
// guarded by mutexes).
#ifndef DEEPINFER_ENGINE_TOKENIZER_INTERNAL_BPE_MODEL_H_
#define DEEPINFER_ENGINE_TOKENIZER_INTERNAL_BPE_MODEL_H_

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "engine/tokenizer/internal/json_util.h"

namespace deepinfer::tokenizer::internal {

class BpeModel {
 public:
  struct Options {
    std::optional<std::string> unk_token;
    std::optional<std::string> continuing_subword_prefix;
    std::optional<std::string> end_of_word_suffix;
    bool fuse_unk = false;
    bool byte_fallback = false;
    bool ignore_merges = false;
    // Cache results of words shorter than kMaxCachedWordBytes; 0 disables the cache.
    size_t cache_capacity = 16384;
  };
  static constexpr size_t kMaxCachedWordBytes = 256;

  // `merges` in rank order. kInvalidArgument if a merge names a token missing from the vocab or
  // the unk token is not in the vocab.
  static absl::StatusOr<std::unique_ptr<BpeModel>> Create(
      std::vector<std::pair<std::string, int32_t>> vocab,
      const std::vector<std::pair<std::string, std::string>>& merges, Options options);
  // Parses the "model" object of tokenizer.json; its type must be "BPE".
  static absl::StatusOr<std::unique_ptr<BpeModel>> FromJson(const Json& model);

  BpeModel(const BpeModel&) = delete;
  BpeModel& operator=(const BpeModel&) = delete;

  // Appends the ids of `word` (one pre-tokenized piece, valid UTF-8) to `ids`.
  absl::Status Tokenize(absl::string_view word, std::vector<int32_t>* ids) const;

  std::optional<int32_t> TokenToId(absl::string_view token) const;
  // The token string of `id`, or null if the vocab has no such id.
  const std::string* IdToToken(int32_t id) const;
  // Number of vocab entries (what tokenizers calls the model's vocab size).
  size_t vocab_size() const { return vocab_.size(); }
  // One past the largest id in the vocab.
  int32_t id_limit() const { return static_cast<int32_t>(id_to_token_.size()); }

 private:
  struct MergeValue {
    uint32_t rank;
    int32_t new_id;
  };
  static constexpr int kCacheShards = 16;
  struct CacheShard {
    absl::Mutex mu;
    absl::flat_hash_map<std::string, std::vector<int32_t>> map ABSL_GUARDED_BY(mu);
  };

  explicit BpeModel(Options options) : options_(std::move(options)) {}
  absl::Status MergeWord(absl::string_view word, std::vector<int32_t>* ids) const;
  const MergeValue* FindMerge(int32_t a, int32_t b) const {
    auto it = merges_.find((static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) |
                           static_cast<uint32_t>(b));
    return it == merges_.end() ? nullptr : &it->second;
  }

  Options options_;
  absl::flat_hash_map<std::string, int32_t> vocab_;
  std::vector<std::string> id_to_token_;
  std::vector<bool> has_id_;
  absl::flat_hash_map<uint64_t, MergeValue> merges_;
  std::optional<int32_t> unk_id_;
  std::array<int32_t, 256> byte_fallback_ids_;  // id of "<0xXX>", or -1
  // Ids of single-byte tokens by byte value when no prefix/suffix applies, -1 if absent.
  std::array<int32_t, 128> ascii_ids_;
  mutable std::array<CacheShard, kCacheShards> cache_;
};

}  // namespace deepinfer::tokenizer::internal

#endif  // DEEPINFER_ENGINE_TOKENIZER_INTERNAL_BPE_MODEL_H_
