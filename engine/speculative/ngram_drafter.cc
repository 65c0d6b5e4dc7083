#include "engine/speculative/ngram_drafter.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace deepinfer::engine::speculative {
namespace {

// splitmix64 finaliser: a cheap, well-mixed step for the n-gram hash.
inline uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Hash of the n-gram that ends at `end` grows one token to the left at a time.
inline uint64_t Extend(uint64_t h, int32_t token) { return Mix(h ^ static_cast<uint32_t>(token)); }

}  // namespace

absl::StatusOr<std::unique_ptr<NgramDrafter>> NgramDrafter::Create(
    const NgramDrafterOptions& options) {
  if (options.min_n < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("ngram drafter min_n: expected >= 1, got ", options.min_n));
  }
  if (options.max_n < options.min_n || options.max_n > 64) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ngram drafter max_n: expected in [min_n=", options.min_n, ", 64], got ", options.max_n));
  }
  return std::unique_ptr<NgramDrafter>(new NgramDrafter(options));
}

void NgramDrafter::Extend(absl::Span<const int32_t> context, SeqIndex* index) const {
  const int64_t n_len = static_cast<int64_t>(context.size());
  // Appending token i gives the n-grams ending at i - 1 a successor: index them now, so every
  // indexed occurrence ends strictly before the current last token.
  for (int64_t i = std::max<int64_t>(index->length, 1); i < n_len; ++i) {
    const int64_t end = i - 1;
    uint64_t h = 0;
    for (int n = 1; n <= options_.max_n && end - n + 1 >= 0; ++n) {
      h = speculative::Extend(h, context[end - n + 1]);
      if (n >= options_.min_n) index->by_n[n - options_.min_n][h] = end;
    }
  }
  index->length = n_len;
  if (n_len > 0) index->last_token = context[n_len - 1];
}

absl::Status NgramDrafter::Propose(int64_t seq_id, absl::Span<const int32_t> context, int k,
                                   DraftProposal* out) {
  *out = DraftProposal();
  if (k < 0)
    return absl::InvalidArgumentError(absl::StrCat("ngram drafter k: expected >= 0, got ", k));
  SeqIndex& index = index_[seq_id];
  const int64_t len = static_cast<int64_t>(context.size());
  if (index.by_n.empty() || len < index.length ||
      (index.length > 0 && context[index.length - 1] != index.last_token)) {
    // New sequence, or a context that is not an extension of the indexed one: rebuild.
    index = SeqIndex();
    index.by_n.resize(options_.max_n - options_.min_n + 1);
  }
  Extend(context, &index);
  if (k == 0 || len < 2) return absl::OkStatus();

  // Hashes of the suffixes ending at len - 1, for n = 1..max_n.
  uint64_t suffix_hash[65];
  const int max_n = static_cast<int>(std::min<int64_t>(options_.max_n, len - 1));
  uint64_t h = 0;
  for (int n = 1; n <= max_n; ++n) suffix_hash[n] = h = speculative::Extend(h, context[len - n]);

  for (int n = max_n; n >= options_.min_n; --n) {
    const auto& map = index.by_n[n - options_.min_n];
    auto it = map.find(suffix_hash[n]);
    if (it == map.end()) continue;
    const int64_t end = it->second;
    if (!std::equal(context.begin() + (end - n + 1), context.begin() + end + 1,
                    context.begin() + (len - n))) {
      continue;  // hash collision
    }
    out->match_length = n;
    out->tokens.reserve(k);
    for (int i = 0; i < k; ++i) {
      const int64_t pos = end + 1 + i;  // < len + i, so always known
      out->tokens.push_back(pos < len ? context[pos] : out->tokens[pos - len]);
    }
    return absl::OkStatus();
  }
  return absl::OkStatus();
}

void NgramDrafter::Release(int64_t seq_id) { index_.erase(seq_id); }

}  // namespace deepinfer::engine::speculative
